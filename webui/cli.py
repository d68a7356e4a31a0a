"""The ``specroute`` command line: database, prompt sets, settings, and the main job (``demo``).

Every command that touches data first checks that the database schema is at head and, if not, says
exactly what to run. Each command is one transaction: it stores everything or nothing.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import click
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

import migrations
from analyzer.db import MAX_ID, engine_from_settings, make_session_factory
from analyzer.models import AnalysisRun
from analyzer.ingest import FORMATS, IngestLimits, PromptFileError
from analyzer.prompt_sets import (
    SAMPLE_NAME,
    PromptSetError,
    delete_prompt_set,
    get_prompt_set,
    import_prompt_file,
    import_sample,
    list_prompt_sets,
    list_prompts,
    summarize,
)
from analyzer.settings import SECRET_SETTINGS, Settings, SettingsError, describe_settings, load_settings


@dataclass
class CliState:
    """What the commands share: the settings in force and, once needed, the engine."""

    settings: Settings
    _engine: Engine | None = None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = engine_from_settings(self.settings)
        return self._engine

    def sessions(self, *, check_schema: bool = True) -> sessionmaker[Session]:
        """A session factory, after checking the schema is at head (unless told not to)."""
        if check_schema:
            try:
                migrations.require_head(self.engine)
            except migrations.SchemaNotCurrent as exc:
                raise click.ClickException(str(exc)) from None
        return make_session_factory(self.engine)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specroute")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """specroute: measure where speculative decoding pays off on your prompts, then route requests.

    Settings come from SPECROUTE_* environment variables; see 'specroute settings'.
    """
    try:
        state = CliState(load_settings())
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None
    ctx.obj = state
    ctx.call_on_close(state.close)


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
@click.option("--format", "file_format", type=click.Choice(FORMATS), help="File format (default: from the extension).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def prompts_import(
    state: CliState, file: Path | None, name: str | None, sample: bool, file_format: str | None, as_json: bool
) -> None:
    """Validate FILE completely and store it as a prompt set; nothing is stored if any line is bad.

    .txt: one prompt per line. .jsonl: {"prompt": ...} or {"messages": [...]}, optional "task" and
    "id". .csv: a header with a "prompt" column, optional "task" and "id". Errors go to stderr with
    line numbers and the exit code is 1.
    """
    if sample == (file is not None):
        raise click.UsageError("give either FILE or --sample")
    sessions = state.sessions()
    limits = IngestLimits.from_settings(state.settings)
    try:
        with sessions() as session, session.begin():
            if sample:
                prompt_set, parsed = import_sample(session, name or SAMPLE_NAME)
            else:
                try:
                    data = file.read_bytes()
                except OSError as exc:
                    raise click.ClickException(f"cannot read {file}: {exc.strerror}") from None
                prompt_set, parsed = import_prompt_file(
                    session, name or file.stem, data, file.name, file_format=file_format, limits=limits
                )
            summary = summarize(session, [prompt_set])[0]
    except PromptFileError as exc:
        if as_json:
            click.echo(json.dumps({"error": {"code": "invalid_prompt_file", "message": exc.summary(),
                                             "details": {"total": exc.total,
                                                         "issues": [i.as_dict() for i in exc.issues]}}}))
        click.echo(exc.report(), err=True)
        sys.exit(1)
    except PromptSetError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({**_summary_dict(summary), "duplicates": [str(d) for d in parsed.duplicates]}))
        return
    click.echo(f"imported {summary.prompt_count} prompts as '{summary.name}' ({_tasks_text(summary.task_counts)})")
    if parsed.duplicates:
        click.echo(f"merged {len(parsed.duplicates)} duplicate(s):")
        for notice in parsed.duplicates[:20]:
            click.echo(f"  {notice}")
        if len(parsed.duplicates) > 20:
            click.echo(f"  ... and {len(parsed.duplicates) - 20} more")


@prompts.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_obj
def prompts_list(state: CliState, as_json: bool) -> None:
    """List prompt sets with their prompt counts per task type."""
    with state.sessions()() as session:
        summaries = list_prompt_sets(session)
    if as_json:
        click.echo(json.dumps([_summary_dict(s) for s in summaries]))
        return
    if not summaries:
        click.echo("no prompt sets yet; import one with 'specroute prompts import FILE' or '--sample'")
        return
    width = max(len(s.name) for s in summaries)
    click.echo(f"{'name':<{width}}  prompts  format  created           tasks")
    for s in summaries:
        created = s.created_at.strftime("%Y-%m-%d %H:%M")
        click.echo(f"{s.name:<{width}}  {s.prompt_count:>7}  {s.file_format:<6}  {created}  {_tasks_text(s.task_counts)}")


@prompts.command("show")
@click.argument("name")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(0, 10_000), help="Prompts to show.")
@click.option("--offset", default=0, type=click.IntRange(0), help="Skip this many prompts first.")
@click.option("--search", help="Only prompts whose text or id contains this (case-insensitive).")
@click.option("--task", help="Only prompts with this task label ('' for unlabelled).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (full prompt texts).")
@click.pass_obj
def prompts_show(
    state: CliState, name: str, limit: int, offset: int, search: str | None, task: str | None, as_json: bool
) -> None:
    """Show a prompt set: its counts per task and a page of its prompts."""
    try:
        with state.sessions()() as session:
            prompt_set = get_prompt_set(session, name)
            summary = summarize(session, [prompt_set])[0]
            page, total = list_prompts(session, prompt_set, offset=offset, limit=limit, search=search, task=task)
    except PromptSetError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({**_summary_dict(summary), "matching": total, "offset": offset,
                               "prompts": [_prompt_dict(p) for p in page]}))
        return
    click.echo(f"{summary.name}: {summary.prompt_count} prompts from {summary.source_filename or '?'} "
               f"({summary.file_format}), {summary.duplicates_merged} duplicate(s) merged")
    click.echo(f"tasks: {_tasks_text(summary.task_counts)}")
    click.echo(f"showing {len(page)} of {total} matching, from #{offset + 1}:" if page else f"{total} matching")
    for p in page:
        body = p.text if p.text is not None else " | ".join(f"{m['role']}: {m['content']}" for m in p.messages)
        body = " ".join(body.split())
        label = p.task or "-"
        ident = f" id={p.external_id}" if p.external_id else ""
        click.echo(f"  #{p.position + 1:<5} line {p.source_line:<6} [{label}]{ident} {body[:100]}{'…' if len(body) > 100 else ''}")


@prompts.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def prompts_delete(state: CliState, name: str, yes: bool) -> None:
    """Delete a prompt set (refused while an analysis run uses it)."""
    if not yes:
        click.confirm(f"Delete prompt set {name!r}?", abort=True)
    try:
        with state.sessions()() as session, session.begin():
            delete_prompt_set(session, name)
    except PromptSetError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"deleted prompt set '{name}'")


# ---------------------------------------------------------------- analysis


class _TqdmProgress:
    """A tqdm bar per phase (profiling, measuring, validating) on stderr."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None
        self.phase = None

    def __call__(self, done: int, total: int, phase: str) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        if phase != self.phase:
            self.close()
            self.phase = phase
            if total == 0:
                click.echo(phase + " ...", err=True)
                return
            unit = "pass" if phase.startswith("profiling") else "prompt"
            self.bar = tqdm(total=total, initial=done, desc=phase, unit=unit, file=sys.stderr, dynamic_ncols=True)
            return
        if self.bar is not None:
            if total > self.bar.total:  # re-measurements add passes to a profile
                self.bar.total = total
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _cache_dir(state: CliState) -> Path:
    return state.settings.resolved_data_dir() / "cache"


