"""An analysis in llama-server: one greedy generation per prompt from a plain server, llama-server's
drafting rules replayed on it for every drafter setting, step costs with the context in them fitted from the
servers' own ``timings`` on calibration prompts chosen to span the workload, the machine's own noise measured,
the predicted speedup of every setting per prompt and per task, the best setting per task (or off), and,
when asked, validation through the servers themselves.

Calibration: the prompts that fit the cost are taken after the replay, to span the workload's context
lengths and draft rates (:func:`analyzer.measuring.calibration_choice.spanning_order`), not the first N.
Each calibration and validation pass runs a prompt on the plain server, on every setting's server, and on the
plain server again: the two plain runs bracket the settings' (each setting's measured speedup is over their
mean) and are a pair of identical runs, from which :func:`analyzer.measuring.noise.noise_floor` measures the
machine's run-to-run noise. Calibration stops by a rule, not a count: a few prompts first, then one more at a
time, the one nearest the prompt the fit missed most, until the fit (:mod:`analyzer.pricing.context_cost`)
holds on prompts it was not fitted on, or the most asked (``calibration_prompts``) are measured; a fit that
still misses, or a machine too noisy, keeps the analysis but withholds its advice (every task off) and
``withheld`` says why, with the numbers and the prompt missed most.

Validation takes the held-out prompts one at a time, across tasks and predicted speedups
(:mod:`analyzer.measuring.validation_plan`), until each setting's time-weighted speedup has a 95% interval
from run noise of at most :data:`VALIDATION_HALF_WIDTH`, or its budget (by default half the plain generation's
time, the server's seconds of reading and generating, the basis its spending is counted on too) is spent, and
says which stopped it. It reports predicted against measured speedup (from ``timings``),
and whether the server's own ``draft_n`` / ``draft_n_accepted`` equal the replay's: that must hold wherever the
speculative output equals plain greedy output (the exactness test). Every server request also records how much
CPU other processes took meanwhile, and the hypervisor's steal; a request over
:data:`analyzer.measuring.interference.MAX_OTHERS_CPU` is marked disturbed and left out of the error figures.

The parts are laid out by concept: server_outcomes.py (the prompts, runs and outcomes, the analysis and its
errors), server_generation.py (the servers and the plain generation), server_replay.py (the drafting rules
replayed), server_passes.py (the passes through the servers, validation's included) and server_calibration.py
(the choice, the noise and the fit); this module runs them in order (:func:`analyze_in_llama_server`).
The analysis' errors and ``served_replay`` (which benchmarks/README.md names here) are importable from here too,
as are the classes of :class:`ServerAnalysis` that benchmarks/results/cost_transfer_*.pickle name here (pickle
finds a class by the module it was saved from), so that ``benchmarks/cost_transfer.py --reprice`` still loads
them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from analyzer.analysis.server_calibration import (
    MIN_CALIBRATION,
    Calibration,
    PriorFit,
    calibrate,
    measured_noise,
)
from analyzer.analysis.server_generation import ServerSetup, generate
from analyzer.analysis.server_outcomes import (
    Progress,
    PromptOutcome,
    PromptTooLong,
    ServerAnalysis,
    ServerAnalysisError,
    ServerPrompt,
    SettingOutcome,
    TimedCompletion,
    Trial,
    aggregate_noise,
)
from analyzer.analysis.server_passes import Attempt, PassLog, ServerHistory, served_replay
from analyzer.analysis.server_replay import replay_settings
from analyzer.engine.llama_server_process import Completion, Server
from analyzer.measuring.server_drafting import ServerDrafter
from analyzer.measuring.time_left import TimeLeft
from analyzer.measuring.validation_plan import (
    DEFAULT_BUDGET_SHARE,
    DEFAULT_TARGET,
    ValidationPlan,
    run_validation,
    validation_order,
)
from analyzer.names import DEFAULT_MARGIN
from analyzer.pricing.server_cost import ServerCost
from analyzer.run_params import LEAVE_OUT

__all__ = [
    "DEFAULT_VALIDATE_REPEATS",
    "MIN_SPEEDUP",
    "VALIDATION_HALF_WIDTH",
    "ValidationAsk",
    "PromptOutcome",
    "PromptTooLong",
    "ServerAnalysis",
    "ServerAnalysisError",
    "ServerPrompt",
    "SettingOutcome",
    "TimedCompletion",
    "Trial",
    "analyze_in_llama_server",
    "served_replay",
]

MIN_SPEEDUP = 1 + DEFAULT_MARGIN  # a setting is advised for a task only where it predicts more than this
VALIDATION_HALF_WIDTH = (
    DEFAULT_TARGET  # validation stops once run noise leaves each setting's aggregate this close
)
DEFAULT_VALIDATE_REPEATS = 3  # ... or this many passes over every held-out prompt


@dataclass(frozen=True)
class ValidationAsk:
    """What validation is asked for: held-out prompts one at a time until run noise leaves each setting's
    aggregate within ``half_width`` (95%; 0: never stop for it) or the passes have cost ``budget_share`` of the
    plain generation; with ``budget_share`` None every held-out prompt, in up to ``repeats`` passes."""

    repeats: int = DEFAULT_VALIDATE_REPEATS
    half_width: float = VALIDATION_HALF_WIDTH
    budget_share: float | None = DEFAULT_BUDGET_SHARE


def analyze_in_llama_server(
    setup: ServerSetup,
    prompts: Sequence[ServerPrompt],
    drafters: Sequence[ServerDrafter],
    *,
    n_predict: int,
    calibration_prompts: int,
    validate: bool,
    validation: ValidationAsk = ValidationAsk(),
    say: Progress = lambda line: None,
    attempt: Attempt | None = None,
    long_prompts: str = LEAVE_OUT,
    prior: PriorFit | None = None,
) -> ServerAnalysis:
    """Generate, replay, calibrate, predict and (when ``validate``) validate as ``validation`` asks (the module
    docstring): at most ``calibration_prompts`` prompts, spanning the workload, fit the cost; validation takes
    the others as :func:`_validate` says. ``attempt``: what an earlier attempt made (kept, not made again) and
    whom to tell what this one makes (a queued analysis stores it, so that a resume keeps it). Prompts whose
    tokens and ``n_predict`` do not fit the context are counted before anything is generated and left out
    (``long_prompts`` :data:`LEAVE_OUT`, named in the analysis) or refused all at once with
    :class:`PromptTooLong` (:data:`REFUSE`). ``prior``: an earlier analysis' fit on this setup, reused where it
    holds on this workload's first prompts."""
    _check_ask(setup, prompts, drafters)
    attempt = attempt or Attempt()
    started = time.perf_counter()
    calibration_prompts = max(1, min(calibration_prompts, len(prompts)))
    eta = _time_left(prompts, len(drafters), calibration_prompts, validate, validation, attempt)
    say = _told(say, eta)
    servers = [setup.server(None)] + [setup.server(d) for d in drafters]
    with _serving(servers):
        outcomes, plain_seconds, long = generate(
            servers[0], prompts, n_predict, say, setup.n_ctx, attempt.generated, attempt.on_generated,
            long_prompts,
        )  # fmt: skip
        replay_settings(setup, outcomes, drafters, n_predict, say)
        history = ServerHistory(n_predict, setup.n_ctx)
        pass_log = PassLog(history, attempt.passes, attempt.on_pass)
        if attempt.passes:
            say(f"kept {len(attempt.passes)} passes through the servers of an earlier attempt")
        calibration = _calibrated(
            servers, outcomes, history, say, pass_log, eta, at_most=calibration_prompts,
            started_here=setup.urls is None, prior=prior,
        )  # fmt: skip
        drafters = [d for d in drafters if d.label not in calibration.left_out]
        analysed = time.perf_counter()
        held_out = [o for o in outcomes if not o.calibration]
        plan = (
            _validate(servers, outcomes, held_out, history, calibration.costs, validation, say, pass_log, eta)
            if validate and held_out
            else None
        )
    noise = measured_noise(outcomes)
    withheld = calibration.withheld or ("; ".join(noise.notes) if noise.verdict == "noisy" else None)
    return ServerAnalysis(
        list(drafters), outcomes, calibration.costs, n_predict, setup.threads, analysed - started, plain_seconds,
        len(calibration.chosen), time.perf_counter() - analysed, setup.n_ctx, noise, withheld,
        plan.passes if plan is not None else 0, calibration.bound, calibration.left_out,
        [p.as_json() for p in long], plan.as_json() if plan is not None else None, calibration.why,
        pass_log.order, calibration.reused_from,
    )  # fmt: skip


