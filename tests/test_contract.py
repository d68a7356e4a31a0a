"""The API's typed contract: the bodies are pydantic models validated once in strict
mode, the feedback body is a discriminated union over the engines' sections, the OpenAPI document is
generated from the models, and every refusal names the field with what the schema accepts there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from router.decide.contract import (
    MAX_BATCH,
    ApiError,
    BatchTooLarge,
    Decision,
    EmptyPrompt,
    MissingPrompt,
    PromptTooLong,
    UnknownField,
    read_batch,
    read_route,
)
from router.decide.feedback_body import FEEDBACK_BODIES, UnknownFeedbackField, read_feedback
from router.decide.feedback_formats import FEEDBACK_FORMATS, FeedbackError
from router.serve.openapi import openapi_document
from router.serve.responses import Policies


def _validator(name: str) -> Draft202012Validator:
    document = openapi_document("0")
    registry = Registry().with_resource(
        "urn:openapi", Resource.from_contents(document, default_specification=DRAFT202012)
    )
    return Draft202012Validator({"$ref": f"urn:openapi#/components/schemas/{name}"}, registry=registry)


@pytest.mark.parametrize(
    "body, error, field, message",
    [
        (
            {"prompt": "x", "max_new_tokens": "3"},
            ApiError,
            "max_new_tokens",
            'an integer from 1 to 1,048,576, got "3"',
        ),
        (
            {"prompt": "x", "max_new_tokens": 1 << 21},
            ApiError,
            "max_new_tokens",
            "from 1 to 1,048,576, got 2097152",
        ),
        ({"prompt": "x", "temperature": True}, ApiError, "temperature", "must be a number >= 0, got true"),
        ({"prompt": "x", "batch_size": 0}, ApiError, "batch_size", "an integer from 1 to 65,536, got 0"),
        (
            {"prompt": "x", "top_p": 0.9},
            UnknownField,
            "top_p",
            "unknown field 'top_p'; known: prompt, messages",
        ),
        ({"messages": [{"role": "user", "content": 5}]}, ApiError, "messages[0].content", "must be a string"),
        ({"messages": [{"role": " ", "content": "x"}]}, ApiError, "messages[0].role", "a non-empty string"),
        ({"messages": [{"role": "user", "content": " "}]}, EmptyPrompt, "messages", "has no content"),
        ({}, MissingPrompt, "prompt", "give exactly one of 'prompt' and 'messages'"),
        ({"prompt": "y" * 11}, PromptTooLong, "prompt", "has 11 characters; the limit is 10"),
    ],
)
def test_a_route_body_is_refused_naming_the_field_and_what_it_takes(body, error, field, message):
    with pytest.raises(ApiError) as caught:
        read_route(body, max_prompt_chars=10)
    assert type(caught.value) is error
    assert caught.value.details["field"] == field and message in caught.value.message


def test_a_batch_names_the_request_and_is_counted_before_it_is_read():
    with pytest.raises(ApiError) as caught:
        read_batch({"requests": [{"prompt": "a"}, {"prompt": "b", "concurrency": 2, "batch_size": 2}]}, 100)
    assert caught.value.details["field"] == "requests[1].concurrency"
    assert caught.value.message == "give 'requests[1].batch_size' or 'requests[1].concurrency', not both"
    with pytest.raises(BatchTooLarge) as too_many:  # 1,001 items that are not even objects: the count first
        read_batch({"requests": [0] * (MAX_BATCH + 1)}, 100)
    assert too_many.value.details == {"field": "requests", "limit": MAX_BATCH}
    read = read_batch(
        {"requests": [{"prompt": "a", "concurrency": 4}, {"messages": [{"role": "u", "content": "b"}]}]}, 9
    )
    assert [(r.prompt, r.batch) for r in read] == [("a", 4), (None, None)]
    assert [m.model_dump() for m in read[1].messages or ()] == [{"role": "u", "content": "b"}]
    assert read[1].classified_text() == "b"


def test_the_feedback_body_is_one_variant_per_engine_section_plus_plain_counts():
    document = openapi_document("0")["components"]["schemas"]
    variants = [ref["$ref"].rsplit("/", 1)[-1] for ref in document["FeedbackBody"]["oneOf"]]
    assert variants == ["CountsFeedback", "VllmFeedback", "SglangFeedback", "LlamaServerFeedback"]
    assert list(FEEDBACK_BODIES) == ["counts", *FEEDBACK_FORMATS]
    bodies = {
        "CountsFeedback": {"task_type": "qa", "rounds": 3, "drafted": 6, "accepted": 4},
        "VllmFeedback": {"task_type": "qa", "speculative_decoding": {"acceptance_histogram": [1, 2, 1]}},
        "SglangFeedback": {
            "task_type": "qa",
            "gamma": 4,
            "meta_info": {"spec_verify_ct": 5, "completion_tokens": 12},
        },
        "LlamaServerFeedback": {
            "route_id": "r",
            "timings": {"predicted_n": 9, "draft_n": 6, "draft_n_accepted": 4},
        },
    }
    union = _validator("FeedbackBody")
    for name, body in bodies.items():
        assert union.is_valid(body), name  # exactly one variant of the documented oneOf
        assert type(read_feedback(body)).__name__ == name
    counts = {name: read_feedback(body).counts() for name, body in bodies.items()}
    assert {n: (c.engine, c.rounds, c.drafted, c.accepted) for n, c in counts.items()} == {
        "CountsFeedback": ("counts", 3, 6, 4),
        "VllmFeedback": ("vllm", 4, 8, 4),
        "SglangFeedback": ("sglang", 5, 20, 7),
        "LlamaServerFeedback": ("llama.cpp", 5, 6, 4),
    }
    # a section's other fields pass (the engine's own), but a body's own fields are only its variant's
    read_feedback({"task_type": "qa", "timings": {"predicted_n": 3, "prompt_per_second": 812.5}})
    with pytest.raises(UnknownFeedbackField, match="unknown field 'rounds'; known: route_id"):
        read_feedback({"task_type": "qa", "rounds": 1, "timings": {"predicted_n": 3}})
    assert not union.is_valid({"task_type": "qa", "rounds": 1, "timings": {"predicted_n": 3}})


@pytest.mark.parametrize(
    "body, field, message",
    [
        (
            {"task_type": "qa", "rounds": 2, "drafted": 4, "accepted": 1, "gamma": 0},
            "gamma",
            "from 1 to 1,000, got 0",
        ),
        (
            {"task_type": "qa", "rounds": "2", "drafted": 4, "accepted": 1},
            "rounds",
            "from 0 to 1,000,000,000",
        ),
        (
            {"task_type": "", "rounds": 2, "drafted": 4, "accepted": 1},
            "task_type",
            "a non-empty string of at most 64",
        ),
        (
            {"task_type": "qa", "rounds": 2, "drafted": 4, "accepted": 1, "engine": "x\n"},
            "engine",
            "printable",
        ),
        (
            {"task_type": "qa", "timings": {"predicted_n": 2, "predicted_ms": "fast"}},
            "timings.predicted_ms",
            "a number >= 0",
        ),
        (
            {"task_type": "qa", "meta_info": {"spec_verify_ct": 2, "spec_accept_rate": 1.5}},
            "meta_info.spec_accept_rate",
            "got 1.5",
        ),
    ],
)
def test_a_feedback_body_is_refused_naming_the_field(body, field, message):
    with pytest.raises(FeedbackError) as caught:
        read_feedback(body)
    assert caught.value.code == "invalid_feedback"
    assert caught.value.details["field"] == field and message in caught.value.message


def test_the_document_is_generated_from_the_models():
    schemas = openapi_document("0")["components"]["schemas"]
    route = schemas["RouteRequest"]
    assert route["additionalProperties"] is False
    assert route["properties"]["max_new_tokens"]["anyOf"][0] == {
        "maximum": 1 << 20,
        "minimum": 1,
        "type": "integer",
    }
    assert schemas["BatchRequest"]["properties"]["requests"]["maxItems"] == MAX_BATCH
    assert (
        set(schemas["Decision"]["required"]) == set(Decision.model_fields) - set()
    )  # every field is always sent
    assert schemas["Policies"]["properties"]["active"]["anyOf"][0] == {
        "$ref": "#/components/schemas/ActivePolicySet"
    }
    assert (
        "FeedbackBody" in schemas
        and "Error" in schemas
        and Policies.model_fields.keys() == {"active", "versions"}
    )


def test_the_document_is_the_one_the_docs_publish():
    """docs/openapi.json is the contract as users read it, so a change to the API shows in its diff; to accept
    one, write ``json.dumps(openapi_document("0.1.0"), indent=1)`` and a newline there."""
    published = (Path(__file__).resolve().parent.parent / "docs" / "openapi.json").read_text()
    assert json.dumps(openapi_document("0.1.0"), indent=1) + "\n" == published


def test_one_class_per_concept_the_router_returns_what_the_api_answers():
    """One Decision, one RouteRequest and one Reason in the whole router package: the in-process Router
    returns the model the API answers with (the same JSON as ``to_data``) and the client reads back."""
    import importlib
    import pkgutil

    import router
    from router.decide.decision import Router
    from router.decide.reasons import Reason
    from router.policies.policy import PolicyContract, PolicySnapshot

    found: dict[str, set[type]] = {}
    for info in pkgutil.walk_packages(router.__path__, "router."):
        module = importlib.import_module(info.name)
        for name in ("Decision", "RouteRequest", "Reason"):
            cls = vars(module).get(name)
            if isinstance(cls, type):
                found.setdefault(name, set()).add(cls)
    assert {name: len(classes) for name, classes in found.items()} == {
        "Decision": 1,
        "RouteRequest": 1,
        "Reason": 1,
    }
    policy = PolicySnapshot("*", True, 3, 0.8, 0.01, 10, 1.35, "RECOMMENDED", (1.1, 1.2, 1.35, 1.3))
    router_ = Router(None, {"*": policy}, policy_version=1, contract=PolicyContract(priced_by="transformers"))
    decision = router_.route("x", max_new_tokens=5)
    assert isinstance(decision, Decision) and all(isinstance(r, Reason) for r in decision.reason_codes)
    assert decision.codes == ["workload_policy", "short_output"] and not decision.speculate
    assert json.loads(decision.to_json()) == decision.to_data()
    assert Decision.model_validate(decision.to_data()) == decision  # what the client reads back is equal
    assert "llama-server" not in decision.to_data()["engine"]  # an engine with no terms is left out, not null


def test_an_answer_holding_nan_or_infinity_is_refused_naming_the_place():
    """The one serializer writes no NaN or Infinity (not JSON): it raises naming the number's place; the words
    inside a string are text and pass."""
    from router.decide.decision import Router
    from router.decide.reasons import reason
    from router.strict_json import NonFiniteNumber

    decision = Router(None, {}, policy_version=None).route("x")
    with pytest.raises(NonFiniteNumber, match="NaN at /expected_speedup"):
        decision.model_copy(update={"expected_speedup": float("nan")}).to_json()
    with pytest.raises(NonFiniteNumber, match="Infinity at /reason_codes/0/speedup"):
        decision.model_copy(update={"reason_codes": [reason("no_policy", speedup=float("inf"))]}).to_json()
    worded = decision.model_copy(update={"task_type": "NaN and Infinity"})
    assert json.loads(worded.to_json())["task_type"] == "NaN and Infinity"
