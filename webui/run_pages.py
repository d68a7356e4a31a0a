"""Analysis pages: start a run (models from SPECROUTE_MODELS only), the list with live progress,
a run's report (the one report page every analysis has, webui/report_page.py), per-prompt drill-down with
tokens coloured by what produced them, cancel, and the exports (JSON, per-prompt CSV, per prompt and option
CSV, a self-contained HTML file)."""

from __future__ import annotations

from datetime import datetime
from importlib import resources

from flask import Response, abort, jsonify, redirect, render_template, request, url_for
from markupsafe import Markup
from sqlalchemy import func, select
from sqlalchemy.orm import Session, object_session

from analyzer.advice.option_rows import options_csv
from analyzer.advice.output_marks import output_marks
from analyzer.advice.report import build_report
from analyzer.advice.report_text import recommendation, report_csv
from analyzer.advice.summary import UNLABELLED
from analyzer.advice.summary_store import run_summary
from analyzer.advice.verdict import run_verdict
from analyzer.analysis.analysis_ref import RUN, AnalysisRef
from analyzer.analysis.chunks import chunk_progress, requeue_run
from analyzer.analysis.repricing import price_comparison
from analyzer.analysis.run_inputs import params_from_inputs, read_inputs
from analyzer.analysis.run_records import RunParams, create_run, get_run, request_cancel, shown_status
from analyzer.checks import check_dtype_name
from analyzer.db import lock_for_write, utcnow
from analyzer.engine.engines import MEASURING
from analyzer.errors import SpecrouteError, error_payload
from analyzer.models.devices import DTYPE_CHOICES
from analyzer.models.specs import DEFAULT_DRAFT, DEFAULT_TARGET, SpecError, parse_spec
from analyzer.names import AUTO_ENGINE, COST_MODES, DEFAULT_VALIDATE, ENGINES, LLAMA_SERVER
from analyzer.orm import AnalysisRun, PromptResult, PromptSet
from analyzer.prompts.prompt_checks import prompt_text
from analyzer.run_params import LIMITS, RunError, RunInputError
from router import strict_json
from router.classify.run_labelling import label_new_run
from router.classify.version_store import rarely_reached
from router.orm import ClassifierVersion, PolicySet
from webui.export_pages import export_card
from webui.report_page import Link, render_report, run_page
from webui.ui import bp, flash, sessions, settings

# The form's numbers and their limits: analyzer.run_params.LIMITS, as on the command line and in
# RunParams.check (the new-run page's inputs take their min and max attributes from here too).
WHOLE_NUMBER_FIELDS = ("max_new_tokens", "gamma_max", "validate", "chunk_size")
FORM_LIMITS = {name: LIMITS[name] for name in (*WHOLE_NUMBER_FIELDS, "temperature", "limit")}
# what the form sends: the run's inputs, read by analyzer.analysis.run_inputs.read_inputs as the CLI's are
FORM_FIELDS = (
    "prompt_set",
    "target",
    "draft",
    "max_new_tokens",
    "gamma_max",
    "temperature",
    "validate",
    "validate_all",
    "engine",
    "cost_mode",
    "device",
    "dtype",
    "batch_sizes",
    "limit",
    "chunk_size",
)
FORM_WORDS = {"limit": "prompts to analyze"}  # a field the form labels otherwise than by its name


def form_words(field: str) -> str:
    """A run input as the form's messages name it: ``max new tokens``, ``prompts to analyze``."""
    return FORM_WORDS.get(field, field.replace("_", " "))


def model_choices() -> tuple[list[str], list[str]]:
    """(targets, drafts) from SPECROUTE_MODELS: model specs are both; n-gram specs are drafts only."""
    specs = [s.strip() for s in settings().models.split(",") if s.strip()]
    targets, drafts = [], []
    for spec in specs:
        try:
            kind = parse_spec(spec).kind
        except SpecError:
            continue
        drafts.append(spec)
        if kind != "ngram":
            targets.append(spec)
    return targets, drafts


