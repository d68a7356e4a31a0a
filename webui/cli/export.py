"""``specroute export``: a run's or a policy set's decisions as the config of the engine you serve with
(router/export/export_plan.py plans them; router/export/export_engines.py writes each engine's terms)."""

from __future__ import annotations

from pathlib import Path

import click

from analyzer.analysis.analysis_ref import AnalysisRef
from analyzer.db import MAX_ID
from webui.cli.base import ANALYSIS, CliState, cli

ENGINE_NAMES = ("vllm", "sglang", "trtllm", "llama-server", "transformers")
FORMATS = ("flags", "json", "yaml", "python")


@cli.command("export")
@click.option(
    "--analysis",
    type=ANALYSIS,
    help="A finished analysis as 'specroute runs list' names it (7: a run; llama-server:3: an analysis in "
    "llama-server), its decisions as publishing it would route them.",
)
@click.option(
    "--run", "run_id", type=click.IntRange(1, MAX_ID), help="A finished analysis run (--analysis 7)."
)
@click.option(
    "--policies",
    "version",
    type=click.IntRange(1, MAX_ID),
    help="A policy set's version (without --analysis, --run or --policies: the active set).",
)
@click.option(
    "--for",
    "engine",
    type=click.Choice(ENGINE_NAMES),
    required=True,
    help="The engine to write the config for.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default=None,
    help="vllm, sglang, llama-server: flags (default) or json; trtllm: yaml (default) or json; "
    "transformers: python (default) or json.",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Refuse an export for an engine other than the one that priced the decisions (and, for "
    "llama-server, a run whose n-gram drafting is not llama-server's).",
)
@click.option(
    "--first-port",
    type=click.IntRange(1, 65535 - 64),
    default=None,
    help="The port of the single server and the first pool (default: the engine's own: vLLM and "
    "TensorRT-LLM 8000, SGLang 30000, llama-server 8081).",
)
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Write to this file.")
@click.pass_obj
def export(
    state: CliState,
    analysis: AnalysisRef | None,
    run_id: int | None,
    version: int | None,
    engine: str,
    fmt: str | None,
    strict: bool,
    first_port: int | None,
    output: Path | None,
) -> None:
    """Write the decisions of an analysis (--analysis, or --run) or a policy set (--policies; default: the
    active one) as ENGINE's own config: one server for the whole workload (per batch size where the engine has
    per-batch knobs: vLLM's num_speculative_tokens_per_batch_size, TensorRT-LLM's draft_len_schedule or
    max_concurrency), the pools a per-task deployment needs with the command that starts each, and the
    SPECROUTE_ROUTER_POOLS mapping that sends each task to its pool. Every value says where it came from;
    the first line warns when another engine priced the decisions. See docs/export.md."""
    from router.export.export_plan import ExportError, plan_for_analysis, plan_for_policy_set, plan_for_run
    from router.export.serving import render_export

    if sum(x is not None for x in (analysis, run_id, version)) > 1:
        raise click.UsageError("give one of --analysis, --run or --policies")
    with state.sessions()() as session:
        if analysis is not None:
            plan = plan_for_analysis(session, analysis)
        elif run_id is not None:
            plan = plan_for_run(session, run_id)
        else:
            plan = plan_for_policy_set(session, version)
    text = render_export(plan, engine, fmt, strict=strict, first_port=first_port)
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ExportError(f"cannot write {output}: {exc.strerror}") from None
    click.echo(f"wrote {output}", err=True)
