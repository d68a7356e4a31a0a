"""The OpenAPI 3.1 document of the routing API, served at ``/openapi.json``. Its schemas are generated
from the pydantic models the API validates its bodies with (router/decide/contract.py,
router/decide/feedback_body.py) and builds its answers by (router/serve/responses.py), so the document
cannot drift from what the server accepts; the tests validate every real answer against it, and
schemathesis fuzzes the server from it."""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from router.decide.contract import MAX_BATCH, BatchRequest, RouteRequest
from router.decide.feedback_body import FeedbackBody
from router.serve.responses import (
    BatchResponse,
    Classifier,
    Decision,
    Error,
    FeedbackResponse,
    Health,
    Policies,
)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    meaning = {
        400: "Bad input: malformed JSON, a wrong type, a missing or unknown field.",
        404: "Unknown route_id.",
        409: "Nothing to apply feedback to: no active policy set, or one without a cost to adapt with "
        "(policy_not_adaptive: a run's set without a cost profile, or a llama-server set published before such "
        "sets took feedback).",
        413: "The body exceeds SPECROUTE_API_MAX_BODY_BYTES.",
        502: "The decision's pool did not answer (pool_unavailable).",
        503: "The database or the stored classifier cannot be used; for the front door also a decision whose "
        "pool is a name, not a URL (pool_not_addressable).",
    }
    return {str(s): _json(_ref("Error"), meaning[s]) for s in statuses}


# the document's schemas, generated from the models the API validates its bodies with and builds its answers by
REQUESTS: tuple[type[BaseModel], ...] = (RouteRequest, BatchRequest, FeedbackBody)
ANSWERS: tuple[type[BaseModel], ...] = (
    Decision,
    BatchResponse,
    FeedbackResponse,
    Policies,
    Classifier,
    Health,
    Error,
)


@functools.cache
def schemas() -> dict[str, Any]:
    """The components' schemas by name: the request models' in validation mode, the answers' in
    serialization mode (JSON Schema 2020-12, as OpenAPI 3.1 takes it)."""
    _, document = models_json_schema(
        [(model, "validation") for model in REQUESTS] + [(model, "serialization") for model in ANSWERS],
        ref_template="#/components/schemas/{model}",
    )
    return document["$defs"]


def openapi_document(version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the API (``version`` is specroute's)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "specroute routing API",
            "version": version,
            "description": "Ask before each generation whether to speculate and with which gamma; "
            "send back what the engine saw. Every error has the Error shape.",
        },
        "paths": _api_paths() | _document_paths(),
        "components": {"schemas": schemas()},
    }


def _post(summary: str, request: str, response: str, *errors: int) -> dict[str, Any]:
    """A POST operation with a required JSON ``request`` body, a JSON ``response`` and its ``errors``."""
    return {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
        "responses": {"200": _json(_ref(response), "OK"), **_errors(*errors)},
    }


def _get(summary: str, response: str, *errors: int) -> dict[str, Any]:
    """A GET operation with a JSON ``response`` and its ``errors``."""
    return {
        "summary": summary,
        "responses": {"200": _json(_ref(response), "OK"), **_errors(*errors)},
    }


def _api_paths() -> dict[str, Any]:
    """The JSON endpoints: routing, feedback, policies, classifier and health."""
    return {
        "/v1/route": {"post": _post("Decide for one request", "RouteRequest", "Decision", 400, 413, 503)},
        "/v1/route/batch": {
            "post": _post(
                f"Decide for up to {MAX_BATCH} requests", "BatchRequest", "BatchResponse", 400, 413, 503
            )
        },
        "/v1/feedback": {
            "post": _post(
                "Report what the engine saw for one generation",
                "FeedbackBody",
                "FeedbackResponse",
                400,
                404,
                409,
                413,
                503,
            )
        },
        "/v1/policies": {
            "get": _get("The active policy set, its online estimates and every version", "Policies", 503)
        },
        "/v1/classifier": {"get": _get("The active task classifier's version record", "Classifier", 503)},
        "/healthz": {"get": _get("Liveness and what is loaded", "Health", 503)},
    }


def _front_door(summary: str, field: str) -> dict[str, Any]:
    """A front-door operation (router/serve/front_door.py): an OpenAI-style body with ``field``, answered by the
    pool the decision names, whole or as server-sent events."""
    return {
        "summary": summary,
        "description": f"Decides for the body's {field} as /v1/route does (max_tokens, temperature), forwards the "
        "body unchanged to the decision's pool and answers with the pool's status and body (text/event-stream "
        "when the body asks for a stream). Headers X-Specroute-Route-Id, X-Specroute-Pool, X-Specroute-Task and "
        "X-Specroute-Speculate carry the decision; the pool's timings are stored as its feedback.",
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object", "required": [field]}}},
        },
        "responses": {
            "200": {
                "description": "The pool's answer",
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            **_errors(400, 413, 502, 503),
        },
    }


def _document_paths() -> dict[str, Any]:
    """The endpoints that answer a document of their own: this one, the Prometheus metrics, and the front
    door's pools' answers."""
    return {
        "/v1/chat/completions": {"post": _front_door("Chat completion through the decided pool", "messages")},
        "/v1/completions": {"post": _front_door("Completion through the decided pool", "prompt")},
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {
                        "description": "Prometheus text format 0.0.4",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }
