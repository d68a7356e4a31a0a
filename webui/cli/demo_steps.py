"""The steps of ``specroute demo`` (:func:`webui.cli.demo.demo`), one function each, in the order the
command calls them: upgrade the database, import the sample prompts, analyze them, train the
classifier, publish the policies (and print the report), serve. Each prints its numbered line; each
reuses what a previous demo left (the set, a finished or interrupted analysis with the same settings,
the classifier, the policies)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

import migrations
from analyzer.db import lock_for_write
from analyzer.engine.engine_base import EngineUnavailable
from analyzer.engine.engines import MEASURING, check_run, measuring_engine
from analyzer.models.specs import DEFAULT_DRAFT as DEMO_DRAFT
from analyzer.models.specs import DEFAULT_TARGET as DEMO_TARGET
from analyzer.orm import AnalysisRun
from analyzer.prompts.prompt_sets import SAMPLE_NAME, PromptSetError, get_prompt_set, import_sample, summarize
from webui.cli.base import CliState, _cache_dir, _tasks_text, _TqdmProgress
from webui.cli.serving import _serve

if TYPE_CHECKING:
    from analyzer.analysis.run_inputs import RunInputs
    from analyzer.analysis.run_records import RunParams

# a stored run is reused by the demo when these of its parameters are the demo's
DEMO_PARAM_KEYS = (
    "max_new_tokens",
    "gamma_max",
    "temperature",
    "validate",
    "limit",
    "chat_template",
    "engine",
    "device",
    "dtype",
)
DEMO_SERVE_THREADS = 8  # the server's threads, as `specroute serve` starts it by default

__all__ = [
    "DEMO_DRAFT",
    "DEMO_PARAM_KEYS",
    "DEMO_SERVE_THREADS",
    "DEMO_TARGET",
    "analyze_sample",
    "demo_run_inputs",
    "import_sample_prompts",
    "publish_policies_and_print_report",
    "require_engine",
    "serve_report",
    "train_classifier_once",
    "upgrade_database",
]


def demo_run_inputs(state: CliState, raw: dict[str, object]) -> RunInputs:
    """The demo's run of the sample: its pair (the embedded target, n-gram drafting) with ``raw`` (the
    demo's options, None where left out) read as every surface reads a run's inputs, so a blank takes the
    defaults the CLI and the web form take (analyzer/run_params.py and the settings: under
    SPECROUTE_ENGINE's default, auto, the demo's run is measured in llama.cpp); checked in full before
    anything is done."""
    from analyzer.analysis.run_inputs import read_inputs
    from analyzer.run_params import RunInputError
    from webui.cli.analysis import option_name

    try:
        inputs = read_inputs(
            {**raw, "target": DEMO_TARGET, "draft": DEMO_DRAFT}, state.settings, engines=MEASURING
        )
    except RunInputError as error:
        raise error.spelled(option_name) from None
    check_run(inputs.params)
    return inputs


def require_engine(engine: str) -> None:
    """Stop before anything is done when the demo's engine is not installed, saying both ways on."""
    try:
        measuring_engine(engine).require_installed()
    except EngineUnavailable as exc:
        raise EngineUnavailable(
            f"{exc}; or run the demo in transformers: specroute demo --engine transformers"
        ) from None


def upgrade_database(state: CliState) -> None:
    """[1/6] Upgrade the database to the newest revision, printing from which revision to which."""
    where = state.engine.url.render_as_string(hide_password=True)
    before = migrations.current_revision(state.engine)
    migrations.upgrade(state.engine)
    click.echo(f"[1/6] database {where}: {before or 'empty'} -> {migrations.current_revision(state.engine)}")


def import_sample_prompts(sessions: sessionmaker[Session]) -> int:
    """[2/6] The bundled sample prompt set, imported unless it already is; prints its task types and
    returns its id."""
    with sessions() as session, session.begin():
        lock_for_write(session)
        try:
            prompt_set = get_prompt_set(session, SAMPLE_NAME)
            click.echo(f"[2/6] sample prompts already imported as '{SAMPLE_NAME}' (reused)")
        except PromptSetError:
            prompt_set, _ = import_sample(session)
            click.echo(f"[2/6] imported the bundled sample prompts as '{SAMPLE_NAME}'")
        summary = summarize(session, [prompt_set])[0]
    click.echo(
        f"      {summary.prompt_count} prompts over {len(summary.task_counts)} task types: "
        f"{_tasks_text(summary.task_counts)}"
    )
    return prompt_set.id


