"""No answer contains NaN or Infinity: the app's JSON provider refuses them (strict JSON or a
ValueError, exactly when a non-finite float is in the value), and the client gets a logged 500 in the
API's error shape that names the number and where it is, on the views and on the /v1/route fast path."""

from __future__ import annotations

import json
import logging
import math

import pytest
from flask import jsonify
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.serve import api
from router.strict_json import NonFiniteNumber, dumps, non_finite_path
from webui.json_provider import StrictJSONProvider


def _refuse_constant(name: str):
    raise AssertionError(f"{name} is not JSON")


def strict_loads(text: str):
    """json.loads that fails on NaN, Infinity and -Infinity (the standard library accepts them)."""
    return json.loads(text, parse_constant=_refuse_constant)


def _has_non_finite(value) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_non_finite(v) for v in value)
    return False


def _as_json(value):
    """What a strict JSON round trip gives back: tuples become lists."""
    if isinstance(value, dict):
        return {k: _as_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_json(v) for v in value]
    return value


def _at_pointer(value, pointer: str):
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        value = value[token] if isinstance(value, dict) else value[int(token)]
    return value


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=8)
    | st.floats(allow_nan=True, allow_infinity=True),
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=json_like)
def test_the_provider_writes_strict_json_or_raises_exactly_on_a_non_finite_float(app, value):
    if _has_non_finite(value):
        with pytest.raises(ValueError) as raised:
            app.json.dumps(value)
        assert isinstance(raised.value, NonFiniteNumber)
        pointer = raised.value.details["path"]
        assert not math.isfinite(_at_pointer(value, pointer)), pointer
    else:
        text = app.json.dumps(value)
        assert strict_loads(text) == _as_json(value)


def test_the_app_factory_installs_the_strict_provider_keeping_key_order(app):
    assert isinstance(app.json, StrictJSONProvider)
    assert app.json.dumps({"b": 1, "a": [1.5, None]}) == '{"b": 1, "a": [1.5, null]}'
    with pytest.raises(NonFiniteNumber, match=r"the answer holds -Infinity at /a/1"):
        app.json.dumps({"a": [0.0, -math.inf]})


@pytest.mark.parametrize(
    "value, pointer, text",
    [
        (math.nan, "", "NaN at the top level"),
        ({"a/b": [0, {"~x": math.inf}]}, "/a~1b/1/~0x", "Infinity at /a~1b/1/~0x"),
        ({math.nan: 1}, "", "NaN at the top level"),  # a key: the standard library writes it as NaN too
        ([1, (2, {"k": -math.inf})], "/1/1/k", "-Infinity at /1/1/k"),
    ],
)
def test_the_error_names_the_number_and_its_json_pointer(value, pointer, text):
    assert non_finite_path(value)[0] == pointer
    with pytest.raises(NonFiniteNumber, match=text) as raised:
        dumps(value)
    assert raised.value.status == 500 and raised.value.details == {"path": pointer}


def test_other_encoding_errors_stay_the_standard_librarys():
    circular: list = []
    circular.append(circular)
    with pytest.raises(ValueError, match="Circular reference") as raised:
        dumps(circular)
    assert not isinstance(raised.value, NonFiniteNumber)
    with pytest.raises(TypeError):
        dumps({"x": object()})


def _assert_non_finite_500(response, pointer: str):
    assert response.status_code == 500 and response.mimetype == "application/json"
    body = strict_loads(response.get_data(as_text=True))
    assert body["error"]["code"] == "non_finite_number"
    assert body["error"]["details"] == {"path": pointer}
    assert pointer in body["error"]["message"] and "server bug" in body["error"]["message"]


def test_an_api_view_answering_nan_gets_a_logged_json_500(app, client, caplog):
    app.add_url_rule("/v1/test-nan", "test_nan", lambda: jsonify({"policies": [{"speedup": float("nan")}]}))
    with caplog.at_level(logging.ERROR, logger="webui.app"):
        response = client.get("/v1/test-nan")
    _assert_non_finite_500(response, "/policies/0/speedup")
    assert "NaN at /policies/0/speedup" in response.get_json()["error"]["message"]
    logged = [r for r in caplog.records if r.name == "webui.app" and "/v1/test-nan" in r.getMessage()]
    assert logged and isinstance(logged[0].exc_info[1], NonFiniteNumber)


def test_the_real_policies_endpoint_refuses_infinity(app, client, monkeypatch):
    from router.serve.responses import Policies

    service = app.extensions[api.EXTENSION]
    active = {
        "version": 1, "active": True, "run_id": 1, "engine": "transformers", "priced_by": "transformers",
        "measured_by": "transformers", "margin": math.inf, "gamma_max": 24, "draft_kind": "ngram",
        "draft_options": None, "cost": None, "pools": None, "notes": None, "created_at": "2026-12-02T00:00:00+00:00",
        "activated_at": None, "policies": [], "estimates": [],
    }  # fmt: skip
    answer = Policies.model_validate({"active": active, "versions": []})
    monkeypatch.setattr(service, "policies", lambda: answer)
    _assert_non_finite_500(client.get("/v1/policies"), "/active/margin")


def test_the_route_fast_path_refuses_nan_too(client, monkeypatch, caplog):
    from router.decide.decision import Router

    decision = (
        Router(None, {}, policy_version=None).route("hi").model_copy(update={"expected_speedup": math.nan})
    )
    monkeypatch.setattr(api, "answer_route", lambda raw, service: decision)
    with caplog.at_level(logging.ERROR, logger="router.serve.api"):
        response = client.post("/v1/route", data=b'{"prompt": "hi"}', content_type="application/json")
    _assert_non_finite_500(response, "/expected_speedup")
    assert any(isinstance(r.exc_info and r.exc_info[1], NonFiniteNumber) for r in caplog.records)


def test_a_page_answering_nan_shows_the_error_page(app, client):
    app.add_url_rule("/test-nan-page", "test_nan_page", lambda: jsonify([math.nan]))
    response = client.get("/test-nan-page")
    text = response.get_data(as_text=True)
    assert response.status_code == 500 and response.mimetype == "text/html"
    assert "NaN at /0" in text and "Traceback" not in text