@cli.command("analyze")
@click.option("--prompts", "prompt_set", required=False, help="Name of the prompt set to analyze.")
@click.option("--target", default="builtin:smollm2-135m-instruct", show_default=True,
              help="Target model spec: hf:<id or folder>, gguf:<folder>#<file>, builtin:smollm2-135m-instruct.")
@click.option("--draft", default="ngram", show_default=True,
              help="Draft: a model spec like --target, or ngram / ngram:max_ngram=N (prompt lookup).")
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(1, 4096))
@click.option("--gamma-max", default=16, show_default=True, type=click.IntRange(1, 64), help="Largest lookahead g analysed.")
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0.0),
              help="0 = exact greedy replay; > 0 = sampling expectations.")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0.0, 1.0, min_open=True))
@click.option("--validate", "validate_n", default=0, show_default=True, type=click.IntRange(0),
              help="Prompts to validate with real speculative decoding (greedy only).")
@click.option("--limit", type=click.IntRange(1), help="Analyze only the first N prompts of the set.")
@click.option("--batch-size", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Prompts per target generation call (left padding).")
@click.option("--margin", default=0.05, show_default=True, type=click.FloatRange(0.0),
              help="Speculate only if the predicted speedup exceeds 1 + margin.")
@click.option("--no-chat-template", is_flag=True, help="Feed plain prompts to the model as they are.")
@click.option("--reprofile", is_flag=True,
              help="Measure new cost profiles even if ones exist for this pair, device, dtype and batch size.")
@click.option("--device", help="auto, cpu, cuda or cuda:N (default: SPECROUTE_DEVICE, auto = the first GPU if any, else the CPU).")
@click.option("--dtype", help="auto, float32, bfloat16 or float16 (default: SPECROUTE_DTYPE; auto = bfloat16 on a GPU, "
                              "float32 on the CPU). Only float32 replays are exact.")
@click.option("--batch-sizes", "batch_sizes",
              help="Batch sizes to profile the cost at, e.g. 1,4,16 (default: 1,4,16 on a GPU, 1 on the CPU); "
                   "the router decides at the request's batch size from these.")
@click.option("--resume", "resume_run", type=click.IntRange(1, MAX_ID), help="Resume an interrupted, failed or cancelled run by id.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def analyze(state: CliState, prompt_set, target, draft, max_new_tokens, gamma_max, temperature, top_p,
            validate_n, limit, batch_size, margin, no_chat_template, reprofile, device, dtype, batch_sizes,
            resume_run, as_json) -> None:
    """Measure acceptance for every gamma, profile the cost and predict the speedup per task type.

    Runs on --device in --dtype (resolved before anything is stored: an absent GPU or a dtype the
    device cannot run stops here). Each prompt's result is stored as soon as it is measured; an
    interrupted run resumes with --resume RUN and skips finished prompts.
    """
    from analyzer.devices import DeviceError, parse_batch_sizes, resolve
    from analyzer.loading import SpecError
    from analyzer.report import build_report
    from analyzer.report_text import report_text
    from analyzer.runs import RunError, RunParams, create_run, execute_run

    sessions = state.sessions()
    try:
        if resume_run is None:
            if not prompt_set:
                raise click.UsageError("give --prompts NAME (or --resume RUN)")
            device, dtype = device or state.settings.device, dtype or state.settings.dtype
            placement = resolve(device, dtype)  # here, so that a run this machine cannot execute is never stored
            click.echo(f"device {placement.device} ({placement.name}), dtype {placement.dtype}", err=True)
            params = RunParams(max_new_tokens=max_new_tokens, gamma_max=gamma_max, temperature=temperature,
                               top_p=top_p, validate=validate_n, limit=limit, chat_template=not no_chat_template,
                               batch_size=batch_size, margin=margin, reprofile=reprofile, device=device,
                               dtype=dtype, profile_batch_sizes=parse_batch_sizes(batch_sizes))
            with sessions() as session, session.begin():
                run_id = create_run(session, prompt_set, target, draft, params).id
            click.echo(f"run {run_id}: {prompt_set} with target {target}, draft {draft}", err=True)
        else:
            run_id = resume_run
        progress = _TqdmProgress(enabled=not as_json or sys.stderr.isatty())
        try:
            execute_run(sessions, run_id, cache_dir=_cache_dir(state), progress=progress,
                        allow_network=state.settings.allow_downloads)
        finally:
            progress.close()
        _label_with_classifier(sessions, run_id)
        with sessions() as session:
            report = build_report(session, run_id)
    except (RunError, SpecError, PromptSetError, DeviceError) as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted; finished prompts are kept. Resume with: specroute analyze --resume {run_id}", err=True)
        sys.exit(130)
    click.echo(json.dumps(report) if as_json else report_text(report))


def _label_with_classifier(sessions, run_id: int) -> None:
    """Give the run's unlabelled prompts the active classifier's task type (if one is trained)."""
    from router.classifier import ClassifierError, label_run_results, load_active

    with sessions() as session, session.begin():
        try:
            classifier = load_active(session)
        except ClassifierError as exc:
            click.echo(f"warning: unlabelled prompts stay 'unlabelled': {exc}", err=True)
            return
        if classifier is not None:
            labelled = label_run_results(session, run_id, classifier)
            if labelled:
                click.echo(f"classifier v{classifier.version} labelled {labelled} unlabelled prompt(s)", err=True)


@cli.command("report")
@click.argument("run_id", type=click.IntRange(1, MAX_ID))
@click.option("--format", "fmt", type=click.Choice(["text", "json", "csv"]), default="text", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True, path_type=Path),
              help="Write to this file instead of stdout.")
