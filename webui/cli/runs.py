"""``specroute report`` and ``specroute runs``: every analysis, whatever measured it, by one reference
(:mod:`analyzer.analysis.analysis_ref`): its report, the listing, resume and cancel. ``specroute analyze``
starts one (webui/cli/analysis.py)."""

from __future__ import annotations

from pathlib import Path

import click

from analyzer.analysis.analysis_ref import (
    RUN,
    SERVER,
    SERVER_JOB,
    AnalysisRef,
    AnalysisRefError,
    resolve_analysis,
)
from analyzer.db import MAX_ID, lock_for_write
from router import strict_json
from webui.cli.analysis import analyze
from webui.cli.base import ANALYSIS, CliState, cli


@cli.command("report")
@click.argument("analysis", type=ANALYSIS, required=False)
@click.option(
    "--llama-server-analysis",
    "server_analysis_id",
    type=click.IntRange(1, MAX_ID),
    help="A stored llama-server analysis by its id (the same as ANALYSIS llama-server:ID).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "csv", "options-csv"]),
    default="text",
    show_default=True,
    help="csv: one row per prompt (a llama-server analysis: per prompt and setting); options-csv: one row per "
    "prompt and drafting option (a run's gammas, a llama-server analysis' settings), the same columns for both.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Write to this file instead of stdout.",
)
@click.pass_obj
def report(
    state: CliState,
    analysis: AnalysisRef | None,
    server_analysis_id: int | None,
    fmt: str,
    output: Path | None,
) -> None:
    """Print the report of ANALYSIS as 'specroute runs list' names it (7: a run; llama-server:3: an analysis in
    llama-server; llama-server-job:2: the analysis that job stored), as text, JSON or CSV."""
    from analyzer.advice.option_rows import options_csv
    from analyzer.advice.report import build_report
    from analyzer.advice.report_text import report_csv, report_text
    from analyzer.analysis.server_store import get_server_analysis, server_analysis_json
    from webui.cli.server_analysis import server_analysis_text

    if (analysis is None) == (server_analysis_id is None):
        raise click.UsageError(
            "name one analysis: ANALYSIS (see 'specroute runs list'), or --llama-server-analysis ID"
        )
    with state.sessions()() as session, session.begin():  # a summary computed here is kept
        lock_for_write(session)
        ref = resolve_analysis(session, analysis or AnalysisRef(SERVER, server_analysis_id or 0))
        if ref.kind == SERVER:
            record = get_server_analysis(session, ref.id)
            data = server_analysis_json(session, record)
            as_text, as_csv = (lambda: server_analysis_text(record)), (lambda: options_csv(data["prompts"]))
        else:
            data = build_report(session, ref.id)
            as_text, as_csv = (lambda: report_text(data)), (lambda: report_csv(data))
        text = {
            "json": lambda: strict_json.dumps(data),
            "csv": as_csv,
            "options-csv": lambda: options_csv(data["prompts"]),
            "text": as_text,
        }[fmt]()
    if output:
        output.write_text(text if text.endswith("\n") else text + "\n", "utf-8")
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text.rstrip("\n"))


@cli.group()
def runs() -> None:
    """Every analysis (runs and analyses in llama-server), each by the reference the other commands take;
    resume or cancel one."""


@runs.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def runs_list(state: CliState, as_json: bool) -> None:
    """Every analysis, newest first, by its reference (7: a run in transformers or llama.cpp; llama-server:3: an
    analysis in llama-server; llama-server-job:2: one still queued, running or stopped), with status, engine
    and progress."""
    from sqlalchemy import select

    from analyzer.analysis.run_records import shown_status
    from analyzer.orm import AnalysisRun

    with state.sessions()() as session:
        rows = [
            {
                "kind": "run",
                "ref": str(AnalysisRef(RUN, r.id)),
                "id": r.id,
                "job": None,
                "status": shown_status(r, stale_after_s=state.settings.stale_after_s),
                "engine": r.priced_by,
                "measured_by": r.measured_by,
                "prompt_set": r.prompt_set.name,
                "target": r.pair.target.spec,
                "draft": r.pair.draft.spec,
                "done": r.progress_done,
                "total": r.progress_total,
                "error": r.error,
                "created_at": r.created_at.isoformat(),
            }
            for r in session.scalars(select(AnalysisRun).order_by(AnalysisRun.id.desc()))
        ] + _server_rows(session)
    rows.sort(key=lambda r: r["created_at"], reverse=True)
    if as_json:
        click.echo(strict_json.dumps(rows))
        return
    if not rows:
        click.echo("no analyses yet; start one with 'specroute analyze --prompts NAME'")
    width = max((len(r["ref"]) for r in rows), default=4)
    for r in rows:
        error = f"  error: {r['error']}" if r["error"] else ""
        click.echo(
            f"{r['ref']:>{width}}  {r['status']:<9} {r['engine']:<12} {r['done']:>4}/{r['total']:<4} "
            f"{r['prompt_set']}  {r['target']} + {r['draft']}{error}"
        )
    if rows:
        click.echo(
            "report: 'specroute report ANALYSIS'; resume or cancel: 'specroute runs resume|cancel ANALYSIS'"
        )


