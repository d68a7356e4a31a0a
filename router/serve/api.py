"""The routing API as a Flask blueprint: parse and check the JSON, call the RouterService, answer its model.

Endpoints: ``POST /v1/route``, ``POST /v1/route/batch`` (up to 1,000 requests), ``POST /v1/feedback``,
the front door (``POST /v1/chat/completions``, ``POST /v1/completions``), ``GET /v1/policies``,
``GET /v1/classifier``, ``GET /healthz``, ``GET /metrics`` (Prometheus text) and ``GET /openapi.json``, each
registered from the one table of them (:data:`router.serve.openapi.ROUTES`) the document is generated from.
Each view answers a pydantic model (router/decide/contract.py's decision, router/serve/responses.py's
others), written by :func:`answer` through :meth:`Answer.to_json`, the one serializer. Every error, including
404/405/413 on these paths and unexpected failures, has one shape, :class:`Error`:
``{"error": {"code", "message", "details"}}`` with a 4xx status for bad input. The errors
are :class:`analyzer.errors.SpecrouteError` classes that carry their status and code (the API's own
are below); :func:`error_response` answers any exception in that shape, and the web app's one error
handler (webui/app.py) calls it for these paths.
"""

from __future__ import annotations

import logging
import time
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

from flask import Blueprint, Flask, Response, current_app, g, jsonify, request
from werkzeug.exceptions import HTTPException
from werkzeug.http import HTTP_STATUS_CODES

from analyzer.errors import SpecrouteError, error_payload
from analyzer.json_input import JsonInputError, loads_untrusted
from router.decide.contract import (
    MAX_NEW_TOKENS,
    Answer,
    ApiError,
    BatchResponse,
    Decision,
    InvalidJson,
    read_batch,
    read_route,
)
from router.serve.front_door import forward, pool_url, route_request, stream_timings, timings_of
from router.serve.openapi import ROUTES, openapi_document
from router.serve.responses import Error, FeedbackResponse
from router.serve.service import RouterService
from router.strict_json import NonFiniteNumber

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

EXTENSION = "specroute.router"
API_PREFIXES = ("/v1/", "/healthz", "/metrics", "/openapi.json")
UNAUTHORIZED = "this endpoint needs 'Authorization: Bearer <token>' (the server's SPECROUTE_API_TOKEN)"
INTERNAL_ERROR = "unexpected server error; the log has the details"
HTTP_ERROR_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
STREAM_TAIL_BYTES = 65536  # the end of a streamed answer kept to find its last event's timings

bp = Blueprint("router_api", __name__)
log = logging.getLogger(__name__)


class BodyTooLarge(ApiError):
    status, code = 413, "body_too_large"

    def __init__(self, limit: int):
        super().__init__(f"the body exceeds {limit} bytes (SPECROUTE_API_MAX_BODY_BYTES)")


class Unauthorized(ApiError):
    status, code = 401, "unauthorized"
    headers = {"WWW-Authenticate": 'Bearer realm="specroute"'}

    def __init__(self):
        super().__init__(UNAUTHORIZED)


class Unhealthy(ApiError):
    status, code = 503, "unhealthy"


def api_error(exc: BaseException, body_limit: int) -> tuple[int, Error, Mapping[str, str]]:
    """(status, answer, extra headers) of the API's answer to ``exc``: a SpecrouteError answers
    with its class's status and code, an HTTP error (Flask's 404, 405, 413) with its own status,
    anything else with 500 ``internal_error`` that tells nothing of the failure (the caller logs it)."""
    if isinstance(exc, HTTPException):
        if exc.code != 413:
            status = exc.code or 500
            payload = error_payload(HTTP_ERROR_CODES.get(status, "http_error"), exc.description or exc.name)
            return status, Error.model_validate(payload), {}
        exc = BodyTooLarge(body_limit)
    if isinstance(exc, SpecrouteError):
        return exc.status, Error.model_validate(exc.payload()), exc.headers
    return 500, Error.model_validate(error_payload("internal_error", INTERNAL_ERROR)), {}


def answer(model: Answer, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """The one way a view answers: ``model`` as JSON (:meth:`Answer.to_json`) with ``status``."""
    return Response(model.to_json() + b"\n", status=status, headers=headers, mimetype="application/json")


def error_response(exc: BaseException) -> Response:
    """:func:`api_error` as a Flask response (inside a request on this app)."""
    status, error, headers = api_error(exc, service().settings.api_max_body_bytes)
    return answer(error, status, headers)


def service() -> RouterService:
    """The RouterService of the current app (:func:`init_app` put it there)."""
    return current_app.extensions[EXTENSION]


# ---------------------------------------------------------------- input checking


def _json_body() -> Any:
    return _parse_json(request.get_data(cache=False))


def _parse_json(raw: bytes) -> Any:
    if not raw:
        raise InvalidJson("the request body is empty; send a JSON object")
    try:
        return loads_untrusted(raw, subject="the body")
    except JsonInputError as exc:
        raise InvalidJson(exc.message, **exc.details) from None


def _object(value: Any) -> dict:
    """A body that must be a JSON object before its model reads it (feedback, the front door's bodies)."""
    if not isinstance(value, dict):
        raise ApiError(f"the body must be a JSON object, got {_kind(value)}", field=None)
    return value


def _kind(value: Any) -> str:
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
        int: "a number",
        float: "a number",
    }.get(type(value), type(value).__name__)