@click.pass_obj
def report(state: CliState, run_id: int, fmt: str, output: Path | None) -> None:
    """Print the report of an analysis run as text, JSON or CSV (one row per prompt)."""
    from analyzer.report import ReportError, build_report
    from analyzer.report_text import report_csv, report_text

    try:
        with state.sessions()() as session:
            data = build_report(session, run_id)
    except ReportError as exc:
        raise click.ClickException(str(exc)) from None
    text = {"json": lambda: json.dumps(data), "csv": lambda: report_csv(data), "text": lambda: report_text(data)}[fmt]()
    if output:
        output.write_text(text if text.endswith("\n") else text + "\n", "utf-8")
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text.rstrip("\n"))


@cli.group()
def runs() -> None:
    """List and cancel analysis runs."""


@runs.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def runs_list(state: CliState, as_json: bool) -> None:
    """Analysis runs, newest first, with status and progress."""
    from sqlalchemy import select

    from analyzer.models import AnalysisRun
    from analyzer.runs import shown_status

    with state.sessions()() as session:
        rows = [
            {"id": r.id, "status": shown_status(r), "prompt_set": r.prompt_set.name, "target": r.pair.target.spec,
             "draft": r.pair.draft.spec, "done": r.progress_done, "total": r.progress_total, "error": r.error,
             "created_at": r.created_at.isoformat()}
            for r in session.scalars(select(AnalysisRun).order_by(AnalysisRun.id.desc()))
        ]
    if as_json:
        click.echo(json.dumps(rows))
        return
    if not rows:
        click.echo("no analysis runs yet; start one with 'specroute analyze --prompts NAME'")
    for r in rows:
        error = f"  error: {r['error']}" if r["error"] else ""
        click.echo(f"{r['id']:>4}  {r['status']:<9} {r['done']:>4}/{r['total']:<4} {r['prompt_set']}  "
                   f"{r['target']} + {r['draft']}{error}")


