"""The one error model: every SpecrouteError class carries its status, code and exit code; the API
answers them in its one JSON shape (the Flask views and the /v1/route fast path alike), the pages
with an error page and never a traceback, the command line with ``Error: <message>`` and the
class's exit code; and the token check of the fast path is the request hook's."""

from __future__ import annotations

import importlib
import re

import pytest
from sqlalchemy import func, select
from werkzeug.test import Client

import migrations
from analyzer.errors import SpecrouteError, error_payload
from analyzer.orm import PromptSet
from analyzer.prompts.prompt_sets import PromptSetNotFound, import_prompt_file
from analyzer.settings import SettingsError
from router.classify.training_data import ClassifierError
from router.decide.feedback import FeedbackError, NoActivePolicy, UnknownRouteId
from router.policies.policy import publish_policies
from router.serve.api import RouteFastPath, Unauthorized
from tests.factories import make_done_run
from webui.app import create_app

# every module that defines an error class, so that the walk below sees them all
ERROR_MODULES = (
    "analyzer.models.devices",
    "analyzer.prompts.ingest",
    "analyzer.models.loading",
    "analyzer.prompts.prompt_sets",
    "analyzer.advice.report",
    "analyzer.analysis.run_records",
    "analyzer.settings",
    "migrations",
    "router.serve.api",
    "router.classify.training_data",
    "router.classify.encoder",
    "router.classify.fast_scorer",
    "router.decide.feedback",
    "router.policies.policy",
)
DOMAIN_ERRORS = {
    "DeviceError",
    "ModelTooLarge",
    "PromptFileError",
    "SpecError",
    "TokenizerMismatch",
    "PromptSetError",
    "PromptSetExists",
    "PromptSetNotFound",
    "PromptSetInUse",
    "UnknownTaskType",
    "ReportError",
    "RunError",
    "RunNotFound",
    "SettingsError",
    "SchemaNotCurrent",
    "ApiError",
    "ClassifierError",
    "EncoderUnavailable",
    "ScorerError",
    "FeedbackError",
    "UnknownRouteId",
    "NoActivePolicy",
    "PolicyError",
    "Unauthorized",
}
SECRET = "s3cret-token-for-tests-0123456789"
BEARER = {"Authorization": f"Bearer {SECRET}"}
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


class TeapotError(SpecrouteError):
    """A domain error of the tests' own, with a status and exit code nothing else uses."""

    status, code, exit_code = 418, "teapot", 3