# ---------------------------------------------------------------- views


def answer_route(raw: bytes, router_service: RouterService) -> Decision:
    """The decision for one raw /v1/route body (a SpecrouteError for anything wrong: ApiError for the
    body, ClassifierError when the stored classifier cannot be used); the view's, and the fast path's."""
    parsed = read_route(_parse_json(raw), router_service.settings.max_prompt_chars)
    return router_service.route([parsed])[0]


def route_one():
    """POST /v1/route: the decision for one request."""
    return answer(answer_route(request.get_data(cache=False), service()))


def route_batch():
    """POST /v1/route/batch: the decisions for a batch of requests, in order."""
    parsed = read_batch(_json_body(), service().settings.max_prompt_chars)
    return answer(BatchResponse(decisions=service().route(parsed)))


def feedback():
    """POST /v1/feedback: store one feedback event; the task's estimate right after it."""
    estimate = service().feedback(_object(_json_body()))  # FeedbackError's classes carry 400/404/409
    return answer(FeedbackResponse(estimate=estimate))


def chat_completions():
    """POST /v1/chat/completions: decide, forward to the decision's pool, answer as the pool does."""
    return _front_door("/v1/chat/completions")


def completions():
    """POST /v1/completions: decide, forward to the decision's pool, answer as the pool does."""
    return _front_door("/v1/completions")


def _front_door(path: str) -> Response:
    """Decide for an OpenAI-style completion body (its messages or prompt checked as /v1/route checks
    them), forward the body unchanged to the decision's pool, and answer with the pool's status and body,
    streamed as it comes when the body asks for a stream; the decision rides in X-Specroute-* headers, and
    the pool's timings are stored as the decision's feedback (router/serve/front_door.py)."""
    router_service = service()
    body = _object(_json_body())
    wanted = route_request(path, body)
    limit = wanted.max_new_tokens
    checked = read_route(
        {
            "prompt": wanted.prompt,
            "messages": wanted.messages,
            "max_new_tokens": min(limit, MAX_NEW_TOKENS) if limit is not None else None,
            "temperature": wanted.temperature,
        },
        router_service.settings.max_prompt_chars,
    )
    decision = router_service.route([checked])[0]
    url = pool_url(decision)
    upstream = forward(url, path, body)
    headers = {
        "X-Specroute-Route-Id": decision.route_id,
        "X-Specroute-Pool": url,
        "X-Specroute-Task": decision.task_type,
        "X-Specroute-Speculate": "true" if decision.speculate else "false",
    }
    if upstream.chunks is None:
        timings = timings_of(upstream.body or b"") if upstream.status == 200 else None
        if timings is not None:
            router_service.observe_completion(decision, timings)
        return Response(
            upstream.body, status=upstream.status, content_type=upstream.content_type, headers=headers
        )
    chunks = upstream.chunks

    def relay() -> Iterator[bytes]:
        tail = b""
        try:
            for chunk in chunks:
                yield chunk
                tail = (tail + chunk)[-STREAM_TAIL_BYTES:]
        finally:  # the client went away, or the stream ended: the pool's connection closes either way
            chunks.close()
        timings = stream_timings(tail)
        if timings is not None:
            router_service.observe_completion(decision, timings)

    return Response(relay(), status=upstream.status, content_type=upstream.content_type, headers=headers)


def policies():
    """GET /v1/policies: the active policy set, its online estimates and every version."""
    return answer(service().policies())


def classifier():
    """GET /v1/classifier: the active task classifier's version record."""
    return answer(service().classifier())


def healthz():
    """GET /healthz: liveness and what is loaded; 503 ``unhealthy`` when the database does not answer."""
    try:
        health = service().health()
    except Exception as exc:  # any database failure means "not healthy", with the reason
        raise Unhealthy(f"the database does not answer: {exc.__class__.__name__}: {exc}") from None
    return answer(health)


def metrics():
    """GET /metrics: the service's metrics in the Prometheus text format."""
    return Response(service().metrics.render(), mimetype="text/plain; version=0.0.4")


def openapi():
    """GET /openapi.json: the OpenAPI document of this API."""
    try:
        own = version("specroute")
    except PackageNotFoundError:
        own = "0"
    return jsonify(openapi_document(own))


# every view at its method and path, as the table the document is generated from declares them
VIEWS = {
    view.__name__: view
    for view in (
        route_one, route_batch, feedback, chat_completions, completions, policies, classifier, healthz, metrics,
        openapi,
    )
}  # fmt: skip
assert set(VIEWS) == {endpoint.view for endpoint in ROUTES}, "a view without its endpoint, or one missing"
for _endpoint in ROUTES:
    bp.add_url_rule(_endpoint.path, view_func=VIEWS[_endpoint.view], methods=[_endpoint.method.upper()])


