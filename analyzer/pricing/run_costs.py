"""The cost profiles a run predicts speedups with: for each batch size of the run, the newest stored
profile of its pair on its device in its dtype that covers k <= gamma_max + 1 and was not judged
noisy, or one measured now on a prompt of median length (with the generation machinery's overhead) and,
where the workload's contexts spread, again over its longest request's, for how each step's time grows with
the context (each prompt is then priced at its own lengths); linked to the run."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from analyzer.db import lock_for_write
from analyzer.engine.engine_base import LoadedPair, ProfilingPlan
from analyzer.measuring.interference import EXTRA_ROUNDS
from analyzer.orm import AnalysisRun, CostProfile, RunCostProfile
from analyzer.pricing.context_cost import MIN_CONTEXT_SPREAD
from analyzer.progress import ProgressCallback
from analyzer.run_params import RunParams

if TYPE_CHECKING:
    from analyzer.engine.overhead import MachineryOverhead
    from analyzer.measuring.cost import CostMeasurement

# a run without prompts is profiled over a context of this many pad tokens
FALLBACK_CONTEXT_TOKENS = 32
# neighbouring batch sizes' T_t(1) may differ by this much the wrong way before one is re-measured
# (a smaller batch slower than a larger one; on a GPU, where small batches read the same weights, either way)
MAX_BATCH_STEP_CHANGE = 0.25
# the timed passes each timed model makes while profiling, after its pair's warmup_passes() (the defaults
# of analyzer.measuring.cost.profile_costs and analyzer.engine.llamacpp_cost.profile_llamacpp_costs): the
# progress bar plans these per model, and re-measurements of noisy points add passes beyond them
TIMED_REPEATS = 5


def profile_run_costs(
    session_factory: sessionmaker,
    run_id: int,
    loaded_models: LoadedPair,
    params: RunParams,
    prompt_ids: list[list[int]],
    progress: ProgressCallback | None,
    *,
    quiet_wait_s: float = 0.0,
) -> int:
    """For each batch size of the run, reuse the newest cost profile of this pair on this device in
    this dtype at that batch size covering k <= gamma_max + 1 and the plan's ``verify_up_to`` (unless
    ``reprofile``; never one judged
    noisy: it is passed over, and progress says so), or measure one on the prompt of median length
    among ``prompt_ids`` (the run's prompts, already tokenized); link them to the run and return the
    smallest batch size's id. The machinery overhead is measured once (at batch 1) for the profiles
    measured now. Profiles are the run's engine's: measured by it (``loaded_models``), reused only
    from it. Before measuring, it waits up to ``quiet_wait_s`` seconds for a quiet machine
    (:func:`analyzer.measuring.interference.wait_for_quiet`, shown in progress); a wait that gave up is noted
    on the profiles measured."""
    plan = loaded_models.profiling_plan(params)
    k_max = max(params.gamma_max + 1, plan.verify_up_to)
    context = _profiling_context(prompt_ids, loaded_models.pad_id)
    long_context = _long_context(prompt_ids, len(context), params.max_new_tokens, k_max)
    chosen, passed_over = _linked_or_reusable_profiles(
        session_factory,
        run_id,
        loaded_models,
        plan,
        k_max,
        reuse=not params.reprofile,
        with_slopes=long_context is not None,
    )
    missing = [b for b in plan.batch_sizes if b not in chosen]
    for note in passed_over:
        if progress:
            progress(0, 0, note)
    if missing:
        overhead = _overhead_after_quiet_wait(loaded_models, context, params, plan, progress, quiet_wait_s)
        measured = _measured_with_slopes(loaded_models, context, long_context, k_max, missing, plan, progress)
        if 1 in measured and overhead.forward_s:  # generate()'s own forwards were timed at batch 1
            from analyzer.measuring.cost import calibrated_to_generate

            measured[1] = calibrated_to_generate(
                measured[1], overhead.forward_s, len(context) + overhead.new_tokens / 2
            )
        for batch_size, measurement in measured.items():
            chosen[batch_size] = _store_cost_profile(
                session_factory, run_id, loaded_models, plan, batch_size, measurement, overhead
            )
            if progress and measurement.quality and measurement.quality.verdict != "clean":
                progress(
                    0,
                    0,
                    f"cost profile at batch size {batch_size}: {measurement.quality.verdict} — "
                    + "; ".join(measurement.quality.notes),
                )
    return _link_profiles_to_run(session_factory, run_id, chosen)


def _measured_with_slopes(
    loaded_models: LoadedPair,
    context: list[int],
    long_context: list[int] | None,
    k_max: int,
    missing: list[int],
    plan: ProfilingPlan,
    progress: ProgressCallback | None,
) -> dict[int, CostMeasurement]:
    """The profiles of the ``missing`` batch sizes measured over ``context``, each with its context slopes from
    a second measurement over ``long_context`` where there is one."""
    measured = _measured_batch_profiles(loaded_models, context, k_max, missing, plan, progress)
    if long_context is None:
        return measured
    from analyzer.measuring.cost import with_context_slopes

    at = f"{len(long_context)} tokens of context"
    far = _measured_batch_profiles(loaded_models, long_context, k_max, missing, plan, progress, at=at)
    return {b: with_context_slopes(m, far[b]) for b, m in measured.items()}


def _overhead_after_quiet_wait(
    loaded_models: LoadedPair,
    context: list[int],
    params: RunParams,
    plan: ProfilingPlan,
    progress: ProgressCallback | None,
    quiet_wait_s: float,
) -> MachineryOverhead:
    """The machinery overhead, measured after waiting up to ``quiet_wait_s`` for a quiet machine (a
    wait that gave up is noted in progress and on the overhead)."""
    from analyzer.measuring.interference import wait_for_quiet

    waited = wait_for_quiet(quiet_wait_s, progress, what="profiling")
    if waited.note and progress:
        progress(0, 0, waited.note)
    overhead = _measure_overhead(loaded_models, context, params, plan, progress)
    if waited.note:
        overhead = replace(overhead, busy="; ".join(filter(None, [waited.note, overhead.busy])))
    return overhead


def _measured_batch_profiles(
    loaded_models: LoadedPair,
    context: list[int],
    k_max: int,
    missing: list[int],
    plan: ProfilingPlan,
    progress: ProgressCallback | None,
    *,
    at: str = "",
) -> dict[int, CostMeasurement]:
    """The cost measurement at each batch size of ``missing`` over a cache of ``context`` (``at`` names it
    in progress where it is not the median prompt); a batch size whose T_t(1) is implausible next to its
    neighbour's is measured again once, and a pair still implausible is judged noisy."""
    measured: dict[int, CostMeasurement] = {}
    over = f", over {at}" if at else ""
    for number, batch_size in enumerate(missing, start=1):
        phase = (
            f"profiling the cost of drafting and verifying at batch size {batch_size} "
            f"({number} of {len(missing)}){over} on {plan.where}"
        )
        measured[batch_size] = _measure_cost_profile(
            loaded_models, context, k_max, batch_size, phase, progress, plan.cost_mode
        )
    on_gpu = plan.device.startswith("cuda")
    for smaller, larger in implausible_batch_steps(measured, on_gpu=on_gpu):  # measured again, once
        phase = (
            f"profiling the cost at batch size {smaller} again: its T_t(1) is implausible next to "
            f"batch size {larger}'s, on {plan.where}"
        )
        measured[smaller] = _measure_cost_profile(
            loaded_models, context, k_max, smaller, phase, progress, plan.cost_mode
        )
    for smaller, larger in implausible_batch_steps(measured, on_gpu=on_gpu):
        note = _batch_note(measured, smaller, larger)
        for batch in (smaller, larger):
            measured[batch] = _judged_noisy(measured[batch], note)
    return measured


def implausible_batch_steps(measured: dict[int, CostMeasurement], *, on_gpu: bool) -> list[tuple[int, int]]:
    """The neighbouring batch sizes (smaller, larger) among ``measured`` whose T_t(1) cannot both be
    right: the smaller batch's step more than MAX_BATCH_STEP_CHANGE slower than the larger one's (a
    larger batch does more work; on one GPU a cold start once gave 24.8 ms at batch 1 against 16.9 ms
    at batch 4), or, on a GPU, where small batches all read the same weights, the larger one's more
    than that slower too (beyond MIN_SPREAD_S of timer jitter)."""
    from analyzer.measuring import interference  # its jitter allowance, read when called

    batches = sorted(measured)
    pairs = []
    for smaller, larger in zip(batches, batches[1:]):
        t_small, t_large = measured[smaller].target_forward_s[0], measured[larger].target_forward_s[0]
        bound = 1 + MAX_BATCH_STEP_CHANGE
        jitter = interference.MIN_SPREAD_S
        if t_small > bound * t_large + jitter or (on_gpu and t_large > bound * t_small + jitter):
            pairs.append((smaller, larger))
    return pairs


def _batch_note(measured: dict[int, CostMeasurement], smaller: int, larger: int) -> str:
    return (
        f"T_t(1) = {measured[smaller].target_forward_s[0] * 1000:.1f} ms at batch size {smaller} against "
        f"{measured[larger].target_forward_s[0] * 1000:.1f} ms at batch size {larger}, after measuring again: "
        f"physically implausible (more than {MAX_BATCH_STEP_CHANGE:.0%} apart the wrong way)"
    )


def _judged_noisy(measurement: CostMeasurement, note: str) -> CostMeasurement:
    """``measurement`` judged noisy with ``note`` added (never reused; its run's advice withheld)."""
    from analyzer.measuring.interference import TimingQuality

    quality = measurement.quality or TimingQuality()
    return replace(measurement, quality=replace(quality, verdict="noisy", notes=[*quality.notes, note]))


def _measure_overhead(
    loaded_models: LoadedPair,
    context: list[int],
    params: RunParams,
    plan: ProfilingPlan,
    progress: ProgressCallback | None,
) -> MachineryOverhead:
    """The machinery overhead, telling ``progress`` of every timed generation (2 x OVERHEAD_REPEATS
    per attempt; an attempt the busy machine spoilt is shown as such and counted afresh)."""
    from analyzer.engine.overhead import (
        OVERHEAD_REPEATS,  # a torch module: loaded when measuring, not with this one
    )

    phase = f"profiling the machinery overhead of {plan.machinery} on {plan.where}"
    planned = 2 * OVERHEAD_REPEATS
    done = {"attempt": 1, "generations": 0}

    def tick(attempt: int) -> None:
        if attempt != done["attempt"]:
            done["attempt"], done["generations"] = attempt, 0
        done["generations"] += 1
        if progress:
            again = f" again (attempt {attempt}: the machine was busy)" if attempt > 1 else ""
            progress(min(done["generations"], planned), planned, phase + again)

    if progress:
        progress(0, planned, phase)
    return loaded_models.measure_overhead(context, params, tick)


def _linked_or_reusable_profiles(
    session_factory: sessionmaker,
    run_id: int,
    loaded_models: LoadedPair,
    plan: ProfilingPlan,
    k_max: int,
    *,
    reuse: bool,
    with_slopes: bool = False,
) -> tuple[dict[int, int], list[str]]:
    """The profile ids already linked to the run (a resumed run keeps its profiles) and, with
    ``reuse``, the newest stored one for each other batch size (:func:`_newest_reusable_profile`; one
    with context slopes where ``with_slopes``: the workload's contexts spread), by batch size; and the
    notes on stored profiles passed over as noisy."""
    chosen: dict[int, int] = {}
    passed_over: list[str] = []
    with session_factory() as session, session.begin():
        lock_for_write(session)
        run = session.get(AnalysisRun, run_id)
        for link in run.batch_profiles:
            chosen[link.batch_size] = link.cost_profile_id
        if reuse:
            for batch_size in plan.batch_sizes:
                if batch_size in chosen:
                    continue
                profile_id = _newest_reusable_profile(
                    session, run, loaded_models.engine, plan, batch_size, k_max, passed_over, with_slopes
                )
                if profile_id is not None:
                    chosen[batch_size] = profile_id
    return chosen, passed_over


def _newest_reusable_profile(
    session: Session,
    run: AnalysisRun,
    engine: str,
    plan: ProfilingPlan,
    batch_size: int,
    k_max: int,
    passed_over: list[str],
    with_slopes: bool = False,
) -> int | None:
    """The id of the newest stored profile of the run's pair in ``engine`` on the plan's device and
    dtype, in its cost mode, at ``batch_size`` that covers ``k_max``, has context slopes where
    ``with_slopes``, and was not judged noisy (each noisy one passed over adds a note to ``passed_over``);
    None when there is none."""
    for profile in session.scalars(
        select(CostProfile)
        .where(
            CostProfile.pair_id == run.pair_id,
            CostProfile.device == plan.device,
            CostProfile.dtype == plan.dtype,
            CostProfile.batch_size == batch_size,
            CostProfile.priced_by == engine,
            CostProfile.measured_by == engine,
            CostProfile.source == "measured",
            CostProfile.cost_mode.is_(None)
            if plan.cost_mode is None
            else CostProfile.cost_mode == plan.cost_mode,
        )
        .order_by(CostProfile.id.desc())
    ):
        if len(profile.target_forward_s) < k_max or (with_slopes and profile.context_slope_s is None):
            continue
        if profile.quality == "noisy":
            passed_over.append(
                f"stored cost profile {profile.id} (batch {batch_size}) was judged noisy "
                f"({'; '.join(profile.quality_notes or [])}); not reused"
            )
            continue
        return profile.id
    return None


def _long_context(
    prompt_ids: list[list[int]], median_tokens: int, max_new_tokens: int, k_max: int
) -> list[int] | None:
    """The second context profiles are measured over: the longest request's mean context (its prompt plus
    half its new tokens, less the widest forward, so that the cache fits where the prompt was cut to the
    model's limit), the longest prompt's ids repeated; None where that is under MIN_CONTEXT_SPREAD times
    the median prompt (one context then prices the workload)."""
    longest = max(prompt_ids, key=len, default=[])
    if not longest:
        return None
    length = len(longest) + max(0, max_new_tokens // 2 - k_max)
    if length < MIN_CONTEXT_SPREAD * max(median_tokens, 1):
        return None
    return [longest[i % len(longest)] for i in range(length)]


def _profiling_context(prompt_ids: list[list[int]], pad_id: int) -> list[int]:
    """The context profiles are measured over: the prompt of median length (pad tokens without prompts)."""
    encoded = sorted(prompt_ids, key=len)
    return list(encoded[len(encoded) // 2] if encoded else [pad_id] * FALLBACK_CONTEXT_TOKENS)


def _measure_cost_profile(
    loaded_models: LoadedPair,
    context: list[int],
    k_max: int,
    batch_size: int,
    phase: str,
    progress: ProgressCallback | None,
    cost_mode: str | None,
) -> CostMeasurement:
    """The engine's cost measurement at ``batch_size`` (in ``cost_mode``), telling ``progress`` of every
    timed pass under ``phase``: planned, each timed model's warm-up and TIMED_REPEATS passes (the
    target's, then a draft model's); a model's passes beyond that re-measure what interference disturbed
    and go to a bar of their own."""
    per_model = loaded_models.warmup_passes() + TIMED_REPEATS
    timed_models = 2 if loaded_models.draft is not None else 1
    passes_planned = per_model * timed_models
    extra_planned = EXTRA_ROUNDS * TIMED_REPEATS * timed_models  # the most re-measurement can add
    extra_phase = f"{phase}: re-measuring what interference disturbed"
    done = [0, 0]  # passes of the target, of the draft model

    def counting(model: int):
        def tick() -> None:
            done[model] += 1
            if progress and done[model] <= per_model:
                progress(sum(min(d, per_model) for d in done), passes_planned, phase)
            elif progress:  # a bar of its own, whose total is the most there can be
                progress(
                    min(sum(max(0, d - per_model) for d in done), extra_planned), extra_planned, extra_phase
                )

        return tick

    if progress:
        progress(0, passes_planned, phase)
    measured = loaded_models.measure_costs(
        context, k_max, batch_size, counting(0), on_draft_repeat=counting(1), cost_mode=cost_mode
    )
    if progress and any(d > per_model for d in done):
        progress(extra_planned, extra_planned, extra_phase)
    return measured


def _store_cost_profile(
    session_factory: sessionmaker,
    run_id: int,
    loaded_models: LoadedPair,
    plan: ProfilingPlan,
    batch_size: int,
    measured: CostMeasurement,
    overhead: MachineryOverhead,
) -> int:
    """Store a profile measured now (the cost measurement with the machinery ``overhead``; judged
    noisy when the overhead was measured on a busy machine) for the run's pair, in the plan's dtype
    and cost mode; returns its id."""
    quality = measured.quality
    with session_factory() as session, session.begin():
        lock_for_write(session)
        run = session.get(AnalysisRun, run_id)
        profile = CostProfile(
            pair_id=run.pair_id,
            device=measured.device,
            dtype=plan.dtype,
            cost_mode=plan.cost_mode,
            priced_by=loaded_models.engine,
            measured_by=loaded_models.engine,
            batch_size=batch_size,
            threads=measured.threads,
            context_tokens=measured.context_tokens,
            repeats=measured.repeats,
            target_forward_s=list(measured.target_forward_s),
            draft_step_s=measured.draft_step_s,
            target_prefill_s=measured.target_prefill_s,
            draft_prefill_s=measured.draft_prefill_s,
            long_context_tokens=measured.long_context_tokens,
            context_slope_s=measured.context_slope_s,
            draft_context_slope_s=measured.draft_context_slope_s,
            generate_ratio=(
                {str(k): r for k, r in measured.generate_ratio.items()} if measured.generate_ratio else None
            ),
            round_overhead_s=overhead.round_s,
            decode_overhead_s=overhead.decode_s,
            target_forward_spread=quality.spread if quality else None,
            quality="noisy" if overhead.busy else quality.verdict if quality else None,
            quality_notes=([overhead.busy] if overhead.busy else []) + (quality.notes if quality else []),
            library_versions=loaded_models.library_versions(),
        )
        session.add(profile)
        session.flush()
        return profile.id


def _link_profiles_to_run(session_factory: sessionmaker, run_id: int, chosen: dict[int, int]) -> int:
    """Link each chosen profile (by batch size) to the run unless it already is, and make the smallest
    batch size's the run's profile; returns its id."""
    with session_factory() as session, session.begin():
        lock_for_write(session)
        run = session.get(AnalysisRun, run_id)
        linked = {link.batch_size for link in run.batch_profiles}
        for batch_size, profile_id in sorted(chosen.items()):
            if batch_size not in linked:
                run.batch_profiles.append(RunCostProfile(batch_size=batch_size, cost_profile_id=profile_id))
        run.cost_profile_id = chosen[min(chosen)]
        return run.cost_profile_id