@runs.command("cancel")
@click.argument("run_id", type=click.IntRange(1, MAX_ID))
@click.pass_obj
def runs_cancel(state: CliState, run_id: int) -> None:
    """Cancel a queued run, or ask a running one to stop after its current prompt."""
    from analyzer.runs import RunError, request_cancel

    try:
        with state.sessions()() as session, session.begin():
            run = request_cancel(session, run_id)
            status = run.status
    except RunError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"run {run_id}: {status}" + (" (stopping after the current prompt)" if status == "running" else ""))


# ---------------------------------------------------------------- task classifier


@cli.command("train")
@click.option("--prompts", "prompt_sets", multiple=True,
              help="Use the labeled prompts of this set only (repeatable; default: every set).")
@click.option("--data", "source", type=click.Choice(["both", "labels", "corpus"]), default="both", show_default=True,
              help="both: the bundled corpus plus your labeled prompts (yours win for the same text); "
                   "labels: your labeled prompts only; corpus: the bundled corpus only.")
@click.option("--cold-start", is_flag=True, help="Same as --data corpus.")
@click.option("--features", type=click.Choice(["tfidf", "minilm", "tfidf+minilm"]), default=None,
              help="Feature set (default: SPECROUTE_CLASSIFIER_FEATURES).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the new version's record as JSON.")
@click.pass_obj
def train(state: CliState, prompt_sets: tuple[str, ...], source: str, cold_start: bool, features: str | None,
          seed: int, as_json: bool) -> None:
    """Train the task classifier; score it by stratified and by leave-one-source-out cross-validation
    beside the keyword baseline; calibrate its confidence and choose the routing threshold on the
    grouped folds; mark the task types it rarely reaches; store it as a new version and make it active.
    """
    from router.classifier import ClassifierError, train_classifier, training_data

    if cold_start:
        source = "corpus"
    features = features or state.settings.classifier_features
    try:
        with state.sessions()() as session, session.begin():
            data = training_data(session, source, prompt_sets or None)
            click.echo(f"training on {len(data.texts)} prompts ({data.source}), {len(set(data.labels))} task types, "
                       f"{len(set(data.groups))} sources, features {features}; cross-validating ...", err=True)
            version = train_classifier(session, data, seed=seed, features=features)
            record = {"version": version.version, "labels": version.labels,
                      "training_prompt_count": version.training_prompt_count,
                      "training_data_sha256": version.training_data_sha256,
                      "library_versions": version.library_versions, "scores": version.scores}
    except ClassifierError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(record))
        return
    scores = record["scores"]
    click.echo(f"classifier v{record['version']} active ({scores['features']}): stratified {scores['folds']}-fold CV "
               f"macro-F1 {scores['macro_f1']:.3f}, accuracy {scores['accuracy']:.3f}; keyword baseline macro-F1 "
               f"{scores['baseline']['macro_f1']:.3f}")
    grouped = scores.get("grouped")
    if grouped:
        click.echo(f"leave-one-source-out ({grouped['folds']} sources, what unseen traffic will see): "
                   f"macro-F1 {grouped['macro_f1']:.3f}, accuracy {grouped['accuracy']:.3f}")
    else:
        click.echo("leave-one-source-out: not possible, the training data has one source")
    click.echo(f"  {'task':<18} {'F1 strat.':>9} {'F1 unseen':>9} {'n':>5}  reached")
    for label, row in scores["per_class"].items():
        unseen = f"{grouped['per_class'][label]['f1-score']:.2f}" if grouped else "-"
        reach = scores["reachability"][label]
        click.echo(f"  {label:<18} {row['f1-score']:>9.2f} {unseen:>9} {int(row['support']):>5}  "
                   + ("yes" if reach["reachable"] else f"RARELY: {reach['reason']}"))
    calibration = scores["calibration"]
    click.echo(f"calibration ({calibration['on']} folds): temperature {calibration['temperature']:.2f}, ECE "
               f"{calibration['ece_before']:.3f} -> {calibration['ece_after']:.3f}; routing threshold "
               f"{calibration['threshold']:.2f} ({100 * calibration['coverage']:.0f}% of prompts clear it, "
               f"{100 * (calibration['precision'] or 0):.0f}% of those right)")
    if scores.get("dropped_labels"):
        click.echo(f"left out (fewer than 2 prompts): {scores['dropped_labels']}")


