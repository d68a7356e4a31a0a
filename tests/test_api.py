"""The routing API: one error shape for every bad input (never a 500), the route/feedback flow with
decision logging and online adaptation, metrics, reloads, and the OpenAPI document checked against
the real responses."""

from __future__ import annotations

import json
import re

import pytest
from jsonschema import Draft202012Validator, ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from sqlalchemy import func, select

from analyzer.db import lock_for_write
from router.orm import FeedbackEvent, PolicySet, RouteDecision, TaskEstimate
from router.policies.policy import activate_policy_set, publish_policies
from router.serve.openapi import ROUTES
from webui.app import create_app


def _validator(client):
    document = client.get("/openapi.json").get_json()
    registry = Registry().with_resource(
        "urn:openapi", Resource.from_contents(document, default_specification=DRAFT202012)
    )
    return document, lambda name, instance: Draft202012Validator(
        {"$ref": f"urn:openapi#/components/schemas/{name}"}, registry=registry
    ).validate(instance)


ERROR_CASES = [
    ("post", "/v1/route", b"{not json", "invalid_json", 400),
    ("post", "/v1/route", b"", "invalid_json", 400),
    ("post", "/v1/route", b"\xff\xfe", "invalid_json", 400),
    ("post", "/v1/route", b"[1, 2]", "invalid_request", 400),
    ("post", "/v1/route", b'{"max_new_tokens": 10}', "missing_prompt", 400),
    ("post", "/v1/route", b'{"prompt": "   "}', "empty_prompt", 400),
    ("post", "/v1/route", b'{"prompt": 5}', "invalid_request", 400),
    (
        "post",
        "/v1/route",
        b'{"prompt": "x", "messages": [{"role": "user", "content": "x"}]}',
        "invalid_request",
        400,
    ),
    ("post", "/v1/route", b'{"messages": [{"role": "user"}]}', "invalid_request", 400),
    ("post", "/v1/route", b'{"messages": []}', "invalid_request", 400),
    ("post", "/v1/route", b'{"prompt": "x", "max_tokens": 5}', "unknown_field", 400),
    ("post", "/v1/route", b'{"prompt": "x", "max_new_tokens": 0}', "invalid_request", 400),
    ("post", "/v1/route", b'{"prompt": "x", "max_new_tokens": true}', "invalid_request", 400),
    ("post", "/v1/route", b'{"prompt": "x", "max_new_tokens": 2.5}', "invalid_request", 400),
    ("post", "/v1/route", b'{"prompt": "x", "temperature": -1}', "invalid_request", 400),
    ("post", "/v1/route", b'{"prompt": "x", "batch_size": 2, "concurrency": 2}', "invalid_request", 400),
    ("post", "/v1/route", json.dumps({"prompt": "y" * 201}).encode(), "prompt_too_long", 400),
    ("post", "/v1/route", json.dumps({"prompt": "z" * 50_000}).encode(), "body_too_large", 413),
    ("post", "/v1/route/batch", b'{"requests": []}', "invalid_request", 400),
    ("post", "/v1/route/batch", b'{"requests": {"prompt": "x"}}', "invalid_request", 400),
    ("post", "/v1/route/batch", b'{"prompts": ["x"]}', "unknown_field", 400),
    (
        "post",
        "/v1/route/batch",
        json.dumps({"requests": [{"prompt": "x"}] * 1001}).encode(),
        "batch_too_large",
        400,
    ),
    ("post", "/v1/route/batch", b'{"requests": [{"prompt": "x"}, {"prompt": ""}]}', "empty_prompt", 400),
    ("post", "/v1/feedback", b'{"task_type": "code", "rounds": 1}', "invalid_feedback", 400),
    (
        "post",
        "/v1/feedback",
        b'{"task_type": "code", "rounds": 1, "drafted": 1, "accepted": 2}',
        "invalid_feedback",
        400,
    ),
    ("post", "/v1/feedback", b'{"rounds": 1, "drafted": 1, "accepted": 1}', "invalid_feedback", 400),
    (
        "post",
        "/v1/feedback",
        b'{"route_id": 7, "rounds": 1, "drafted": 1, "accepted": 1}',
        "invalid_feedback",
        400,
    ),
    (
        "post",
        "/v1/feedback",
        b'{"route_id": "nope", "rounds": 1, "drafted": 1, "accepted": 1}',
        "unknown_route_id",
        404,
    ),
    (
        "post",
        "/v1/feedback",
        b'{"task_type": "qa", "meta_info": {"spec_verify_ct": 3, "completion_tokens": 9}}',
        "invalid_feedback",
        400,
    ),
    ("post", "/v1/feedback", b'"text"', "invalid_request", 400),
    (
        "post",
        "/v1/feedback",
        b'{"task_type": "astrology", "rounds": 2, "drafted": 4, "accepted": 2}',
        "invalid_feedback",
        400,
    ),
    (
        "post",
        "/v1/feedback",
        b'{"task_type": "*", "rounds": 2, "drafted": 4, "accepted": 2}',
        "invalid_feedback",
        400,
    ),
    ("get", "/v1/route", None, "method_not_allowed", 405),
    ("get", "/v1/nothing-here", None, "not_found", 404),
]