@contextlib.contextmanager
def _serving(servers: Sequence[Server]) -> Iterator[None]:
    """Every server started (llama-server processes, or the user's servers checked) and, however the block
    ends, stopped."""
    try:
        for server in servers:
            server.start()
        yield
    finally:
        for server in servers:
            server.stop()


def _check_ask(
    setup: ServerSetup, prompts: Sequence[ServerPrompt], drafters: Sequence[ServerDrafter]
) -> None:
    """Refuse an analysis that cannot start: no prompt or no drafter, or a draft model's setting without one."""
    if not prompts or not drafters:
        raise ServerAnalysisError("an analysis needs at least one prompt and one drafter")
    if setup.draft_model is None and any(d.needs_draft_model for d in drafters):
        raise ServerAnalysisError("a draft-simple setting needs the draft model (its GGUF file)")


def _calibrated(
    servers: list[Server],
    outcomes: list[PromptOutcome],
    history: ServerHistory,
    say: Progress,
    pass_log: PassLog,
    eta: TimeLeft,
    *,
    at_most: int,
    started_here: bool,
    prior: PriorFit | None,
) -> Calibration:
    """Calibration (:func:`calibrate`, its step told in progress with its share of the estimate), then every
    setting's predicted speedup on every prompt from the costs it fitted; its outcome."""
    first = min(MIN_CALIBRATION, at_most)
    eta.start("calibration", first)
    say(
        f"calibrating: {first} prompts that span the workload, then one at a time until the fit holds (at most "
        f"{at_most}), each run on the plain server twice and on {len(servers) - 1} settings' servers"
    )
    calibration = calibrate(
        servers, outcomes, history, say, pass_log, at_most=at_most, started_here=started_here, prior=prior
    )
    for outcome in outcomes:
        for setting in outcome.settings:
            setting.predicted_speedup = calibration.costs[setting.drafter.family].speedup(setting.replay)
    return calibration


