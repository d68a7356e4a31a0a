"""``specroute db`` and ``specroute prompts``: the schema and the prompt sets."""

import sys
from pathlib import Path

import click

import migrations
from analyzer.db import lock_for_write
from analyzer.prompts.ingest import FORMATS, IngestLimits, PromptFileError
from analyzer.prompts.prompt_checks import prompt_text
from analyzer.prompts.prompt_sets import (
    SAMPLE_NAME,
    delete_prompt_set,
    get_prompt_set,
    import_prompt_file,
    import_sample,
    list_prompt_sets,
    list_prompts,
    summarize,
)
from router import strict_json
from webui.cli.base import CliState, _prompt_dict, _summary_dict, _tasks_text, cli

# ---------------------------------------------------------------- db


@cli.group()
def db() -> None:
    """Create, upgrade and inspect the database schema (Alembic migrations)."""


@db.command("upgrade")
@click.argument("revision", default="head")
@click.pass_obj
def db_upgrade(state: CliState, revision: str) -> None:
    """Upgrade the database to REVISION (default: head), creating it if needed."""
    before = migrations.current_revision(state.engine)
    migrations.upgrade(state.engine, revision)
    after = migrations.current_revision(state.engine)
    where = state.engine.url.render_as_string(hide_password=True)
    if before == after:
        click.echo(f"database {where} already at revision {after}")
    else:
        click.echo(f"database {where} upgraded from {before or 'empty'} to {after}")


@db.command("downgrade")
@click.argument("revision")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def db_downgrade(state: CliState, revision: str, yes: bool) -> None:
    """Downgrade the database to REVISION ('base' drops every table and its data)."""
    if not yes:
        click.confirm(f"Downgrade to {revision}? Data in dropped tables is lost.", abort=True)
    migrations.downgrade(state.engine, revision)
    click.echo(f"database at revision {migrations.current_revision(state.engine) or 'base (empty)'}")


@db.command("current")
@click.pass_obj
def db_current(state: CliState) -> None:
    """Print the database URL, its revision and the newest revision."""
    current = migrations.current_revision(state.engine)
    head = migrations.head_revision()
    click.echo(f"database: {state.engine.url.render_as_string(hide_password=True)}")
    click.echo(f"revision: {current or 'none (empty database)'}")
    click.echo(f"head:     {head}" + ("" if current == head else "  -> run: specroute db upgrade"))


# ---------------------------------------------------------------- prompts


@cli.group()
def prompts() -> None:
    """Import, list, show and delete prompt sets (.txt, .jsonl, .csv)."""


@prompts.command("import")
@click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--name", help="Name of the new prompt set (default: the file name without extension).")
@click.option("--sample", is_flag=True, help="Import the bundled sample prompts instead of a file.")
@click.option(
    "--format", "file_format", type=click.Choice(FORMATS), help="File format (default: from the extension)."
)
@click.option(
    "--suggest/--no-suggest",
    default=None,
    help="Suggest a task for each unlabelled prompt with the teacher (default: SPECROUTE_SUGGEST_TASKS).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def prompts_import(
    state: CliState,
    file: Path | None,
    name: str | None,
    sample: bool,
    file_format: str | None,
    suggest: bool | None,
    as_json: bool,
) -> None:
    """Check FILE completely and store it as a prompt set; nothing is stored if any line is bad.

    .txt: one prompt per line. .jsonl: {"prompt": ...} or {"messages": [...]}, optional "task" and
    "id". .csv: a header with a "prompt" column, optional "task" and "id". Errors go to stderr with
    line numbers and the exit code is 1. Then, unless --no-suggest, the teacher suggests a task for
    each unlabelled prompt (see 'specroute prompts suggest').
    """
    if sample == (file is not None):
        raise click.UsageError("give either FILE or --sample")
    summary, parsed = _store_prompt_set(state, file, name, file_format, as_json)
    suggested = None
    if (state.settings.suggest_tasks if suggest is None else suggest) and summary.task_counts.get(None):
        suggested = _suggest(state, [summary.name], quiet_without_encoder=suggest is None)
    if as_json:
        click.echo(
            strict_json.dumps(
                {
                    **_summary_dict(summary),
                    "duplicates": [str(d) for d in parsed.duplicates],
                    "suggested": suggested.total if suggested else 0,
                }
            )
        )
        return
    _print_import_result(summary, parsed, suggested)


