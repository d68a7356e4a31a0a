"""A run's validation step: real speculative decoding in the run's engine (and cost mode) beside plain
greedy, on a sample of its prompts drawn across tasks, each timed while the machine's other processes
are watched, so that a validation disturbed by them is measured again or marked (``others_cpu``)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from analyzer.analysis.run_records import validation_sample
from analyzer.db import lock_for_write
from analyzer.engine.engine_base import LoadedPair
from analyzer.orm import AnalysisRun, PromptResult, ValidationResult
from analyzer.progress import ProgressCallback
from analyzer.run_params import RunParams

if TYPE_CHECKING:
    from analyzer.advice.summary import AnalysisSummary, PromptSummary


def validate_run(
    session_factory: sessionmaker,
    run_id: int,
    loaded_models: LoadedPair,
    params: RunParams,
    progress: ProgressCallback | None,
    *,
    quiet_wait_s: float = 0.0,
) -> None:
    """Run real speculative decoding in the run's engine at each validated prompt's task g* beside
    plain greedy, on a sample drawn across tasks (:func:`validation_sample`), from the prompt ids the
    run measured (stored with each result). It first waits for a quiet machine (up to
    ``quiet_wait_s`` seconds in all, :func:`analyzer.measuring.interference.wait_for_quiet`); a prompt
    validated while other processes used more than MAX_OTHERS_CPU of the machine is validated
    again after another wait (while the budget lasts), and the less disturbed measurement is kept
    with its share (``others_cpu``), so that the report can mark it."""
    from analyzer.measuring.interference import wait_for_quiet
    from analyzer.measuring.noise import machine_sample, steal_share

    summary, validated, stored = _stored_for_validation(session_factory, run_id)
    already = [p for p in summary.prompts if p.prompt_id in validated]
    chosen = validation_sample(summary, params.validate, already=already)
    deadline = time.monotonic() + quiet_wait_s
    if chosen:
        wait_for_quiet(quiet_wait_s, progress, what="validating")
    for number, prompt in enumerate(chosen, start=1):
        if progress:
            progress(number - 1, len(chosen), "validating with real speculative decoding")
        gamma = summary.tasks[prompt.task].best_gamma or prompt.best_gamma or 1
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
    if progress and chosen:
        progress(len(chosen), len(chosen), "validating with real speculative decoding")


def _stored_for_validation(
    session_factory: sessionmaker, run_id: int
) -> tuple[AnalysisSummary, set[int], dict[int, tuple[list[int], list[int] | None]]]:
    """The run's summary (stored now), the prompts already validated, and each result's stored
    (prompt token ids, output token ids) by prompt id."""
    from analyzer.advice.summary_store import store_summary

    with session_factory() as session, session.begin():  # stored: finishing adds the validations to it
        lock_for_write(session)
        summary = store_summary(session, session.get(AnalysisRun, run_id))
        validated = set(
            session.scalars(select(ValidationResult.prompt_id).where(ValidationResult.run_id == run_id))
        )
        stored = {
            pid: (prompt_ids, output)
            for pid, prompt_ids, output in session.execute(
                select(
                    PromptResult.prompt_id, PromptResult.prompt_token_ids, PromptResult.output_token_ids
                ).where(PromptResult.run_id == run_id)
            )
        }
    return summary, validated, stored


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
