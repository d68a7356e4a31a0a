"""Route ids: what a routing decision is called, so that feedback knows which policy set and task it
is about without looking the decision up (the decision log is written off the request path).

A route id is ``v<policy set version>-<16 random hex digits><16 hex digits of MAC>-<task>``: the MAC is
an HMAC-SHA256 over the version, the random part and the task, keyed with the server's secret key
(SPECROUTE_SECRET_KEY, or the key generated once in the data folder, which every process and replica
on that folder or with that setting shares). Feedback whose route id does not verify is refused
(404 ``unknown_route_id``), so a well-formed but made-up route id cannot move the estimates. Without a
key (tests, a library user), each process has a random one: its ids verify only within it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

ROUTE_ID = re.compile(r"v(\d{1,9})-([0-9a-f]{16})([0-9a-f]{16})-(.{1,64})", re.DOTALL)
PROCESS_KEY = secrets.token_bytes(32)  # the key when none is given


def route_key(secret: str | bytes | None) -> bytes:
    """The MAC key for a server secret (a str is UTF-8 encoded); PROCESS_KEY for none."""
    if not secret:
        return PROCESS_KEY
    return secret.encode("utf-8") if isinstance(secret, str) else secret


def _mac(key: bytes, version: int, nonce: str, task: str) -> str:
    message = f"v{version}-{nonce}-{task}".encode("utf-8")
    return hmac.new(key, message, hashlib.sha256).hexdigest()[:16]


def new_route_id(policy_version: int | None, task: str, key: bytes = PROCESS_KEY) -> str:
    """A decision's route_id (version 0 before any policy set; ``task``: the task whose policy decided,
    "*" for the fallback), signed with ``key``."""
    version, nonce = policy_version or 0, secrets.token_hex(8)
    return f"v{version}-{nonce}{_mac(key, version, nonce, task)}-{task}"


def parse_route_id(route_id: str, key: bytes = PROCESS_KEY) -> tuple[int, str] | None:
    """(policy set version, task) of a route_id that :func:`new_route_id` made with ``key``; None for
    anything else, a forged or altered one included."""
    found = ROUTE_ID.fullmatch(route_id)
    if found is None:
        return None
    version, nonce, mac, task = int(found.group(1)), found.group(2), found.group(3), found.group(4)
    return (version, task) if hmac.compare_digest(mac, _mac(key, version, nonce, task)) else None