def _store_prompt_set(
    state: CliState, file: Path | None, name: str | None, file_format: str | None, as_json: bool
):
    """Check and store FILE (or the bundled sample when there is no FILE) as a prompt set in one
    transaction; return its summary and the parsed file, or print every problem and exit."""
    sessions = state.sessions()
    limits = IngestLimits.from_settings(state.settings)
    try:
        with sessions() as session, session.begin():
            lock_for_write(session)
            if file is None:
                prompt_set, parsed = import_sample(session, name or SAMPLE_NAME)
            else:
                try:
                    data = file.read_bytes()
                except OSError as exc:
                    raise click.ClickException(f"cannot read {file}: {exc.strerror}") from None
                prompt_set, parsed = import_prompt_file(
                    session, name or file.stem, data, file.name, file_format=file_format, limits=limits
                )
            return summarize(session, [prompt_set])[0], parsed
    except PromptFileError as exc:  # every listed issue on its own line, not the one-line "Error: ..."
        if as_json:
            click.echo(strict_json.dumps(exc.payload()))
        click.echo(exc.report(), err=True)
        sys.exit(exc.exit_code)


def _print_import_result(summary, parsed, suggested) -> None:
    """Print what an import stored: the count and tasks, the suggestions made, the duplicates merged."""
    click.echo(
        f"imported {summary.prompt_count} prompts as '{summary.name}' ({_tasks_text(summary.task_counts)})"
    )
    if suggested:
        click.echo(
            f"suggested a task for {suggested.total} unlabelled prompts; see them with: specroute prompts "
            f'show {summary.name} --task ""; accept them with: specroute prompts accept {summary.name} '
            "--min-confidence X"
        )
    if parsed.duplicates:
        click.echo(f"merged {len(parsed.duplicates)} duplicate(s):")
        for notice in parsed.duplicates[:20]:
            click.echo(f"  {notice}")
        if len(parsed.duplicates) > 20:
            click.echo(f"  ... and {len(parsed.duplicates) - 20} more")


def _suggest(state: CliState, names: list[str], quiet_without_encoder: bool = False):
    """The teacher's suggestions for the sets' unlabelled prompts, read and stored in short transactions
    of their own (the teacher trains outside any); None (and
    a note) when the sentence encoder is missing and ``quiet_without_encoder``."""
    from router.classify.suggestions import TeacherUnavailable, suggest_tasks_apart

    try:
        return suggest_tasks_apart(state.sessions(), names, lambda line: click.echo(f"  {line}", err=True))
    except TeacherUnavailable as exc:
        if not quiet_without_encoder:
            raise click.ClickException(str(exc)) from None
        click.echo(f"no task suggestions: {exc}", err=True)
        return None


