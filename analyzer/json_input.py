"""Untrusted JSON in: the one parser for every JSON document a user sends (API bodies, cost files).

``json.loads`` accepts four things specroute cannot use and that would surface as server errors
further in: arrays or objects nested past the interpreter's recursion limit (a ``RecursionError``), lone
UTF-16 surrogates from a ``\\ud800`` escape (a ``str`` that no UTF-8 or UTF-32 encoder, and no database,
takes), the same key twice in one object (which of the two values counts is left to the parser), and
numbers that are not finite (``NaN``, ``Infinity``, or ``1e400``, which overflows).
:func:`loads_untrusted` refuses all four, and bad JSON, with a :class:`JsonInputError` that names the
place: a JSON pointer, and the line and column where the text gives them.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from analyzer.errors import SpecrouteError

MAX_DEPTH = 64
"""The deepest nesting of arrays and objects accepted; no specroute document needs more than 5."""

_SURROGATES = re.compile("[\ud800-\udfff]")


class JsonInputError(SpecrouteError):
    """A JSON document specroute refuses (400 ``invalid_json``). ``details``: ``pointer`` (a JSON
    pointer to the place, None for the document as a whole) and, for a syntax error, ``line``,
    ``column`` and ``reason`` (the parser's words)."""

    status, code = 400, "invalid_json"


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


class _NotFinite(ValueError):
    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


def _no_constant(text: str) -> float:
    raise _NotFinite(text)  # NaN, Infinity, -Infinity: Python's extensions, not JSON


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e400 overflows to inf
        raise _NotFinite(text)
    return number


def _token(key: Any) -> str:
    """One reference token of a JSON pointer (RFC 6901: ``~`` is ``~0``, ``/`` is ``~1``)."""
    return str(key).replace("~", "~0").replace("/", "~1")


def _escaped(text: str) -> str:
    """``text`` with each lone surrogate written as its ``\\uXXXX`` escape (safe to print and store)."""
    return _SURROGATES.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def check_tree(value: Any, max_depth: int = MAX_DEPTH, subject: str = "the document") -> None:
    """Raise :class:`JsonInputError` when ``value`` (parsed JSON) nests deeper than ``max_depth`` or holds
    a string (a value or a key) with a lone surrogate. Iterative: any depth is walked without recursion."""
    stack: list[tuple[str, Any, int]] = [("", value, 0)]
    while stack:
        path, item, depth = stack.pop()
        if isinstance(item, str):
            found = _SURROGATES.search(item)
            if found:
                raise JsonInputError(
                    f"{subject} holds an unpaired UTF-16 surrogate (\\u{ord(found.group()):04x}) in the "
                    f"string at {_escaped(path) or 'the top level'}, which is not Unicode text; send valid UTF-8",
                    pointer=_escaped(path),
                )
            continue
        if not isinstance(item, (dict, list)):
            continue
        if depth >= max_depth:
            raise JsonInputError(
                f"{subject} nests arrays and objects deeper than {max_depth} levels (at {_escaped(path[:200])})",
                pointer=_escaped(path[:200]),
            )
        if isinstance(item, dict):
            for key, child in item.items():
                child_path = f"{path}/{_token(key)}"
                if _SURROGATES.search(key):
                    raise JsonInputError(
                        f"{subject} holds an unpaired UTF-16 surrogate in the key at {_escaped(child_path)}, "
                        "which is not Unicode text; send valid UTF-8",
                        pointer=_escaped(child_path),
                    )
                stack.append((child_path, child, depth + 1))
        else:
            stack.extend((f"{path}/{i}", child, depth + 1) for i, child in enumerate(item))


def loads_untrusted(data: str | bytes, max_depth: int = MAX_DEPTH, subject: str = "the document") -> Any:
    """The value of the JSON document ``data`` (a ``str``, or ``bytes`` in UTF-8, -16 or -32), refusing
    bad JSON, bytes that are not Unicode, nesting deeper than ``max_depth``, a key given twice in one
    object and lone surrogates, each with a :class:`JsonInputError` whose message starts with ``subject``
    and says where."""
    try:
        value = json.loads(
            data, object_pairs_hook=_unique_pairs, parse_constant=_no_constant, parse_float=_finite_float
        )
    except _NotFinite as exc:
        raise JsonInputError(
            f"{subject} holds the number {exc.text[:40]}, which is not finite (JSON has no NaN or Infinity)",
            number=exc.text[:40],
        ) from None
    except _DuplicateKey as exc:
        raise JsonInputError(
            f"{subject} gives the key {_escaped(json.dumps(exc.key))} twice in one object; send it once",
            key=_escaped(exc.key),
        ) from None
    except UnicodeDecodeError as exc:
        raise JsonInputError(f"{subject} is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise JsonInputError(
            f"{subject} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}",
            line=exc.lineno,
            column=exc.colno,
            reason=exc.msg,
        ) from None
    except RecursionError:
        raise JsonInputError(f"{subject} nests arrays and objects deeper than {max_depth} levels") from None
    except ValueError as exc:  # e.g. an integer of more digits than int() takes
        raise JsonInputError(f"{subject} is not valid JSON: {exc}") from None
    check_tree(value, max_depth, subject)
    return value