def analyze_sample(
    state: CliState, sessions: sessionmaker[Session], prompt_set_id: int, inputs: RunInputs
) -> int:
    """[3/6] The analysis of the sample with the demo's pair and ``inputs`` (:func:`demo_run_inputs`): a
    finished run is reused, an interrupted one resumed, else a new one is created and executed (Ctrl-C
    keeps what is finished and exits with 130). With ``reprofile`` no finished run is reused: an
    interrupted re-profiling run is resumed, else a new run measures everything again, cost profiles
    included (never reusing a stored one). Returns the run's id."""
    params = inputs.params
    run_id, status = _reused_or_new_run(sessions, prompt_set_id, params)
    if status == "done":
        click.echo(f"[3/6] analysis run {run_id} already done (reused)")
        return run_id
    click.echo(
        f"[3/6] analysis run {run_id} ({'resumed' if status != 'new' else 'new'}): {DEMO_TARGET} with "
        f"{DEMO_DRAFT} drafting in {params.engine}, {params.max_new_tokens} new tokens, gamma "
        f"1..{params.gamma_max}, {params.validate} validated"
    )
    if inputs.engine_why:
        click.echo(f"      engine {params.engine}: {inputs.engine_why}")
    _execute_run_with_progress(state, sessions, run_id)
    return run_id


def _reused_or_new_run(
    sessions: sessionmaker[Session], prompt_set_id: int, params: RunParams
) -> tuple[int, str]:
    """The newest done run of the demo's pair over the set with the demo's parameters, else the
    newest such run not cancelled, else a new one; its id and status ("new" for a new one). With
    ``params.reprofile`` only an unfinished re-profiling run is taken up."""
    from analyzer.analysis.run_records import RunParams, create_run
    from analyzer.models.specs import parse_spec
    from router.classify.run_labelling import label_new_run

    canonical = (parse_spec(DEMO_TARGET).canonical, parse_spec(DEMO_DRAFT).canonical)
    with sessions() as session, session.begin():
        lock_for_write(session)
        runs_of_set = session.scalars(
            select(AnalysisRun)
            .where(AnalysisRun.prompt_set_id == prompt_set_id)
            .order_by(AnalysisRun.id.desc())
        )
        candidates = [
            r
            for r in runs_of_set
            if (r.pair.target.spec, r.pair.draft.spec) == canonical
            and _has_demo_params(r, params)
            and r.status != "cancelled"
            and (not params.reprofile or (r.status != "done" and RunParams.from_json(r.params).reprofile))
        ]
        reuse = next((r for r in candidates if r.status == "done"), None) or next(iter(candidates), None)
        if reuse is not None:
            return reuse.id, reuse.status
        run = create_run(session, SAMPLE_NAME, DEMO_TARGET, DEMO_DRAFT, params)
        label_new_run(session, run)  # the bundled sample is labelled: nothing is left to the classifier
        return run.id, "new"


def _has_demo_params(run: AnalysisRun, params: RunParams) -> bool:
    """Whether the run's parameters named in :data:`DEMO_PARAM_KEYS` are those of ``params``."""
    from analyzer.analysis.run_records import RunParams

    stored = RunParams.from_json(run.params)
    return all(getattr(stored, k) == getattr(params, k) for k in DEMO_PARAM_KEYS)


def _execute_run_with_progress(state: CliState, sessions: sessionmaker[Session], run_id: int) -> None:
    """Execute (or resume) the run here with progress bars; Ctrl-C says how to resume and exits 130."""
    from analyzer.analysis.runs import execute_run

    progress = _TqdmProgress(enabled=True)
    try:
        execute_run(sessions, run_id, cache_dir=_cache_dir(state), progress=progress)
    except KeyboardInterrupt:
        click.echo(
            f"\ninterrupted; finished prompts are kept and 'specroute demo' resumes run {run_id}", err=True
        )
        sys.exit(130)
    finally:
        progress.close()