@prompts.command("suggest")
@click.argument("names", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def prompts_suggest(state: CliState, names: tuple[str, ...], as_json: bool) -> None:
    """Suggest a task for every unlabelled prompt of the named sets (replacing earlier suggestions),
    with the teacher trained on the bundled corpus and every label in the database; the sets'
    prompts are labelled together, so alike prompts vote with each other. Labels are not changed."""
    summary = _suggest(state, list(names))
    with state.sessions()() as session:
        rows = {name: _suggestion_counts(session, name) for name in names}
    if as_json:
        click.echo(strict_json.dumps({"suggested_by": summary.suggested_by, "sets": rows}))
        return
    for name, counts in rows.items():
        click.echo(f"{name}: {summary.suggested[name]} unlabelled prompts suggested: {_tasks_text(counts)}")
    if summary.suggested_by:
        click.echo(f"by {summary.suggested_by}")


def _suggestion_counts(session, name: str) -> dict:
    from sqlalchemy import func, select

    from analyzer.orm import Prompt

    prompt_set = get_prompt_set(session, name)
    rows = session.execute(
        select(Prompt.suggested_task, func.count())
        .where(
            Prompt.prompt_set_id == prompt_set.id, Prompt.task.is_(None), Prompt.suggested_task.is_not(None)
        )
        .group_by(Prompt.suggested_task)
    )
    return dict(sorted(rows.all()))


@prompts.command("accept")
@click.argument("name")
@click.option(
    "--min-confidence",
    required=True,
    type=click.FloatRange(0.0, 1.0),
    help="Accept the suggestions whose teacher confidence is at least this.",
)
@click.pass_obj
def prompts_accept(state: CliState, name: str, min_confidence: float) -> None:
    """Make the suggested task the label of every unlabelled prompt of the set whose suggestion is at
    least --min-confidence sure (one transaction)."""
    from router.classify.suggestions import accept_suggestions

    with state.sessions()() as session, session.begin():
        lock_for_write(session)
        accepted = accept_suggestions(session, get_prompt_set(session, name), min_confidence)
    click.echo(f"{name}: {accepted} suggestions at or above {min_confidence:.2f} are labels now")


@prompts.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_obj
def prompts_list(state: CliState, as_json: bool) -> None:
    """List prompt sets with their prompt counts per task type."""
    with state.sessions()() as session:
        summaries = list_prompt_sets(session)
    if as_json:
        click.echo(strict_json.dumps([_summary_dict(s) for s in summaries]))
        return
    if not summaries:
        click.echo("no prompt sets yet; import one with 'specroute prompts import FILE' or '--sample'")
        return
    width = max(len(s.name) for s in summaries)
    click.echo(f"{'name':<{width}}  prompts  format  created           tasks")
    for s in summaries:
        created = s.created_at.strftime("%Y-%m-%d %H:%M")
        click.echo(
            f"{s.name:<{width}}  {s.prompt_count:>7}  {s.file_format:<6}  {created}  {_tasks_text(s.task_counts)}"
        )


@prompts.command("show")
@click.argument("name")
@click.option(
    "--limit", default=20, show_default=True, type=click.IntRange(0, 10_000), help="Prompts to show."
)
@click.option("--offset", default=0, type=click.IntRange(0), help="Skip this many prompts first.")
@click.option("--search", help="Only prompts whose text or id contains this (case-insensitive).")
@click.option("--task", help="Only prompts with this task label ('' for unlabelled).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (full prompt texts).")
@click.pass_obj
def prompts_show(
    state: CliState, name: str, limit: int, offset: int, search: str | None, task: str | None, as_json: bool
) -> None:
    """Show a prompt set: its counts per task and a page of its prompts."""
    with state.sessions()() as session:
        prompt_set = get_prompt_set(session, name)
        summary = summarize(session, [prompt_set])[0]
        page, total = list_prompts(session, prompt_set, offset=offset, limit=limit, search=search, task=task)
    if as_json:
        click.echo(
            strict_json.dumps(
                {
                    **_summary_dict(summary),
                    "matching": total,
                    "offset": offset,
                    "prompts": [_prompt_dict(p) for p in page],
                }
            )
        )
        return
    click.echo(
        f"{summary.name}: {summary.prompt_count} prompts from {summary.source_filename or '?'} "
        f"({summary.file_format}), {summary.duplicates_merged} duplicate(s) merged"
    )
    click.echo(f"tasks: {_tasks_text(summary.task_counts)}")
    click.echo(
        f"showing {len(page)} of {total} matching, from #{offset + 1}:" if page else f"{total} matching"
    )
    for p in page:
        body = prompt_text(p.text, p.messages, separator=" | ")
        body = " ".join(body.split())
        label = p.task or (
            f"suggested {p.suggested_task} {p.suggested_confidence:.2f}" if p.suggested_task else "-"
        )
        ident = f" id={p.external_id}" if p.external_id else ""
        click.echo(
            f"  #{p.position + 1:<5} line {p.source_line:<6} [{label}]{ident} "
            f"{body[:100]}{'…' if len(body) > 100 else ''}"
        )


@prompts.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def prompts_delete(state: CliState, name: str, yes: bool) -> None:
    """Delete a prompt set (refused while an analysis run uses it)."""
    if not yes:
        click.confirm(f"Delete prompt set {name!r}?", abort=True)
    with state.sessions()() as session, session.begin():
        lock_for_write(session)
        delete_prompt_set(session, name)
    click.echo(f"deleted prompt set '{name}'")
