"""``specroute settings`` and ``demo`` (the main job on the embedded defaults)."""

import json
import os
import sys

import click
from sqlalchemy import select

import migrations
from analyzer.db import lock_for_write
from analyzer.orm import AnalysisRun
from analyzer.prompt_sets import (
    SAMPLE_NAME,
    PromptSetError,
    get_prompt_set,
    import_sample,
    summarize,
)
from analyzer.engines import ENGINES, LLAMA_CPP
from analyzer.settings import SECRET_SETTINGS, describe_settings, env_name


from webui.cli.serving import _serve
from webui.cli.base import CliState, _TqdmProgress, _cache_dir, _tasks_text, cli


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


from analyzer.specs import DEFAULT_DRAFT as DEMO_DRAFT, DEFAULT_TARGET as DEMO_TARGET  # noqa: E402
DEMO_ENGINE = LLAMA_CPP  # the engine users serve GGUF models with on CPUs (benchmarks/RESULTS.md: "Which engine")
DEMO_PARAM_KEYS = ("max_new_tokens", "gamma_max", "temperature", "validate", "limit", "chat_template", "engine",
                   "device", "dtype")


@cli.command("demo")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to serve on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="Port to serve on.")
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(1, 1024))
@click.option("--validate", "validate_n", default=3, show_default=True, type=click.IntRange(0),
              help="Prompts to validate with real speculative decoding.")
@click.option("--limit", type=click.IntRange(1), help="Analyze only the first N sample prompts (a quick look).")
@click.option("--no-serve", is_flag=True, help="Stop after the report instead of serving it.")
@click.option("--engine", type=click.Choice(ENGINES),
              help=f"Engine of the analysis (default: SPECROUTE_ENGINE when it is set, else {DEMO_ENGINE}, which "
                   "needs the [llamacpp] extra; --engine transformers needs nothing more).")
@click.pass_obj
def demo(state: CliState, host: str, port: int, max_new_tokens: int, validate_n: int, limit: int | None,
         no_serve: bool, engine: str | None) -> None:
    """The main job on the embedded defaults: upgrade the database, import the bundled sample
    prompts, analyze them with SmolLM2-135M-Instruct and n-gram drafting in llama.cpp (or --engine),
    train the classifier on the bundled corpus, publish the policies, print the report, and serve the
    web UI and the router. A rerun reuses what exists (the set, a finished or interrupted analysis
    with the same settings, the classifier, the policies)."""
    from analyzer.specs import parse_spec
    from analyzer.report import build_report
    from analyzer.report_text import report_text
    from analyzer.run_records import RunParams, create_run
    from analyzer.runs import execute_run
    from router.classifier import ClassifierError, cold_start_data, load_active, train_classifier
    from router.policy import active_policy_set, publish_policies

    engine = engine or (state.settings.engine if os.environ.get(env_name("engine")) else DEMO_ENGINE)
    if engine == LLAMA_CPP:
        _require_llama_cpp_for_demo()
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
                       engine=engine, device=state.settings.device, dtype=state.settings.dtype)
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
                   f"{DEMO_DRAFT} drafting in {engine}, {max_new_tokens} new tokens, gamma 1..16, {validate_n} validated")
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
        lock_for_write(session)
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


def _require_llama_cpp_for_demo() -> None:
    """Stop before anything is done when the demo's engine is not installed, saying both ways on."""
    from analyzer.llamacpp_engine import EngineUnavailable, require_llama_cpp

    try:
        require_llama_cpp()
    except EngineUnavailable as exc:
        raise EngineUnavailable(f"{exc}; or run the demo in transformers: specroute demo --engine transformers") from None