# ---------------------------------------------------------------- the fast path


class RouteFastPath:
    """WSGI middleware that answers ``POST /v1/route`` without Flask's request machinery (which
    costs about as much as the decision itself: ~0.5 ms a request on this machine): an adapter over the
    view's own code (:func:`answer_route`, :func:`api_error`, :meth:`Answer.to_json`: the same parsing,
    decision, errors and JSON), with the app's response headers and the request metrics; a request with no
    valid Content-Length, and every other path, goes to Flask. ``authorize(environ) -> bool`` is the app's
    token check of a route request, the same one its request hook makes (webui/access.py); None when routing
    needs no token."""

    def __init__(
        self,
        wsgi_app: WSGIApplication,
        router_service: RouterService,
        headers: Mapping[str, str],
        body_limit: int,
        authorize: Callable[[Mapping[str, Any]], bool] | None = None,
    ):
        self.wsgi_app, self.service, self.body_limit, self.authorize = (
            wsgi_app,
            router_service,
            body_limit,
            authorize,
        )
        self.headers = [(name, value) for name, value in headers.items()]

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/v1/route" or environ.get("REQUEST_METHOD") != "POST":
            return self.wsgi_app(environ, start_response)
        try:
            length = int(environ.get("CONTENT_LENGTH") or "")
        except ValueError:
            return self.wsgi_app(environ, start_response)
        if length < 0 or environ.get("HTTP_TRANSFER_ENCODING"):
            return self.wsgi_app(environ, start_response)
        started = time.perf_counter()
        extra: Mapping[str, str] = {}
        try:
            if self.authorize is not None and not self.authorize(environ):
                raise Unauthorized()
            if length > self.body_limit:
                raise BodyTooLarge(self.body_limit)
            status, body = 200, answer_route(environ["wsgi.input"].read(length), self.service).to_json()
        except Exception as exc:  # noqa: BLE001 - answered as the app answers it (api_error), the unexpected logged
            if not isinstance(exc, SpecrouteError) or isinstance(exc, NonFiniteNumber):
                log.exception("unexpected error on POST /v1/route")
            status, error, extra = api_error(exc, self.body_limit)
            body = error.to_json()
        body += b"\n"
        start_response(
            f"{status} {HTTP_STATUS_CODES.get(status, 'Error')}",
            [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
            + self.headers
            + list(extra.items()),
        )
        self.service.metrics.observe_request("/v1/route", "POST", status, time.perf_counter() - started)
        return [body]


def answers_in_memory(router_service: RouterService) -> Callable[[str, str], bool]:
    """(method, path) -> whether this API answers the request from memory, with no database or network on the
    way: ``POST /v1/route`` while the router is loaded and not due to be checked against the database
    (:meth:`RouterService.decides_in_memory`; its decision is queued for the log, never waited on). A server
    may answer such a request on the thread that read it (webui/inline_serving.py)."""

    def quick(method: str, path: str) -> bool:
        return method == "POST" and path == "/v1/route" and router_service.decides_in_memory()

    return quick


# ---------------------------------------------------------------- wiring


def is_api_path(path: str) -> bool:
    """Whether ``path`` is the API's (its errors are JSON; the web UI's pages are HTML)."""
    return path.startswith(API_PREFIXES)


def _is_api_path() -> bool:
    return is_api_path(request.path)


def init_app(
    app: Flask,
    router_service: RouterService,
    headers: Mapping[str, str] | None = None,
    authorize: Callable[[Mapping[str, Any]], bool] | None = None,
) -> None:
    """Register the blueprint, request metrics and the service on ``app``, and put the /v1/route
    fast path in front of it. ``headers`` are the headers the app adds to every response (the fast
    path adds them too); ``authorize`` is the token check of a route request (see RouteFastPath).
    The errors are the app's to answer, once for all its paths: :func:`error_response` on the API's
    (webui/app.py does this)."""
    app.extensions[EXTENSION] = router_service
    app.config.setdefault("MAX_CONTENT_LENGTH", router_service.settings.api_max_body_bytes)
    api_limit = router_service.settings.api_max_body_bytes
    app.register_blueprint(bp)
    # Flask's documented way to add WSGI middleware is to replace the instance's wsgi_app; its stubs
    # declare wsgi_app a method (mypy refuses assigning to one), so the instance attribute is set by name
    setattr(app, "wsgi_app", RouteFastPath(app.wsgi_app, router_service, headers or {}, api_limit, authorize))

    @app.before_request
    def start_timer():
        g.specroute_started = time.perf_counter()
        if _is_api_path():
            request.max_content_length = api_limit

    @app.after_request
    def count_request(response: Response):
        started = g.get("specroute_started")
        if started is not None and _is_api_path():
            endpoint = request.url_rule.rule if request.url_rule is not None else "unmatched"
            router_service.metrics.observe_request(
                endpoint, request.method, response.status_code, time.perf_counter() - started
            )
        return response
