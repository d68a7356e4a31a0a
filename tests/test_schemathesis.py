"""Schemathesis against the API's own OpenAPI document (``/openapi.json``), in process through the
WSGI app: generated requests for every operation, and every response must be no server error, a
documented status code and content type, and match its documented schema.

CI runs SPECROUTE_FUZZ_EXAMPLES (default 100) cases per operation; the dedicated run is
``SPECROUTE_FUZZ_EXAMPLES=10000 python -m pytest -q tests/test_schemathesis.py``."""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from router.openapi import openapi_document
from tests.factories import make_routing_database
from webui.app import create_app

EXAMPLES = int(os.environ.get("SPECROUTE_FUZZ_EXAMPLES", "100"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def api_app(tmp_path_factory):
    folder = tmp_path_factory.mktemp("schemathesis")
    url = f"sqlite:///{folder}/api.db"
    engine = make_routing_database(url)
    app = create_app(
        {"database_url": url, "data_dir": str(folder), "router_refresh_s": 0, "ui_worker": False}
    )
    yield app
    app.extensions["specroute.close"]()
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
def test_every_operation_conforms_to_the_openapi_document(case, api_app):
    case.call_and_validate(app=api_app, checks=CHECKS)


def test_the_document_is_the_one_served(api_app):
    served = api_app.test_client().get("/openapi.json").get_json()
    assert served["paths"] == openapi_document("0")["paths"]