@pytest.mark.parametrize("method, path, body, code, status", ERROR_CASES)
def test_every_bad_input_gets_a_4xx_in_the_one_error_shape(
    engine, db_url, published, method, path, body, code, status
):
    app = create_app(
        {"database_url": db_url, "max_prompt_chars": 200, "api_max_body_bytes": 40_000, "ui_worker": False}
    )
    try:
        client = app.test_client()
        response = getattr(client, method)(path, data=body, content_type="application/json")
        data = response.get_json()
        assert response.status_code == status, data
        assert set(data) == {"error"} and set(data["error"]) == {"code", "message", "details"}
        assert data["error"]["code"] == code and data["error"]["message"]
        assert isinstance(data["error"]["details"], dict)
        _, validate = _validator(client)
        validate("Error", data)
    finally:
        app.extensions["specroute.close"]()


def test_the_route_fast_path_answers_as_the_flask_view(engine, db_url, published):
    from werkzeug.test import Client

    from router.serve.api import RouteFastPath

    app = create_app(
        {"database_url": db_url, "max_prompt_chars": 200, "api_max_body_bytes": 40_000, "ui_worker": False}
    )
    try:
        assert isinstance(app.wsgi_app, RouteFastPath)
        fast, flask_view = app.test_client(), Client(app.wsgi_app.wsgi_app)  # the second skips the fast path
        bodies = [body for _, path, body, _, _ in ERROR_CASES if path == "/v1/route" and body is not None]
        bodies += [
            b'{"prompt": "def add(a, b): return a + b"}',
            b'{"messages": [{"role": "user", "content": "Capital?"}]}',
        ]
        before = app.extensions["specroute.router"].metrics.render()
        for body in bodies:
            one = fast.post("/v1/route", data=body, content_type="application/json")
            two = flask_view.post("/v1/route", data=body, content_type="application/json")
            assert one.status_code == two.status_code, body
            a, b = one.get_json(), two.get_json()
            if one.status_code == 200:
                assert a.pop("route_id") != b.pop("route_id")
            assert a == b, body
            for name in (
                "Content-Type",
                "Content-Security-Policy",
                "X-Content-Type-Options",
                "X-Frame-Options",
                "Referrer-Policy",
            ):
                assert one.headers[name] == two.headers[name], name
        after = app.extensions["specroute.router"].metrics.render()
        count = re.compile(
            r'specroute_http_requests_total\{endpoint="/v1/route",method="POST",status="200"\} (\d+)'
        )
        ok = [int(m.group(1)) if (m := count.search(text)) else 0 for text in (before, after)]
        assert ok[1] - ok[0] == 4  # both paths count their requests
    finally:
        app.extensions["specroute.close"]()


def test_error_messages_name_the_field(client, published):
    data = client.post(
        "/v1/route/batch", json={"requests": [{"prompt": "a"}, {"prompt": "b", "max_new_tokens": -3}]}
    ).get_json()
    assert data["error"]["details"]["field"] == "requests[1].max_new_tokens"
    assert "requests[1].max_new_tokens" in data["error"]["message"]
    unknown = client.post("/v1/route", json={"prompt": "a", "max_tokens": 3}).get_json()
    assert (
        "unknown field 'max_tokens'" in unknown["error"]["message"]
        and "max_new_tokens" in unknown["error"]["message"]
    )


def test_no_active_policy_set_is_a_conflict(client):
    response = client.post(
        "/v1/feedback", json={"task_type": "code", "rounds": 2, "drafted": 4, "accepted": 2}
    )
    assert response.status_code == 409 and response.get_json()["error"]["code"] == "no_active_policy"
    decision = client.post("/v1/route", json={"prompt": "hello"}).get_json()
    assert decision["speculate"] is False and decision["policy_version"] is None


def test_route_feedback_adaptation_and_decision_log(app, client, session, published):
    code = client.post(
        "/v1/route",
        json={"prompt": "def add(a, b): return a + b  # fix this python function", "max_new_tokens": 128},
    ).get_json()
    assert (
        code["task_type"] == "code"
        and code["speculate"]
        and code["gamma"] >= 2
        and code["policy_version"] == 1
    )
    assert code["engine"]["transformers"]["assistant_model"] is True
    assert code["engine"]["pool"] == f"spec-k{code['gamma']}"
    qa = client.post(
        "/v1/route",
        json={"messages": [{"role": "user", "content": "What is the capital of France? Answer briefly."}]},
    ).get_json()
    assert qa["task_type"] == "qa" and not qa["speculate"] and qa["gamma"] == 0
    short = client.post(
        "/v1/route", json={"prompt": "def f(x): return x  # fix this python function", "max_new_tokens": 5}
    ).get_json()
    assert (
        not short["speculate"]
        and {"code": "short_output", "max_new_tokens": 5, "min_output_tokens": 20} in short["reason_codes"]
    )
    assert len(short["reasons"]) == len(short["reason_codes"])  # the same reasons, in words
    # the engine now reports almost no acceptance for code: the estimate falls and speculation turns off
    first = client.post(
        "/v1/feedback",
        json={"route_id": code["route_id"], "rounds": 40, "drafted": 40 * code["gamma"], "accepted": 2},
    ).get_json()["estimate"]
    assert first["task_type"] == "code" and first["events"] == 1
    assert first["option"] == (f"gamma {first['gamma']}" if first["speculate"] else None)
    for _ in range(20):
        estimate = client.post(
            "/v1/feedback",
            json={
                "task_type": "code",
                "engine": "vllm",
                "speculative_decoding": {"num_drafts": 40, "num_draft_tokens": 160, "num_accepted_tokens": 3},
            },
        ).get_json()["estimate"]
    assert estimate["events"] == 21 and not estimate["speculate"] and estimate["alpha"] < first["alpha"]
    after = client.post(
        "/v1/route",
        json={"prompt": "def g(y): return y * 2  # fix this python function", "max_new_tokens": 128},
    ).get_json()
    assert after["task_type"] == "code" and not after["speculate"]
    assert [r["events"] for r in after["reason_codes"] if r["code"] == "online_estimate"] == [21]
    # every decision was logged; feedback by route_id found it
    app.extensions["specroute.router"].decision_log.flush()
    with session.begin():
        assert session.scalar(select(func.count()).select_from(RouteDecision)) == 4
        stored = session.scalar(select(TaskEstimate).where(TaskEstimate.task_type == "code"))
        assert stored.events == 21 and not stored.speculate
    policies = client.get("/v1/policies").get_json()
    assert policies["active"]["version"] == 1
    assert [e["task_type"] for e in policies["active"]["estimates"]] == ["code"]
    assert policies["active"]["estimates"][0]["option"] is None  # off now, named as a policy's option is
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'specroute_route_decisions_total{task="code",outcome="speculate"} 1' in metrics
    assert 'specroute_route_decisions_total{task="code",outcome="off"} 2' in metrics
    assert 'specroute_feedback_events_total{task="code",engine="vllm"} 20' in metrics
    assert (
        f'specroute_feedback_drafted_tokens_total{{task="code"}} {40 * code["gamma"] + 20 * 160}' in metrics
    )
    assert 'specroute_http_requests_total{endpoint="/v1/route",method="POST",status="200"} 4' in metrics


