"""Route ids: what a routing decision is called, so that feedback knows which policy set and task it
is about without looking the decision up (the decision log is written off the request path)."""

from __future__ import annotations

import re
import uuid

ROUTE_ID = re.compile(r"v(\d{1,9})-[0-9a-f]{32}-(.{1,64})", re.DOTALL)


def new_route_id(policy_version: int | None, task: str) -> str:
    """A decision's route_id, ``v<policy set version>-<32 random hex digits>-<task>`` (version 0
    before any policy set; ``task``: the task whose policy decided, "*" for the fallback), so that
    feedback knows what it is about without looking the decision up."""
    return f"v{policy_version or 0}-{uuid.uuid4().hex}-{task}"


def parse_route_id(route_id: str) -> tuple[int, str] | None:
    """(policy set version, task) of a route_id from :func:`new_route_id`; None for anything else."""
    found = ROUTE_ID.fullmatch(route_id)
    return (int(found.group(1)), found.group(2)) if found else None
