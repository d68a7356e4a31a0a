"""Access control with ``SPECROUTE_API_TOKEN``: when it is set, every write needs the token, and
``SPECROUTE_API_TOKEN_SCOPE`` says what else does.

What a request is:
- write: ``POST /v1/feedback`` and every web UI form (upload, delete, start or cancel an analysis,
  train, activate, publish) except the playground;
- route: ``POST /v1/route``, ``POST /v1/route/batch`` and the playground form;
- read: every other API ``GET`` (``/v1/policies``, ``/v1/classifier``, ``/metrics``, ``/openapi.json``)
  and every web page;
- open: ``GET /healthz``, the static files, and the sign-in page.

A request proves the token with ``Authorization: Bearer <token>`` (compared in constant time), or,
in the web UI, with a session signed in on ``/login`` (the session keeps a hash of the token, so
changing the token signs everybody out). Missing or wrong: the API answers 401 in its error shape
with ``WWW-Authenticate: Bearer``; a page sends the browser to the sign-in page; a form answers 401.
The token is never logged or shown. The check is :class:`Access`, made once by the app factory and
used by both the request hook and the ``POST /v1/route`` fast path (which answers before Flask).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Callable, Mapping

from flask import Flask, Response, redirect, render_template, request, session, url_for

from router.serve.api import Unauthorized, is_api_path

SESSION_KEY = "specroute_token"
OPEN_ENDPOINTS = {"static", "ui.static", "ui.login", "router_api.healthz"}
# the front door (router/serve/front_door.py) decides like /v1/route before it forwards
ROUTE_ENDPOINTS = {
    "router_api.route_one",
    "router_api.route_batch",
    "router_api.chat_completions",
    "router_api.completions",
    "ui.playground",
}


def bearer_ok(header: str | None, token: str) -> bool:
    """Whether an Authorization header carries ``token`` (constant-time comparison)."""
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer ") :].strip().encode(), token.encode())


def _fingerprint(token: str) -> str:
    return hashlib.sha256(b"specroute-session:" + token.encode()).hexdigest()


def signed_in(token: str) -> bool:
    """Whether the browser session was signed in with this token."""
    return hmac.compare_digest(str(session.get(SESSION_KEY, "")), _fingerprint(token))


def kind_of_request() -> str:
    """ "open", "route", "read" or "write" for the current request."""
    endpoint = request.endpoint or ""
    if endpoint in OPEN_ENDPOINTS:
        return "open"
    if endpoint in ROUTE_ENDPOINTS and (request.method == "POST" or endpoint.startswith("router_api.")):
        return "route"
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return "read"
    return "write"


def needs_token(kind: str, scope: str) -> bool:
    return (
        kind == "write"
        or (kind == "route" and scope in ("writes,route", "all"))
        or (kind == "read" and scope == "all")
    )


class Access:
    """The token check: whether a request of a kind ("open", "route", "read", "write") with this
    Authorization header may go on, given ``SPECROUTE_API_TOKEN`` (``token``, "" for none) and its
    scope. The request hook and the route fast path both ask :meth:`allows`."""

    def __init__(self, token: str, scope: str):
        self.token, self.scope = token, scope

    @property
    def enabled(self) -> bool:
        return bool(self.token)

    def allows(self, kind: str, authorization: str | None) -> bool:
        return not (self.token and needs_token(kind, self.scope)) or bearer_ok(authorization, self.token)

    def route_check(self) -> Callable[[Mapping[str, Any]], bool] | None:
        """The check of a route request's WSGI environ for the fast path; None when routing is open,
        so that the fast path checks nothing."""
        if self.allows("route", None):
            return None
        return lambda environ: self.allows("route", environ.get("HTTP_AUTHORIZATION"))


def init_access(app: Flask, access: Access) -> None:
    """Guard ``app``'s requests with ``access`` (nothing to do without a token); the sign-in page is
    ``ui.login``. An API request without the token raises :class:`router.serve.api.Unauthorized` (401 in
    the error shape, from the app's error handler)."""
    app.config["SPECROUTE_AUTH"] = access.enabled
    if not access.enabled:
        return

    @app.before_request
    def _check_token():
        if access.allows(kind_of_request(), request.headers.get("Authorization")):
            return None
        if is_api_path(request.path):
            raise Unauthorized()
        if signed_in(access.token):
            return None
        if request.method == "GET":
            return redirect(url_for("ui.login", next=request.full_path.rstrip("?")))
        return Response(
            render_template(
                "login.html", next="/", message="Sign in with the server's API token to do this."
            ),
            status=401,
        )


def login_view(token: str):
    """GET shows the form; POST signs the session in when the token matches (401 otherwise)."""
    target = request.values.get("next") or "/"
    if not target.startswith("/") or target.startswith("//"):
        target = "/"  # never an open redirect
    if request.method == "POST":
        sent = request.form.get("token", "")
        if token and hmac.compare_digest(sent.encode(), token.encode()):
            session[SESSION_KEY] = _fingerprint(token)
            return redirect(target)
        return render_template(
            "login.html", next=target, message="That token is not the server's API token."
        ), 401
    return render_template("login.html", next=target, message=None)
