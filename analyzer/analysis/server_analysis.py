"""An analysis in llama-server: one greedy generation per prompt from a plain server, llama-server's
drafting rules replayed on it for every drafter setting, step costs with the context in them fitted from the
servers' own ``timings`` on calibration prompts chosen to span the workload, the machine's own noise measured,
the predicted speedup of every setting per prompt and per task, the best setting per task (or off), and,
when asked, validation through the servers themselves.

Calibration: the prompts that fit the cost are chosen after the replay, to span the workload's context
lengths and draft rates (:func:`analyzer.measuring.calibration_choice.spanning_choice`), not the first N.
Each calibration and validation pass runs a prompt on the plain server, on every setting's server, and on the
plain server again: the two plain runs bracket the settings' (each setting's measured speedup is over their
mean) and are a pair of identical runs, from which :func:`analyzer.measuring.noise.noise_floor` measures the
machine's run-to-run noise. The fit (:mod:`analyzer.pricing.context_cost`) is checked on prompts it was not
fitted on; a fit whose held-out error exceeds its bound is measured again once, and if it still fails, or the
machine is too noisy, the analysis is kept but its advice is withheld (every task off) and ``withheld`` says
why, with the numbers.

Validation takes a sample of the held-out prompts, across tasks and predicted speedups, that its budget
pays for (:mod:`analyzer.measuring.validation_plan`: by default passes costing half the plain generation),
and repeats the passes over it, interleaved, until each setting's time-weighted speedup has a 95% interval
from run noise of at most :data:`VALIDATION_HALF_WIDTH` (at most the repeats asked, and what the budget pays
for). It reports predicted against measured speedup (from ``timings``), and whether the server's own
``draft_n`` / ``draft_n_accepted`` equal the replay's: that must hold wherever the speculative output equals
plain greedy output (the exactness test). Every server request also records how much CPU other processes took
meanwhile, and the hypervisor's steal; a request over
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

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analyzer.analysis.server_calibration import (
    FALLBACK_RUN_ERROR,
    calibrate,
    calibration_choice,
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
)
from analyzer.analysis.server_passes import Attempt, PassLog, ServerHistory, served_replay, validate_held_out
from analyzer.analysis.server_replay import replay_settings
from analyzer.measuring.noise import repeats_for_aggregate
from analyzer.measuring.server_drafting import ServerDrafter
from analyzer.measuring.validation_plan import DEFAULT_BUDGET_SHARE, ValidationPlan, plan_validation
from analyzer.run_params import DEFAULT_MARGIN, LEAVE_OUT

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
VALIDATION_HALF_WIDTH = 0.015  # validation repeats until run noise leaves each setting's speedup this close
DEFAULT_VALIDATE_REPEATS = 3  # ... or this many passes over the validated prompts


@dataclass(frozen=True)
class ValidationAsk:
    """What validation is asked for: passes until run noise leaves each setting's aggregate within
    ``half_width`` (95%; 0: always ``repeats``), at most ``repeats``, over the sample of held-out prompts whose
    passes cost at most ``budget_share`` of the plain generation (None: every held-out prompt)."""

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
) -> ServerAnalysis:
    """Generate, replay, calibrate, predict and (when ``validate``) validate as ``validation`` asks; see the
    module docstring. ``calibration_prompts`` prompts, chosen to span the workload, fit the cost and are not
    validated; validation takes a sample of the others across tasks and predicted speedups whose passes cost at
    most ``validation.budget_share`` of the plain generation (at least
    :data:`~analyzer.measuring.validation_plan.MIN_VALIDATED`), and makes at most ``validation.repeats`` passes
    over it, fewer where run noise already leaves each setting's aggregate within ``validation.half_width``.
    ``attempt``: what an earlier attempt made (kept instead of made again) and whom to tell what this one makes
    (a queued analysis stores it, so that a resume keeps it). Prompts whose tokens and ``n_predict`` do not fit
    the context are counted before anything is generated and left out (``long_prompts`` :data:`LEAVE_OUT`,
    named in the analysis) or refused all at once with :class:`PromptTooLong` (:data:`REFUSE`)."""
    if not prompts or not drafters:
        raise ServerAnalysisError("an analysis needs at least one prompt and one drafter")
    if setup.draft_model is None and any(d.needs_draft_model for d in drafters):
        raise ServerAnalysisError("a draft-simple setting needs the draft model (its GGUF file)")
    attempt = attempt or Attempt()
    started = time.perf_counter()
    calibration_prompts = max(1, min(calibration_prompts, len(prompts)))
    servers = [setup.server(None)] + [setup.server(d) for d in drafters]
    try:
        for server in servers:
            server.start()
        outcomes, plain_seconds, long = generate(
            servers[0],
            prompts,
            n_predict,
            say,
            setup.n_ctx,
            attempt.generated,
            attempt.on_generated,
            long_prompts,
        )
        replay_settings(setup, outcomes, drafters, n_predict, say)
        chosen = calibration_choice(outcomes, calibration_prompts)
        for outcome in chosen:
            outcome.calibration = True
        history = ServerHistory(n_predict, setup.n_ctx)
        pass_log = PassLog(history, attempt.passes, attempt.on_pass)
        if attempt.passes:
            say(f"kept {len(attempt.passes)} passes through the servers of an earlier attempt")
        calibration = calibrate(
            servers, outcomes, chosen, history, say, pass_log, started_here=setup.urls is None
        )
        drafters = [d for d in drafters if d.label not in calibration.left_out]
        for outcome in outcomes:
            for setting in outcome.settings:
                setting.predicted_speedup = calibration.costs[setting.drafter.family].speedup(setting.replay)
        analysed = time.perf_counter()
        held_out = [o for o in outcomes if not o.calibration]
        repeats, plan = 0, None
        if validate and held_out:
            plan = _validation_plan(outcomes, held_out, validation.budget_share)
            sample = [held_out[i] for i in plan.chosen]
            say(f"validating {plan.why}")
            run_error = calibration.noise.run_error or FALLBACK_RUN_ERROR
            weights = [o.plain.completion.predicted_ms for o in sample]
            repeats = repeats_for_aggregate(
                run_error, weights, validation.half_width, at_most=validation.repeats
            )
            if plan.estimated_s > 0 and plan.budget_s < float("inf"):  # the budget pays for whole passes only
                repeats = max(1, min(repeats, int(plan.budget_s // plan.estimated_s)))
            validate_held_out(servers, sample, history, repeats, say, pass_log)
    finally:
        for server in servers:
            server.stop()
    noise = measured_noise(outcomes)
    withheld = calibration.withheld or ("; ".join(noise.notes) if noise.verdict == "noisy" else None)
    return ServerAnalysis(
        list(drafters), outcomes, calibration.costs, n_predict, setup.threads, analysed - started, plain_seconds,
        len(chosen), time.perf_counter() - analysed, setup.n_ctx, noise, withheld, repeats, calibration.passes,
        calibration.bound, calibration.left_out, [p.as_json() for p in long],
        plan.as_json() if plan is not None else None,
    )  # fmt: skip


def _pass_seconds(outcome: PromptOutcome) -> float:
    """One validation pass of ``outcome`` estimated from its plain generation: two plain runs and one run per
    setting at its predicted speedup."""
    plain_s = outcome.plain.completion.predicted_ms / 1000.0
    return plain_s * (2.0 + sum(1.0 / max(s.predicted_speedup or 1.0, 0.1) for s in outcome.settings))


def _validation_plan(
    outcomes: Sequence[PromptOutcome], held_out: Sequence[PromptOutcome], budget_share: float | None
) -> ValidationPlan:
    """The held-out prompts validation takes (:func:`analyzer.measuring.validation_plan.plan_validation`):
    across tasks and predicted speedups, while one pass over them costs at most ``budget_share`` of the plain
    generation of every prompt (None: every held-out prompt)."""
    generation_s = sum(o.plain.completion.predicted_ms for o in outcomes) / 1000.0
    budget_s = float("inf") if budget_share is None else budget_share * generation_s
    predicted = np.array([[s.predicted_speedup or 1.0 for s in o.settings] for o in held_out])
    return plan_validation(
        [o.prompt.task for o in held_out], predicted, [_pass_seconds(o) for o in held_out], budget_s
    )
