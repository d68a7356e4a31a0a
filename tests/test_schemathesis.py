"""Schemathesis against the API's own OpenAPI document (``/openapi.json``), in process through the
WSGI app: generated requests for every operation, and every response must be no server error, a
documented status code and content type, and match its documented schema.

CI runs SPECROUTE_FUZZ_EXAMPLES (default 100) cases per operation; the dedicated run is
``SPECROUTE_FUZZ_EXAMPLES=10000 python -m pytest -q tests/test_schemathesis.py``."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from router.serve.openapi import openapi_document
from tests.factories import make_routing_database
from webui.app import create_app

EXAMPLES = int(os.environ.get("SPECROUTE_FUZZ_EXAMPLES", "100"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


class _Pool(BaseHTTPRequestHandler):
    """A stand-in for the pools the front door forwards to (an OpenAI-style server answering with
    llama-server's ``timings``, whole or as server-sent events): this test checks specroute's own answers,
    and tests/test_server_routing.py forwards to real llama-server pools."""

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        answer = {
            "choices": [{"text": "ok"}],
            "timings": {"predicted_n": 3, "draft_n": 2, "draft_n_accepted": 1},
        }
        streamed = isinstance(body, dict) and body.get("stream") is True
        data = (
            f"data: {json.dumps(answer)}\n\ndata: [DONE]\n\n" if streamed else json.dumps(answer)
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if streamed else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def api_app(tmp_path_factory):
    folder = tmp_path_factory.mktemp("schemathesis")
    url = f"sqlite:///{folder}/api.db"
    engine = make_routing_database(url)
    pool = ThreadingHTTPServer(("127.0.0.1", 0), _Pool)
    threading.Thread(target=pool.serve_forever, daemon=True).start()
    with engine.begin() as connection:  # every published pool is that server, so the front door forwards
        pools = json.loads(connection.exec_driver_sql("SELECT pools FROM policy_sets").scalar())
        address = f"http://127.0.0.1:{pool.server_port}"
        connection.exec_driver_sql(
            "UPDATE policy_sets SET pools = ?", (json.dumps(dict.fromkeys(pools, address)),)
        )
    app = create_app(
        {"database_url": url, "data_dir": str(folder), "router_refresh_s": 0, "ui_worker": False}
    )
    yield app
    app.extensions["specroute.close"]()
    pool.shutdown()
    engine.dispose()


# the document the app serves at /openapi.json (a test in test_api.py checks they are the same)
schema = schemathesis.openapi.from_dict(openapi_document("0"))


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
@pytest.mark.slow
@pytest.mark.parallel
def test_every_operation_conforms_to_the_openapi_document(case, api_app):
    case.call_and_validate(app=api_app, checks=CHECKS)


def test_the_document_is_the_one_served(api_app):
    served = api_app.test_client().get("/openapi.json").get_json()
    assert served["paths"] == openapi_document("0")["paths"]


def test_the_fuzzed_front_door_reaches_its_pool(api_app):
    """The fuzzed front-door requests above reach the stand-in pool (not a 503 for a pool named, not addressed)."""
    client = api_app.test_client()
    answer = client.post(
        "/v1/completions", json={"prompt": "def f(x): return x + 1  # fix this", "max_tokens": 8}
    )
    assert answer.status_code == 200 and answer.get_json()["timings"]["draft_n"] == 2
    assert answer.headers["X-Specroute-Pool"].startswith("http://127.0.0.1:")