def _all_error_classes() -> list[type[SpecrouteError]]:
    for name in ERROR_MODULES:
        importlib.import_module(name)
    found, todo = [], [SpecrouteError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def test_every_error_class_carries_its_status_code_and_exit_code_on_the_class():
    classes = _all_error_classes()
    assert DOMAIN_ERRORS <= {cls.__name__ for cls in classes}  # each domain error is a SpecrouteError
    statuses: dict[str, int] = {}
    for cls in classes:
        assert "code" in vars(cls), f"{cls.__name__} names no code of its own"
        assert isinstance(cls.status, int) and 400 <= cls.status <= 599, cls
        assert isinstance(cls.code, str) and re.fullmatch(r"[a-z_]+", cls.code), cls
        assert isinstance(cls.exit_code, int) and cls.exit_code not in (0, 2, 130), (
            cls
        )  # 2 and 130 are click's and Ctrl-C's
        assert statuses.setdefault(cls.code, cls.status) == cls.status, f"{cls.code} answers two statuses"
    # the statuses the API has always answered
    assert (FeedbackError.status, UnknownRouteId.status, NoActivePolicy.status) == (400, 404, 409)
    assert ClassifierError.status == 503 and Unauthorized.status == 401 and PromptSetNotFound.status == 404


def test_one_payload_shape():
    error = PromptSetNotFound("no prompt set named 'x'", known=["a"])
    assert (
        error.payload()
        == error_payload("prompt_set_not_found", "no prompt set named 'x'", {"known": ["a"]})
        == {
            "error": {
                "code": "prompt_set_not_found",
                "message": "no prompt set named 'x'",
                "details": {"known": ["a"]},
            }
        }
    )
    assert error_payload("x", "y") == {"error": {"code": "x", "message": "y", "details": {}}}
    assert str(error) == error.message == "no prompt set named 'x'" and isinstance(error, LookupError)


@pytest.fixture
def published(session):
    with session.begin():
        run = make_done_run(session, {"code": 0.9, "qa": 0.2})
        publish_policies(session, run.id)
    return run


@pytest.fixture
def make_app(engine, db_url, tmp_path):
    apps = []

    def build(**config):
        app = create_app(
            {
                "database_url": db_url,
                "data_dir": str(tmp_path),
                "router_refresh_s": 0,
                "ui_worker": False,
                "TESTING": True,
                **config,
            }
        )
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.extensions["specroute.close"]()


@pytest.mark.parametrize(
    "error",
    [
        TeapotError("short and stout", spout=1),
        PromptSetNotFound("no prompt set named 'x'"),
        SettingsError("SPECROUTE_X: bad"),
        Unauthorized(),
    ],
)
def test_the_api_answers_a_domain_error_from_a_view_with_its_class_status_and_code(make_app, error):
    app = make_app()

    def view():
        raise error

    app.add_url_rule("/v1/test-error", "test_error", view)
    response = app.test_client().get("/v1/test-error")
    assert response.status_code == type(error).status
    assert response.get_json() == {
        "error": {"code": type(error).code, "message": str(error), "details": error.details}
    }
    assert ("WWW-Authenticate" in response.headers) == isinstance(error, Unauthorized)


def test_the_route_fast_path_and_the_view_answer_a_domain_error_alike(make_app, published, monkeypatch):
    app = make_app()
    assert isinstance(app.wsgi_app, RouteFastPath)

    def broken(requests):
        raise ClassifierError("classifier version 1 is corrupted (hash mismatch); run: specroute train")

    monkeypatch.setattr(app.extensions["specroute.router"], "route", broken)
    fast, view = app.test_client(), Client(app.wsgi_app.wsgi_app)  # the second skips the fast path
    one, two = (c.post("/v1/route", json={"prompt": "def f(): pass"}) for c in (fast, view))
    assert one.status_code == two.status_code == 503
    assert (
        one.get_json()
        == two.get_json()
        == ClassifierError(
            "classifier version 1 is corrupted (hash mismatch); run: specroute train"
        ).payload()
    )


def test_feedback_errors_come_from_their_classes(make_app):
    client = make_app().test_client()  # no policy set published
    response = client.post(
        "/v1/feedback", json={"task_type": "code", "rounds": 1, "drafted": 2, "accepted": 1}
    )
    assert response.status_code == NoActivePolicy.status
    assert response.get_json()["error"]["code"] == NoActivePolicy.code


def test_pages_show_an_error_page_never_a_traceback_and_a_500_stores_nothing(make_app, session):
    app = make_app()

    def half_written():
        with app.extensions["specroute.sessions"]() as s, s.begin():
            import_prompt_file(s, "half", b"one prompt\n", "half.txt")
            raise RuntimeError("secret internals at 0xdeadbeef")

    def domain():
        raise TeapotError("I am a teapot")

    app.add_url_rule("/test-half-written", "test_half", half_written)
    app.add_url_rule("/test-domain", "test_domain", domain)
    client = app.test_client()

    missing = client.get("/prompts/nope")
    text = missing.get_data(as_text=True)
    assert missing.status_code == PromptSetNotFound.status and missing.mimetype == "text/html"
    assert "no prompt set named" in text and "nope" in text and "Traceback" not in text

    teapot = client.get("/test-domain")
    assert teapot.status_code == 418 and "I am a teapot" in teapot.get_data(as_text=True)

    crashed = client.get("/test-half-written")
    body = crashed.get_data(as_text=True)
    assert crashed.status_code == 500 and "server log has the details" in body
    assert "0xdeadbeef" not in body and "Traceback" not in body and "RuntimeError" not in body
    session.rollback()
    assert session.scalar(select(func.count()).select_from(PromptSet).where(PromptSet.name == "half")) == 0


def test_the_cli_reports_a_domain_error_with_its_message_and_exit_code(runner, monkeypatch):
    from webui.cli import base, cli

    unmigrated = runner.invoke(cli, ["prompts", "list"])
    assert unmigrated.exit_code == migrations.SchemaNotCurrent.exit_code == 1
    assert unmigrated.stderr.startswith("Error: ") and "Run: specroute db upgrade" in unmigrated.stderr
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    missing = runner.invoke(cli, ["prompts", "show", "nope"])
    assert missing.exit_code == PromptSetNotFound.exit_code == 1
    assert (
        missing.stderr.startswith("Error: no prompt set named 'nope'")
        and len(missing.stderr.splitlines()) == 1
    )
    assert runner.invoke(cli, ["prompts", "import"]).exit_code == 2  # click's usage errors keep 2

    def teapot(*args, **kwargs):
        raise TeapotError("the settings are a teapot")

    monkeypatch.setattr(base, "load_settings", teapot)
    custom = runner.invoke(cli, ["prompts", "list"])
    assert custom.exit_code == 3 and custom.stderr.strip() == "Error: the settings are a teapot"


def test_the_fast_path_and_the_request_hook_make_one_token_check(make_app, published):
    routed = make_app(api_token=SECRET, api_token_scope="writes,route")
    assert routed.wsgi_app.authorize is not None
    fast, hook = routed.test_client(), Client(routed.wsgi_app.wsgi_app)  # the second is Flask's hook only
    page = fast.get("/playground")
    token = CSRF.search(page.get_data(as_text=True)).group(1)
    for headers, allowed in (
        ({}, False),
        ({"Authorization": "Bearer wrong"}, False),
        ({"Authorization": SECRET}, False),
        ({"Authorization": "Basic eA=="}, False),
        (BEARER, True),
    ):
        one = fast.post("/v1/route", json={"prompt": "def f(): pass"}, headers=headers)
        two = hook.post("/v1/route", json={"prompt": "def f(): pass"}, headers=headers)
        batch = hook.post("/v1/route/batch", json={"requests": [{"prompt": "x"}]}, headers=headers)
        form = fast.post(
            "/playground", data={"csrf_token": token, "prompt": "def f(): pass"}, headers=headers
        )
        assert [r.status_code for r in (one, two, batch, form)] == ([200] * 4 if allowed else [401] * 4), (
            headers
        )
        if not allowed:
            assert one.get_json() == two.get_json() == batch.get_json() == Unauthorized().payload()
            assert (
                one.headers["WWW-Authenticate"]
                == two.headers["WWW-Authenticate"]
                == 'Bearer realm="specroute"'
            )

    open_routing = make_app(api_token=SECRET, api_token_scope="writes")
    assert open_routing.wsgi_app.authorize is None  # routing needs no token: the fast path checks nothing
    client = open_routing.test_client()
    assert client.post("/v1/route", json={"prompt": "x"}).status_code == 200
    assert (
        client.post(
            "/v1/feedback", json={"task_type": "code", "rounds": 1, "drafted": 2, "accepted": 1}
        ).status_code
        == 401
    )
