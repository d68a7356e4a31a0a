"""The web UI's secret key and CSRF protection.

The key signs Flask's session cookie, which carries the CSRF token. It comes from
``SPECROUTE_SECRET_KEY`` or, when that is empty, from ``<data_dir>/secret_key`` (generated once,
mode 0600). A key shorter than 32 characters or a well-known placeholder is refused unless the app
is created for tests. Every form of the UI posts the session's token; a POST without the right one is
refused with 400 before the view runs. The JSON API (/v1/...) uses no cookies and is not subject to it.
"""

from __future__ import annotations

import hmac
import os
import secrets
import tempfile
from pathlib import Path

from flask import abort, request, session

from analyzer.settings import Settings, SettingsError

WELL_KNOWN_KEYS = {"dev", "development", "secret", "change-me", "changeme", "default", "test", "specroute"}
MIN_KEY_CHARS = 32
CSRF_FIELD = "csrf_token"


def resolve_secret_key(settings: Settings, *, testing: bool = False) -> str:
    """The key in force (see the module docstring); SettingsError for a weak key outside tests."""
    key = settings.secret_key
    if key:
        weak = key.strip().lower() in WELL_KNOWN_KEYS or len(key) < MIN_KEY_CHARS
        if weak and not testing:
            raise SettingsError(
                f"SPECROUTE_SECRET_KEY is too weak (well-known or shorter than {MIN_KEY_CHARS} "
                "characters); set a long random value, or leave it empty to have one generated"
            )
        return key
    path = Path(settings.resolved_data_dir()) / "secret_key"
    if path.is_file():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_hex(32)
    # written whole under another name, then linked into place: processes starting together on one
    # data folder (server replicas, gunicorn workers) never read a half-written key, and all keep the
    # first one linked
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".secret_key.")
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(key)
        os.link(temporary, path)
    except FileExistsError:
        return path.read_text().strip()
    finally:
        os.unlink(temporary)
    return key


def csrf_token() -> str:
    """The session's CSRF token (created on first use); templates put it in every form."""
    token = session.get(CSRF_FIELD)
    if not token:
        token = session[CSRF_FIELD] = secrets.token_urlsafe(32)
    return token


def check_csrf() -> None:
    """Abort with 400 unless a state-changing request carries the session's token."""
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return
    sent = request.form.get(CSRF_FIELD) or request.headers.get("X-CSRF-Token") or ""
    expected = session.get(CSRF_FIELD) or ""
    if not expected or not hmac.compare_digest(str(sent), str(expected)):
        abort(
            400,
            description="the form has expired or did not come from this site (CSRF check); "
            "reload the page and try again",
        )
