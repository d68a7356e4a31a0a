"""The web app's JSON provider: Flask's default, but strict. ``jsonify``, ``app.json.dumps`` and the
templates' ``tojson`` all go through :func:`router.strict_json.dumps`, so an answer holding NaN or
Infinity raises :class:`router.strict_json.NonFiniteNumber` instead of writing ``NaN`` (not JSON). The
app's error handler (webui/app.py) logs it and answers 500 ``non_finite_number`` in the API's error
shape on the API's paths, an error page elsewhere.
"""

from __future__ import annotations

from typing import Any

from flask.json.provider import DefaultJSONProvider

from router import strict_json


class StrictJSONProvider(DefaultJSONProvider):
    """:class:`flask.json.provider.DefaultJSONProvider` whose ``dumps`` refuses NaN and Infinity
    (``allow_nan=False``); keys keep their order (``sort_keys = False``), as the API documents them."""

    sort_keys = False

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        kwargs.setdefault("default", self.default)
        kwargs.setdefault("ensure_ascii", self.ensure_ascii)
        kwargs.setdefault("sort_keys", self.sort_keys)
        return strict_json.dumps(obj, **kwargs)
