"""``specroute llama-server analyze | show | pools``: an analysis in llama.cpp's own server of a stored prompt
set (analyzer/analysis/server_analysis.py), stored in the database, printed, and the pools its per-task
choices need (analyzer/analysis/server_store.py)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import click

from analyzer.advice.verdict import left_out_lines, server_verdict
from analyzer.analysis.server_analysis import (
    DEFAULT_VALIDATE_REPEATS,
    VALIDATION_HALF_WIDTH,
)
from analyzer.analysis.server_calibration import MIN_CALIBRATION, REUSE_CHECK
from analyzer.analysis.server_jobs import (
    DEFAULT_DRAFTERS,
    ServerJobError,
    ServerJobParams,
    cancel_server_job,
    claim_server_job,
    create_server_job,
    execute_server_job,
    get_server_job,
    job_view,
    list_server_jobs,
    resume_server_job,
)
from analyzer.analysis.server_store import (
    get_server_analysis,
    pool_plan_text,
    server_analysis_json,
)
from analyzer.analysis.server_text import (
    cost_text,
    decision_text,
    divergence_text,
    noise_text,
    num,
    routing_text,
)
from analyzer.db import MAX_ID, lock_for_write
from analyzer.engine.llama_server import find_llama_server
from analyzer.engine.llama_server_process import RemoteServer
from analyzer.engine.llamacpp_engine import gguf_file
from analyzer.measuring.server_drafting import ServerDrafter, parse_drafter
from analyzer.measuring.validation_plan import DEFAULT_BUDGET_SHARE, MIN_VALIDATED
from analyzer.models.specs import parse_spec
from analyzer.names import DEFAULT_MARGIN
from analyzer.orm import ServerAnalysisRecord
from analyzer.pricing.speedup import INTERVAL_LEVEL, MIN_TASK_PROMPTS
from analyzer.prompts.prompt_sets import SAMPLE_NAME, PromptSetError, get_prompt_set, import_sample
from analyzer.run_params import LEAVE_OUT, LONG_PROMPT_RULES, LONG_PROMPTS_HELP
from router import strict_json
from webui.cli.base import CliState, _cache_dir
from webui.cli.llama_server import llama_server


def drafters_of(values: tuple[str, ...]) -> list[ServerDrafter]:
    """The --drafter values as settings (the default five n-gram settings for none)."""
    drafters = []
    for value in values or DEFAULT_DRAFTERS:
        try:
            drafters.append(parse_drafter(value))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--drafter") from None
    if len({d.label for d in drafters}) < len(drafters):
        raise click.BadParameter("a setting is named twice", param_hint="--drafter")
    return drafters


@llama_server.command("analyze")
@click.option(
    "--prompt-set",
    "set_name",
    default=SAMPLE_NAME,
    show_default=True,
    help="The stored prompt set to analyze (the bundled sample is imported when it is not yet).",
)
@click.option(
    "--model",
    default="builtin:smollm2-135m-instruct",
    show_default=True,
    help="The target model: a GGUF spec (gguf:<folder>#<file.gguf> or builtin:<name>).",
)
@click.option(
    "--drafter",
    "drafter_texts",
    multiple=True,
    help="A drafter setting, repeatable: 'ngram-simple', 'ngram-simple N/M', 'ngram-mod', 'ngram-mod MATCH "
    "MIN-MAX', 'draft-simple' or 'draft-simple MIN-MAX pP' (needs --draft-model) "
    f"(default: {', '.join(DEFAULT_DRAFTERS)}).",
)
@click.option(
    "--draft-model",
    default=None,
    help="The draft model of the draft-simple settings: a GGUF spec sharing the target's vocabulary.",
)
@click.option(
    "--n-predict", type=click.IntRange(2, 4096), default=64, show_default=True, help="New tokens per prompt."
)
@click.option(
    "--threads",
    type=click.IntRange(1, 256),
    default=2,
    show_default=True,
    help="Threads of every llama-server the analysis starts.",
)
@click.option(
    "--ctx",
    "n_ctx",
    type=click.IntRange(256, 131072),
    default=4096,
    show_default=True,
    help="Context size of each server; prompts that do not fit it with their new tokens are left out or "
    "refused (--long-prompts).",
)
@click.option(
    "--long-prompts",
    type=click.Choice(LONG_PROMPT_RULES),
    default=LEAVE_OUT,
    show_default=True,
    help=LONG_PROMPTS_HELP,
)
@click.option(
    "--calibration",
    type=click.IntRange(1, 1000),
    default=8,
    show_default=True,
    help="At most this many prompts fit the step costs: taken after the replay to span the workload's context "
    "lengths and draft rates, run on the plain and every setting's server, and not validated. Calibration "
    f"measures {MIN_CALIBRATION} first and adds one at a time, nearest the prompt its fit missed most, until the fit "
    "holds on prompts it was not fitted on.",
)
@click.option(
    "--per-task",
    type=click.IntRange(1, 100000),
    default=None,
    help="At most this many prompts per task, in set order (default: all).",
)
@click.option(
    "--server",
    "server_texts",
    multiple=True,
    help="A llama-server you already run, repeatable: 'URL' for the plain one and 'SETTING=URL' for each "
    "drafter setting's (e.g. 'ngram-mod 16 8-32=http://10.0.0.5:8082'). Then no server is started: the settings "
    "are the ones named here (not --drafter), the model and context are the plain server's (its /props; --model "
    "and --ctx are not used), and --threads is recorded as given.",
)
@click.option(
    "--validate/--no-validate",
    default=True,
    show_default=True,
    help="Run prompts calibration did not use, one at a time across tasks and predicted speedups, on the plain "
    "and every setting's server, and store predicted vs measured, until run noise leaves every setting's "
    f"aggregate within ±{VALIDATION_HALF_WIDTH:.0%} (95%) or the passes have cost {DEFAULT_BUDGET_SHARE:.0%} of "
    f"the plain generation (at least {MIN_VALIDATED} prompts).",
)
@click.option(
    "--validate-all",
    is_flag=True,
    help="Validate every prompt calibration did not use, with no budget (the cost of a sweep of the settings).",
)
@click.option(
    "--validate-repeats",
    type=click.IntRange(1, 20),
    default=DEFAULT_VALIDATE_REPEATS,
    show_default=True,
    help="At most this many interleaved passes over the held-out prompts, where every one of them is validated "
    f"(--validate-all, or a budget that pays for them all) and run noise still leaves a setting's aggregate wider "
    f"than ±{VALIDATION_HALF_WIDTH:.0%} (95%).",
)
@click.option(
    "--refit",
    is_flag=True,
    help="Fit the step costs on this workload even where an earlier analysis on this machine, model, threads, "
    f"context and server build has a fit; by default that fit is checked on {REUSE_CHECK} prompts first and reused "
    "where it holds.",
)
@click.option(
    "--queue",
    "queue_only",
    is_flag=True,
    help="Only queue the analysis (print its job id) for the workers ('specroute worker', the server's own).",
)
@click.pass_obj
def analyze(
    state: CliState,
    set_name: str,
    model: str,
    drafter_texts: tuple[str, ...],
    draft_model: str | None,
    n_predict: int,
    threads: int,
    n_ctx: int,
    calibration: int,
    per_task: int | None,
    server_texts: tuple[str, ...],
    validate: bool,
    validate_all: bool,
    validate_repeats: int,
    refit: bool,
    queue_only: bool,
    long_prompts: str = LEAVE_OUT,
) -> None:
    """Analyze a prompt set in llama-server: one plain greedy generation per prompt, llama-server's own
    drafting rules replayed on it for every drafter setting, step costs fitted from the servers' timings,
    the predicted speedup per prompt and task, the best setting per task, and (unless --no-validate)
    predicted vs measured through the servers. Stores the analysis and prints it."""  # fmt: skip
    if server_texts and drafter_texts:
        raise click.UsageError("with --server the settings are the ones --server names; leave out --drafter")
    urls, drafters = servers_of(server_texts) if server_texts else (None, drafters_of(drafter_texts))
    record_id = run_server_analysis(
        state, set_name, model, drafters, draft_model, n_predict=n_predict, threads=threads, n_ctx=n_ctx,
        calibration=calibration, per_task=per_task, urls=urls, validate=validate, validate_repeats=validate_repeats,
        queue_only=queue_only, long_prompts=long_prompts, validate_all=validate_all, refit=refit,
    )  # fmt: skip
    if record_id is None:
        return
    with state.sessions()() as session:
        click.echo(server_analysis_text(get_server_analysis(session, record_id)))


def run_server_analysis(
    state: CliState,
    set_name: str,
    model: str,
    drafters: list[ServerDrafter],
    draft_model: str | None,
    *,
    n_predict: int,
    threads: int = 2,
    n_ctx: int = 4096,
    calibration: int = 8,
    per_task: int | None = None,
    limit: int | None = None,
    urls: dict[str, str] | None = None,
    validate: bool = True,
    validate_repeats: int = DEFAULT_VALIDATE_REPEATS,
    queue_only: bool = False,
    long_prompts: str = LEAVE_OUT,
    validate_all: bool = False,
    refit: bool = False,
) -> int | None:
    """Queue an analysis of prompt set ``set_name`` in llama-server (``specroute llama-server analyze`` and
    ``specroute analyze --engine llama-server`` alike) and execute it here, progress on stderr (``queue_only``:
    leave it to the workers and print its job id); the stored analysis' id (None: only queued)."""
    params = ServerJobParams(
        model, tuple(d.label for d in drafters), draft_model, n_predict, threads, n_ctx, calibration, per_task,
        limit, validate, validate_repeats, urls, long_prompts, validate_all, refit,
    )  # fmt: skip
    try:
        params.checked()
    except ServerJobError as exc:
        raise click.BadParameter(str(exc)) from None
    if urls is not None:
        _remote_setup(urls)  # every server answers and runs one model and context, before anything is queued
    else:
        find_llama_server(
            state.settings.llama_server, _cache_dir(state), build_cache=state.settings.resolved_build_cache()
        )
        gguf_file(parse_spec(model))
    if draft_model:
        gguf_file(parse_spec(draft_model))
    sessions = state.sessions()
    with sessions() as session, session.begin():
        lock_for_write(session)
        try:
            prompt_set = get_prompt_set(session, set_name)
        except PromptSetError:
            if set_name != SAMPLE_NAME:
                raise
            prompt_set, _ = import_sample(session)
        job_id = create_server_job(session, prompt_set, params).id
    click.echo(f"llama-server analysis job #{job_id} queued", err=True)
    if queue_only:
        click.echo(str(job_id))
        return None
    return execute_here(state, job_id)