def test_one_probe_in_twenty_while_off_then_back_on(client, published):
    decisions = [
        client.post(
            "/v1/route", json={"prompt": f"What is the capital of country {i}? Answer briefly."}
        ).get_json()
        for i in range(40)
    ]
    assert all(d["task_type"] == "qa" for d in decisions)
    probes = [i for i, d in enumerate(decisions) if d["speculate"]]
    assert probes == [19, 39]
    assert [
        i for i, d in enumerate(decisions) if any(r["code"] == "probe" for r in d["reason_codes"])
    ] == probes
    for _ in range(15):  # qa turns out to accept nearly everything
        estimate = client.post(
            "/v1/feedback", json={"task_type": "qa", "rounds": 10, "drafted": 40, "accepted": 40}
        ).get_json()["estimate"]
    assert estimate["speculate"]
    assert client.post(
        "/v1/route", json={"prompt": "What is the capital of Peru? Answer briefly."}
    ).get_json()["speculate"]


def test_batch_of_a_thousand(client, published):
    requests = [
        {"prompt": f"What is the capital of country {i}? Answer briefly.", "max_new_tokens": 64}
        for i in range(500)
    ] + [
        {"prompt": f"def f{i}(x): return x  # fix this python function", "batch_size": 2} for i in range(500)
    ]
    decisions = client.post("/v1/route/batch", json={"requests": requests}).get_json()["decisions"]
    assert len(decisions) == 1000 and len({d["route_id"] for d in decisions}) == 1000
    assert {d["task_type"] for d in decisions[:500]} == {"qa"} and {
        d["task_type"] for d in decisions[500:]
    } == {"code"}
    assert sum(d["speculate"] for d in decisions[500:]) == 500


def test_a_newly_activated_policy_set_is_picked_up(client, session, published):
    assert client.post("/v1/route", json={"prompt": "x"}).get_json()["policy_version"] == 1
    with session.begin():
        lock_for_write(session)  # the app's decision log writes beside us
        publish_policies(session, published.id)
    assert client.post("/v1/route", json={"prompt": "x"}).get_json()["policy_version"] == 2
    with session.begin():
        lock_for_write(session)
        activate_policy_set(session, 1)
        assert session.scalar(select(PolicySet.version).where(PolicySet.is_active.is_(True))) == 1
    assert client.post("/v1/route", json={"prompt": "x"}).get_json()["policy_version"] == 1


