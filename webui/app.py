"""The Flask application factory: the routing API (router/serve/api.py) and, beside it, the web UI.

``create_app(config=None)`` reads the settings (declared defaults, then ``SPECROUTE_*`` variables,
then ``config``), refuses to start on a database whose schema is not at head, and keeps the routing
service in ``app.extensions``. No app exists at import time.

Errors are answered in one place, :func:`handle_error`, for every path: the API's in its JSON error
shape, the pages with an error page; authentication is one :class:`webui.access.Access`, shared by
the request hook and the route fast path.
"""

from __future__ import annotations

import atexit
import logging
from typing import Any, Mapping

from flask import Flask, render_template, request
from werkzeug.exceptions import HTTPException
from werkzeug.routing import IntegerConverter

import migrations
from analyzer.analysis.worker import Worker
from analyzer.db import MAX_ID, engine_from_settings, make_session_factory
from analyzer.errors import SpecrouteError
from analyzer.settings import api_token_scope, load_settings
from router.serve import api
from router.serve.jobs import run_next_job
from router.serve.service import RouterService
from router.strict_json import NonFiniteNumber
from webui import access, cost_pages, prompt_pages, router_pages, run_pages, server_pages, ui
from webui.background import BackgroundJobs
from webui.json_provider import StrictJSONProvider
from webui.security import resolve_secret_key

PAGE_MODULES = (
    prompt_pages,
    run_pages,
    router_pages,
    cost_pages,
    server_pages,
)  # importing them registers their views on ui.bp
log = logging.getLogger(__name__)


def create_app(config: Mapping[str, Any] | None = None, *, check_schema: bool = True) -> Flask:
    """A configured app. ``config`` holds setting names (see ``specroute settings``); Flask's own
    keys (upper case, e.g. ``TESTING``) are passed to ``app.config``."""
    config = dict(config or {})
    flask_keys = {k: config.pop(k) for k in list(config) if k.isupper() and not k.startswith("SPECROUTE_")}
    settings = load_settings(config)
    engine = engine_from_settings(settings)
    if check_schema:
        migrations.require_head(engine)
    app = Flask(__name__)
    app.url_map.converters["int"] = _DatabaseId  # before any blueprint adds a rule
    app.config.update(flask_keys)
    app.config["SPECROUTE_SETTINGS"] = settings
    app.config["SECRET_KEY"] = resolve_secret_key(settings, testing=bool(app.config.get("TESTING")))
    app.config["MAX_CONTENT_LENGTH"] = max(settings.api_max_body_bytes, settings.max_upload_bytes + 1_000_000)
    app.config["SESSION_COOKIE_SAMESITE"] = "Lax"
    app.json = StrictJSONProvider(app)  # no NaN or Infinity in any answer: raises NonFiniteNumber, a 500
    sessions = make_session_factory(engine)
    router_service = RouterService(settings, sessions, secret_key=app.config["SECRET_KEY"])
    app.extensions["specroute.engine"] = engine
    app.extensions["specroute.sessions"] = sessions
    rules = access.Access(settings.api_token, api_token_scope(settings))
    app.extensions["specroute.access"] = rules
    api.init_app(app, router_service, headers=SECURITY_HEADERS, authorize=rules.route_check())
    app.register_blueprint(ui.bp)
    access.init_access(app, rules)
    app.register_error_handler(Exception, handle_error)
    jobs = BackgroundJobs(sessions, stale_after_s=settings.stale_after_s)
    app.extensions["specroute.jobs"] = jobs
    worker = _start_worker(settings, sessions, jobs, router_service) if settings.ui_worker else None
    app.extensions["specroute.worker"] = worker
    app.after_request(_security_headers)

    closed: list[bool] = []

    def close() -> None:
        if not closed:
            closed.append(True)
            jobs.closing.set()  # a background job the worker thread runs stops at its next progress line too
            if worker is not None:
                worker.stop()
            jobs.close()
            router_service.close()
            engine.dispose()

    app.extensions["specroute.close"] = close
    atexit.register(close)
    return app


def _start_worker(settings, sessions, jobs: BackgroundJobs, router_service: RouterService) -> Worker:
    """The server's worker thread: queued runs, analyses in
    llama-server, and the background jobs a server left queued (a finished training reloads the router)."""
    return Worker(
        sessions,
        cache_dir=settings.resolved_data_dir() / "cache",
        allow_network=settings.allow_downloads,
        stale_after_s=settings.stale_after_s,
        also=lambda worker_id: run_next_job(
            sessions,
            worker_id,
            stale_after_s=settings.stale_after_s,
            closing=jobs.closing,
            on_done=lambda kind: router_service.reload(),
        ),  # fmt: skip
    ).start()


class _DatabaseId(IntegerConverter):
    """``<int:...>`` in URLs: 0 to MAX_ID; a larger number is a 404, not a database overflow."""

    def __init__(self, url_map, *args, **kwargs):
        kwargs.setdefault("max", MAX_ID)
        super().__init__(url_map, *args, **kwargs)


SECURITY_HEADERS = {
    # no inline script anywhere: the pages' JavaScript is static/app.js
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}


def _security_headers(response):
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def handle_error(exc: Exception):
    """The app's one error handler: every exception a view, a hook or Flask raises. On the API's
    paths the JSON error shape (router.serve.api.error_response), elsewhere an error page (ui.page_error);
    the status is a SpecrouteError's class status, an HTTP error's own, or 500 for anything else
    (logged here, never shown). A NaN or Infinity in an answer (the JSON provider's NonFiniteNumber)
    is logged too and answered 500 naming it. Views hold their database sessions in ``with`` blocks,
    so an exception has rolled back and closed them before it gets here."""
    if isinstance(exc, HTTPException) and (exc.code is None or exc.code < 400):
        return exc  # redirects (e.g. a missing trailing slash) stay redirects
    if not isinstance(exc, (SpecrouteError, HTTPException)) or isinstance(exc, NonFiniteNumber):
        log.error("unexpected error on %s %s", request.method, request.path, exc_info=exc)
    if api.is_api_path(request.path):
        return api.error_response(exc)
    if isinstance(exc, HTTPException) and exc.code == 413 and request.path == "/prompts":
        limit = ui.settings().max_upload_bytes
        return render_template(
            "error.html",
            code=413,
            name="File too large",
            message=f"The file is larger than the {limit:,} bytes this server accepts "
            "(SPECROUTE_MAX_UPLOAD_BYTES). Split it into smaller files.",
        ), 413
    return ui.page_error(exc)