# failures that a resume would meet again (the analysis as asked cannot be made): no resume is suggested
ANALYSIS_MISTAKES = ("server_analysis_failed", "prompt_too_long", "invalid_server_job")


def execute_here(state: CliState, job_id: int) -> int:
    """Claim job ``job_id`` and execute it in this process, progress on stderr; its analysis' id. A failure
    exits with its message and code; Ctrl-C cancels it, saying how to resume."""
    sessions = state.sessions()
    worker_id = f"{socket.gethostname()}:{os.getpid()}:cli"
    if claim_server_job(sessions, worker_id, job_id=job_id) is None:
        raise click.ClickException(f"job #{job_id} is not queued (see 'specroute llama-server jobs')")
    try:
        analysis_id = execute_server_job(
            sessions, job_id, worker_id=worker_id, cache_dir=_cache_dir(state),
            llama_server=state.settings.llama_server, echo=lambda line: click.echo(f"  {line}", err=True),
        )  # fmt: skip
    except KeyboardInterrupt:
        with sessions() as session, session.begin():
            lock_for_write(session)
            cancel_server_job(session, job_id)
        click.echo(
            f"\ninterrupted; its plain generations and finished passes are kept. Resume with: "
            f"specroute runs resume llama-server-job:{job_id}",
            err=True,
        )
        sys.exit(130)
    with sessions() as session:
        job = get_server_job(session, job_id)
        if analysis_id is None:
            raise click.ClickException(
                f"{job.error or 'stopped'} (job #{job_id} {job.status}, {job.error_code or job.status}"
                + (
                    ""
                    if job.error_code in ANALYSIS_MISTAKES
                    else f"; 'specroute runs resume llama-server-job:{job_id}' tries again, keeping its greedy "
                    "outputs and passes"
                )
                + ")"
            )
    return analysis_id