# ---------------------------------------------------------------- policies and routing


@cli.group()
def policies() -> None:
    """Publish routing policies from an analysis run, list them, re-activate an older set."""


def _policy_set_dict(policy_set) -> dict:
    return {
        "version": policy_set.version, "run_id": policy_set.run_id, "active": policy_set.is_active,
        "margin": policy_set.margin, "notes": policy_set.notes, "created_at": policy_set.created_at.isoformat(),
        "policies": {p.task_type: {"speculate": p.speculate, "gamma": p.gamma, "alpha_mean": p.alpha_mean,
                                   "alpha_var": p.alpha_var, "n": p.n_prompts, "expected_speedup": p.expected_speedup,
                                   "tier": p.tier, "fallback": p.is_fallback}
                     for p in policy_set.policies},
    }


def _print_policy_set(data: dict) -> None:
    state = "active" if data["active"] else "inactive"
    click.echo(f"policy set v{data['version']} ({state}) from run {data['run_id']}, margin {data['margin']}")
    for task, p in data["policies"].items():
        label = "* (fallback)" if p["fallback"] else task
        decision = f"speculate, gamma {p['gamma']}" if p["speculate"] else "off"
        click.echo(f"  {label:<18} {decision:<20} S={p['expected_speedup']:.2f}x  alpha={p['alpha_mean']:.2f}"
                   f"  n={p['n']}  {p['tier']}")


@policies.command("publish")
@click.option("--run", "run_id", required=True, type=click.IntRange(1, MAX_ID), help="A finished analysis run.")
@click.option("--notes", help="A note stored with the policy set.")
@click.option("--no-activate", is_flag=True, help="Store the set without making it active.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def policies_publish(state: CliState, run_id: int, notes: str | None, no_activate: bool, as_json: bool) -> None:
    """Turn an analysis run into a new, versioned policy set (active unless --no-activate)."""
    from router.policy import PolicyError, publish_policies

    try:
        with state.sessions()() as session, session.begin():
            data = _policy_set_dict(publish_policies(session, run_id, notes=notes, activate=not no_activate))
    except PolicyError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(data))
    else:
        _print_policy_set(data)


@policies.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def policies_list(state: CliState, as_json: bool) -> None:
    """Every policy set, newest first."""
    from router.policy import list_policy_sets

    with state.sessions()() as session:
        data = [_policy_set_dict(p) for p in list_policy_sets(session)]
    if as_json:
        click.echo(json.dumps(data))
        return
    if not data:
        click.echo("no policy sets yet; publish one with 'specroute policies publish --run RUN'")
    for item in data:
        _print_policy_set(item)


@policies.command("activate")
@click.argument("version", type=click.IntRange(1, MAX_ID))
@click.pass_obj
def policies_activate(state: CliState, version: int) -> None:
    """Make policy set VERSION the active one."""
    from router.policy import PolicyError, activate_policy_set

    try:
        with state.sessions()() as session, session.begin():
            activate_policy_set(session, version)
    except PolicyError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"policy set v{version} is active")


@cli.group()
def decisions() -> None:
    """The log of routing decisions."""


