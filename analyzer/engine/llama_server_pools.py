"""The llama-server pools a policy set routes to: one server per distinct drafter setting plus a plain one
(router/policies/server_policy.py plans them from a set), their command lines, and starting them on this machine.

A pool's URL says where it serves. ``specroute pools start`` runs the pools whose URL is on this machine
(``http://127.0.0.1:<port>`` or ``http://localhost:<port>``) and names the others, which run elsewhere
with the command line ``specroute pools plan`` prints for them."""

from __future__ import annotations

import shlex
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from analyzer.engine.llama_server_process import LlamaServerProcess, server_command
from analyzer.measuring.server_drafting import parse_drafter

LOCAL_HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class Pool:
    """One pool: its key ("off" or a drafter setting's label), where it serves (the policy set's value for
    the key), its llama-server flags (``-md`` with the draft model for draft-simple) and the tasks sent there
    ("*": the workload-wide fallback)."""

    key: str
    url: str
    flags: list[str]
    tasks: list[str] = field(default_factory=list)

    @property
    def local_port(self) -> int | None:
        """The port when ``url`` is an http URL on this machine with one; None otherwise."""
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme != "http" or parsed.hostname not in LOCAL_HOSTS:
            return None
        try:
            return parsed.port
        except ValueError:
            return None


@dataclass(frozen=True)
class PoolPlan:
    """The pools of one policy set and what every server of them runs: the target model, the draft model
    (draft-simple settings only), threads and context, as the analysis measured them."""

    policy_version: int
    analysis_id: int
    model: str
    draft_model: str | None
    threads: int
    n_ctx: int
    pools: list[Pool]

    @property
    def mapping(self) -> dict[str, str]:
        """The SPECROUTE_ROUTER_POOLS mapping of these pools (key -> URL)."""
        return {pool.key: pool.url for pool in self.pools}

    def command(self, pool: Pool, binary: Path | str = "llama-server", first_port: int = 8081) -> list[str]:
        """The command line that starts ``pool`` (on its URL's port; a pool elsewhere gets ``first_port``
        plus its position, to be changed to where it runs)."""
        port = pool.local_port or first_port + self.pools.index(pool)
        return server_command(
            binary, self.model, port=port, threads=self.threads, n_ctx=self.n_ctx, flags=pool.flags
        )


def pool_flags(key: str, draft_model: str | None) -> list[str]:
    """llama-server's flags for the pool ``key``: none for "off", else its drafter's (``-md`` first for a
    drafter that needs the draft model)."""
    if key == "off":
        return []
    drafter = parse_drafter(key)
    return (["-md", str(draft_model)] if drafter.needs_draft_model else []) + drafter.server_flags()


def plan_text(plan: PoolPlan, *, first_port: int = 8081) -> str:
    """The plan as ``specroute pools plan`` prints it: per pool a comment and its command line, then the
    SPECROUTE_ROUTER_POOLS line."""
    import json

    lines = [
        f"# pools of policy set v{plan.policy_version} (llama-server analysis #{plan.analysis_id}, "
        f"{plan.threads} threads, context {plan.n_ctx})"
    ]
    for pool in plan.pools:
        where = "" if pool.local_port else f"; runs at {pool.url}: start it there"
        lines.append(
            f"# {pool.key} -> {pool.url} for {', '.join(pool.tasks) or 'requests kept plain'}{where}"
        )
        lines.append(shlex.join(plan.command(pool, first_port=first_port)))
    lines.append("SPECROUTE_ROUTER_POOLS=" + shlex.quote(json.dumps(plan.mapping)))
    return "\n".join(lines)


def start_pools(
    plan: PoolPlan, binary: Path, *, say: Callable[[str], None] = lambda line: None
) -> list[LlamaServerProcess]:
    """Start every pool of ``plan`` whose URL is on this machine and wait until each serves (a pool
    elsewhere is named through ``say`` and skipped). One that fails stops those already started, and its
    :class:`analyzer.engine.llama_server_process.LlamaServerError` (with the server's log) propagates. The
    caller stops the returned servers."""
    started: list[LlamaServerProcess] = []
    try:
        for pool in plan.pools:
            port = pool.local_port
            if port is None:
                say(f"{pool.key}: {pool.url} is not on this machine; start it there")
                continue
            process = LlamaServerProcess(
                binary, Path(plan.model), threads=plan.threads, n_ctx=plan.n_ctx, flags=pool.flags, port=port
            )
            started.append(process.start())
            say(f"{pool.key}: serving at {pool.url}")
    except BaseException:
        stop_pools(started)
        raise
    return started


def stop_pools(processes: Sequence[LlamaServerProcess]) -> None:
    """Stop every server of ``processes``."""
    for process in processes:
        process.stop()