@llama_server.command("jobs")
@click.pass_obj
def jobs(state: CliState) -> None:
    """Queued, running and finished analyses in llama-server, newest first: status, progress, analysis."""
    with state.sessions()() as session:
        views = [job_view(job) for job in list_server_jobs(session)]
    for view in views:
        done = f"analysis #{view.analysis_id}" if view.analysis_id else view.line
        click.echo(f"{view.id:>4}  {view.status:<9} {view.prompt_set:<16} {done}")


@llama_server.command("resume")
@click.argument("job_id", type=click.IntRange(1, MAX_ID))
@click.option("--queue", "queue_only", is_flag=True, help="Only queue it again, for the workers.")
@click.option("--json", "as_json", is_flag=True, help="Print the analysis as JSON.")
@click.pass_obj
def resume(state: CliState, job_id: int, queue_only: bool, as_json: bool = False) -> None:
    """Resume a failed or cancelled analysis job: queued again with the plain generations and the passes
    through the servers it finished on this machine kept, and executed here (--queue: by the workers).
    The same as 'specroute runs resume llama-server-job:JOB_ID'."""
    with state.sessions()() as session, session.begin():
        lock_for_write(session)
        status = resume_server_job(session, job_id).status
    if queue_only:
        click.echo(strict_json.dumps({"job_id": job_id, "status": status}) if as_json else str(job_id))
        return
    echo_server_analysis(state, execute_here(state, job_id), as_json)