@decisions.command("prune")
@click.option("--older-than-days", required=True, type=click.FloatRange(0.0), help="Delete decisions older than this.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def decisions_prune(state: CliState, older_than_days: float, yes: bool) -> None:
    """Delete logged routing decisions older than N days, in one transaction (feedback events and
    the estimates they moved are kept; feedback naming a pruned route_id gets 404)."""
    from datetime import timedelta

    from sqlalchemy import delete, func

    from analyzer.db import utcnow
    from router.models import RouteDecision

    cutoff = utcnow() - timedelta(days=older_than_days)
    sessions = state.sessions()
    with sessions() as session:
        count = session.scalar(select(func.count()).select_from(RouteDecision).where(RouteDecision.created_at < cutoff))
    if count and not yes:
        click.confirm(f"Delete {count} routing decisions older than {older_than_days:g} days?", abort=True)
    with sessions() as session, session.begin():
        deleted = session.execute(delete(RouteDecision).where(RouteDecision.created_at < cutoff)).rowcount
    click.echo(f"deleted {deleted} routing decisions older than {cutoff.isoformat(timespec='seconds')}")


@cli.command("route")
@click.argument("prompt")
@click.option("--max-new-tokens", type=click.IntRange(1), help="Expected output length.")
@click.option("--batch-size", type=click.IntRange(1), help="Batch size or concurrency of the request.")
@click.option("--temperature", type=click.FloatRange(0.0), help="Sampling temperature of the request.")
@click.option("--json", "as_json", is_flag=True, help="Print the decision as JSON.")
@click.pass_obj
def route(state: CliState, prompt: str, max_new_tokens, batch_size, temperature, as_json: bool) -> None:
    """Print the routing decision for PROMPT with the active classifier and policy set."""
    from router.classifier import ClassifierError
    from router.decision import RouterConfig, router_from_database

    settings = state.settings
    try:
        config = RouterConfig.from_settings(settings)
        with state.sessions()() as session:
            router = router_from_database(session, config)
    except (ClassifierError, SettingsError) as exc:
        raise click.ClickException(str(exc)) from None
    decision = router.route(prompt, max_new_tokens=max_new_tokens, batch_size=batch_size, temperature=temperature)
    if as_json:
        click.echo(json.dumps(decision.as_dict()))
        return
    verdict = f"speculate with gamma {decision.gamma}" if decision.speculate else "do not speculate"
    click.echo(f"{verdict} (task {decision.task_type}, confidence {decision.confidence:.2f}, "
               f"expected speedup {decision.expected_speedup:.2f}x, policy v{decision.policy_version})")
    for reason in decision.reasons:
        click.echo(f"  - {reason}")
    click.echo(f"  transformers: {json.dumps(decision.engine['transformers'])}; pool: {decision.engine['pool']}")


@cli.command("worker")
@click.option("--once", is_flag=True, help="Execute at most one queued run, then exit.")
@click.option("--poll", default=2.0, show_default=True, type=click.FloatRange(0.1), help="Seconds between queue checks.")
@click.pass_obj
def worker(state: CliState, once: bool, poll: float) -> None:
    """Execute analysis runs queued from the web UI (any number of workers may run; each run is
    taken by one). Runs until Ctrl-C; set SPECROUTE_UI_WORKER=false on the server to leave all
    runs to these processes."""
    import socket
    import time

    from analyzer.worker import requeue_stale, run_queued

    sessions = state.sessions()
    worker_id = f"{socket.gethostname()}:{os.getpid()}:cli"
    click.echo(f"worker {worker_id} waiting for queued runs; Ctrl-C stops", err=True)
    try:
        while True:
            requeue_stale(sessions)
            ran = run_queued(sessions, cache_dir=_cache_dir(state), worker_id=worker_id,
                             allow_network=state.settings.allow_downloads)
            if ran is not None:
                with sessions() as session:
                    run = session.get(AnalysisRun, ran)
                    click.echo(f"run {ran}: {run.status}" + (f" ({run.error})" if run.error else ""), err=True)
            if once:
                return
            if ran is None:
                time.sleep(poll)
    except KeyboardInterrupt:
        raise SystemExit(130) from None


@cli.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on (0.0.0.0 for all).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="TCP port (0 picks a free one).")
@click.option("--threads", default=8, show_default=True, type=click.IntRange(1, 256), help="Worker threads per server process.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Server processes sharing the port (one per CPU core serves the most routing requests). "
                   "Each keeps its own metrics; online estimates are shared through the database.")
@click.pass_obj
def serve(state: CliState, host: str, port: int, threads: int, workers: int) -> None:
    """Serve the web UI and the routing API on waitress, a production WSGI server, until Ctrl-C."""
    state.sessions()  # the schema check, with its message
    _serve(state, host, port, threads, workers=workers)


def _serve(state: CliState, host: str, port: int, threads: int, urls: list[str] | None = None, workers: int = 1) -> None:
    import socket

    import waitress

    from webui.app import create_app

    state.close()  # no connection crosses a fork
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.create_server((host, port), family=family, backlog=1024)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    effective_host, effective_port = listener.getsockname()[:2]
    base = f"http://{effective_host if family != socket.AF_INET6 else f'[{effective_host}]'}:{effective_port}"

    def serve_here(ui_worker: bool) -> None:
        try:
            app = create_app({} if ui_worker else {"ui_worker": False}, route_id_wait_s=1.0 if workers > 1 else 0.0)
        except SettingsError as exc:
            raise click.ClickException(str(exc)) from None
        server = waitress.create_server(app, sockets=[listener], threads=threads, ident="specroute",
                                        max_request_body_size=app.config["MAX_CONTENT_LENGTH"] + 1)
        try:
            server.run()
        except KeyboardInterrupt:
            pass
        finally:
            server.close()
            app.extensions["specroute.close"]()

    processes = "" if workers == 1 else f", {workers} processes"
    click.echo(f"specroute serving on {base} ({threads} threads{processes}); Ctrl-C stops", err=True)
    for line in urls or [f"web UI: {base}/", f"API: {base}/v1/route (OpenAPI at {base}/openapi.json)"]:
        click.echo("  " + line.replace("{base}", base), err=True)
    if workers == 1:
        import signal

        signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops as Ctrl-C does: logs flushed
        serve_here(ui_worker=True)
        return
    _supervise(serve_here, workers)