def _session_of(row: AnalysisRun) -> Session:
    """The session ``row`` was loaded in (rows here are always read from one)."""
    session = object_session(row)
    if session is None:
        raise RuntimeError(f"run {row.id} is not in a session")
    return session


def _run_row(run: AnalysisRun) -> dict:
    now = utcnow()
    elapsed = ((run.finished_at or now) - run.started_at).total_seconds() if run.started_at else None
    done, total = run.progress_done, run.progress_total
    status = shown_status(run, stale_after_s=settings().stale_after_s)
    eta = (
        elapsed / done * (total - done) if elapsed and done and status == "running" and total > done else None
    )
    return {
        "kind": "run",
        "id": run.id,
        "ref": str(AnalysisRef(RUN, run.id)),
        "status": status,
        "engine": run.priced_by,
        "measured_by": run.measured_by,
        "prompt_set": run.prompt_set.name,
        "target": run.pair.target.spec,
        "draft": run.pair.draft.spec,
        "done": done,
        "total": total,
        "percent": round(100 * done / total) if total else 0,
        "elapsed_s": elapsed,
        "eta_s": eta,
        "error": run.error,
        "created_at": run.created_at.isoformat(timespec="seconds"),
        "phase": run.phase if status in ("queued", "running") else None,
        "chunks": chunk_progress(_session_of(run), run.id),
        "url": url_for("ui.run", run_id=run.id),
    }


@bp.get("/runs")
def runs():
    """Every analysis, newest first: runs, and llama-server analyses and their jobs not yet stored (as
    ``specroute runs list`` lists them)."""
    with sessions()() as session:
        rows = analysis_rows(session, session.scalars(select(AnalysisRun)))
    return render_template("runs.html", runs=rows)


def analysis_rows(session: Session, analysis_runs) -> list[dict]:
    """The rows of ``analysis_runs`` and of every llama-server analysis and job not yet stored, newest first."""
    dated = [(r.created_at, _run_row(r)) for r in analysis_runs] + server_rows(session)
    dated.sort(key=lambda pair: pair[0], reverse=True)
    return [row for _, row in dated]


@bp.get("/")
def home():
    """The start page: the steps, with how many prompt sets and analyses (runs and llama-server analyses alike,
    as the runs page lists them) there are, and the latest five analyses."""
    with sessions()() as session:
        latest = analysis_rows(
            session, session.scalars(select(AnalysisRun).order_by(AnalysisRun.id.desc()).limit(5))
        )
        counts = {
            "prompt_sets": session.scalar(select(func.count()).select_from(PromptSet)),
            "analyses": (session.scalar(select(func.count()).select_from(AnalysisRun)) or 0)
            + len(server_rows(session)),
        }
        classifier = session.scalar(
            select(ClassifierVersion.version).where(ClassifierVersion.is_active.is_(True))
        )
        policy = session.scalar(select(PolicySet.version).where(PolicySet.is_active.is_(True)))
    return render_template("home.html", counts=counts, runs=latest[:5], classifier=classifier, policy=policy)


def server_rows(session) -> list[tuple[datetime, dict]]:
    """The llama-server analyses and their jobs as rows of the runs page, each with when it was made: each
    stored analysis (done, its page) and each job that stored none (its page, its status and progress)."""
    from analyzer.analysis.server_jobs import listed_analyses

    return [
        (
            a.created_at,
            {
                "kind": a.kind,
                "id": a.id,
                "ref": a.ref,
                "status": a.status,
                "engine": LLAMA_SERVER,
                "prompt_set": a.prompt_set,
                "target": a.model,
                "draft": ", ".join(a.drafters),
                "done": a.done,
                "total": a.total,
                "percent": round(100 * a.done / a.total) if a.total else 0,
                "elapsed_s": a.seconds,
                "eta_s": None,
                "error": a.error,
                "created_at": a.created_at.isoformat(timespec="seconds"),
                "url": url_for("ui.server_analysis", analysis_id=a.id)
                if a.kind == "server"
                else url_for("ui.server_job", job_id=a.id),
            },
        )  # fmt: skip
        for a in listed_analyses(session)
    ]


