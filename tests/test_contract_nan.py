"""A policy set from a run with any gamma_max routes, over real HTTP, with finite numbers only: a run
analysed up to gamma 24 gets an online estimate priced over its whole curve (gamma 24 on a curve that
reaches 24, so ``expected_speedup`` is a number), and feedback may move gamma above 16. No response may
contain NaN or Infinity, which are not JSON."""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import urllib.request
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from werkzeug.serving import make_server

import analyzer.analysis.simulated_run
from router.policies.policy import publish_policies
from tests.factories import make_done_run
from webui.app import create_app

# T_t(k) for k = 1..41, nearly flat (a GPU-like verify cost): with high acceptance the best gamma is
# the largest one analysed, above the 16 the router once assumed
FLAT_COST_CURVE = [0.040 + 0.0004 * k for k in range(41)]


def _strict(text: str):
    """``text`` parsed as strict JSON: NaN, Infinity and -Infinity are refused."""

    def refuse(constant):
        raise AssertionError(f"{constant} in a response: not JSON")

    return json.loads(text, parse_constant=refuse)


def _call(base: str, path: str, body: dict | None = None) -> tuple[int, object]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        base + path,
        data=data,
        headers={"Content-Type": "application/json"},
        method="POST" if body is not None else "GET",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, _strict(response.read().decode())
    except urllib.error.HTTPError as error:
        return error.code, _strict(error.read().decode())


@contextlib.contextmanager
def serving(folder: Path, template: Path):
    """A real HTTP server (werkzeug's WSGI server on a socket) on a new SQLite file in ``folder``, a copy of
    the session's migrated ``template``; yields (base URL, session factory)."""
    from analyzer.db import make_engine, make_session_factory

    shutil.copyfile(template, folder / "specroute.db")
    url = f"sqlite:///{folder / 'specroute.db'}"
    engine = make_engine(url)
    app = create_app({"database_url": url, "router_refresh_s": 0, "ui_worker": False})
    server = make_server(
        "127.0.0.1", 0, app, threaded=True
    )  # shutdown() is thread-safe, unlike waitress' close()
    # shutdown() returns once the loop looks again: every 50 ms, not the default half second per server
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", make_session_factory(engine)
    finally:
        server.shutdown()
        thread.join(timeout=5)
        app.extensions["specroute.close"]()
        engine.dispose()


def _publish(sessions, gamma_max: int, acceptance: float, seed: int, monkeypatch) -> None:
    monkeypatch.setattr(analyzer.analysis.simulated_run, "SIMULATED_COST_CURVE", FLAT_COST_CURVE)
    with sessions() as session, session.begin():
        run = make_done_run(
            session,
            {"code": acceptance},
            per_task=3,
            gamma_max=gamma_max,
            n_tokens=128,
            draft_spec="ngram",
            draft_step_s=0.0005,
            seed=seed,
            name=f"set-{seed}-{gamma_max}",
        )
        publish_policies(session, run.id)


def _route_and_feed(base: str, events: int) -> list[dict]:
    """Route, send ``events`` feedback events for the decision, route again; every answer checked."""
    answers = []
    status, decision = _call(base, "/v1/route", {"prompt": "def f(x): return x", "max_new_tokens": 128})
    assert status == 200, decision
    answers.append(decision)
    for _ in range(events):
        status, estimate = _call(
            base,
            "/v1/feedback",
            {
                "route_id": decision["route_id"],
                "rounds": 10,
                "drafted": 10 * max(decision["gamma"], 1),
                "accepted": 10 * max(decision["gamma"], 1) - 1,
            },
        )
        assert status == 200, estimate
        answers.append(estimate)
    status, after = _call(base, "/v1/route", {"prompt": "def f(x): return x", "max_new_tokens": 128})
    assert status == 200, after
    answers.append(after)
    for path in ("/v1/policies", "/v1/classifier", "/healthz"):
        status, listed = _call(base, path)
        assert status == 200
        answers.append(listed)
    return answers


def test_a_policy_at_gamma_24_routes_with_a_finite_speedup_and_keeps_its_gamma_after_feedback(
    tmp_path, monkeypatch, _migrated_template
):
    with serving(tmp_path, _migrated_template) as (base, sessions):
        _publish(sessions, 24, 0.99, seed=1, monkeypatch=monkeypatch)
        first, *_, after, policies, _, _ = _route_and_feed(base, events=3)
    assert first["speculate"] and first["gamma"] > 16  # the analysis chose beyond 16
    assert 1.0 < first["expected_speedup"] < 100
    assert policies["active"]["gamma_max"] == 24
    assert after["speculate"] and after["gamma"] > 16  # feedback does not cap gamma at 16
    assert 1.0 < after["expected_speedup"] < 100


@given(gamma_max=st.integers(1, 40), acceptance=st.floats(0.05, 0.995), events=st.integers(0, 3))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@pytest.mark.slow
@pytest.mark.parallel
def test_no_response_contains_nan_or_infinity_for_any_gamma_max(
    tmp_path_factory, monkeypatch, _migrated_template, gamma_max, acceptance, events
):
    with serving(tmp_path_factory.mktemp("nan"), _migrated_template) as (base, sessions):
        _publish(sessions, gamma_max, acceptance, seed=gamma_max * 1000 + events, monkeypatch=monkeypatch)
        for answer in _route_and_feed(base, events):
            text = json.dumps(answer, allow_nan=False)  # raises on a NaN that parse_constant let through
            assert "NaN" not in text and "Infinity" not in text
        status, decision = _call(base, "/v1/route", {"prompt": "def f(x): return x", "max_new_tokens": 128})
        assert status == 200 and (1 <= decision["gamma"] <= gamma_max or not decision["speculate"])