def echo_server_analysis(state: CliState, analysis_id: int, as_json: bool) -> None:
    """Print a stored llama-server analysis as ``specroute llama-server show`` prints it, or as JSON."""
    with state.sessions()() as session:
        record = get_server_analysis(session, analysis_id)
        click.echo(
            strict_json.dumps(server_analysis_json(session, record))
            if as_json
            else server_analysis_text(record)
        )


def servers_of(values: tuple[str, ...]) -> tuple[dict[str, str], list[ServerDrafter]]:
    """The --server values as {"off" or a setting's label: URL} and the settings they name."""
    urls: dict[str, str] = {}
    drafters = []
    for value in values:
        setting, _, url = (
            value.rpartition("=") if not value.startswith(("http://", "https://")) else ("", "", value)
        )
        if not url.startswith(("http://", "https://")):
            raise click.BadParameter(
                f"{value!r}: give 'URL' or 'SETTING=URL' with an http(s) URL", param_hint="--server"
            )
        key = "off"
        if setting:
            try:
                drafter = parse_drafter(setting.strip())
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint="--server") from None
            key = drafter.label
            drafters.append(drafter)
        if key in urls:
            raise click.BadParameter(
                f"{'the plain server' if key == 'off' else key} is named twice", param_hint="--server"
            )
        urls[key] = url
    if "off" not in urls or not drafters:
        raise click.BadParameter(
            "give the plain server ('URL') and at least one setting's ('SETTING=URL')", param_hint="--server"
        )
    return urls, drafters


def _remote_setup(urls: dict[str, str]) -> tuple[Path, int, str]:
    """The users' servers' model, per-slot context and build, from their /props: one model and one context
    for all of them (a ClickException naming the server that differs)."""
    seen = {}
    for key, url in urls.items():
        server = RemoteServer(url).start()
        model_path, n_ctx = server.setup()
        seen[key] = (Path(model_path).name, n_ctx, url)
    plain_model, plain_ctx, _ = seen["off"]
    for key, (name, n_ctx, url) in seen.items():
        if (name, n_ctx) != (plain_model, plain_ctx):
            raise click.ClickException(
                f"the server at {url} ({key}) runs {name} with context {n_ctx}, the plain one {plain_model} with "
                f"context {plain_ctx}: every server of one analysis runs the same model and context"
            )
    props = RemoteServer(urls["off"]).client.props()
    return (
        Path(str(props.get("model_path", plain_model))),
        plain_ctx,
        str(props.get("build_info", "unknown"))[:100],
    )


@llama_server.command("show")
@click.argument("analysis_id", type=int)
@click.pass_obj
def show(state: CliState, analysis_id: int) -> None:
    """Print a stored llama-server analysis: its step costs, predicted vs measured per setting, and per
    task every setting's speedup and the chosen one."""
    with state.sessions()() as session:
        click.echo(server_analysis_text(get_server_analysis(session, analysis_id)))


@llama_server.command("pools")
@click.argument("analysis_id", type=int)
@click.option(
    "--port",
    "first_port",
    type=click.IntRange(1, 65000),
    default=8081,
    show_default=True,
    help="The first pool's port; the others follow.",
)
@click.pass_obj
def pools(state: CliState, analysis_id: int, first_port: int) -> None:
    """Print the llama-server command line of every pool a stored analysis' per-task choices need (one
    pool per distinct setting, and a plain one where a task chose none), and which task goes where."""  # fmt: skip
    with state.sessions()() as session:
        record = get_server_analysis(session, analysis_id)
        click.echo(pool_plan_text(record, first_port))


