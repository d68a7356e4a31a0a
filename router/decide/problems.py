"""One error from pydantic's: the first thing wrong in a body, as a :class:`analyzer.errors.SpecrouteError`
whose message and ``details.field`` name the field by its path (``requests[1].max_new_tokens``) and say, from
the model's own JSON schema, what the field accepts. The API's body models (router/decide/contract.py,
router/decide/feedback_body.py) raise their own rules' failures with :func:`rule_broken`."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Collection

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

from analyzer.errors import SpecrouteError


def value_refused(accepts: str) -> PydanticCustomError:
    """A value a field's own check refuses, for :func:`problem_of`: ``accepts`` says what the field takes
    ("printable text of at most 32 characters")."""
    return PydanticCustomError("value_refused", "{accepts}", {"accepts": accepts})


def rule_broken(code: str, message: str, at: str, **details: Any) -> PydanticCustomError:
    """A failed check of a model's own rule, for :func:`problem_of`: ``code`` is the error's code,
    ``message`` a sentence in which ``{prefix}`` stands for the path of the object checked (``requests[2].``)
    and ``{request}`` for that path itself, ``at`` the field the problem is in, relative to that object."""
    return PydanticCustomError(code, message, {"at": at, **details})


@dataclass(frozen=True)
class _Located:
    """An error's field path (``requests[1].max_new_tokens``), the JSON schema of the field there (None
    where the schema has no such field) and of the object it is in."""

    path: str
    schema: dict[str, Any] | None
    parent: dict[str, Any] | None
    defs: dict[str, Any]


def _resolved(schema: dict[str, Any] | None, defs: dict[str, Any]) -> dict[str, Any] | None:
    """``schema`` with its $ref followed and a nullable anyOf reduced to its other branch."""
    while schema is not None:
        if "$ref" in schema:
            schema = defs.get(schema["$ref"].rsplit("/", 1)[-1])
        elif "anyOf" in schema:
            branches = [b for b in schema["anyOf"] if b.get("type") != "null"]
            schema = branches[0] if len(branches) == 1 else schema
            if len(branches) != 1:
                return schema
        else:
            return schema
    return None


@functools.lru_cache(maxsize=32)
def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


def _located(loc: tuple[Any, ...], model: type[BaseModel]) -> _Located:
    """Where ``loc`` (pydantic's, a union's tag left out) points in ``model``'s schema."""
    root = _schema(model)
    defs = root.get("$defs", {})
    schema: dict[str, Any] | None = root
    parent: dict[str, Any] | None = None
    path = ""
    for part in loc:
        parent = _resolved(schema, defs)
        if isinstance(part, int):
            path += f"[{part}]"
            schema = parent.get("items") if parent else None
        else:
            path += f".{part}" if path else str(part)
            schema = (parent or {}).get("properties", {}).get(part)
    return _Located(path, _resolved(schema, defs), parent, defs)


def _described(schema: dict[str, Any] | None, defs: dict[str, Any]) -> str:
    """What a field of ``schema`` accepts, in words: "an integer from 0 to 1,000,000,000" (``defs``: the
    schemas its references name)."""
    schema = _resolved(schema, defs) or {}
    kind, low, high = schema.get("type"), schema.get("minimum"), schema.get("maximum")
    if kind == "integer" and low is not None:
        return f"an integer from {low:,} to {high:,}" if high is not None else f"an integer >= {low:,}"
    if kind == "number" and low is not None:
        return f"a number >= {low}"
    if kind == "string":
        text = "a non-empty string" if schema.get("minLength") else "a string"
        most = schema.get("maxLength")
        return f"{text} of at most {most} characters" if most else text
    if kind == "array":
        items = _described(schema.get("items"), defs)
        for one, many in (("an integer", "integers"), ("an object", "objects"), ("a string", "strings")):
            items = items.replace(one, many, 1) if items.startswith(one) else items
        return f"{'a non-empty list' if schema.get('minItems') else 'a list'} of {items}"
    kinds = {"integer": "an integer", "number": "a number", "object": "an object", "boolean": "true or false"}
    return kinds.get(str(kind), "something else")


def _shown(value: Any) -> str:
    """A value in an error message: a short JSON text, or its kind for an object or array."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else f"{text[:37]}..."


TYPE_ERRORS = frozenset({"model_type", "dict_type", "model_attributes_type"})


def problem_of(
    exc: ValidationError,
    model: type[BaseModel],
    errors: dict[str, type[SpecrouteError]],
    default: type[SpecrouteError],
    tags: Collection[str] = (),
) -> SpecrouteError:
    """The first thing wrong in ``exc`` (an unknown field before anything else) as one error of
    ``errors`` (by code; ``default`` for the others), whose message and ``details.field`` name the field
    by its path in ``model``'s body (``tags``: a discriminated union's, left out of the path)."""
    found = exc.errors(include_url=False)
    first = next((e for e in found if e["type"] == "extra_forbidden"), found[0])
    loc = tuple(part for index, part in enumerate(first["loc"]) if not (index == 0 and part in tags))
    kind, context = first["type"], first.get("ctx") or {}
    if "at" in context:  # a model's own rule: the error's loc is the object it checked
        where = _located(loc, model)
        prefix = f"{where.path}." if where.path else ""
        field = prefix + context["at"] if context["at"] else where.path
        message = first["msg"].replace("{prefix}", prefix).replace("{request}", where.path or "the request")
        details = {"field": field or None} | ({"limit": context["limit"]} if "limit" in context else {})
        return errors.get(kind, default)(message, **details)
    where = _located(loc, model)
    field = where.path
    if kind == "extra_forbidden":
        known = ", ".join((where.parent or {}).get("properties", {}))
        return errors.get("unknown_field", default)(f"unknown field '{field}'; known: {known}", field=field)
    if kind == "missing":
        return default(f"field '{field}' is missing", field=field)
    accepted = context.get("accepts") or (
        "an object" if kind in TYPE_ERRORS else _described(where.schema, where.defs)
    )
    subject = f"field '{field}'" if field else "the body"
    message = f"{subject} must be {accepted}, got {_shown(first.get('input'))}"
    limit = (where.schema or {}).get("maximum", (where.schema or {}).get("maxLength"))
    return default(message, field=field or None, **({"limit": limit} if limit is not None else {}))
