"""Strict JSON: no answer of specroute may contain NaN or Infinity (they are not JSON, and most clients
refuse them). :func:`dumps` is ``json.dumps`` with ``allow_nan=False`` that, instead of the standard
library's bare ValueError, raises :class:`NonFiniteNumber` naming where the number is. The web app's JSON
provider (webui/json_provider.py), the /v1/route fast path (router/serve/api.py) and the command line's
``--json`` output all serialise through it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from analyzer.errors import SpecrouteError


class NonFiniteNumber(SpecrouteError, ValueError):
    """An answer holds NaN or Infinity, which JSON cannot carry: a server bug, answered with a 500 that
    says so (``details.path``: a JSON pointer to the number, None where it could not be found)."""

    status, code = 500, "non_finite_number"


def _pointer_token(key: Any) -> str:
    """One reference token of a JSON pointer (RFC 6901: ``~`` is ``~0``, ``/`` is ``~1``)."""
    return str(key).replace("~", "~0").replace("/", "~1")


def non_finite_path(value: Any) -> tuple[str, float] | None:
    """The JSON pointer (``""`` is the value itself, ``/a/0`` is ``value["a"][0]``) and the number of the
    first NaN or infinite float in ``value``, looking through dicts (keys and values), lists and tuples
    (each container once: a circular one ends the walk); None if it holds none there."""
    stack: list[tuple[str, Any]] = [("", value)]
    seen: set[int] = set()
    while stack:
        path, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return path, item
        if isinstance(item, (dict, list, tuple)):
            if id(item) in seen:
                continue
            seen.add(id(item))
        if isinstance(item, dict):
            children = []
            for key, child in item.items():
                if isinstance(key, float) and not math.isfinite(key):
                    return path, key
                children.append((f"{path}/{_pointer_token(key)}", child))
            stack.extend(reversed(children))
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed([(f"{path}/{i}", child) for i, child in enumerate(item)]))
    return None


def _number_text(number: float) -> str:
    return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps(value, **kwargs)`` with ``allow_nan=False``: strict JSON, or :class:`NonFiniteNumber`
    (a ValueError) when ``value`` holds NaN or Infinity. Other errors (a circular reference, a type JSON
    has no form for) are the standard library's."""
    kwargs["allow_nan"] = False
    try:
        return json.dumps(value, **kwargs)
    except ValueError as error:
        found = non_finite_path(value)
        if found is None and "Out of range float values" not in str(error):
            raise
        # a number only a ``default`` hook produced is not found by the walk: reported without its place
        where = f"at {found[0] or 'the top level'}" if found else "somewhere"
        text = _number_text(found[1]) if found else "NaN or Infinity"
        raise NonFiniteNumber(
            f"the answer holds {text} {where}, which JSON cannot represent; this is a "
            "server bug and the server log has the details",
            path=found[0] if found else None,
        ) from error
