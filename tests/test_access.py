"""Access with SPECROUTE_API_TOKEN: every write needs the bearer token (or a signed-in browser
session), routing and reads as configured, 401s in the API's error shape, nothing written by a
refused request, the sign-in page, and secrets never shown by ``specroute settings``."""

from __future__ import annotations

import io
import json
import re

import pytest
from sqlalchemy import func, select

from analyzer.orm import AnalysisRun, PromptSet
from analyzer.settings import SettingsError
from router.orm import FeedbackEvent
from router.policies.policy import publish_policies
from tests.factories import make_done_run
from webui.app import create_app

SECRET = "s3cret-token-for-tests-0123456789"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
BEARER = {"Authorization": f"Bearer {SECRET}"}


@pytest.fixture
def make(engine, db_url, tmp_path):
    apps = []

    def build(scope: str = "writes"):
        app = create_app(
            {
                "database_url": db_url,
                "data_dir": str(tmp_path),
                "router_refresh_s": 0,
                "ui_worker": False,
                "api_token": SECRET,
                "api_token_scope": scope,
                "TESTING": True,
            }
        )
        apps.append(app)
        return app.test_client()

    yield build
    for app in apps:
        app.extensions["specroute.close"]()


@pytest.fixture
def published(session):
    with session.begin():
        run = make_done_run(session, {"code": 0.9, "qa": 0.2})
        publish_policies(session, run.id)
    return run


def _csrf(web, path="/prompts") -> str:
    return CSRF.search(web.get(path, headers=BEARER).get_data(as_text=True)).group(1)


def _counts(session) -> tuple[int, int, int]:
    session.rollback()  # a fresh snapshot: see what the app committed
    return (
        session.scalar(select(func.count()).select_from(FeedbackEvent)),
        session.scalar(select(func.count()).select_from(PromptSet)),
        session.scalar(select(func.count()).select_from(AnalysisRun)),
    )


def test_writes_need_the_token_and_nothing_else_does_by_default(make, session, published):
    web = make()
    feedback = {"task_type": "code", "rounds": 4, "drafted": 8, "accepted": 6}
    before = _counts(session)
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": SECRET},
        {"Authorization": "Basic eA=="},
    ):
        refused = web.post("/v1/feedback", json=feedback, headers=headers)
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Bearer")
        assert refused.get_json()["error"]["code"] == "unauthorized"
    assert _counts(session) == before  # nothing written
    assert web.post("/v1/feedback", json=feedback, headers=BEARER).status_code == 200
    assert _counts(session)[0] == before[0] + 1
    assert web.post("/v1/route", json={"prompt": "def f(): pass"}).status_code == 200  # routing open
    assert web.post("/v1/route/batch", json={"requests": [{"prompt": "x"}]}).status_code == 200
    for path in ("/v1/policies", "/v1/classifier", "/metrics", "/openapi.json", "/healthz", "/", "/runs"):
        assert web.get(path).status_code == 200, path  # reads open


def test_every_ui_form_needs_a_signed_in_session(make, session, published):
    web = make()
    token = _csrf(web)  # reading the page is open; the form is not
    forms = [
        ("/prompts", {"name": "x", "file": (io.BytesIO(b'{"prompt": "hi"}\n'), "x.jsonl")}),
        ("/prompts/x/delete", {}),
        ("/runs", {"prompt_set": "x"}),
        (f"/runs/{published.id}/cancel", {}),
        (f"/runs/{published.id}/resume", {}),
        ("/classifier/train", {}),
        ("/classifier/1/activate", {}),
        ("/policies/publish", {"run_id": published.id}),
        ("/policies/1/activate", {}),
    ]
    before = _counts(session)
    for path, data in forms:
        response = web.post(path, data={"csrf_token": token, **data})
        assert response.status_code == 401 and "Sign in" in response.get_data(as_text=True), path
    assert _counts(session) == before
    wrong = web.post("/login", data={"csrf_token": token, "token": "nope", "next": "/prompts"})
    assert wrong.status_code == 401 and "not the server" in wrong.get_data(as_text=True)
    right = web.post("/login", data={"csrf_token": token, "token": SECRET, "next": "/prompts"})
    assert right.status_code == 302 and right.headers["Location"].endswith("/prompts")
    assert "Sign out" in web.get("/").get_data(as_text=True)
    uploaded = web.post(
        "/prompts",
        data={
            "csrf_token": token,
            "name": "mine",
            "file": (io.BytesIO(b'{"prompt": "hello there"}\n'), "mine.jsonl"),
        },
    )
    assert uploaded.status_code in (200, 302) and _counts(session)[1] == before[1] + 1
    web.post("/logout", data={"csrf_token": token})
    assert web.post("/prompts/mine/delete", data={"csrf_token": token}).status_code == 401
    evil = web.post("/login", data={"csrf_token": token, "token": SECRET, "next": "//evil.example/"})
    assert evil.headers["Location"] in ("/", "http://localhost/")  # never an open redirect


def test_scopes_route_and_all(make, published):
    route = make("writes,route")
    assert route.post("/v1/route", json={"prompt": "x"}).status_code == 401  # the fast path checks too
    assert route.post("/v1/route", json={"prompt": "x"}, headers=BEARER).status_code == 200
    assert route.post("/v1/route/batch", json={"requests": [{"prompt": "x"}]}).status_code == 401
    assert route.get("/v1/policies").status_code == 200
    everything = make("all")
    assert everything.get("/v1/policies").status_code == 401
    assert everything.get("/v1/policies", headers=BEARER).status_code == 200
    page = everything.get("/runs")
    assert page.status_code == 302 and "/login?next=/runs" in page.headers["Location"]
    assert everything.get("/healthz").status_code == 200
    assert everything.get("/static/style.css").status_code == 200
    assert everything.get("/login").status_code == 200


def test_bad_scope_and_hidden_secrets(engine, db_url, runner, monkeypatch):
    with pytest.raises(SettingsError, match="SPECROUTE_API_TOKEN_SCOPE"):
        create_app(
            {"database_url": db_url, "api_token": SECRET, "api_token_scope": "some", "ui_worker": False}
        )
    monkeypatch.setenv("SPECROUTE_API_TOKEN", SECRET)
    monkeypatch.setenv("SPECROUTE_SECRET_KEY", "k" * 40)
    monkeypatch.setenv("SPECROUTE_DATABASE_URL", "postgresql://user:pa55word@localhost/db")
    from webui.cli import cli

    result = runner.invoke(cli, ["settings", "--json"])
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output and "k" * 40 not in result.output and "pa55word" not in result.output
    rows = {row["name"]: row["value"] for row in json.loads(result.output)}
    assert rows["api_token"] == "(set, hidden)" and rows["secret_key"] == "(set, hidden)"