def _supervise(serve_here, workers: int) -> None:
    """Fork ``workers`` server processes on the shared listening socket and keep them running: one
    that dies is started again (unless it died within 10 s of its start: then all stop, exit 1);
    Ctrl-C or SIGTERM stops them all. Only the first runs the analysis worker thread."""
    import signal
    import time

    def start(index: int) -> int:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                signal.signal(signal.SIGTERM, signal.default_int_handler)
                serve_here(ui_worker=index == 0)
            except BaseException as exc:  # noqa: BLE001 - a child never returns into the parent's code
                if not isinstance(exc, KeyboardInterrupt):
                    click.echo(f"specroute server process {index}: {exc}", err=True)
                    code = 1
            finally:
                os._exit(code)
        return pid

    children = {start(i): (i, time.monotonic()) for i in range(workers)}
    stopping = []

    def stop(*_args) -> None:
        stopping.append(True)
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, stop)
    failed = False
    try:
        while children:
            try:
                pid, status = os.wait()
            except KeyboardInterrupt:
                stop()
                continue
            except ChildProcessError:
                break
            index, started = children.pop(pid, (None, 0.0))
            if index is None or stopping:
                continue
            click.echo(f"specroute server process {index} (pid {pid}) exited with status {status}", err=True)
            if time.monotonic() - started < 10:
                click.echo("it died within 10 s of its start; stopping every server process", err=True)
                failed = True
                stop()
            else:
                children[start(index)] = (index, time.monotonic())
    finally:
        if children:
            stop()
    if failed:
        raise SystemExit(1)


# ---------------------------------------------------------------- settings and the main job


@cli.command("settings")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def settings_command(state: CliState, as_json: bool) -> None:
    """Print every setting: environment variable, value in force, default and meaning."""
    rows = [{**row, "value": _shown_value(row["name"], getattr(state.settings, row["name"]))} for row in describe_settings()]
    if as_json:
        click.echo(json.dumps(rows))
        return
    click.echo(f"data folder in force: {state.settings.resolved_data_dir()}")
    click.echo(f"database in force:    {state.engine.url.render_as_string(hide_password=True)}")
    for row in rows:
        click.echo(f"\n{row['env']} = {row['value']!r}  (default {row['default']!r}, {row['type']})")
        click.echo(f"    {row['help']}")


def _shown_value(name: str, value):
    """A setting's value as printed: secrets hidden, passwords in URLs masked."""
    if name in SECRET_SETTINGS:
        return "(set, hidden)" if value else ""
    if name == "database_url" and value:
        from sqlalchemy.engine import make_url

        try:
            return make_url(value).render_as_string(hide_password=True)
        except Exception:  # noqa: BLE001 - an unparsable URL is shown as the server would report it
            return "(unparsable URL)"
    return value


from analyzer.loading import DEFAULT_DRAFT as DEMO_DRAFT, DEFAULT_TARGET as DEMO_TARGET  # noqa: E402
DEMO_PARAM_KEYS = ("max_new_tokens", "gamma_max", "temperature", "validate", "limit", "chat_template", "device", "dtype")


@cli.command("demo")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to serve on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="Port to serve on.")
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(1, 1024))
@click.option("--validate", "validate_n", default=3, show_default=True, type=click.IntRange(0),
              help="Prompts to validate with real speculative decoding.")