def _server_rows(session) -> list[dict]:
    """The llama-server analyses as ``runs list`` rows: each stored analysis, and each job that has not stored
    one (queued, running, failed or cancelled)."""
    from analyzer.analysis.server_jobs import listed_analyses
    from analyzer.names import LLAMA_SERVER

    return [
        {
            "kind": "llama-server",
            "ref": a.ref,
            "id": a.id if a.kind == "server" else None,
            "job": a.id if a.kind == "job" else None,
            "status": a.status,
            "engine": LLAMA_SERVER,
            "measured_by": LLAMA_SERVER,
            "prompt_set": a.prompt_set,
            "target": a.model,
            "draft": ", ".join(a.drafters),
            "done": a.done,
            "total": a.total,
            "error": a.error,
            "created_at": a.created_at.isoformat(),
        }  # fmt: skip
        for a in listed_analyses(session)
    ]


@runs.command("cancel")
@click.argument("analysis", type=ANALYSIS)
@click.pass_obj
def runs_cancel(state: CliState, analysis: AnalysisRef) -> None:
    """Cancel ANALYSIS: a queued run, or ask a running one to stop after its current prompt; a queued or
    running analysis in llama-server (llama-server-job:ID), which stops at its next progress line."""
    from analyzer.analysis.run_records import request_cancel
    from analyzer.analysis.server_jobs import cancel_server_job

    with state.sessions()() as session, session.begin():
        lock_for_write(session)
        if analysis.kind == RUN:
            status = request_cancel(session, analysis.id).status
        elif analysis.kind == SERVER_JOB:
            status = cancel_server_job(session, analysis.id).status
        else:
            raise AnalysisRefError(
                f"{analysis} is a stored analysis: it is finished, there is nothing to cancel"
            )
    stopping = " (stopping after the current prompt)" if analysis.kind == RUN and status == "running" else ""
    click.echo(f"{'run ' if analysis.kind == RUN else ''}{analysis}: {status}{stopping}")


@runs.command("resume")
@click.argument("analysis", type=ANALYSIS)
@click.option("--queue", "queue_only", is_flag=True, help="Only queue it again, for the workers.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def runs_resume(ctx: click.Context, analysis: AnalysisRef, queue_only: bool, as_json: bool) -> None:
    """Resume ANALYSIS where it stopped (an interrupted, failed or cancelled run keeps its finished prompts; an
    analysis in llama-server, llama-server-job:ID, its plain generations and finished passes on this machine)
    and execute it here (--queue: by the workers), printing its report."""
    from analyzer.analysis.chunks import requeue_run
    from analyzer.analysis.run_records import RunError, get_run
    from webui.cli.server_analysis import resume as resume_server

    state: CliState = ctx.obj
    if analysis.kind == SERVER_JOB:
        ctx.invoke(resume_server, job_id=analysis.id, queue_only=queue_only, as_json=as_json)
        return
    if analysis.kind != RUN:
        raise AnalysisRefError(f"{analysis} is a stored analysis: it is finished, there is nothing to resume")
    if queue_only:
        with state.sessions()() as session, session.begin():
            lock_for_write(session)
            status = requeue_run(session, analysis.id).status
        click.echo(strict_json.dumps({"run_id": analysis.id, "status": status}) if as_json else str(analysis))
    else:
        with state.sessions()() as session:
            if get_run(session, analysis.id).status == "done":
                raise RunError(f"run {analysis.id} is done: there is nothing to resume")
        ctx.invoke(analyze, resume_run=analysis.id, as_json=as_json)
