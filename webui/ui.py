"""The web UI blueprint and what its pages share: the session factory and settings of the app, CSRF
on every form, number formatting, and error pages that never show a stack trace. The pages are in
prompt_pages.py, run_pages.py and server_pages.py (both analyses' one report page: report_page.py),
cost_pages.py, router_pages.py and export_pages.py."""

from __future__ import annotations

import math

from flask import Blueprint, Response, current_app, redirect, render_template, request, session, url_for
from flask import flash as flask_flash
from sqlalchemy.orm import Session, sessionmaker
from werkzeug.exceptions import HTTPException
from werkzeug.http import HTTP_STATUS_CODES

from analyzer.errors import SpecrouteError
from analyzer.names import COST_MODE_WORDS
from analyzer.settings import Settings
from webui import access
from webui.security import check_csrf, csrf_token

bp = Blueprint("ui", __name__, template_folder="templates", static_folder="static", static_url_path="/static")


def sessions() -> sessionmaker[Session]:
    return current_app.extensions["specroute.sessions"]


def settings() -> Settings:
    return current_app.config["SPECROUTE_SETTINGS"]


FLASH_CHARS = 600  # a message quoting a 10 MB field would not fit the session cookie (4 kB)


def flash(message: str, category: str = "message") -> None:
    """Flask's ``flash``, with the message cut to FLASH_CHARS: messages quote what the user sent, and
    they travel in the session cookie, which a browser drops past 4 kB."""
    if len(message) > FLASH_CHARS:
        message = f"{message[: FLASH_CHARS - 30]}... ({len(message):,} characters)"
    flask_flash(message, category)


@bp.before_app_request
def _csrf():
    if request.blueprint == "ui" or (request.endpoint or "").startswith("ui."):
        check_csrf()


@bp.app_context_processor
def _globals():
    auth = bool(current_app.config.get("SPECROUTE_AUTH"))
    return {
        "csrf_token": csrf_token,
        "cost_mode_words": COST_MODE_WORDS.get,
        "auth_enabled": auth,
        "signed_in": auth and access.signed_in(settings().api_token),
    }


@bp.route("/login", methods=["GET", "POST"])
def login():
    return access.login_view(settings().api_token)


@bp.post("/logout")
def logout():
    session.pop(access.SESSION_KEY, None)
    return redirect(url_for("ui.home"))


@bp.app_template_filter("num")
def num(value, digits: int = 2) -> str:
    """A number for a table cell: fixed digits, '–' for missing or not finite."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}"


PAGE_INTERNAL_ERROR = "Internal server error; the server log has the details."


def page_error(exc: Exception):
    """An HTML error page for UI paths: the status, its name and the message, never a traceback. A
    SpecrouteError has its class's status and its message, an HTTP error its own; anything else is a
    500 that tells nothing of the failure (the app's handler logs it)."""
    if isinstance(exc, SpecrouteError):
        status, message = exc.status, exc.message
    elif isinstance(exc, HTTPException):
        status, message = exc.code or 500, exc.description or exc.name
    else:
        status, message = 500, PAGE_INTERNAL_ERROR
    try:
        return render_template(
            "error.html", code=status, name=HTTP_STATUS_CODES.get(status, "Error"), message=message
        ), status
    except Exception:  # noqa: BLE001 - the page itself failed (e.g. the database behind its header): plain text
        return Response(message, status=status, mimetype="text/plain")