def _time_left(
    prompts: Sequence[ServerPrompt],
    settings: int,
    calibration_prompts: int,
    validate: bool,
    validation: ValidationAsk,
    attempt: Attempt,
) -> TimeLeft:
    """The analysis' phases for its progress lines (:class:`analyzer.measuring.time_left.TimeLeft`), in
    prompt generations: generation first (the prompts an earlier attempt did not generate), then calibration
    (its first prompts, each a pass of two plain runs and one per setting), then validation (its budget's share
    of the generation, or one pass over every held-out prompt per repeat where it has no budget)."""
    runs = 2 + settings
    later = {"calibration": float(min(MIN_CALIBRATION, calibration_prompts) * runs)}
    if validate:
        held_out = len(prompts) - calibration_prompts
        share = validation.budget_share
        later["validation"] = (
            share * len(prompts) if share is not None else held_out * runs * validation.repeats
        )
    eta = TimeLeft(later=later)
    eta.start("generation", sum(1 for p in prompts if p.key not in attempt.generated))
    return eta


def _told(say: Progress, eta: TimeLeft) -> Progress:
    """``say`` with the time left at the end of each step's line (a prompt generated, calibrated or
    validated); a generated or calibrated prompt is a step of its phase (validation counts its own)."""

    def told(line: str) -> None:
        if line.startswith(("generated ", "calibrated ")):
            eta.step()
        say(line + eta.words() if line.startswith(("generated ", "calibrated ", "validated ")) else line)

    return told


def _server_seconds(completion: Completion) -> float:
    """The seconds a completion took the server: its prompt and its generated tokens (the one basis of the
    validation budget, its estimates and its spending)."""
    return (completion.predicted_ms + float(completion.timings.get("prompt_ms", 0.0))) / 1000.0


