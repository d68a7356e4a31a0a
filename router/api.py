"""The routing API as a Flask blueprint: parse and check the JSON, call the RouterService, serialise.

Endpoints: ``POST /v1/route``, ``POST /v1/route/batch`` (up to 1,000 requests), ``POST /v1/feedback``,
``GET /v1/policies``, ``GET /v1/classifier``, ``GET /healthz``, ``GET /metrics`` (Prometheus text) and
``GET /openapi.json``. Every error, including 404/405/413 on these paths and unexpected failures, has
one shape: ``{"error": {"code", "message", "details"}}`` with a 4xx status for bad input.
"""

from __future__ import annotations

import json
import logging
import math
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Mapping

from flask import Blueprint, Flask, Response, current_app, g, jsonify, request
from werkzeug.exceptions import HTTPException
from werkzeug.http import HTTP_STATUS_CODES

from router.classifier import ClassifierError
from router.decision import RouteRequest
from router.feedback import FeedbackError
from router.openapi import MAX_BATCH, openapi_document
from router.service import RouterService

EXTENSION = "specroute.router"
API_PREFIXES = ("/v1/", "/healthz", "/metrics", "/openapi.json")
ROUTE_FIELDS = ("prompt", "messages", "max_new_tokens", "batch_size", "concurrency", "temperature")
UNAUTHORIZED = "this endpoint needs 'Authorization: Bearer <token>' (the server's SPECROUTE_API_TOKEN)"
FEEDBACK_STATUS = {"invalid_feedback": 400, "unknown_route_id": 404, "no_active_policy": 409}