def server_analysis_text(record: ServerAnalysisRecord) -> str:
    """The stored analysis as the CLI prints it: the verdict first (:mod:`analyzer.advice.verdict`), then the
    analysis' setup, costs, validation, tasks and routing."""
    lines = server_verdict(record).lines() + [
        "",
        f"llama-server analysis #{record.id} of prompt set #{record.prompt_set_id}: {len(record.prompts)} prompts, "
        f"{record.n_predict} new tokens, {record.threads} threads, llama-server {record.server_build}, {record.model}"
        + (f" (draft {record.draft_model})" if record.draft_model else ""),
        f"machine: {record.machine}",
    ]
    if record.advice_withheld:
        lines.append(f"Advice withheld: {record.advice_withheld}. Every task is off.")
    lines += left_out_lines(record.left_out)
    lines += [
        f"cost from the servers' timings, {family} settings: {cost_text(cost)}"
        for family, cost in record.cost.items()
    ]
    lines.append(noise_text(record.noise))
    lines += [
        f"took {record.seconds:.0f} s ({record.seconds / max(record.plain_generation_seconds, 1e-9):.1f}x plain "
        f"generation of the same prompts) + {record.validation_seconds:.0f} s validation"
        + (
            f" ({record.validation_repeats} pass{'es' if record.validation_repeats > 1 else ''})"
            if record.validation_repeats
            else ""
        ),
        *([f"calibrated: {record.calibration_why}"] if record.calibration_why else []),
        *([f"validated {record.validation_plan['why']}"] if record.validation_plan else []),
        "",
        "setting | validated (passes, disturbed) | output = plain | draft counts = replay | error per prompt "
        "(the work served / the advice) | within noise + 3 pts | the work served: aggregate predicted / measured "
        "(error, noise) | the advice: aggregate predicted / measured (error) | correlation (prompts drafting) | "
        "controls' |speedup - 1|",
    ]
    for f in record.validation:
        lines += _validation_rows(f)
    lines.append(divergence_text(record.validation))
    lines += [
        "",
        "task | prompts | " + " | ".join(record.drafters) + " (predicted / measured speedup) | chosen | "
        f"the rule (speculate where the best setting's speedup clears {1 + DEFAULT_MARGIN:.2f} and its "
        f"{INTERVAL_LEVEL:.0%} interval clears 1.0; a task of fewer than {MIN_TASK_PROMPTS} prompts takes the "
        "workload's decision)",
    ]
    for task in record.tasks:
        cells = [f"{task['predicted'][d]:.2f} / {num(task['measured'][d])}" for d in record.drafters]
        lines.append(
            f"{task['task']} | {task['prompts']} | "
            + " | ".join(cells)
            + f" | {task['chosen'] or 'off'} | "
            + decision_text(task)
        )
    lines += routing_text(record.routing)
    return "\n".join(lines)


def _validation_rows(f: dict) -> list[str]:
    """One setting's validation row of :func:`server_analysis_text`, and its passes one by one where there were
    several."""
    served = (
        f"{num(f.get('aggregate_predicted'), '{:.3f}')} / {num(f.get('aggregate_measured'), '{:.3f}')} "
        f"({num(f.get('aggregate_error'), '{:.1%}')}, ±{num(f.get('aggregate_noise'), '{:.1%}')})"
    )
    advice = (
        f"{num(f.get('advice_predicted'), '{:.3f}')} / {num(f.get('advice_measured'), '{:.3f}')} "
        f"({num(f.get('advice_error'), '{:.1%}')})"
    )
    lines = [
        f"{f['setting']} | {f['runs']} ({f.get('trials', f['runs'])}, {f['disturbed']}) | "
        f"{num(f['output_equal'], '{:.0%}')} | {num(f['counts_equal'], '{:.0%}')} | "
        f"{num(f['mare'], '{:.1%}')} / {num(f.get('advice_mare'), '{:.1%}')} | "
        f"{num(f.get('within_noise'), '{:.0%}')} | {served} | {advice} | "
        f"{num(f.get('correlation'))} ({f.get('drafting', '-')}) | "
        f"{num(f.get('control_error'), '{:.1%}')} ({f.get('controls', '-')})"
    ]
    passes = f.get("per_pass") or []
    if len(passes) > 1:
        lines.append(
            "  the work served, pass by pass: "
            + "; ".join(
                f"pass {p['pass']} ({p['prompts']} prompts) {num(p['predicted'], '{:.3f}')} / "
                f"{num(p['measured'], '{:.3f}')} ({num(p['error'], '{:.1%}')})"
                for p in passes
            )
        )
    return lines