def _pass_seconds(outcome: PromptOutcome) -> float:
    """One validation pass of ``outcome`` estimated from its plain generation: two plain runs and one run per
    setting, each reading the prompt and generating (a setting's generation at its predicted speedup); what
    the budget checks before it runs the pass."""
    completion = outcome.plain.completion
    prompt_s = float(completion.timings.get("prompt_ms", 0.0)) / 1000.0
    decode_s = completion.predicted_ms / 1000.0
    speedups = [max(s.predicted_speedup or 1.0, 0.1) for s in outcome.settings]
    return prompt_s * (2 + len(speedups)) + decode_s * (2.0 + sum(1.0 / v for v in speedups))


def _validate(
    servers: Sequence[Server],
    outcomes: Sequence[PromptOutcome],
    held_out: Sequence[PromptOutcome],
    history: ServerHistory,
    costs: dict[str, ServerCost],
    validation: ValidationAsk,
    say: Progress,
    pass_log: PassLog,
    eta: TimeLeft,
) -> ValidationPlan:
    """Validate the held-out prompts with the stopping rule of
    :func:`analyzer.measuring.validation_plan.run_validation`: in :func:`validation_order` (across tasks and
    predicted speedups), one prompt at a time, until every setting's aggregate interval from run noise (the
    noise of every pass so far) is within ``validation.half_width`` or the next pass would overrun the budget,
    ``validation.budget_share`` of the plain generation of every prompt (None: every held-out prompt, up to
    ``validation.repeats`` passes)."""
    generation_s = sum(_server_seconds(o.plain.completion) for o in outcomes)
    share = validation.budget_share
    budget_s = float("inf") if share is None else share * generation_s
    predicted = np.array([[s.predicted_speedup or 1.0 for s in o.settings] for o in held_out])
    order = validation_order([o.prompt.task for o in held_out], predicted)
    taken: list[int] = []
    eta.start("validation", len(held_out) * validation.repeats, budget_s=None if share is None else budget_s)
    say(
        f"validating {len(held_out)} held-out prompts in turn across tasks and predicted speedups, until every "
        f"setting's aggregate is within ±{validation.half_width:.1%}"
        + (
            f" or the budget of {budget_s:.0f} s ({share:.0%} of the plain generation) is spent"
            if share
            else ""
        )
    )

    def validate(index: int, number: int) -> float:
        outcome = held_out[index]
        kept = pass_log.run(servers, outcome, history, "validation", number)
        if number == 1:
            taken.append(index)
        position = len(taken) if number == 1 else taken.index(index) + 1
        runs = [*outcome.plain_pairs[-1], *(s.trials[-1].measured for s in outcome.settings)]
        seconds = sum(_server_seconds(r.completion) for r in runs)
        eta.step(spent_s=seconds)
        of = f", pass {number}/{validation.repeats}" if validation.repeats > 1 else ""
        say(f"validated {position}/{len(held_out)} ({outcome.prompt.key}){of}{' (kept)' if kept else ''}")
        return seconds

    plan = run_validation(
        order, lambda index: _pass_seconds(held_out[index]), validate,
        lambda: _widest(outcomes, [held_out[i] for i in taken], costs),
        budget_s=budget_s, target=validation.half_width, passes=validation.repeats,
    )  # fmt: skip
    say(f"validation: {plan.why}")
    return plan


def _widest(
    outcomes: Sequence[PromptOutcome], checked: Sequence[PromptOutcome], costs: dict[str, ServerCost]
) -> float | None:
    """The widest aggregate interval of any setting over the ``checked`` prompts, from the run noise of every
    pass so far over ``outcomes``; None before there is any."""
    run_error = measured_noise(outcomes).run_error
    if run_error is None or not checked:
        return None
    widths = [
        aggregate_noise(costs[setting.drafter.family], [o.settings[k] for o in checked], run_error)
        for k, setting in enumerate(checked[0].settings)
    ]
    return max((w for w in widths if w is not None), default=None)