bp = Blueprint("router_api", __name__)
log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error answered as ``{"error": {"code", "message", "details"}}`` with ``status``."""

    def __init__(self, status: int, code: str, message: str, **details: Any):
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details


def error_response(status: int, code: str, message: str, details: Mapping[str, Any] | None = None) -> Response:
    response = jsonify(_error_payload(code, message, details))
    response.status_code = status
    return response


def service() -> RouterService:
    return current_app.extensions[EXTENSION]


# ---------------------------------------------------------------- input checking


def _json_body() -> Any:
    return _parse_json(request.get_data(cache=False))


def _parse_json(raw: bytes) -> Any:
    if not raw:
        raise ApiError(400, "invalid_json", "the request body is empty; send a JSON object")
    try:
        return json.loads(raw)
    except UnicodeDecodeError as exc:
        raise ApiError(400, "invalid_json", f"the body is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:
        raise ApiError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None


def _object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise ApiError(400, "invalid_request", f"{where or 'the body'} must be a JSON object, got {_kind(value)}",
                       field=where or None)
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _positive_int(body: dict, key: str, where: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ApiError(400, "invalid_request", f"field '{where}{key}' must be a positive integer, got {value!r}",
                       field=where + key)
    return value


def parse_route_request(body: Any, max_chars: int, where: str = "") -> RouteRequest:
    """A RouteRequest from one JSON object; ApiError naming the field for anything wrong."""
    body = _object(body, where.rstrip("."))
    unknown = sorted(set(body) - set(ROUTE_FIELDS))
    if unknown:
        raise ApiError(400, "unknown_field", f"unknown field '{where}{unknown[0]}'; known: {', '.join(ROUTE_FIELDS)}",
                       field=where + unknown[0])
    prompt, messages = body.get("prompt"), body.get("messages")
    if (prompt is None) == (messages is None):
        raise ApiError(400, "missing_prompt" if prompt is None else "invalid_request",
                       f"give exactly one of '{where}prompt' and '{where}messages'", field=where + "prompt")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise ApiError(400, "invalid_request", f"field '{where}prompt' must be a string, got {_kind(prompt)}",
                           field=where + "prompt")
        if not prompt.strip():
            raise ApiError(400, "empty_prompt", f"field '{where}prompt' is empty", field=where + "prompt")
        length = len(prompt)
    else:
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "invalid_request", f"field '{where}messages' must be a non-empty array",
                           field=where + "messages")
        for i, message in enumerate(messages):
            if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)):
                raise ApiError(400, "invalid_request", f"field '{where}messages[{i}]' must be an object with "
                               "string 'role' and 'content'", field=f"{where}messages[{i}]")
        if not any(m["content"].strip() for m in messages):
            raise ApiError(400, "empty_prompt", f"field '{where}messages' has no content", field=where + "messages")
        length = sum(len(m["content"]) for m in messages)
    if length > max_chars:
        raise ApiError(400, "prompt_too_long", f"the prompt of '{where or 'the request'}' has {length} characters; "
                       f"the limit is {max_chars} (SPECROUTE_MAX_PROMPT_CHARS)", field=where + "prompt",
                       limit=max_chars)
    batch_size, concurrency = _positive_int(body, "batch_size", where), _positive_int(body, "concurrency", where)
    if batch_size is not None and concurrency is not None:
        raise ApiError(400, "invalid_request", f"give '{where}batch_size' or '{where}concurrency', not both",
                       field=where + "concurrency")
    temperature = body.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                    or not math.isfinite(temperature) or temperature < 0):
        raise ApiError(400, "invalid_request", f"field '{where}temperature' must be a number >= 0, got {temperature!r}",
                       field=where + "temperature")
    return RouteRequest(prompt=prompt, messages=messages, max_new_tokens=_positive_int(body, "max_new_tokens", where),
                        batch_size=batch_size if batch_size is not None else concurrency,
                        temperature=float(temperature) if temperature is not None else None)


def parse_batch(body: Any, max_chars: int) -> list[RouteRequest]:
    """The requests of a batch body ``{"requests": [...]}`` (1 to MAX_BATCH)."""
    body = _object(body, "")
    unknown = sorted(set(body) - {"requests"})
    if unknown:
        raise ApiError(400, "unknown_field", f"unknown field '{unknown[0]}'; a batch is {{\"requests\": [...]}}",
                       field=unknown[0])
    requests = body.get("requests")
    if not isinstance(requests, list) or not requests:
        raise ApiError(400, "invalid_request", "field 'requests' must be a non-empty array", field="requests")
    if len(requests) > MAX_BATCH:
        raise ApiError(400, "batch_too_large", f"a batch holds at most {MAX_BATCH} requests, got {len(requests)}",
                       field="requests", limit=MAX_BATCH)
    return [parse_route_request(r, max_chars, f"requests[{i}].") for i, r in enumerate(requests)]


# ---------------------------------------------------------------- views


def _router_errors(call):
    try:
        return call()
    except ClassifierError as exc:
        raise ApiError(503, "classifier_unavailable", str(exc)) from None


def answer_route(raw: bytes, router_service: RouterService) -> dict[str, Any]:
    """The decision for one raw /v1/route body (ApiError for anything wrong); shared by the view and
    the fast path."""
    parsed = parse_route_request(_parse_json(raw), router_service.settings.max_prompt_chars)
    return _router_errors(lambda: router_service.route([parsed]))[0].as_dict()


@bp.post("/v1/route")
def route_one():
    return jsonify(answer_route(request.get_data(cache=False), service()))


@bp.post("/v1/route/batch")
def route_batch():
    parsed = parse_batch(_json_body(), service().settings.max_prompt_chars)
    decisions = _router_errors(lambda: service().route(parsed))
    return jsonify({"decisions": [d.as_dict() for d in decisions]})


@bp.post("/v1/feedback")
def feedback():
    body = _object(_json_body(), "")
    try:
        estimate = _router_errors(lambda: service().feedback(body))
    except FeedbackError as exc:
        raise ApiError(FEEDBACK_STATUS.get(exc.code, 400), exc.code, str(exc)) from None
    return jsonify({"estimate": estimate})


@bp.get("/v1/policies")
def policies():
    return jsonify(service().policies())


@bp.get("/v1/classifier")
def classifier():
    return jsonify(service().classifier())


@bp.get("/healthz")
def healthz():
    try:
        return jsonify(service().health())
    except Exception as exc:  # any database failure means "not healthy", with the reason
        raise ApiError(503, "unhealthy", f"the database does not answer: {exc.__class__.__name__}: {exc}") from None


@bp.get("/metrics")
def metrics():
    return Response(service().metrics.render(), mimetype="text/plain; version=0.0.4")


@bp.get("/openapi.json")
def openapi():
    try:
        own = version("specroute")
    except PackageNotFoundError:
        own = "0"
    return jsonify(openapi_document(own))


# ---------------------------------------------------------------- the fast path


class RouteFastPath:
    """WSGI middleware that answers ``POST /v1/route`` without Flask's request machinery (which
    costs about as much as the decision itself: ~0.5 ms a request on this machine). The answer is
    the view's own (``answer_route``: same parsing, errors, JSON), with the app's response headers
    and the request metrics; a request with no valid Content-Length, and every other path, goes
    to Flask."""

    def __init__(self, wsgi_app, router_service: RouterService, headers: Mapping[str, str], body_limit: int):
        self.wsgi_app, self.service, self.body_limit = wsgi_app, router_service, body_limit
        self.headers = [(name, value) for name, value in headers.items()]
        self.authorize = None  # set to a check of the WSGI environ when routing needs a token

    def __call__(self, environ, start_response):
        if environ.get("PATH_INFO") != "/v1/route" or environ.get("REQUEST_METHOD") != "POST":
            return self.wsgi_app(environ, start_response)
        try:
            length = int(environ.get("CONTENT_LENGTH") or "")
        except ValueError:
            return self.wsgi_app(environ, start_response)
        if length < 0 or environ.get("HTTP_TRANSFER_ENCODING"):
            return self.wsgi_app(environ, start_response)
        started = time.perf_counter()
        extra = []
        if self.authorize is not None and not self.authorize(environ):
            status, payload = 401, _error_payload("unauthorized", UNAUTHORIZED)
            extra = [("WWW-Authenticate", 'Bearer realm="specroute"')]
        elif length > self.body_limit:
            status, payload = 413, _error_payload("body_too_large", _too_large(self.body_limit))
        else:
            try:
                status, payload = 200, answer_route(environ["wsgi.input"].read(length), self.service)
            except ApiError as exc:
                status, payload = exc.status, _error_payload(exc.code, exc.message, exc.details)
            except Exception:  # noqa: BLE001 - answered as the app answers it: 500 with the error shape, logged
                log.exception("unexpected error on POST /v1/route")
                status, payload = 500, _error_payload("internal_error", "unexpected server error; the log has the details")
        body = json.dumps(payload, separators=(",", ":")).encode() + b"\n"
        start_response(f"{status} {HTTP_STATUS_CODES[status]}",
                       [("Content-Type", "application/json"), ("Content-Length", str(len(body)))] + self.headers + extra)
        self.service.metrics.observe_request("/v1/route", "POST", status, time.perf_counter() - started)
        return [body]


def _error_payload(code: str, message: str, details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": dict(details or {})}}


def _too_large(limit: int) -> str:
    return f"the body exceeds {limit} bytes (SPECROUTE_API_MAX_BODY_BYTES)"


# ---------------------------------------------------------------- wiring


def _is_api_path() -> bool:
    return request.path.startswith(API_PREFIXES)


def init_app(app: Flask, router_service: RouterService, page_error=None,
             headers: Mapping[str, str] | None = None) -> None:
    """Register the blueprint, the error shape, request metrics and the service on ``app``, and put
    the /v1/route fast path in front of it. ``page_error(exc)`` answers HTTP errors outside the
    API's paths (the web UI's pages); ``headers`` are the headers the app adds to every response
    (the fast path adds them too)."""
    app.extensions[EXTENSION] = router_service
    app.config.setdefault("MAX_CONTENT_LENGTH", router_service.settings.api_max_body_bytes)
    api_limit = router_service.settings.api_max_body_bytes
    app.register_blueprint(bp)
    app.wsgi_app = RouteFastPath(app.wsgi_app, router_service, headers or {}, api_limit)

    @app.errorhandler(ApiError)
    def api_error(exc: ApiError):
        return error_response(exc.status, exc.code, exc.message, exc.details)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        if exc.code is not None and exc.code < 400:  # redirects (e.g. a missing trailing slash) stay redirects
            return exc
        if not _is_api_path():
            return page_error(exc) if page_error is not None else exc
        code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(exc.code, "http_error")
        message = exc.description or exc.name
        if exc.code == 413:
            message = _too_large(api_limit)
        return error_response(exc.code or 500, code, message)

    @app.errorhandler(Exception)
    def unexpected(exc: Exception):
        log.exception("unexpected error on %s %s", request.method, request.path)
        if _is_api_path():
            return error_response(500, "internal_error", "unexpected server error; the log has the details")
        return Response("Internal server error; the server log has the details.", status=500, mimetype="text/plain")

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
            router_service.metrics.observe_request(endpoint, request.method, response.status_code,
                                                   time.perf_counter() - started)
        return response
