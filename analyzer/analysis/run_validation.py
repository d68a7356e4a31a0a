"""A run's validation step: real speculative decoding in the run's engine (and cost mode) beside plain
greedy, on a sample of its prompts drawn across tasks, each timed while the machine's other processes
are watched, so that a validation disturbed by them is measured again or marked (``others_cpu``)."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from analyzer.analysis.run_records import validation_sample
from analyzer.db import lock_for_write
from analyzer.engine.engine_base import LoadedPair
from analyzer.measuring.noise import noise_floor, sampled_half_width
from analyzer.measuring.time_left import TimeLeft
from analyzer.measuring.validation_plan import (
    DEFAULT_BUDGET_SHARE,
    DEFAULT_TARGET,
    MIN_VALIDATED,
    ValidationPlan,
    run_validation,
)
from analyzer.orm import AnalysisRun, PromptResult, ValidationResult
from analyzer.progress import ProgressCallback
from analyzer.run_params import RunParams

if TYPE_CHECKING:
    from analyzer.advice.summary import AnalysisSummary, PromptSummary
    from analyzer.measuring.validate import ValidationMeasurement

# each engine's greedy and speculative runs per validated prompt, until a pass says otherwise
ASSUMED_RUNS = 2.0


def validate_run(
    session_factory: sessionmaker,
    run_id: int,
    loaded_models: LoadedPair,
    params: RunParams,
    progress: ProgressCallback | None,
    *,
    quiet_wait_s: float = 0.0,
) -> ValidationPlan | None:
    """Run real speculative decoding in the run's engine at each validated prompt's task g* beside
    plain greedy, on a sample drawn across tasks (:func:`validation_sample`), from the prompt ids the
    run measured (stored with each result). The sample's prompts are taken one at a time by the stopping rule
    every engine's validation shares (:func:`analyzer.measuring.validation_plan.run_validation`): all
    ``params.validate`` of them with ``params.validate_all``, else until every measured aggregate is within
    :data:`DEFAULT_TARGET` (95%, from the run noise of the greedy pairs so far) or validation has cost
    :data:`DEFAULT_BUDGET_SHARE` of the run's plain generation (both counted in seconds of generating); the
    plan is stored with the run (``validation_plan``) and returned (None: nothing to validate). It first
    waits for a quiet machine (up to ``quiet_wait_s`` seconds in all,
    :func:`analyzer.measuring.interference.wait_for_quiet`); a prompt validated while other processes used
    more than MAX_OTHERS_CPU of the machine is validated again after another wait (while the budget lasts), and
    the less disturbed measurement is kept with its share (``others_cpu``), so that the report can mark it."""
    from analyzer.measuring.interference import wait_for_quiet

    summary, validated, stored, generated_s = _stored_for_validation(session_factory, run_id)
    already = [p for p in summary.prompts if p.prompt_id in validated]
    chosen = validation_sample(summary, params.validate, already=already)
    if not chosen:
        return None
    deadline = time.monotonic() + quiet_wait_s
    wait_for_quiet(quiet_wait_s, progress, what="validating")
    gammas = [summary.tasks[p.task].best_gamma or p.best_gamma or 1 for p in chosen]
    passes = _Passes.of(chosen, gammas, generated_s)
    every = params.validate_all
    budget_s = math.inf if every else DEFAULT_BUDGET_SHARE * sum(generated_s.values())
    # the time left in progress: the budget unspent, or (validating every one) the pace so far over the rest
    eta = TimeLeft(unit_s=sum(generated_s.values()) / max(len(generated_s), 1))
    eta.start("validation", len(chosen), budget_s=None if every else budget_s)

    def validate(index: int, number: int) -> float:
        if progress:
            progress(len(passes.done), len(chosen), f"validating with real speculative decoding{eta.words()}")
        measured = _validate_one(session_factory, run_id, loaded_models, params, chosen[index], gammas[index],
                                 stored, deadline, progress)  # fmt: skip
        seconds = passes.add(index, measured)
        eta.step(spent_s=seconds)
        return seconds

    plan = run_validation(
        range(len(chosen)), passes.estimate, validate, passes.widest, budget_s=budget_s,
        target=0.0 if every else DEFAULT_TARGET, passes=1, at_least=MIN_VALIDATED,
    )  # fmt: skip
    with session_factory() as session, session.begin():
        lock_for_write(session)
        run = session.get(AnalysisRun, run_id)
        assert run is not None  # the run being validated
        run.validation_plan = plan.as_json()
    if progress:
        progress(len(plan.chosen), len(plan.chosen), f"validated {plan.why}")
    return plan


@dataclass
class _Passes:
    """The prompts validated so far, each (index, seconds generating, greedy times, greedy time), and what the
    stopping rule asks of them: the next pass's estimate and the interval reached."""

    bases: list[float]  # per chosen prompt, its pass's generating at one run each (before any pass)
    done: list[tuple[int, float, list[float], float]] = field(default_factory=list)

    @classmethod
    def of(cls, chosen: list[PromptSummary], gammas: list[int], generated_s: dict[int, float]) -> _Passes:
        """One pass's generating, estimated before it runs: the prompt's plain generation and its speculative
        one at the predicted speedup (times the runs of each an engine makes: learned from the passes)."""
        return cls(
            [
                generated_s.get(p.prompt_id, 0.0) * (1.0 + 1.0 / max(_predicted_speedup(p, g), 0.1))
                for p, g in zip(chosen, gammas, strict=True)
            ]
        )

    def estimate(self, index: int) -> float:
        """The seconds prompt ``index``'s pass will take: its base times the runs per base the passes took."""
        taken = sum(self.bases[i] for i, *_ in self.done)
        runs = sum(seconds for _, seconds, *_ in self.done) / taken if taken > 0 else ASSUMED_RUNS
        return self.bases[index] * runs

    def add(self, index: int, measured: ValidationMeasurement) -> float:
        """Take prompt ``index``'s validation; the seconds it spent generating."""
        greedy = list(measured.greedy_times_s) or [measured.greedy_time_s]
        speculative = list(measured.speculative_times_s) or [measured.speculative_time_s]
        seconds = float(sum(greedy) + sum(speculative))
        self.done.append((index, seconds, greedy, float(measured.greedy_time_s)))
        return seconds

    def widest(self) -> float | None:
        """The widest half-width of the aggregates so far, from the run noise of the greedy pairs (None: no
        pair yet)."""
        pairs = [(a, b) for _, _, greedy, _ in self.done for a, b in zip(greedy, greedy[1:])]
        run_error = noise_floor([a for a, _ in pairs], [b for _, b in pairs]).run_error
        if run_error is None:
            return None
        done = self.done
        return sampled_half_width(run_error, [g for *_, g in done], [len(greedy) for _, _, greedy, _ in done])


