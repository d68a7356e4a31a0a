"""Price stored acceptance with another cost profile, without measuring again: the "what if this engine
or this hardware" answer. The acceptance side of speculative decoding is engine-independent (the same
greedy tokens); the cost side is the engine's. A finished run is **re-priced** into a new run that
holds a copy of its per-prompt results (the match sequences and the counts for every gamma) and the
chosen profiles: S(g), g*, intervals and decisions follow from them, the report and the policies
work on it as on any run, and it points back at the run it came from (``repriced_from_run_id``).
Validations are not copied (they timed another engine). A new analysis can be priced with stored
profiles from the start (``specroute analyze --cost-profile ID``): :func:`link_pricing_profiles`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from analyzer.advice.summary import finite
from analyzer.db import utcnow
from analyzer.errors import SpecrouteError
from analyzer.orm import AnalysisRun, CostProfile, GammaCount, PromptResult, RunCostProfile
from analyzer.run_params import RunParams

SKIPPED_COLUMNS = {"id", "run_id", "created_at"}


class RepriceError(SpecrouteError, ValueError):
    """A run cannot be priced with these profiles; the message says why."""

    status, code = 400, "cannot_reprice"


def pricing_profiles(session: Session, profile_ids: Sequence[int], pair_id: int) -> list[CostProfile]:
    """The profiles ``profile_ids`` (smallest batch size first), checked: they exist, are of pair
    ``pair_id`` (a profile times one pair's models), of one engine, and of distinct batch sizes."""
    if not profile_ids:
        raise RepriceError("give at least one cost profile")
    profiles = []
    for profile_id in profile_ids:
        profile = session.get(CostProfile, profile_id)
        if profile is None:
            raise RepriceError(f"no cost profile {profile_id} ('specroute costs list' shows them)")
        if profile.pair_id != pair_id:
            raise RepriceError(
                f"cost profile {profile_id} times {_pair_text(profile.pair)}, not this run's pair; import the "
                "engine's times for this run's pair ('specroute costs import FILE --for-run RUN')"
            )
        profiles.append(profile)
    if len({p.priced_by for p in profiles}) > 1:
        raise RepriceError(
            "the cost profiles must come from one engine: "
            + ", ".join(sorted({p.priced_by for p in profiles}))
        )
    batches = [p.batch_size or 1 for p in profiles]
    if len(set(batches)) < len(batches):
        raise RepriceError(
            f"two cost profiles for one batch size ({sorted(batches)}): give one per batch size"
        )
    return sorted(profiles, key=lambda p: p.batch_size or 1)


def priced_gamma_max(profiles: Sequence[CostProfile], gamma_max: int) -> int:
    """The largest gamma the profiles can price (T_t(k) up to k = gamma + 1 in every one), at most
    ``gamma_max``; a RepriceError when they cannot price gamma 1."""
    covered = min(len(p.target_forward_s) for p in profiles) - 1
    if covered < 1:
        raise RepriceError("a cost profile needs T_t(1) and T_t(2) at least to price gamma 1")
    return min(gamma_max, covered)


def reprice_run(session: Session, run_id: int, profile_ids: Sequence[int]) -> AnalysisRun:
    """A new, finished run holding a copy of run ``run_id``'s results, priced with the profiles
    ``profile_ids`` (one per batch size, of the run's pair and one engine): its engine is theirs, its
    gamma_max the smaller of the run's and what the profiles cover. The caller commits."""
    run = session.get(AnalysisRun, run_id)
    if run is None:
        raise RepriceError(f"no analysis run {run_id}")
    if run.status != "done":
        raise RepriceError(f"run {run_id} is {run.status}; only a finished run can be re-priced")
    profiles = pricing_profiles(session, profile_ids, run.pair_id)
    params: RunParams = run.run_params
    gamma_max = priced_gamma_max(profiles, params.gamma_max)
    results = list(
        session.scalars(
            select(PromptResult)
            .where(PromptResult.run_id == run_id)
            .order_by(PromptResult.id)
            .options(selectinload(PromptResult.gamma_counts))
        )
    )
    if not results:
        raise RepriceError(f"run {run_id} has no measured prompts to price")
    now = utcnow()
    priced = AnalysisRun(
        prompt_set_id=run.prompt_set_id,
        pair_id=run.pair_id,
        status="done",
        measured_by=run.measured_by,
        priced_by=profiles[0].priced_by,
        params=replace(
            params, gamma_max=gamma_max, profile_batch_sizes=tuple(p.batch_size or 1 for p in profiles)
        ).to_json(),
        progress_done=len(results),
        progress_total=len(results),
        device=run.device,
        dtype=run.dtype,
        library_versions=dict(run.library_versions or {}),
        eos_token_ids=run.eos_token_ids,
        started_at=now,
        finished_at=now,
        repriced_from_run_id=run.id,
    )
    session.add(priced)
    session.flush()
    _link(priced, profiles)
    for result in results:
        session.add(_copied_result(result, priced.id, gamma_max))
    session.flush()
    return priced


def _copied_result(result: PromptResult, run_id: int, gamma_max: int) -> PromptResult:
    """A copy of ``result`` for run ``run_id``, with its counts for gamma up to ``gamma_max``."""
    copy = PromptResult(
        run_id=run_id,
        **{
            c.key: getattr(result, c.key)
            for c in PromptResult.__table__.columns
            if c.key not in SKIPPED_COLUMNS
        },
    )
    copy.gamma_counts = [
        GammaCount(
            **{
                c.key: getattr(g, c.key)
                for c in GammaCount.__table__.columns
                if c.key not in ("id", "result_id")
            }
        )
        for g in result.gamma_counts
        if g.gamma <= gamma_max
    ]
    return copy


def link_pricing_profiles(session: Session, run: AnalysisRun, profile_ids: Sequence[int]) -> None:
    """Price a new run with stored profiles instead of measuring its own: link them (the profiling
    step then measures nothing) and record their engine as the one that priced it. Its gamma_max and
    batch sizes must be within what they cover (the caller sets them so)."""
    profiles = pricing_profiles(session, profile_ids, run.pair_id)
    params = run.run_params
    if priced_gamma_max(profiles, params.gamma_max) < params.gamma_max:
        raise RepriceError(
            f"the cost profiles cover gamma up to {priced_gamma_max(profiles, params.gamma_max)}; "
            f"use --gamma-max {priced_gamma_max(profiles, params.gamma_max)} or less"
        )
    run.priced_by = profiles[0].priced_by
    _link(run, profiles)


def _link(run: AnalysisRun, profiles: Sequence[CostProfile]) -> None:
    for profile in profiles:
        run.batch_profiles.append(
            RunCostProfile(batch_size=profile.batch_size or 1, cost_profile_id=profile.id)
        )
    run.cost_profile_id = profiles[0].id


def _pair_text(pair) -> str:
    return f"{pair.target.spec} with draft {pair.draft.spec}"


MAX_COMPARED = 12  # the newest stored profiles a run's acceptance is priced on, side by side


def price_comparison(session: Session, run: AnalysisRun) -> list[dict]:
    """The run's stored acceptance priced on each stored profile of its pair (its own, from the stored
    summary, then the newest others, up to MAX_COMPARED in all; any engine, device, dtype and batch
    size), side by side: per profile, what priced it (engine and version, cost mode, device, dtype,
    batch size, measured or imported), the gamma range it covers, the workload's g*, S(g*) and
    decision, and the tasks it would speculate on. Empty when the pair has no other profile. A stored
    profile never changes, so each other profile's row is computed once and kept with the run
    (``analysis_runs.price_comparisons``, by profile id; the caller commits) until the run's summary is
    computed anew (its results or their task types changed), which drops them."""
    from analyzer.advice.summary import cost_from_profile, load_results, summarize_groups
    from analyzer.advice.summary_store import run_summary

    if run.status != "done" or run.cost_profile is None:
        return []
    own = {link.cost_profile_id for link in run.batch_profiles} | {run.cost_profile_id}
    others = list(
        session.scalars(
            select(CostProfile)
            .where(CostProfile.pair_id == run.pair_id, CostProfile.id.not_in(own))
            .order_by(CostProfile.id.desc())
            .limit(MAX_COMPARED - 1)
        )
    )
    if not others:  # nothing to compare with: nothing computed (the page reads the stored summary)
        return []
    params = run.run_params
    stored = run_summary(session, run)  # first: a summary computed anew drops the rows kept
    cached = dict(run.price_comparisons or {})
    results = None
    rows = []
    for profile in [run.cost_profile, *others]:
        gamma_max = min(params.gamma_max, len(profile.target_forward_s) - 1)
        if gamma_max < 1:
            continue
        if profile.id == run.cost_profile_id:  # the run's own pricing, as stored
            rows.append(_comparison_row(profile, gamma_max, stored.tasks, stored.workload, own=True))
            continue
        if str(profile.id) not in cached:
            results = results if results is not None else load_results(session, run.id)
            if not results:
                continue
            cost = cost_from_profile(profile, run.pair.draft.kind)
            tasks, workload = summarize_groups(
                results, cost, gamma_max=gamma_max, margin=float(params.margin), sampling=params.sampling
            )
            cached[str(profile.id)] = _comparison_row(
                profile, gamma_max, tasks, workload, own=profile.id in own
            )
        rows.append(cached[str(profile.id)])
    if cached != (run.price_comparisons or {}):
        run.price_comparisons = cached
    return rows


def _comparison_row(profile: CostProfile, gamma_max: int, tasks: dict, workload, *, own: bool) -> dict:
    """One row of :func:`price_comparison` (JSON-ready: undefined speedups are None)."""
    return {
        "profile_id": profile.id,
        "own": own,
        "engine": profile.priced_by,
        "priced_by": profile.priced_by,
        "engine_version": profile.engine_version,
        "cost_mode": profile.cost_mode,
        "source": profile.source or "measured",
        "device": profile.device,
        "dtype": profile.dtype or "float32",
        "batch_size": profile.batch_size or 1,
        "quality": profile.quality,
        "target_step_ms": profile.target_forward_s[0] * 1000,
        "gamma_max": gamma_max,
        "workload": {
            "best_gamma": workload.best_gamma if workload else None,
            "predicted_speedup": finite(workload.predicted_speedup) if workload else None,
            "speculate": bool(workload.speculate) if workload else False,
        },
        "speculate_on": [t for t, s in tasks.items() if s.speculate],
        "tasks": {
            t: {
                "best_gamma": s.best_gamma,
                "predicted_speedup": finite(s.predicted_speedup),
                "speculate": bool(s.speculate),
            }
            for t, s in tasks.items()
        },
    }