def test_openapi_document_matches_the_real_responses(app, client, published):
    document, validate = _validator(client)
    Draft202012Validator.check_schema({"$defs": document["components"]["schemas"]})
    served = {
        (rule.rule, method.lower(), rule.endpoint)
        for rule in app.url_map.iter_rules()
        if rule.endpoint.startswith("router_api.")
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    # one table declares every endpoint: the server's rules and the document's operations are its rows
    assert served == {(e.path, e.method, f"router_api.{e.view}") for e in ROUTES}
    assert {(path, method) for path, item in document["paths"].items() for method in item} == {
        (e.path, e.method) for e in ROUTES
    }
    for endpoint in [e for e in ROUTES if e.operation is None]:  # each error status the table declares
        responses = document["paths"][endpoint.path][endpoint.method]["responses"]
        assert {int(status) for status in responses if status != "200"} == set(endpoint.errors)
    decision = client.post(
        "/v1/route", json={"prompt": "def f(x): return x  # fix this python function"}
    ).get_json()
    validate("Decision", decision)
    validate(
        "BatchResponse",
        client.post(
            "/v1/route/batch",
            json={
                "requests": [
                    {"prompt": "a"},
                    {"messages": [{"role": "user", "content": "b"}], "concurrency": 3, "temperature": 0.7},
                ]
            },
        ).get_json(),
    )
    validate(
        "FeedbackResponse",
        client.post(
            "/v1/feedback",
            json={
                "route_id": decision["route_id"],
                "timings": {"draft_n": 30, "draft_n_accepted": 20, "predicted_n": 64},
            },
        ).get_json(),
    )
    validate("Policies", client.get("/v1/policies").get_json())
    validate("Classifier", client.get("/v1/classifier").get_json())
    active = client.get("/v1/classifier").get_json()["active"]  # 12 prompts of one source: no grouped CV
    assert (
        active["features"] == "tfidf"
        and active["grouped"] is None
        and active["calibration"]["on"] == "stratified"
    )
    assert set(active["reachability"]) == set(active["labels"]) == {"code", "qa"}
    validate("Health", client.get("/healthz").get_json())
    # the documented request shapes accept what the server accepts
    validate("RouteRequest", {"prompt": "x", "max_new_tokens": 5, "batch_size": 2, "temperature": 0.0})
    validate("FeedbackBody", {"task_type": "qa", "meta_info": {"spec_verify_ct": 3}})
    with pytest.raises(ValidationError, match="'four' is not of type 'integer'"):
        validate("Decision", {**decision, "gamma": "four"})


def test_empty_database_answers_policies_classifier_and_health(client):
    _, validate = _validator(client)
    assert client.get("/v1/policies").get_json() == {"active": None, "versions": []}
    assert client.get("/v1/classifier").get_json() == {"active": None}
    health = client.get("/healthz").get_json()
    validate("Health", health)
    assert health["status"] == "ok"


def test_metrics_are_valid_prometheus_text(client, published):
    client.post("/v1/route", json={"prompt": "x"})
    client.post("/v1/route", data=b"{", content_type="application/json")
    text = client.get("/metrics").get_data(as_text=True)
    sample = re.compile(
        r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? -?[0-9.e+Inf-]+$'
    )
    for line in text.splitlines():
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or sample.match(line), line
    assert 'specroute_http_requests_total{endpoint="/v1/route",method="POST",status="400"} 1' in text
    buckets = [
        int(row.rsplit(" ", 1)[1])
        for row in text.splitlines()
        if row.startswith('specroute_http_request_duration_seconds_bucket{endpoint="/v1/route"')
    ]
    assert buckets == sorted(buckets) and buckets[-1] == 2


def test_feedback_for_a_made_up_task_is_refused_and_leaves_no_estimate_or_metrics_label(
    client, published, session
):
    for task in ("astrology", "*"):
        response = client.post(
            "/v1/feedback", json={"task_type": task, "rounds": 2, "drafted": 4, "accepted": 2}
        )
        assert response.status_code == 400
        error = response.get_json()["error"]
        assert error["code"] == "invalid_feedback"
        assert error["message"].startswith(
            f"unknown task_type '{task}': name a task type with a published policy"
        )
        assert "(code, qa)" in error["message"]
    assert (
        client.post(
            "/v1/feedback", json={"task_type": "qa", "rounds": 2, "drafted": 4, "accepted": 2}
        ).status_code
        == 200
    )
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'task="qa"' in metrics and "astrology" not in metrics and 'task="*"' not in metrics
    assert session.scalar(select(func.count()).select_from(FeedbackEvent)) == 1
    assert [e.task_type for e in session.scalars(select(TaskEstimate))] == ["qa"]


def test_feedback_with_an_unknown_field_is_refused_like_a_route_body(client):
    typo = client.post("/v1/feedback", json={"task_type": "code", "rounds": 2, "drafted": 4, "acepted": 2})
    assert typo.status_code == 400
    error = typo.get_json()["error"]
    assert error["code"] == "unknown_field" and "'acepted'" in error["message"]
    route = client.post("/v1/route", json={"prompt": "x", "max_new_token": 5})
    assert route.status_code == 400 and route.get_json()["error"]["code"] == "unknown_field"


def test_health_says_the_active_versions_before_the_first_route(client, published):
    health = client.get("/healthz").get_json()  # this process has not routed yet (one of several workers)
    assert (health["classifier_version"], health["policy_version"]) == (1, 1)


def test_a_chat_request_routes_like_the_same_text_as_a_prompt(client, published):
    from analyzer.prompts.ingest import parse_prompt_file
    from analyzer.prompts.prompt_sets import sample_bytes

    texts = [p.text for p in parse_prompt_file(sample_bytes(), "sample.jsonl").prompts]
    assert len(texts) == 64

    def routed(requests):
        answer = client.post("/v1/route/batch", json={"requests": requests}).get_json()["decisions"]
        # task, confidence and the policy that decided (speculate itself moves with the probe counter)
        return [(d["task_type"], d["confidence"], d["route_id"].rsplit("-", 1)[1]) for d in answer]

    as_prompt = routed([{"prompt": t, "max_new_tokens": 64} for t in texts])
    as_chat = routed([{"messages": [{"role": "user", "content": t}], "max_new_tokens": 64} for t in texts])
    with_system = routed(
        [
            {
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": t},
                ],
                "max_new_tokens": 64,
            }
            for t in texts
        ]
    )
    assert as_chat == as_prompt and with_system == as_prompt
    assert {task for task, *_ in as_prompt} == {"code", "qa"}  # the fixture's classifier tells two tasks
