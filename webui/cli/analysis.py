"""``specroute analyze``: a new analysis in any engine, or a resumed run (``report`` and ``runs`` are in
webui/cli/runs.py)."""

import sys
from typing import Callable

import click

from analyzer.analysis.run_inputs import read_inputs
from analyzer.analysis.server_jobs import LIMITS as SERVER_LIMITS
from analyzer.db import MAX_ID, lock_for_write
from analyzer.engine.engine_base import EngineUnavailable
from analyzer.engine.engines import MEASURING, analyzes_settings, check_run, measuring_engine
from analyzer.names import AUTO_ENGINE, COST_MODES, DEFAULT_VALIDATE, ENGINES, LLAMA_SERVER
from analyzer.run_params import (
    BLANK_MEANS,
    LEAVE_OUT,
    LIMITS,
    LONG_PROMPT_RULES,
    LONG_PROMPTS_HELP,
    Limit,
    RunInputError,
    RunParams,
    range_words,
    whole_number,
)
from router import strict_json
from webui.cli.base import CliState, _cache_dir, _TqdmProgress, cli

# ---------------------------------------------------------------- analysis


def option_name(field: str) -> str:
    """The option a run input is given with: ``max_new_tokens`` -> ``--max-new-tokens``, ``n_ctx`` -> ``--ctx``."""
    return "--ctx" if field == "n_ctx" else "--" + field.replace("_", "-")


def run_input_option(field: str, help_text: str, dest: str | None = None) -> Callable:
    """A ``click`` option of the run input ``field``, taken as typed and read by
    :func:`analyzer.analysis.run_inputs.read_inputs` (so a bad value gets the words the web form gives); its
    help states the limit and the default, both from analyzer/run_params.py."""
    default = BLANK_MEANS.get(field) or (
        f"{DEFAULT_VALIDATE} for a greedy run, 0 for a sampling one"
        if field == "validate"
        else getattr(RunParams, field)
    )
    whole = whole_number(field)
    kind = "a whole number" if whole else "a number"
    return click.option(
        option_name(field),
        dest or field,
        metavar="N" if whole else "X",
        help=f"{help_text} ({kind} {range_words(LIMITS[field])}; default: {default}).",
    )


# the options of an analysis in llama-server that no run takes (as 'specroute llama-server analyze' takes them),
# by the parameter's name: the option
SERVER_ONLY = {
    "drafter_texts": "--drafter",
    "threads": "--threads",
    "calibration": "--calibration",
    "per_task": "--per-task",
    "server_texts": "--server",
    "validate_repeats": "--validate-repeats",
    "refit": "--refit",
}


