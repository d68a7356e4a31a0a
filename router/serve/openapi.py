"""The routing API's endpoints (:data:`ROUTES`) and its OpenAPI 3.1 document, served at ``/openapi.json``.

:data:`ROUTES` is the one table of the endpoints: router/serve/api.py registers each view at its method and path
from it, and the document's paths, request and answer schemas and error statuses are generated from it, so a
path or a status cannot be declared twice. The schemas are generated from the pydantic models the API validates
its bodies with (router/decide/contract.py, router/decide/feedback_body.py) and answers with (the decision's in
router/decide/contract.py, the others' in router/serve/responses.py), so the document cannot drift from what
the server accepts or answers; the tests validate every real answer against it, and schemathesis fuzzes the
server from it. One function over the table, not a Flask
OpenAPI library: the table is a dozen lines, and the /v1/route fast path in front of Flask (router/serve/api.py)
answers by the same view code and models, which such a library would not see."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from router.decide.contract import MAX_BATCH, BatchRequest, BatchResponse, Decision, RouteRequest
from router.decide.feedback_body import FeedbackBody
from router.serve.responses import Classifier, Error, FeedbackResponse, Health, Policies


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
        "paths": paths(),
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


def _own_document(summary: str, description: str, media: str, kind: str) -> Callable[[], dict[str, Any]]:
    """A GET operation answering a document of its own (``media``, a JSON Schema ``kind``): this document, the
    Prometheus text."""
    return lambda: {
        "summary": summary,
        "responses": {"200": {"description": description, "content": {media: {"schema": {"type": kind}}}}},
    }


@dataclass(frozen=True)
class Endpoint:
    """One endpoint: the view router/serve/api.py registers (by its function's name) at ``method`` and ``path``,
    and what the document says of it: ``summary``, the request model (``body``), the answer's (``answer``) and
    the error statuses (``errors``); or, for an endpoint that answers a document of its own (the front door's
    pools, the metrics, this document), its whole operation (``operation``)."""

    view: str
    method: str
    path: str
    summary: str = ""
    body: type[BaseModel] | None = None
    answer: type[BaseModel] | None = None
    errors: tuple[int, ...] = ()
    operation: Callable[[], dict[str, Any]] | None = None

    def document(self) -> dict[str, Any]:
        """This endpoint's OpenAPI operation."""
        if self.operation is not None:
            return self.operation()
        assert self.answer is not None  # an endpoint without its own operation answers a model
        if self.body is None:
            return _get(self.summary, self.answer.__name__, *self.errors)
        return _post(self.summary, self.body.__name__, self.answer.__name__, *self.errors)


ROUTES: tuple[Endpoint, ...] = (
    Endpoint("route_one", "post", "/v1/route", "Decide for one request", RouteRequest, Decision, (400, 413, 503)),
    Endpoint(
        "route_batch", "post", "/v1/route/batch", f"Decide for up to {MAX_BATCH} requests", BatchRequest,
        BatchResponse, (400, 413, 503),
    ),
    Endpoint(
        "feedback", "post", "/v1/feedback", "Report what the engine saw for one generation", FeedbackBody,
        FeedbackResponse, (400, 404, 409, 413, 503),
    ),
    Endpoint(
        "policies", "get", "/v1/policies", "The active policy set, its online estimates and every version",
        answer=Policies, errors=(503,),
    ),
    Endpoint(
        "classifier", "get", "/v1/classifier", "The active task classifier's version record", answer=Classifier,
        errors=(503,),
    ),
    Endpoint("healthz", "get", "/healthz", "Liveness and what is loaded", answer=Health, errors=(503,)),
    Endpoint(
        "chat_completions", "post", "/v1/chat/completions",
        operation=functools.partial(_front_door, "Chat completion through the decided pool", "messages"),
    ),
    Endpoint(
        "completions", "post", "/v1/completions",
        operation=functools.partial(_front_door, "Completion through the decided pool", "prompt"),
    ),
    Endpoint(
        "openapi", "get", "/openapi.json",
        operation=_own_document("This document", "OpenAPI 3.1", "application/json", "object"),
    ),
    Endpoint(
        "metrics", "get", "/metrics",
        operation=_own_document("Prometheus metrics", "Prometheus text format 0.0.4", "text/plain", "string"),
    ),
)  # fmt: skip


def paths() -> dict[str, Any]:
    """The document's paths, each endpoint of :data:`ROUTES` at its path and method."""
    found: dict[str, Any] = {}
    for endpoint in ROUTES:
        found.setdefault(endpoint.path, {})[endpoint.method] = endpoint.document()
    return found