def _validate_one(
    session_factory: sessionmaker,
    run_id: int,
    loaded_models: LoadedPair,
    params: RunParams,
    prompt: PromptSummary,
    gamma: int,
    stored: dict[int, tuple[list[int], list[int] | None]],
    deadline: float,
    progress: ProgressCallback | None,
):
    """Validate ``prompt`` at ``gamma`` (again after a wait where others disturbed it) and store the result;
    what the engine measured."""
    from analyzer.measuring.noise import machine_sample, steal_share

    prompt_ids, output_ids = stored[prompt.prompt_id]
    before = machine_sample()
    measured, others = _least_disturbed_validation(
        loaded_models, prompt_ids, params, gamma, deadline, progress
    )
    steal = steal_share(before, machine_sample())
    with session_factory() as session, session.begin():
        lock_for_write(session)
        session.add(
            ValidationResult(
                run_id=run_id,
                prompt_id=prompt.prompt_id,
                gamma=gamma,
                greedy_time_s=measured.greedy_time_s,
                speculative_time_s=measured.speculative_time_s,
                measured_speedup=measured.measured_speedup,
                predicted_speedup=_predicted_speedup(prompt, gamma),
                outputs_identical=measured.outputs_identical,
                target_forward_passes=measured.target_forward_passes,
                replayed_rounds=prompt.rounds.get(gamma),
                replay_identical=measured.speculative_ids == list(output_ids or []),
                others_cpu=others,
                greedy_times_s=list(measured.greedy_times_s) or None,
                speculative_times_s=list(measured.speculative_times_s) or None,
                steal_share=steal,
            )
        )
    return measured


