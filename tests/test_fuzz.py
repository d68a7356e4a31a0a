"""Generated bad input against every API endpoint and every web form: never a 500 or an unhandled
exception, the one JSON error shape on the API, and no partial writes (row counts unchanged after a
rejected request, exactly one more row after an accepted feedback).

CI runs SPECROUTE_FUZZ_EXAMPLES (default 100) cases per surface; the dedicated run is

    SPECROUTE_FUZZ_EXAMPLES=10000 python -m pytest -q tests/test_fuzz.py

(docs/RELIABILITY.md gives its time and result)."""

from __future__ import annotations

import io
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from analyzer.orm import AnalysisRun, Prompt, PromptSet
from analyzer.prompts.ingest import IngestLimits, parse_prompt_file
from router.orm import ClassifierVersion, FeedbackEvent, PolicySet, RouteDecision
from tests.factories import routing_test_app

EXAMPLES = int(os.environ.get("SPECROUTE_FUZZ_EXAMPLES", "100"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=10,
)
messages = st.lists(
    st.dictionaries(st.sampled_from(["role", "content", "name"]), json_values, max_size=3), max_size=3
)
route_bodies = st.fixed_dictionaries(
    {},
    optional={
        "prompt": st.text(max_size=300) | json_values,
        "messages": messages | json_values,
        "max_new_tokens": json_values,
        "batch_size": json_values,
        "concurrency": json_values,
        "temperature": json_values,
        "extra": json_values,
    },
)
feedback_bodies = st.fixed_dictionaries(
    {},
    optional={
        "route_id": st.text(max_size=40) | json_values,
        "task_type": st.sampled_from(["code", "qa", "x" * 70]) | json_values,
        "rounds": json_values,
        "drafted": json_values,
        "accepted": json_values,
        "gamma": json_values,
        "timings": st.dictionaries(
            st.sampled_from(["draft_n", "draft_n_accepted", "predicted_n"]), json_values, max_size=3
        ),
        "speculative_decoding": st.dictionaries(
            st.sampled_from(
                [
                    "num_drafts",
                    "num_spec_steps",
                    "num_draft_tokens",
                    "num_accepted_tokens",
                    "num_accepted_tokens_per_pos",
                ]
            ),
            json_values,
            max_size=4,
        ),
        "meta_info": st.dictionaries(
            st.sampled_from(
                ["spec_verify_ct", "completion_tokens", "spec_accept_rate", "spec_accept_length", "gamma"]
            ),
            json_values,
            max_size=4,
        ),
    },
)


def _encode(body) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


@pytest.fixture(scope="module")
def surfaces(tmp_path_factory):
    app, client, sessions, token, engine, url = routing_test_app(
        tmp_path_factory.mktemp("fuzz"), max_prompt_chars=2000
    )
    yield client, sessions, app, token
    app.extensions["specroute.close"]()
    engine.dispose()


def _counts(sessions, app) -> tuple[int, ...]:
    app.extensions["specroute.router"].decision_log.flush()
    with sessions() as session:
        return tuple(
            session.scalar(select(func.count()).select_from(model))
            for model in (
                FeedbackEvent,
                RouteDecision,
                PromptSet,
                Prompt,
                AnalysisRun,
                ClassifierVersion,
                PolicySet,
            )
        )


def _check_api(response, allowed) -> None:
    assert response.status_code in allowed, (response.status_code, response.get_data()[:300])
    data = response.get_json()
    if response.status_code >= 400:
        assert set(data) == {"error"} and set(data["error"]) == {"code", "message", "details"}
        assert data["error"]["message"] and isinstance(data["error"]["details"], dict)


@FUZZ
@given(body=route_bodies | st.binary(max_size=200) | json_values)
def test_route_takes_any_body(surfaces, body):
    client, sessions, app, _ = surfaces
    _check_api(client.post("/v1/route", data=_encode(body), content_type="application/json"), (200, 400))


@FUZZ
@given(
    body=st.fixed_dictionaries({"requests": st.lists(route_bodies, min_size=0, max_size=5)})
    | json_values
    | st.binary(max_size=200)
)
def test_batch_takes_any_body(surfaces, body):
    client, sessions, app, _ = surfaces
    response = client.post("/v1/route/batch", data=_encode(body), content_type="application/json")
    _check_api(response, (200, 400))
    if response.status_code == 200:
        assert len(response.get_json()["decisions"]) == len(body["requests"])


@FUZZ
@given(body=feedback_bodies | json_values | st.binary(max_size=200))
def test_feedback_takes_any_body_and_writes_all_or_nothing(surfaces, body):
    client, sessions, app, _ = surfaces
    before = _counts(sessions, app)
    response = client.post("/v1/feedback", data=_encode(body), content_type="application/json")
    _check_api(response, (200, 400, 404))
    after = _counts(sessions, app)
    assert after[0] == before[0] + (1 if response.status_code == 200 else 0) and after[1:] == before[1:]


@FUZZ
@given(
    path=st.sampled_from(
        [
            "/v1/policies",
            "/v1/classifier",
            "/healthz",
            "/metrics",
            "/openapi.json",
            "/v1/route",
            "/v1/nothing",
            "/runs/1/prompts/1",
            "/prompts/x",
            "/runs/999",
            "/",
            "/runs/" + "9" * 25,
            "/runs/9223372036854775808/report.json",
            "/runs/1/prompts/" + "9" * 20,
        ]
    ),
    query=st.dictionaries(
        st.sampled_from(["page", "q", "task", "gamma", "prompts", "next"]), st.text(max_size=20), max_size=3
    ),
)
def test_gets_with_any_query(surfaces, path, query):
    client, *_ = surfaces
    response = client.get(path, query_string=query)
    assert response.status_code in (200, 302, 400, 404, 405), (path, query, response.status_code)


form_text = st.text(max_size=30) | st.sampled_from(
    ["", "0", "-1", "1", "9" * 30, "9223372036854775808", "1e9", "nan", "sample", "q"]
)


@FUZZ
@given(
    name=form_text,
    content=st.binary(max_size=300) | st.text(max_size=300).map(str.encode),
    filename=st.sampled_from(["a.txt", "a.jsonl", "a.csv", "a.bin", "", "../../etc/passwd.txt", "a.pkl"]),
)
def test_upload_form(surfaces, name, content, filename):
    client, sessions, app, token = surfaces
    before = _counts(sessions, app)
    response = client.post(
        "/prompts", data={"csrf_token": token, "name": name, "file": (io.BytesIO(content), filename)}
    )
    assert response.status_code in (200, 302, 400, 409, 413), response.status_code
    after = _counts(sessions, app)
    if response.status_code >= 400:
        assert after == before
    else:  # one whole set: every prompt the file holds (duplicates merged), and nothing else
        assert response.status_code == 302
        limits = IngestLimits.from_settings(app.config["SPECROUTE_SETTINGS"])
        parsed = parse_prompt_file(content, filename, limits=limits)
        assert len(parsed.prompts) >= 1
        assert after[2] == before[2] + 1 and after[3] == before[3] + len(parsed.prompts)
        assert after[:2] + after[4:] == before[:2] + before[4:]


@FUZZ
@given(
    fields=st.fixed_dictionaries(
        {},
        optional={
            k: form_text
            for k in (
                "prompt_set",
                "target",
                "draft",
                "max_new_tokens",
                "gamma_max",
                "temperature",
                "validate",
            )
        },
    )
)
def test_new_run_form(surfaces, fields):
    client, sessions, app, token = surfaces
    before = _counts(sessions, app)
    response = client.post("/runs", data={"csrf_token": token, **fields})
    assert response.status_code in (302, 400, 404), response.status_code
    if response.status_code >= 400:
        assert _counts(sessions, app) == before


@FUZZ
@given(
    form=st.sampled_from(
        [
            "/policies/publish",
            "/classifier/train",
            "/playground",
            "/runs/1/cancel",
            "/runs/1/resume",
            "/prompts/x/delete",
            "/policies/77/activate",
            "/classifier/77/activate",
            "/login",
            "/runs/9223372036854775808/cancel",
            "/policies/" + "9" * 22 + "/activate",
            "/logout",
        ]
    ),
    fields=st.dictionaries(
        st.sampled_from(
            [
                "analysis",
                "run_id",
                "notes",
                "prompt_sets",
                "source",
                "prompt",
                "max_new_tokens",
                "batch_size",
                "token",
                "next",
            ]
        ),
        form_text,
        max_size=4,
    ),
    with_token=st.booleans(),
)
@pytest.mark.slow
@pytest.mark.parallel
def test_other_forms(surfaces, form, fields, with_token):
    client, sessions, app, token = surfaces
    before = _counts(sessions, app)
    data = {"csrf_token": token, **fields} if with_token else fields
    response = client.post(form, data=data)
    assert response.status_code in (200, 302, 400, 401, 404, 409), (form, fields, response.status_code)
    if response.status_code >= 400:
        assert _counts(sessions, app) == before