def _new_run_page(errors: list[str] | None = None, values: dict | None = None, status: int = 200):
    targets, drafts = model_choices()
    with sessions()() as session:
        names = list(session.scalars(select(PromptSet.name).order_by(PromptSet.name)))
    # the defaults every surface shares (analyzer/run_params.py, the settings); a blank input takes them
    defaults = {
        "prompt_set": request.args.get("prompts", names[0] if names else ""),
        "target": _default_choice(targets, DEFAULT_TARGET),
        "draft": _default_choice(drafts, DEFAULT_DRAFT),
        "max_new_tokens": RunParams.max_new_tokens,
        "gamma_max": RunParams.gamma_max,
        "temperature": RunParams.temperature,
        "limit": "",
        "validate": "",  # DEFAULT_VALIDATE for a greedy run, 0 for a sampling one
        "engine": settings().engine,
        "cost_mode": "",  # the engine's own default (SPECROUTE_COST_MODE for transformers)
        "device": settings().device,
        "dtype": check_dtype_name(settings().dtype),
        "batch_sizes": "",
        "chunk_size": RunParams.chunk_size,
    }
    return render_template(
        "new_run.html",
        prompt_sets=names,
        targets=targets,
        drafts=drafts,
        errors=errors or [],
        limits=FORM_LIMITS,
        dtypes=DTYPE_CHOICES,
        engines=(AUTO_ENGINE, *ENGINES),
        cost_modes=COST_MODES,
        default_validate=DEFAULT_VALIDATE,
        engine_setting=settings().engine,
        cost_mode_setting=settings().cost_mode,
        engine_note=_engine_note(defaults),
        values={**defaults, **(values or {})},
    ), status


def _engine_note(defaults: dict) -> str | None:
    """Which engine the form's defaults measure in and why (``llama.cpp: SPECROUTE_ENGINE is auto and
    llama.cpp can measure this run as asked``); None when they cannot be read (no model to choose)."""
    try:
        inputs = read_inputs({**defaults, "engine": ""}, settings(), engines=MEASURING)
    except RunInputError:
        return None
    return f"{inputs.params.engine}: {inputs.engine_why}"


def _default_choice(choices: list[str], preferred: str) -> str:
    """The demo's model where the operator's list has it (specs compared canonically), else the first."""
    try:
        wanted = parse_spec(preferred).canonical
    except SpecError:
        wanted = None
    for spec in choices:
        try:
            if parse_spec(spec).canonical == wanted:
                return spec
        except SpecError:
            continue
    return choices[0] if choices else ""


@bp.get("/runs/new")
def new_run():
    return _new_run_page()


@bp.post("/runs")
def start_run():
    values = {k: request.form.get(k, "") for k in FORM_FIELDS}
    errors = []
    targets, drafts = model_choices()
    if values["target"] not in targets:
        errors.append("choose a target from the list (the operator sets it with SPECROUTE_MODELS)")
    if values["draft"] not in drafts:
        errors.append("choose a draft from the list (the operator sets it with SPECROUTE_MODELS)")
    elif values["draft"] == values["target"]:
        errors.append(
            "choose a draft other than the target: drafting with the target itself cannot speed it up"
        )
    try:  # the CLI's reader: the same defaults, the same words
        params = params_from_inputs(values, settings(), engines=MEASURING)
    except RunInputError as error:
        errors += error.messages(form_words)
    if errors:
        return _new_run_page(errors, values, 400)
    try:
        with sessions()() as session, session.begin():
            lock_for_write(session)
            run = create_run(session, values["prompt_set"], values["target"], values["draft"], params)
            labelling = label_new_run(session, run)
            run_id = run.id
    except SpecrouteError as exc:  # RunError, SpecError, PromptSetNotFound: shown in the form
        return _new_run_page([str(exc)], values, 400)
    said = labelling.text()
    flash(
        f"analysis run {run_id} queued in {params.engine}; it starts as soon as a worker is free"
        + (f"; {said}" if said else "")
    )
    return redirect(url_for("ui.run", run_id=run_id))