def train_classifier_once(state: CliState, sessions: sessionmaker[Session]) -> None:
    """[4/6] Train the task classifier on the bundled corpus unless an active one loads; prints its
    cross-validated scores."""
    from router.classify.pipeline import fold_jobs, resolve_features, routing_reach_text
    from router.classify.training import train_classifier_apart
    from router.classify.training_data import ClassifierError, cold_start_data
    from router.classify.version_store import load_active

    with sessions() as session, session.begin():
        try:
            classifier = load_active(session)
        except ClassifierError:
            classifier = None
    if classifier is not None:
        click.echo(f"[4/6] classifier v{classifier.version} already trained (reused)")
        return
    click.echo(
        "[4/6] training the task classifier on the bundled corpus (stratified and "
        "leave-one-source-out cross-validation, a line per fold)"
    )
    features, fallback = resolve_features(state.settings.classifier_features)
    if fallback:
        click.echo(f"      {fallback}")
    version = train_classifier_apart(
        sessions,
        cold_start_data(),
        features=features,
        progress=lambda line: click.echo(f"      {line}"),
        jobs=fold_jobs(state.settings.classifier_jobs, features),
    )
    scores = version.scores
    click.echo(
        f"      classifier v{version.version}, features {scores['features']}, trained in "
        f"{scores['training_seconds']:.0f} s: macro-F1 {scores['macro_f1']:.3f} stratified, "
        f"{scores['grouped']['macro_f1']:.3f} on unseen sources; keyword baseline "
        f"{scores['baseline']['macro_f1']:.3f}; routing threshold {scores['calibration']['threshold']:.2f}"
    )
    reach = routing_reach_text(scores)
    if reach:
        click.echo(f"      {reach}")


def publish_policies_and_print_report(sessions: sessionmaker[Session], run_id: int) -> None:
    """[5/6] Publish the run's policies unless a set from it exists, then print the run's report
    (which leads with "Advice withheld" when its cost profile was measured on a busy machine; such a
    set is published but not activated)."""
    from analyzer.advice.report import build_report
    from analyzer.advice.report_text import report_text
    from router.orm import PolicySet
    from router.policies.policy import publish_policies

    with sessions() as session, session.begin():
        lock_for_write(session)
        existing = session.scalar(
            select(PolicySet).where(PolicySet.run_id == run_id).order_by(PolicySet.version.desc()).limit(1)
        )
        report = build_report(session, run_id)
        withheld = report.get("advice_withheld")
        if existing is None:
            published = publish_policies(session, run_id, notes="specroute demo")
            state = "active" if published.is_active else "NOT activated: advice withheld"
            click.echo(f"[5/6] published policy set v{published.version} from run {run_id} ({state})")
        else:
            state = "active" if existing.is_active else "not active"
            click.echo(
                f"[5/6] policy set v{existing.version} from run {run_id} already published ({state}; reused)"
            )
    click.echo("\n" + report_text(report) + "\n")
    if withheld:
        click.echo(
            "The router does not follow this run's policies: measure again on a quiet machine with "
            "'specroute demo --reprofile' (or activate the set anyway: 'specroute policies activate VERSION').\n"
        )


def serve_report(state: CliState, host: str, port: int, report_path: str, *, serve: bool) -> None:
    """[6/6] Serve the report (at ``report_path``: ``/runs/ID`` or ``/llama-server/ID``), the web UI and the
    router on ``host:port`` until stopped (with ``serve`` False, only say where ``specroute serve`` shows
    the report)."""
    if not serve:
        click.echo(f"[6/6] not serving (--no-serve); 'specroute serve' shows the report at {report_path}")
        return
    click.echo("[6/6] serving the report and the router")
    urls = [
        f"report: {{base}}{report_path}",
        "web UI: {base}/",
        "router API: POST {base}/v1/route (OpenAPI at {base}/openapi.json)",
    ]
    _serve(state, host, port, DEMO_SERVE_THREADS, urls)
