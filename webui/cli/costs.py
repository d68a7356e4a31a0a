"""``specroute costs`` (import an engine's own step times, list the stored profiles) and ``specroute
reprice`` (price a finished run's acceptance with another profile, without measuring again)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from analyzer.db import MAX_ID, lock_for_write
from router import strict_json
from webui.cli.base import CliState, cli


@cli.group("costs")
def costs() -> None:
    """Cost profiles: import an engine's own step times (vLLM, SGLang, ...), list what is stored."""


@costs.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path))
@click.option(
    "--for-run",
    type=click.IntRange(1, MAX_ID),
    help="Store the profiles for this run's model pair (for rows that name no target and draft).",
)
@click.option(
    "--new-pair",
    is_flag=True,
    help="Allow a target or draft that no stored run or model spec knows yet (refused without it: a typo).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def costs_import(state: CliState, file: Path, for_run: int | None, new_pair: bool, as_json: bool) -> None:
    """Store the cost profiles of a JSON or CSV FILE (docs/costs.md: the columns and how vLLM's and
    SGLang's latency benchmarks give them). The whole file is checked first: any bad line stores
    nothing and every problem is listed with its line and field. Refused: a step under 0.1 ms (seconds,
    not milliseconds) or any time over a minute, a batch size over 1024, an implausible T(k)/T(1), a
    profile already stored (or given twice), and a target or draft no stored run knows unless --new-pair."""
    from analyzer.analysis.cost_import import CostFileError
    from analyzer.analysis.cost_import_parse import parse_cost_file
    from analyzer.analysis.cost_import_store import store_imported_profiles

    try:
        profiles = parse_cost_file(file.read_bytes(), file.name)
        with state.sessions()() as session, session.begin():
            lock_for_write(session)  # the check for a stored copy and the insert, one import at a time
            stored = store_imported_profiles(session, profiles, file.name, for_run=for_run, new_pair=new_pair)
            rows = [_profile_row(p) for p in stored]
    except CostFileError as exc:  # every problem on its own line, not the one-line "Error: ..."
        if as_json:
            click.echo(strict_json.dumps(exc.payload()))
        click.echo(exc.report(), err=True)
        sys.exit(exc.exit_code)
    if as_json:
        click.echo(strict_json.dumps(rows))
        return
    click.echo(f"{file.name}: stored {len(rows)} cost profile{'s' if len(rows) != 1 else ''}")
    for row in rows:
        click.echo("  " + _profile_line(row))
    click.echo("price a finished run with one: specroute reprice RUN --cost-profile ID")


@costs.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def costs_list(state: CliState, as_json: bool) -> None:
    """Every stored cost profile, newest first: measured by analyses or imported."""
    from sqlalchemy import select

    from analyzer.orm import CostProfile

    with state.sessions()() as session:
        rows = [_profile_row(p) for p in session.scalars(select(CostProfile).order_by(CostProfile.id.desc()))]
    if as_json:
        click.echo(strict_json.dumps(rows))
        return
    if not rows:
        click.echo("no cost profiles yet: an analysis measures one, 'specroute costs import FILE' stores one")
    for row in rows:
        click.echo(_profile_line(row))


def _profile_row(profile) -> dict:
    """:func:`analyzer.advice.report.profile_dict` with the step times in milliseconds, as this command prints them."""
    from analyzer.advice.report import profile_dict

    row = profile_dict(profile)
    return {
        **row,
        "k_max": len(row["target_k_s"]),
        "target_step_ms": [t * 1000 for t in row["target_k_s"]],
        "draft_step_ms": row["draft_s"] * 1000,
    }


def _profile_line(row: dict) -> str:
    version = f" {row['engine_version']}" if row["engine_version"] else ""
    return (
        f"profile {row['id']} ({row['source']}): {row['engine']}{version}"
        + (f" ({row['cost_mode']})" if row["cost_mode"] else "")
        + f" on {row['device']} in {row['dtype']}, "
        f"batch {row['batch_size']}, {row['target']} with draft {row['draft']}, T_t(1) = "
        f"{row['target_step_ms'][0]:.2f} ms, k = 1..{row['k_max']}"
        + (f", {row['quality']}" if row["quality"] else "")
    )


@cli.command("reprice")
@click.argument("run_id", type=click.IntRange(1, MAX_ID))
@click.option(
    "--cost-profile",
    "profile_ids",
    multiple=True,
    required=True,
    type=click.IntRange(1, MAX_ID),
    help="A stored cost profile of the run's pair (repeat it, one per batch size; 'specroute costs list').",
)
@click.option("--publish", is_flag=True, help="Publish the re-priced run's policies (and activate them).")
@click.option("--json", "as_json", is_flag=True, help="Print the new run's report as JSON.")
@click.pass_obj
def reprice(state: CliState, run_id: int, profile_ids: tuple[int, ...], publish: bool, as_json: bool) -> None:
    """Price finished run RUN_ID's stored acceptance with other cost profiles, without measuring again:
    a new run with a copy of its results, whose S(g), g*, intervals and decisions come from those
    profiles (an engine's own step times, another device). Prints what changed per task."""
    from analyzer.advice.report import build_report
    from analyzer.advice.report_text import report_text
    from analyzer.analysis.repricing import reprice_run
    from router.policies.policy import publish_policies

    with state.sessions()() as session, session.begin():
        lock_for_write(session)
        before = build_report(session, run_id)
        priced = reprice_run(session, run_id, list(profile_ids))
        after = build_report(session, priced.id)
        published = publish_policies(session, priced.id, notes=f"re-priced run {run_id}") if publish else None
        version = (published.version, published.is_active) if published else None
    if as_json:
        click.echo(strict_json.dumps(after))
        return
    click.echo(
        f"run {priced.id}: run {run_id}'s acceptance priced with cost profile {', '.join(map(str, profile_ids))}"
    )
    click.echo(_changes(before, after))
    if version:
        click.echo(
            f"published policy set v{version[0]} from run {priced.id}"
            + (" (active)" if version[1] else " (not activated)")
        )
    click.echo("\n" + report_text(after))


def _changes(before: dict, after: dict) -> str:
    """Per task and for the workload: g*, S(g*) and the decision before -> after."""

    def cell(summary: dict | None) -> str:
        if not summary or summary.get("predicted_speedup") is None:
            return "-"
        return f"g{summary['best_gamma']} {summary['predicted_speedup']:.2f}x {'on' if summary['speculate'] else 'off'}"

    heads = [
        f"{when} ({report.get('engine') or ''})" for when, report in (("before", before), ("after", after))
    ]
    width = max(24, *(len(h) + 2 for h in heads))
    lines = [f"{'task':<18} {heads[0]:>{width}} {heads[1]:>{width}}"]
    for task in after["tasks"]:
        lines.append(
            f"{task:<18} {cell(before['tasks'].get(task)):>{width}} {cell(after['tasks'][task]):>{width}}"
        )
    lines.append(
        f"{'(workload)':<18} {cell(before.get('workload')):>{width}} {cell(after.get('workload')):>{width}}"
    )
    return "\n".join(lines)
