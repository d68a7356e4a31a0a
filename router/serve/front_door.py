"""The front door: OpenAI-style ``POST /v1/chat/completions`` and ``POST /v1/completions`` on specroute's
own server. Each request is decided like ``/v1/route`` (its messages or prompt, ``max_tokens``,
``temperature``), forwarded unchanged to the pool the decision names, and the pool's answer goes back to
the client as it comes, streamed (``"stream": true``, server-sent events) or whole. Clients that speak the
OpenAI API then need no change: they point at specroute instead of at a server.

The pool's own ``timings`` (llama-server puts them in a whole answer and in the last streamed event) are
stored as a feedback event of the decision: under a policy set that adapts, through the router's feedback
(the task's estimate moves); under one that cannot (published from a llama-server analysis, whose servers
fix their settings), as the event alone. Without Flask: router/serve/api.py holds the views."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

from analyzer.errors import SpecrouteError
from router.decide.contract import Decision, RouteRequest

FORWARD_TIMEOUT_S = 600.0


class PoolNotAddressable(SpecrouteError):
    """The decision's pool is a name, not an http(s) URL the front door can forward to."""

    status, code = 503, "pool_not_addressable"


class PoolUnavailable(SpecrouteError):
    """The decision's pool did not answer (refused, reset or timed out)."""

    status, code = 502, "pool_unavailable"


class FrontDoorRequestError(SpecrouteError):
    """A completion body the front door cannot decide for; the message names the field."""

    status, code = 400, "invalid_completion_request"


def route_request(path: str, body: Any) -> RouteRequest:
    """What to decide for one completion ``body`` at ``path``: the chat ``messages`` (chat completions) or
    the ``prompt`` string (completions), ``max_tokens`` (``n_predict`` as llama-server also takes it) and
    ``temperature``. The body's other fields go to the pool untouched."""
    if not isinstance(body, dict):
        raise FrontDoorRequestError("the body must be a JSON object")
    key = "messages" if path.endswith("/chat/completions") else "prompt"
    if key not in body:
        raise FrontDoorRequestError(f"field '{key}' is missing: {path} needs it", field=key)
    name = "max_tokens" if "max_tokens" in body else "n_predict"
    limit = body.get(name)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise FrontDoorRequestError(f"field '{name}' must be a positive integer, got {limit!r}", field=name)
    if key == "messages":
        return RouteRequest.of(
            messages=body["messages"], max_new_tokens=limit, temperature=body.get("temperature")
        )
    return RouteRequest.of(body["prompt"], max_new_tokens=limit, temperature=body.get("temperature"))


def pool_url(decision: Decision) -> str:
    """The decision's pool as a URL to forward to; PoolNotAddressable when it is only a name."""
    pool = decision.engine.pool
    parsed = urllib.parse.urlsplit(pool)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise PoolNotAddressable(
            f"the decision's pool {pool!r} is a name, not a URL: publish the policy set with SPECROUTE_ROUTER_POOLS "
            "naming each pool's URL (a set from a llama-server analysis gets http://127.0.0.1:<port> by default)",
            pool=pool,
        )
    return pool.rstrip("/")


@dataclass
class Upstream:
    """The pool's answer: its status, content type, and the body whole or as chunks (a stream)."""

    status: int
    content_type: str
    body: bytes | None
    chunks: Generator[bytes, None, None] | None


def forward(url: str, path: str, body: Mapping[str, Any], timeout_s: float = FORWARD_TIMEOUT_S) -> Upstream:
    """POST ``body`` to ``url + path``; a streamed answer comes back as an iterator of its chunks (which
    closes the connection when exhausted or closed). PoolUnavailable when the pool does not answer."""
    parsed = urllib.parse.urlsplit(url)
    connection_class = http.client.HTTPSConnection if parsed.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parsed.hostname or "", parsed.port, timeout=timeout_s)
    try:
        connection.request(
            "POST",
            (parsed.path or "") + path,
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        response = connection.getresponse()
    except (OSError, http.client.HTTPException) as exc:
        connection.close()
        raise PoolUnavailable(f"the pool at {url} did not answer: {exc}", pool=url) from None
    content_type = response.getheader("Content-Type", "application/json")
    if body.get("stream") and response.status == 200:
        return Upstream(response.status, content_type, None, _chunks(connection, response))
    try:
        data = response.read()
    finally:
        connection.close()
    return Upstream(response.status, content_type, data, None)


def _chunks(
    connection: http.client.HTTPConnection, response: http.client.HTTPResponse
) -> Generator[bytes, None, None]:
    try:
        while chunk := response.read1(65536):
            yield chunk
    finally:
        connection.close()


def timings_of(body: bytes) -> dict[str, Any] | None:
    """The ``timings`` object of a whole JSON answer (None without one)."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    timings = payload.get("timings") if isinstance(payload, dict) else None
    return timings if isinstance(timings, dict) else None


def stream_timings(events: bytes) -> dict[str, Any] | None:
    """The ``timings`` of the last server-sent event that carries them (None when none does)."""
    found = None
    for line in events.split(b"\n"):
        line = line.strip()
        if line.startswith(b"data:") and b'"timings"' in line:
            found = timings_of(line[5:].strip()) or found
    return found


def feedback_of(
    decision: Decision, timings: Mapping[str, Any], settings: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    """The feedback payload of a pool's ``timings`` (a plain server leaves the draft counts out: 0), or
    None when they lack the output count. ``settings``: a llama-server set's pools by setting ("off" and each
    setting's label -> URL); the payload then names the setting of the pool that served."""
    produced = timings.get("predicted_n")
    if isinstance(produced, bool) or not isinstance(produced, int):
        return None
    counts: dict[str, float] = {
        "draft_n": int(timings.get("draft_n", 0)),
        "draft_n_accepted": int(timings.get("draft_n_accepted", 0)),
        "predicted_n": produced,
    }
    for name in ("predicted_ms", "prompt_n", "cache_n"):  # price the request against plain decoding
        value = timings.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            counts[name] = value
    payload: dict[str, Any] = {"route_id": decision.route_id, "timings": counts}
    served = next((key for key, url in (settings or {}).items() if url == decision.engine.pool), None)
    if served is not None:
        payload["setting"] = served  # the pool's setting ("off": the plain pool)
    return payload