@bp.get("/runs/<int:run_id>/status.json")
def run_status(run_id: int):
    with sessions()() as session:
        run = session.get(AnalysisRun, run_id)
        if run is None:
            return jsonify(error_payload("not_found", f"no analysis run {run_id}")), 404
        return jsonify(_run_row(run))


@bp.post("/runs/<int:run_id>/resume")
def resume_run(run_id: int):
    """Queue a failed or cancelled run again for the workers, its finished prompts kept
    (``specroute runs resume RUN --queue``)."""
    with sessions()() as session, session.begin():
        lock_for_write(session)
        try:
            status = requeue_run(session, run_id).status
        except RunError as exc:
            if exc.status == 404:
                raise  # the app's 404 page
            flash(str(exc))
            return redirect(request.referrer or url_for("ui.runs"))
    flash(
        f"run {run_id}: {'queued again, its finished prompts kept' if status == 'queued' else f'already {status}'}"
    )
    return redirect(request.referrer or url_for("ui.runs"))


@bp.post("/runs/<int:run_id>/cancel")
def cancel_run(run_id: int):
    with sessions()() as session, session.begin():
        lock_for_write(session)
        status = request_cancel(session, run_id).status  # RunNotFound: the app's 404 page
    flash(
        f"run {run_id}: "
        + (
            "cancelled"
            if status == "cancelled"
            else "stopping after the prompt it is on"
            if status == "running"
            else f"already {status}"
        )
    )
    return redirect(request.referrer or url_for("ui.runs"))


def _report(run_id: int) -> dict:
    # committed: a run from before summaries were stored gets its summary stored by the first view
    with sessions()() as session, session.begin():
        lock_for_write(session)
        return build_report(session, run_id)  # ReportError: the app's 404 page


@bp.get("/runs/<int:run_id>")
def run(run_id: int):
    """The run's report: the one report page every analysis has (webui/report_page.py), with a run's own
    sections (progress, recommendation, costs, validation, price comparison, export card)."""
    report = _report(run_id)
    with sessions()() as session, session.begin():  # committed: comparison rows computed now are kept
        lock_for_write(session)
        stored = get_run(session, run_id)
        row = _run_row(stored)
        classifier_version, rarely = rarely_reached(session)
        comparison = price_comparison(session, stored) if report["prompts"] else []
        export = (
            export_card(session, run_id=run_id) if stored.status == "done" and report["prompts"] else None
        )
    page = run_page(
        report,
        status=row["status"],
        prompt_url=lambda prompt_id, gamma: _prompt_url(run_id, prompt_id, gamma),
        exports=_run_exports(run_id) if report["prompts"] else (),
    )
    return render_report(
        page,
        report=report,
        run=row,
        verdict=recommendation(report),
        verdict_lines=run_verdict(report).lines(),
        rarely=rarely,
        classifier_version=classifier_version,
        comparison=comparison,
        export=export,
    )


def _prompt_url(run_id: int, prompt_id: int, gamma: int | None) -> str:
    """A prompt's drill-down, opening at ``gamma`` (None: the page's own choice)."""
    if gamma is None:
        return url_for("ui.prompt_detail", run_id=run_id, prompt_id=prompt_id)
    return url_for("ui.prompt_detail", run_id=run_id, prompt_id=prompt_id, gamma=gamma)


def _run_exports(run_id: int) -> tuple[Link, ...]:
    """A run's exports: the two every analysis has (report.json, options.csv), then a run's own."""
    return (
        Link("JSON", url_for("ui.report_json", run_id=run_id)),
        Link("per prompt and option CSV", url_for("ui.report_options_csv", run_id=run_id)),
        Link("per-prompt CSV", url_for("ui.report_prompts_csv", run_id=run_id)),
        Link("self-contained HTML", url_for("ui.report_html", run_id=run_id)),
    )