@click.option("--limit", type=click.IntRange(1), help="Analyze only the first N sample prompts (a quick look).")
@click.option("--no-serve", is_flag=True, help="Stop after the report instead of serving it.")
@click.pass_obj
def demo(state: CliState, host: str, port: int, max_new_tokens: int, validate_n: int, limit: int | None,
         no_serve: bool) -> None:
    """The main job on the embedded defaults: upgrade the database, import the bundled sample
    prompts, analyze them with SmolLM2-135M-Instruct and n-gram drafting, train the classifier on
    the bundled corpus, publish the policies, print the report, and serve the web UI and the router.
    A rerun reuses what exists (the set, a finished or interrupted analysis with the same settings,
    the classifier, the policies)."""
    from analyzer.loading import parse_spec
    from analyzer.report import build_report
    from analyzer.report_text import report_text
    from analyzer.runs import RunParams, create_run, execute_run
    from router.classifier import ClassifierError, cold_start_data, load_active, train_classifier
    from router.policy import active_policy_set, publish_policies

    where = state.engine.url.render_as_string(hide_password=True)
    before = migrations.current_revision(state.engine)
    migrations.upgrade(state.engine)
    click.echo(f"[1/6] database {where}: {before or 'empty'} -> {migrations.current_revision(state.engine)}")
    sessions = state.sessions()
    with sessions() as session, session.begin():
        try:
            prompt_set = get_prompt_set(session, SAMPLE_NAME)
            click.echo(f"[2/6] sample prompts already imported as '{SAMPLE_NAME}' (reused)")
        except PromptSetError:
            prompt_set, _ = import_sample(session)
            click.echo(f"[2/6] imported the bundled sample prompts as '{SAMPLE_NAME}'")
        summary = summarize(session, [prompt_set])[0]
    click.echo(f"      {summary.prompt_count} prompts over {len(summary.task_counts)} task types: "
               f"{_tasks_text(summary.task_counts)}")
    params = RunParams(max_new_tokens=max_new_tokens, gamma_max=16, validate=validate_n, limit=limit,
                       device=state.settings.device, dtype=state.settings.dtype)
    canonical = (parse_spec(DEMO_TARGET).canonical, parse_spec(DEMO_DRAFT).canonical)
    with sessions() as session, session.begin():
        candidates = [r for r in session.scalars(select(AnalysisRun).where(AnalysisRun.prompt_set_id == prompt_set.id)
                                                  .order_by(AnalysisRun.id.desc()))
                      if (r.pair.target.spec, r.pair.draft.spec) == canonical
                      and all(getattr(RunParams.from_json(r.params), k) == getattr(params, k) for k in DEMO_PARAM_KEYS) and r.status != "cancelled"]
        reuse = next((r for r in candidates if r.status == "done"), None) or next(iter(candidates), None)
        run_id = reuse.id if reuse is not None else create_run(session, SAMPLE_NAME, DEMO_TARGET, DEMO_DRAFT, params).id
        status = reuse.status if reuse is not None else "new"
    if status == "done":
        click.echo(f"[3/6] analysis run {run_id} already done (reused)")
    else:
        click.echo(f"[3/6] analysis run {run_id} ({'resumed' if status != 'new' else 'new'}): {DEMO_TARGET} with "
                   f"{DEMO_DRAFT} drafting, {max_new_tokens} new tokens, gamma 1..16, {validate_n} validated")
        progress = _TqdmProgress(enabled=True)
        try:
            execute_run(sessions, run_id, cache_dir=_cache_dir(state), progress=progress)
        except KeyboardInterrupt:
            click.echo(f"\ninterrupted; finished prompts are kept and 'specroute demo' resumes run {run_id}", err=True)
            sys.exit(130)
        finally:
            progress.close()
    with sessions() as session, session.begin():
        try:
            classifier = load_active(session)
        except ClassifierError:
            classifier = None
        if classifier is None:
            click.echo("[4/6] training the task classifier on the bundled corpus (stratified and leave-one-source-out "
                       "cross-validation; about two minutes)")
            version = train_classifier(session, cold_start_data(), features=state.settings.classifier_features)
            scores = version.scores
            click.echo(f"      classifier v{version.version} ({scores['features']}): macro-F1 {scores['macro_f1']:.3f} "
                       f"stratified, {scores['grouped']['macro_f1']:.3f} on unseen sources; keyword baseline "
                       f"{scores['baseline']['macro_f1']:.3f}; routing threshold {scores['calibration']['threshold']:.2f}")
        else:
            click.echo(f"[4/6] classifier v{classifier.version} already trained (reused)")
    with sessions() as session, session.begin():
        active = active_policy_set(session)
        if active is None or active.run_id != run_id:
            active = publish_policies(session, run_id, notes="specroute demo")
            click.echo(f"[5/6] published policy set v{active.version} from run {run_id}")
        else:
            click.echo(f"[5/6] policy set v{active.version} from run {run_id} already active (reused)")
        report = build_report(session, run_id)
    click.echo("\n" + report_text(report) + "\n")
    if no_serve:
        click.echo(f"[6/6] not serving (--no-serve); 'specroute serve' shows the report at /runs/{run_id}")
        return
    click.echo("[6/6] serving the report and the router")
    _serve(state, host, port, 8, [f"report: {{base}}/runs/{run_id}", "web UI: {base}/",
                                  "router API: POST {base}/v1/route (OpenAPI at {base}/openapi.json)"])


def _tasks_text(counts: dict[str | None, int]) -> str:
    return ", ".join(f"{task or 'unlabelled'} {count}" for task, count in counts.items()) or "empty"


def _summary_dict(summary) -> dict:
    return {
        "name": summary.name,
        "prompt_count": summary.prompt_count,
        "file_format": summary.file_format,
        "source_filename": summary.source_filename,
        "duplicates_merged": summary.duplicates_merged,
        "task_counts": {task or "": count for task, count in summary.task_counts.items()},
        "created_at": summary.created_at.isoformat(),
    }


def _prompt_dict(prompt) -> dict:
    return {
        "position": prompt.position,
        "line": prompt.source_line,
        "id": prompt.external_id,
        "task": prompt.task,
        "text": prompt.text,
        "messages": prompt.messages,
    }


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="specroute")


if __name__ == "__main__":
    main()