def _stored_for_validation(
    session_factory: sessionmaker, run_id: int
) -> tuple[AnalysisSummary, set[int], dict[int, tuple[list[int], list[int] | None]], dict[int, float]]:
    """The run's summary (stored now), the prompts already validated, each result's stored (prompt token ids,
    output token ids) and the seconds its plain generation took (``target_time_s``), by prompt id."""
    from analyzer.advice.summary_store import store_summary

    with session_factory() as session, session.begin():  # stored: finishing adds the validations to it
        lock_for_write(session)
        summary = store_summary(session, session.get(AnalysisRun, run_id))
        validated = set(
            session.scalars(select(ValidationResult.prompt_id).where(ValidationResult.run_id == run_id))
        )
        rows = session.execute(
            select(
                PromptResult.prompt_id,
                PromptResult.prompt_token_ids,
                PromptResult.output_token_ids,
                PromptResult.target_time_s,
            ).where(PromptResult.run_id == run_id)
        ).all()
    stored = {pid: (prompt_ids, output) for pid, prompt_ids, output, _ in rows}
    return summary, validated, stored, {pid: float(seconds or 0.0) for pid, *_, seconds in rows}


def _least_disturbed_validation(
    loaded_models: LoadedPair,
    prompt_ids: list[int],
    params: RunParams,
    gamma: int,
    deadline: float,
    progress: ProgressCallback | None,
):
    """One prompt validated, and again after a wait for quiet when others used more than
    MAX_OTHERS_CPU and the wait budget (``deadline``) lasts; the less disturbed one and its share."""
    from analyzer.measuring.interference import MAX_OTHERS_CPU, wait_for_quiet

    measured, others = _validated_while_watching(loaded_models, prompt_ids, params, gamma)
    left = deadline - time.monotonic()
    if others is not None and others > MAX_OTHERS_CPU and left > 0:
        if wait_for_quiet(left, progress, what="validating again").quiet:
            again, others_again = _validated_while_watching(loaded_models, prompt_ids, params, gamma)
            if others_again is not None and others_again < others:
                measured, others = again, others_again
    return measured, others


def _predicted_speedup(prompt: PromptSummary, gamma: int) -> float:
    """The prompt's predicted S(gamma), which a validation is compared with."""
    predicted = prompt.speedup_curve[gamma - 1]
    if predicted is None:  # not finite: an empty output, whose S(g) is NaN, has nothing to compare
        raise ValueError(
            f"prompt {prompt.prompt_id} has no predicted speedup at gamma {gamma} (empty output?); "
            "it cannot be validated"
        )
    return float(predicted)


def _validated_while_watching(loaded_models: LoadedPair, prompt_ids, params: RunParams, gamma: int):
    """``loaded_models.validate`` of one prompt, and the share of the machine's CPU other processes
    used meanwhile (None where it cannot be read)."""
    from analyzer.measuring.interference import machine_reading, others_busy_s

    before, started = machine_reading(), time.perf_counter()
    measured = loaded_models.validate(list(prompt_ids), params, gamma)
    used = others_busy_s(before, machine_reading())
    elapsed = time.perf_counter() - started
    share = None if used is None or elapsed <= 0 else min(1.0, used / (elapsed * (os.cpu_count() or 1)))
    return measured, share