@bp.get("/runs/<int:run_id>/report.json")
def report_json(run_id: int):
    report = _report(run_id)
    return Response(
        strict_json.dumps(report, indent=1),
        mimetype="application/json",
        headers={"Content-Disposition": f'attachment; filename="specroute-run-{run_id}.json"'},
    )


@bp.get("/runs/<int:run_id>/prompts.csv")
def report_prompts_csv(run_id: int):
    return Response(
        report_csv(_report(run_id)),
        mimetype="text/csv",
        headers={"Content-Disposition": f'attachment; filename="specroute-run-{run_id}-prompts.csv"'},
    )


@bp.get("/runs/<int:run_id>/options.csv")
def report_options_csv(run_id: int):
    """One row per prompt and gamma, the columns a llama-server analysis' options.csv has."""
    return Response(
        options_csv(_report(run_id)["prompts"]),
        mimetype="text/csv",
        headers={"Content-Disposition": f'attachment; filename="specroute-run-{run_id}-options.csv"'},
    )


@bp.get("/runs/<int:run_id>/report.html")
def report_html(run_id: int):
    report = _report(run_id)
    css = resources.files("webui").joinpath("static/style.css").read_text(encoding="utf-8")
    with sessions()() as session:
        classifier_version, rarely = rarely_reached(session)
    html = render_template(
        "report_export.html",
        page=run_page(report, status=None),  # no links: the file opens offline
        report=report,
        verdict=recommendation(report),
        css=Markup(css),
        rarely=rarely,
        classifier_version=classifier_version,
    )
    return Response(
        html,
        mimetype="text/html",
        headers={"Content-Disposition": f'attachment; filename="specroute-run-{run_id}.html"'},
    )


def _task_best_gamma(session, run: AnalysisRun, task: str | None) -> int | None:
    """g* of one task of a run, from the run's summary (None before profiling)."""
    group = run_summary(session, run).tasks.get(task or UNLABELLED)
    return group.best_gamma if group else None


@bp.get("/runs/<int:run_id>/prompts/<int:prompt_id>")
def prompt_detail(run_id: int, prompt_id: int):
    with sessions()() as session, session.begin():  # committed: the summary, where this view computed it
        lock_for_write(session)
        result = session.scalar(
            select(PromptResult).where(PromptResult.run_id == run_id, PromptResult.prompt_id == prompt_id)
        )
        if result is None:
            abort(404, description=f"run {run_id} has no result for prompt {prompt_id}")
        run_row = get_run(session, run_id)
        prompt = result.prompt
        text = prompt_text(prompt.text, prompt.messages)
        counts = {g.gamma: g for g in result.gamma_counts}
        gamma_max = run_row.run_params.gamma_max
        gamma = request.args.get("gamma", type=int)
        if gamma is None:  # open at the best gamma of the prompt's task
            gamma = _task_best_gamma(session, run_row, result.task_type) or min(4, gamma_max)
        gamma = min(max(gamma, 1), gamma_max)
        marks = output_marks(run_row, result, gamma)  # from the stored ids: no tokenizer, no torch
        info = {
            "task": result.task_type,
            "external_id": prompt.external_id,
            "prompt_tokens": result.prompt_tokens,
            "output_tokens": result.output_tokens,
            "output_text": result.output_text,
            "text": text,
            "messages": prompt.messages,
            "rounds": counts[gamma].rounds if gamma in counts else None,
            "accepted": counts[gamma].accepted if gamma in counts else None,
            "drafted": counts[gamma].drafted if gamma in counts else None,
        }
    return render_template(
        "prompt_detail.html",
        run_id=run_id,
        prompt_id=prompt_id,
        info=info,
        gamma=gamma,
        gammas=list(range(1, gamma_max + 1)),
        pieces=marks.pieces,
        note=marks.note,
    )
