"""The one error model: every error a user can cause or meet is a :class:`SpecrouteError` whose class
says how each surface answers it.

- ``status``: the HTTP status the API and the web pages answer (400..599);
- ``code``: the stable, machine-readable name in the API's error shape;
- ``exit_code``: what the command line exits with (1: the command failed, message on stderr; 2 stays
  click's usage errors, 130 an interrupted analysis);
- ``details``: a mapping per instance (``field``, ``limit``, the issues of a prompt file, ...);
- ``headers``: HTTP headers the answer carries (``WWW-Authenticate`` on a 401).

Each surface has one handler that reads these: the API and the pages in the web app's error handler
(``webui/app.py``), the command line in its group (``webui/cli/base.py``). A JSON surface builds its
body with :func:`error_payload`, so the shape is ``{"error": {"code", "message", "details"}}``
everywhere.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping


def error_payload(code: str, message: str, details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of an error: ``{"error": {"code": code, "message": message, "details": {...}}}``."""
    return {"error": {"code": code, "message": message, "details": dict(details or {})}}


class SpecrouteError(Exception):
    """The base of every specroute error; subclasses set ``status``, ``code`` (and, where it differs,
    ``exit_code`` or ``headers``) on the class. ``str(exc)`` is the message a person reads."""

    status: ClassVar[int] = 400
    code: ClassVar[str] = "bad_request"
    exit_code: ClassVar[int] = 1
    headers: ClassVar[Mapping[str, str]] = {}

    def __init__(self, message: str = "", **details: Any):
        super().__init__(message)
        self.details: dict[str, Any] = details

    @property
    def message(self) -> str:
        return str(self)

    def payload(self) -> dict[str, Any]:
        """This error in the JSON error shape (see :func:`error_payload`)."""
        return error_payload(self.code, self.message, self.details)
