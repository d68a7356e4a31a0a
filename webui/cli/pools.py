"""``specroute pools plan | start``: the llama-server pools a policy set published from a llama-server
analysis routes to (router/policies/server_policy.py plans them; analyzer/engine/llama_server_pools.py starts them)."""

from __future__ import annotations

import signal
import threading

import click

from analyzer.db import MAX_ID
from analyzer.engine.llama_server import find_llama_server
from analyzer.engine.llama_server_pools import plan_text, start_pools, stop_pools
from webui.cli.base import CliState, _cache_dir, cli

_VERSION = click.option(
    "--policies",
    "version",
    type=click.IntRange(1, MAX_ID),
    default=None,
    help="The policy set's version (default: the active one).",
)


@cli.group()
def pools() -> None:
    """llama-server pools: one server per drafter setting the policies use, and a plain one."""


@pools.command("plan")
@_VERSION
@click.pass_obj
def plan(state: CliState, version: int | None) -> None:
    """Print the llama-server command line of every pool the policy set routes to (its tasks on a comment
    line above it) and the SPECROUTE_ROUTER_POOLS mapping that names them. The set must have been published
    from a llama-server analysis ('specroute policies publish --llama-server-analysis ID')."""
    from router.policies.server_policy import policy_set_plan

    with state.sessions()() as session:
        click.echo(plan_text(policy_set_plan(session, version)))


@pools.command("start")
@_VERSION
@click.pass_obj
def start(state: CliState, version: int | None) -> None:
    """Start every pool of the policy set that serves on this machine (its URL on 127.0.0.1 or localhost),
    wait until each answers, print "ready", and keep them running until Ctrl-C or SIGTERM stops them all.
    A pool that cannot start (a port in use, a missing model) stops the others and prints its log."""
    from router.policies.server_policy import policy_set_plan

    with state.sessions()() as session:
        chosen = policy_set_plan(session, version)
    binary = find_llama_server(
        state.settings.llama_server, _cache_dir(state), build_cache=state.settings.resolved_build_cache()
    ).path
    stopping = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    servers = start_pools(chosen, binary, say=lambda line: click.echo(line, err=True))
    try:
        click.echo(
            f"ready: {len(servers)} pools of policy set v{chosen.policy_version}; Ctrl-C stops them", err=True
        )
        while not stopping.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        stop_pools(servers)
        signal.signal(signal.SIGTERM, previous)
        click.echo("pools stopped", err=True)