def server_only_options(command: Callable) -> Callable:
    """The options of :data:`SERVER_ONLY` on ``specroute analyze``, each left out (None, empty) unless given:
    'specroute llama-server analyze' then takes its defaults."""
    said = "With --engine llama-server (as 'specroute llama-server analyze' takes it): "
    options = [
        click.option("--drafter", "drafter_texts", multiple=True, help=said + "a drafter setting, repeatable "
                     "(default: the five n-gram settings for --draft ngram, draft-simple for a GGUF --draft)."),
        click.option("--threads", type=click.IntRange(1, 256), default=None,
                     help=said + "threads of every llama-server the analysis starts (default: 2)."),
        click.option("--calibration", type=click.IntRange(1, 1000), default=None,
                     help=said + "at most this many prompts fit the step costs (default: 8)."),
        click.option("--per-task", type=click.IntRange(1, 100000), default=None,
                     help=said + "at most this many prompts per task, in set order (default: all)."),
        click.option("--server", "server_texts", multiple=True, help=said + "a llama-server you already run, "
                     "repeatable: 'URL' for the plain one, 'SETTING=URL' for each setting's."),
        click.option("--validate-repeats", type=click.IntRange(1, 20), default=None,
                     help=said + "at most this many passes over the held-out prompts validated."),
        click.option("--refit", is_flag=True, default=None,
                     help=said + "fit the step costs anew where an earlier analysis' fit would be reused."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


@cli.command("analyze")
@click.option("--prompts", "prompt_set", required=False, help="Name of the prompt set to analyze.")
@click.option(
    "--target",
    default="builtin:smollm2-135m-instruct",
    show_default=True,
    help="Target model spec: hf:<id or folder>, gguf:<folder>#<file>, builtin:smollm2-135m-instruct.",
)
@click.option(
    "--draft",
    default="ngram",
    show_default=True,
    help="Draft: a model spec like --target, or ngram / ngram:max_ngram=N (prompt lookup).",
)
@run_input_option("max_new_tokens", "New tokens generated per prompt")
@run_input_option("gamma_max", "Largest lookahead g analysed")
@run_input_option("temperature", "0 = exact greedy replay; > 0 = sampling expectations")
@run_input_option("top_p", "Nucleus sampling's p, when sampling")
@run_input_option(
    "validate",
    "Prompts to validate with real speculative decoding (greedy runs only: a sampling run with N > 0 is "
    "refused)",
    dest="validate_n",
)
@click.option(
    "--validate-all",
    "validate_all",
    is_flag=True,
    help="Validate all --validate prompts. Without it, at most that many: validation stops once every measured "
    "aggregate is within ±5% (95%, from the run noise measured so far) or validation has cost half the plain "
    "generation's time, and the report says which.",
)
@run_input_option("limit", "Analyze only the first N prompts of the set")
@run_input_option("batch_size", "Prompts per target generation call (left padding)")
@run_input_option("margin", "Speculate only if the predicted speedup exceeds 1 + margin")
@click.option("--no-chat-template", is_flag=True, help="Feed plain prompts to the model as they are.")
@click.option(
    "--reprofile",
    is_flag=True,
    help="Measure new cost profiles even if ones exist for this pair, device, dtype and batch size.",
)
@click.option(
    "--engine",
    metavar="|".join((AUTO_ENGINE, *ENGINES, LLAMA_SERVER)),
    help="Engine that measures and prices the run (default: SPECROUTE_ENGINE, auto: llama.cpp where it can "
    "measure the run as asked, else transformers; the command says which it picked and why). llama.cpp: "
    "GGUF models (gguf: or builtin:) with ngram or GGUF drafts, greedy, on the CPU, batch 1. llama-server: "
    "the analysis in llama.cpp's own server (as 'specroute llama-server analyze' with its defaults: the five "
    "n-gram settings for --draft ngram, draft-simple for a GGUF --draft; --max-new-tokens, --limit, --validate "
    "0 or not, --validate-all, --queue, --json, and its own --drafter, --threads, --calibration, --per-task, "
    "--server, --validate-repeats, --refit, --ctx, --long-prompts; the other run options are refused).",
)
@click.option(
    "--cost-mode",
    metavar="|".join(COST_MODES),
    help="How the transformers engine times drafting and verifying (default: SPECROUTE_COST_MODE, eager). "
    "eager: forwards as transformers' generate() runs them. cuda-graphs: each step replayed from a captured "
    "CUDA graph over a static KV cache, as vLLM, SGLang and TensorRT-LLM serve, and validated with a "
    "speculative loop over the same graphs; needs a CUDA GPU (refused on a CPU).",
)
@click.option(
    "--device",
    help="auto, cpu, cuda or cuda:N (default: SPECROUTE_DEVICE, auto = the first GPU if any, else the CPU).",
)
@click.option(
    "--dtype",
    help="auto, float32, bfloat16 or float16 (default: SPECROUTE_DTYPE; auto = bfloat16 on a GPU, "
    "float32 on the CPU). Only float32 replays are exact.",
)
@click.option(
    "--batch-sizes",
    "batch_sizes",
    help="Batch sizes to profile the cost at, e.g. 1,4,16 (default: 1,4,16 on a GPU, 1 on the CPU); "
    "the router decides at the request's batch size from these.",
)
@run_input_option(
    "chunk_size",
    "Prompts per chunk: the pieces any number of workers claim (specroute worker on other machines)",
)
@click.option(
    "--queue",
    "queue_only",
    is_flag=True,
    help="Only queue the run (print its id) for the workers to execute, instead of executing it here.",
)
@click.option(
    "--resume",
    "resume_run",
    type=click.IntRange(1, MAX_ID),
    help="Resume an interrupted, failed or cancelled run by id.",
)
@click.option(
    "--cost-profile",
    "cost_profiles",
    multiple=True,
    type=click.IntRange(1, MAX_ID),
    help="Price the run with this stored cost profile of its pair (an engine's own step times from "
    "'specroute costs import', or an older measurement) instead of measuring one; repeat it, one per "
    "batch size. A finished run is re-priced with 'specroute reprice'.",
)
@click.option(
    "--ctx",
    "n_ctx",
    type=click.IntRange(*SERVER_LIMITS["n_ctx"]),
    default=None,
    help="Context size, for the engines that have one: each server's with --engine llama-server, the model's "
    "with --engine llama.cpp (default: 4096, or what the model was trained for where that is less). The "
    "transformers engine holds each model's own context.",
)
@click.option(
    "--long-prompts",
    type=click.Choice(LONG_PROMPT_RULES),
    default=None,
    help=LONG_PROMPTS_HELP,
)
@server_only_options
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def analyze(
    state: CliState,
    prompt_set,
    target,
    draft,
    reprofile,
    engine,
    batch_sizes,
    queue_only,
    resume_run,
    cost_profiles,
    n_ctx,
    long_prompts,
    as_json,
    **run_inputs,
) -> None:
    """Measure acceptance for every gamma, profile the cost and predict the speedup per task type.

    Runs in --engine on --device in --dtype, timing costs in --cost-mode (resolved before anything is
    stored: an absent GPU, a dtype the device cannot run or cuda-graphs without a GPU stops here).
    Options left out take the defaults every surface shares (analyzer/run_params.py and the settings);
    every bad value is named at once, in the words the web form uses.
    Each prompt's result is stored as soon as it is measured; an
    interrupted run resumes with --resume RUN and skips finished prompts. The run is split in chunks
    of --chunk-size prompts: workers (specroute worker, here or on other machines) that are running
    claim some of them too; --queue leaves all of it to them.
    """
    from analyzer.advice.report_text import report_text

    server_only = {name: run_inputs.pop(name) for name in SERVER_ONLY}
    if not analyzes_settings(engine) and (given := [SERVER_ONLY[k] for k, v in server_only.items() if v]):
        raise click.UsageError(f"{', '.join(given)} apply to --engine llama-server only")
    if analyzes_settings(engine):
        run_only = {"--reprofile": reprofile, "--batch-sizes": batch_sizes, "--resume": resume_run,
                    "--cost-profile": cost_profiles}  # fmt: skip
        _refuse_run_options(run_only, run_inputs)
        server_options = {"n_ctx": n_ctx or 4096, "long_prompts": long_prompts or LEAVE_OUT}
        _analyze_in_llama_server(
            state, prompt_set, target, draft, run_inputs, as_json, queue_only, server_options, server_only
        )
        return
    if resume_run is not None and (n_ctx is not None or long_prompts is not None):
        raise click.UsageError("--ctx and --long-prompts set a new run: a resumed run keeps its own")
    if cost_profiles and (resume_run is not None or batch_sizes or reprofile):
        raise click.UsageError(
            "--cost-profile prices a new run: not with --resume, --batch-sizes or --reprofile"
        )
    new = None
    if resume_run is None:
        if not prompt_set:
            raise click.UsageError("give --prompts NAME (or --resume RUN)")
        new = {**_new_run_inputs(run_inputs, target, draft, reprofile, engine, batch_sizes), "n_ctx": n_ctx,
               "long_prompts": long_prompts}  # fmt: skip
    report = _analyze_a_run(state, prompt_set, new, resume_run, cost_profiles, queue_only, as_json)
    if report is not None:
        click.echo(strict_json.dumps(report) if as_json else report_text(report))


def _analyze_a_run(
    state: CliState,
    prompt_set,
    new: dict | None,
    resume_run: int | None,
    cost_profiles,
    queue_only: bool,
    as_json: bool,
) -> dict | None:
    """Store a new run of ``new``'s raw inputs (its batch sizes, where not given, the cost profiles') or resume
    ``resume_run``, then execute it here: its report; None where it was only queued (its id printed).
    Ctrl-C ends with exit status 130 and says how to resume."""
    sessions = state.sessions()
    run_id = resume_run  # None until a new run is stored
    try:
        if new is not None:
            new["batch_sizes"] = new["batch_sizes"] or _batch_sizes_of(sessions, cost_profiles)
            run_id = _create_new_run(state, sessions, prompt_set, new, queue_only, cost_profiles)
            if queue_only:
                click.echo(
                    strict_json.dumps({"run_id": run_id, "status": "queued"}) if as_json else str(run_id)
                )
                return None
        assert run_id is not None  # a new run's id, or the one resumed
        return _execute_and_build_report(state, sessions, run_id, as_json)
    except KeyboardInterrupt:
        # run_id None: stopped while the new run was being stored ('specroute runs list' shows whether it was)
        if run_id is None:
            click.echo("\ninterrupted before the run was stored; see 'specroute runs list'", err=True)
        else:
            click.echo(
                f"\ninterrupted; finished prompts are kept. Resume with: specroute runs resume {run_id}",
                err=True,
            )
        sys.exit(130)


def _refuse_run_options(run_only: dict, run_inputs: dict) -> None:
    """UsageError naming every option given that only a run takes (``run_only``: option -> value, and the run
    inputs beyond :data:`SERVER_RUN_INPUTS`), for ``--engine llama-server``."""
    given = [name for name, value in run_only.items() if value] + [
        option_name(k) for k, v in run_inputs.items() if v not in (None, False) and k not in SERVER_RUN_INPUTS
    ]
    if given:
        raise click.UsageError(
            f"{', '.join(given)} do not apply to --engine llama-server: "
            "it analyzes llama-server's own drafting settings (see 'specroute llama-server analyze --help')"
        )


SERVER_RUN_INPUTS = (
    "max_new_tokens",
    "limit",
    "validate_n",
    "validate_all",
)  # the run options --engine llama-server takes


def _analyze_in_llama_server(
    state: CliState,
    prompt_set,
    target,
    draft,
    run_inputs: dict,
    as_json: bool,
    queue_only: bool,
    server_options: dict,
    server_only: dict,
) -> None:
    """``specroute analyze --engine llama-server``: the llama-server analysis of ``prompt_set`` (a job executed
    here; ``queue_only``: left to the workers, its job id printed), printed as ``specroute llama-server show``
    prints it, or as JSON. ``server_only``: the options of :data:`SERVER_ONLY` as given (None or empty: the
    analysis' defaults)."""
    from webui.cli.server_analysis import echo_server_analysis, run_server_analysis

    if not prompt_set:
        raise click.UsageError("give --prompts NAME")
    draft_model, urls, drafters = _server_settings(draft, server_only)
    values = _server_run_values(run_inputs)
    record_id = run_server_analysis(
        state,
        prompt_set,
        target,
        drafters,
        draft_model,
        n_predict=values.get("max_new_tokens", RunParams.max_new_tokens),
        limit=values.get("limit"),
        validate=values.get("validate_n", 1) > 0,
        validate_all=bool(run_inputs["validate_all"]),
        queue_only=queue_only,
        urls=urls,
        **server_options,
        **{name: value for name, value in server_only.items() if value is not None},
    )
    if record_id is not None:
        echo_server_analysis(state, record_id, as_json)


def _server_settings(draft, server_only: dict) -> tuple:
    """(draft model or None, the servers' URLs or None, the settings) that ``--draft``, ``--drafter`` and
    ``--server`` name for an analysis in llama-server; ``server_only`` loses its two texts."""
    from analyzer.measuring.server_drafting import parse_drafter
    from webui.cli.server_analysis import DEFAULT_DRAFTERS, drafters_of, servers_of

    draft_model = None if draft == "ngram" else draft
    if draft_model is not None and draft_model.startswith("ngram"):
        raise click.BadParameter(
            "llama-server's n-gram settings are its own: give --draft ngram (all five) or use "
            "'specroute llama-server analyze --drafter'",
            param_hint="--draft",
        )
    drafter_texts, server_texts = server_only.pop("drafter_texts"), server_only.pop("server_texts")
    if server_texts and drafter_texts:
        raise click.UsageError("with --server the settings are the ones --server names; leave out --drafter")
    urls, drafters = servers_of(server_texts) if server_texts else (None, drafters_of(drafter_texts))
    if not server_texts and not drafter_texts:  # the settings --draft names
        drafters = [
            parse_drafter(label) for label in (("draft-simple",) if draft_model else DEFAULT_DRAFTERS)
        ]
    return draft_model, urls, drafters


def _server_run_values(run_inputs: dict) -> dict:
    """The run options an analysis in llama-server takes (:data:`SERVER_RUN_INPUTS`), each checked against the
    job's own bounds and named by its option when out of them."""
    from analyzer.analysis.server_jobs import LIMITS as JOB_LIMITS

    values = {}
    bounds = {  # a job's own bounds (at least two new tokens), the run's words
        "max_new_tokens": JOB_LIMITS["n_predict"],
        "limit": JOB_LIMITS["limit"],
        "validate_n": (int(LIMITS["validate"].low), int(LIMITS["validate"].high or 0)),
    }
    for field, (low, high) in bounds.items():
        text = run_inputs[field]
        if text is None:
            continue
        try:
            values[field] = int(text)
        except ValueError:
            values[field] = low - 1
        if not low <= values[field] <= high:
            hint = "--validate" if field == "validate_n" else option_name(field)
            raise click.BadParameter(
                f"must be a whole number {range_words(Limit(low, high))}, got {text!r}", param_hint=hint
            )
    return values


def _new_run_inputs(run_inputs: dict, target, draft, reprofile, engine, batch_sizes) -> dict:
    """The raw inputs of a new run, as ``read_inputs`` reads them, from the options of ``analyze``
    (``run_inputs``: the run-input options it passes through unread)."""
    return {
        "target": target,
        "draft": draft,
        "max_new_tokens": run_inputs["max_new_tokens"],
        "gamma_max": run_inputs["gamma_max"],
        "temperature": run_inputs["temperature"],
        "top_p": run_inputs["top_p"],
        "validate": run_inputs["validate_n"],
        "validate_all": run_inputs["validate_all"] or None,
        "limit": run_inputs["limit"],
        "batch_size": run_inputs["batch_size"],
        "margin": run_inputs["margin"],
        "chunk_size": run_inputs["chunk_size"],
        "chat_template": False if run_inputs["no_chat_template"] else None,
        "reprofile": reprofile or None,
        "engine": engine,
        "cost_mode": run_inputs["cost_mode"],
        "device": run_inputs["device"],
        "dtype": run_inputs["dtype"],
        "batch_sizes": batch_sizes,
    }


def _create_new_run(
    state: CliState, sessions, prompt_set: str, raw: dict, queue_only: bool, cost_profiles: tuple[int, ...]
) -> int:
    """Read and check the inputs, say where the run will measure, store the run with its unlabelled prompts'
    tasks (the classifier's, :func:`router.classify.run_labelling.label_new_run`) and return its id."""
    from analyzer.analysis.run_records import create_run
    from router.classify.run_labelling import label_new_run

    try:
        inputs = read_inputs(raw, state.settings, engines=MEASURING)
    except RunInputError as error:
        raise error.spelled(option_name) from None
    params = inputs.params
    chosen = raw["engine"] is None
    if chosen:
        click.echo(f"engine {params.engine}: {inputs.engine_why}", err=True)
    # resolved before the run is stored: a run that cannot measure here is never stored
    click.echo(_placement_text(check_run(params), queue_only, chosen=chosen), err=True)
    with sessions() as session, session.begin():
        lock_for_write(session)
        run = create_run(session, prompt_set, raw["target"], raw["draft"], params)
        if cost_profiles:
            from analyzer.analysis.repricing import link_pricing_profiles

            link_pricing_profiles(session, run, cost_profiles)
        labelling = label_new_run(session, run)
        run_id = run.id
    click.echo(f"run {run_id}: {prompt_set} with target {raw['target']}, draft {raw['draft']}", err=True)
    if (said := labelling.text()) is not None:
        click.echo(("warning: " if labelling.problem else "") + said, err=True)
    return run_id


def _execute_and_build_report(state: CliState, sessions, run_id: int, as_json: bool) -> dict:
    """Execute the run here (with a progress bar, except for --json with stderr not a terminal) and return its
    report."""
    from analyzer.advice.report import build_report
    from analyzer.analysis.runs import execute_run

    progress = _TqdmProgress(enabled=not as_json or sys.stderr.isatty())
    try:
        execute_run(
            sessions,
            run_id,
            cache_dir=_cache_dir(state),
            progress=progress,
            allow_network=state.settings.allow_downloads,
        )
    finally:
        progress.close()
    with sessions() as session, session.begin():  # a summary computed here is kept
        lock_for_write(session)
        return build_report(session, run_id)


def _placement_text(params, queue_only: bool = False, *, chosen: bool = False) -> str:
    """Where the run will measure, resolved on this machine (DeviceError if it cannot, EngineUnavailable
    when its engine is not installed here and RunError when its cost mode cannot time here, unless it
    is only queued for other workers: nothing is stored). ``chosen``: the engine was not asked for, so
    the refusal of an engine not installed also says how to name the other one."""
    try:
        return measuring_engine(params.engine).placement_text(params, queue_only=queue_only)
    except EngineUnavailable as error:
        if not chosen:
            raise
        raise EngineUnavailable(f"{error}; or analyze in transformers: --engine transformers") from None


def _batch_sizes_of(sessions, profile_ids: tuple[int, ...]) -> tuple[int, ...] | None:
    """The batch sizes of the stored profiles a new run is priced with (None without any)."""
    if not profile_ids:
        return None
    from analyzer.orm import CostProfile

    with sessions() as session:
        found = [session.get(CostProfile, i) for i in profile_ids]
    return tuple(sorted({p.batch_size or 1 for p in found if p is not None})) or None
