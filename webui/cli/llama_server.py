"""``specroute llama-server``: find llama.cpp's own C++ server, or compile it (with the libraries
llama-cpp-python loads) from the pinned llama-cpp-python sdist's vendored llama.cpp into the cache
(analyzer/engine/llama_server.py)."""

from __future__ import annotations

import click

from analyzer.engine.llama_server import build_llama_server, find_llama_server
from webui.cli.base import CliState, _cache_dir, cli


@cli.group("llama-server")
def llama_server() -> None:
    """llama.cpp's own server: where specroute finds it, and building it once per version."""


@llama_server.command("where")
@click.pass_obj
def where(state: CliState) -> None:
    """Print the llama-server binary specroute uses and where it was found (SPECROUTE_LLAMA_SERVER,
    PATH or the build cache); exit 1 with the build command when there is none."""
    found = find_llama_server(
        state.settings.llama_server, _cache_dir(state), build_cache=state.settings.resolved_build_cache()
    )
    click.echo(f"{found.path} (from {found.source})")


@llama_server.command("build")
@click.option("--force", is_flag=True, help="Build again even when this version is already in the cache.")
@click.option(
    "--jobs", type=click.IntRange(1, 256), help="Parallel compile jobs (default: one per CPU core)."
)
@click.pass_obj
def build(state: CliState, force: bool, jobs: int | None) -> None:
    """Compile llama.cpp once: llama-server and the shared libraries llama-cpp-python loads, from the
    llama.cpp that the pinned llama-cpp-python version's sdist vendors (pip downloads the sdist; needs
    CMake, Ninja and a C++ compiler), into the machine's build cache (SPECROUTE_BUILD_CACHE, by default the
    per-user cache folder), which every data folder shares, printing each compile step (step N of M) and the
    time taken; reuse a build of the same version (there or in the data folder's cache) unless --force. 4 to 14
    minutes on 2 cores the first time."""
    path = build_llama_server(
        state.settings.resolved_build_cache(),
        also=[_cache_dir(state)],
        jobs=jobs,
        force=force,
        say=lambda line: click.echo(line, err=True),
    )
    click.echo(str(path))
