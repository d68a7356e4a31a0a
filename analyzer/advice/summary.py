"""The analysis summary: what one run found, typed, built once from the stored raw counts and cost
profiles. Per prompt: alpha, the S(g) curve and its g*. Per task type and for the workload: n, alpha
mean and variance, tier, acceptance length, the pooled S(g) curve at every profiled batch size, g*
with its bootstrap interval, the decision with its basis and reason, and the speedup measured by real
speculative decoding. The report (JSON, CSV, text, HTML) serialises it; publishing policies and
choosing prompts to validate read it.

A finished run's summary is computed once and stored with the run (``AnalysisRun.summary``):
:func:`store_summary` when the run finishes, :func:`run_summary` for every reader, which computes
and stores it only where none is stored or what it was computed from has changed since (runs from
before it was stored, a resumed run, new validations or cost profiles)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from analyzer.measuring.acceptance import alpha_from_matches, mean_acceptance_length
from analyzer.measuring.interference import disturbed
from analyzer.orm import AnalysisRun, CostProfile, PromptResult, ValidationResult
from analyzer.pricing.assistant_price import assistant_defaults_price
from analyzer.pricing.policy_curve import BASE, DECISION_CODES, PolicyCurve, as_curve  # noqa: F401 (DECISION_CODES: importers name it here)
from analyzer.pricing.speedup import (
    DEFAULT_MARGIN,
    INTERVAL_LEVEL,
    MIN_TASK_PROMPTS,
    Cost,
    best_gamma,
    bootstrap_speedup_interval,
    iid_speedup,
    leviathan_speedup,
    mean_and_variance,
    pooled_speedup,
    predicted_speedup,
    recommendation_tier,
    speculative_time_s,
)

UNLABELLED = "unlabelled"


def finite(value: float | None) -> float | None:
    """``value`` as a float, None for None, NaN and infinities (JSON has no NaN)."""
    return None if value is None or not math.isfinite(value) else float(value)


# ---------------------------------------------------------------- the types


@dataclass(frozen=True, kw_only=True)
class DecisionReason:
    """Why a group is speculated or not, structured: a code of :data:`DECISION_CODES` and the
    numbers its sentence shows: S(g*) and its interval (None where not finite), n, the margin, the
    fewest prompts that decide alone, and for a group too small to decide the workload's decision it
    took (``workload_speculate`` None: not taken yet). :meth:`text` renders the sentence."""

    code: str = "nothing_measured"
    speedup: float | None = None
    interval: tuple[float | None, float | None] = (None, None)
    n: int = 0
    margin: float = DEFAULT_MARGIN
    min_prompts: int = MIN_TASK_PROMPTS
    workload_speculate: bool | None = None
    workload_gamma: int | None = None

    def text(self) -> str:
        """The reason in words, e.g. ``1.13x [1.04, 1.22], n = 5: S(g*) clears 1.05x and the interval
        stays above 1.00x`` (the sentence the published policies store)."""
        if self.code == "nothing_measured":
            return "nothing measured"
        speedup = _or_nan(self.speedup)
        low, high = (_or_nan(v) for v in self.interval)
        shown = (
            f"{speedup:.2f}x [{low:.2f}, {high:.2f}], n = {self.n}"
            if self.interval[0] is not None
            else f"{speedup:.2f}x, n = {self.n}"
        )
        needed = f"{1 + self.margin:.2f}x"
        if self.code == "too_few_prompts":
            taken = (
                ""
                if self.workload_speculate is None
                else f" (speculate at gamma {self.workload_gamma})"
                if self.workload_speculate
                else " (off)"
            )
            return (
                f"{shown}: too few prompts to decide (fewer than {self.min_prompts}), "
                f"the workload's decision applies{taken}"
            )
        if self.code == "point_estimate":
            return f"{shown}: too few prompts for an interval; decided on S(g*) alone"
        if self.code == "below_margin":
            return f"{shown}: S(g*) does not clear {needed}"
        if self.code == "interval_reaches_loss":
            return f"{shown}: S(g*) clears {needed} but the interval reaches {low:.2f}x, a possible loss"
        if self.code == "clears":
            return f"{shown}: S(g*) clears {needed} and the interval stays above 1.00x"
        raise ValueError(f"unknown decision code {self.code!r}")


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value


@dataclass(kw_only=True)
class GroupDecision:
    """The decision for a group of prompts at one batch size: g* (None: nothing measured), S(g*)
    with its interval, speculate (None while undecided: too few prompts), on what basis ("task",
    "workload" or "point estimate"), why (``reason``: its code and sentence are ``decision_code``
    and ``decision_reason``), and the pooled S(g) curve, ``speedup_curve[g-1]`` = S(g), None where it
    is not finite."""

    best_gamma: int | None = None
    predicted_speedup: float | None = None
    speedup_interval: tuple[float | None, float | None] = (None, None)
    speculate: bool | None = False
    decision_basis: str = "task"
    reason: DecisionReason = field(default_factory=DecisionReason)
    speedup_curve: list[float | None] = field(default_factory=list)

    @property
    def decision_code(self) -> str:
        """Why, as one of :data:`DECISION_CODES`."""
        return self.reason.code

    @property
    def decision_reason(self) -> str:
        """Why, in words."""
        return self.reason.text()

    def decision_dict(self) -> dict:
        """The decision's fields as JSON-ready data."""
        return {
            "best_gamma": self.best_gamma,
            "predicted_speedup": self.predicted_speedup,
            "speedup_interval": list(self.speedup_interval),
            "speculate": self.speculate,
            "decision_basis": self.decision_basis,
            "decision_code": self.decision_code,
            "decision_reason": self.decision_reason,
            "speedup_curve": list(self.speedup_curve),
        }


@dataclass(kw_only=True)
class GroupSummary(GroupDecision):
    """What a task type (or the workload) found: the decision at batch 1 (inherited fields), the
    acceptance statistics, the i.i.d. and Leviathan curves for comparison, the accepted-length
    histogram at g*, the speedup measured by validation, the decision at each profiled batch size,
    replay fidelity, and why tier and decision disagree (``tier_note``)."""

    n: int
    alpha_mean: float | None
    alpha_var: float | None
    alpha_std: float | None
    tier: str
    output_tokens: int
    interval_level: float | None = None
    al: float | None = None
    iid_curve: list[float | None] = field(default_factory=list)
    leviathan_curve: list[float | None] = field(default_factory=list)
    histogram: list[int] = field(default_factory=list)
    measured_speedup: float | None = None
    measured_n: int = 0
    measured_tasks: list[str] = field(default_factory=list)
    by_batch: dict[int, GroupDecision] = field(default_factory=dict)
    fidelity: dict | None = None
    tier_note: str | None = None
    # transformers' assisted generation under its defaults, priced at batch 1 from the replayed rounds
    # (analyzer/pricing/assistant_price.py); None: not replayed (another engine, prompt lookup, sampling)
    assistant_defaults: dict | None = None

    def as_dict(self) -> dict:
        """The report's JSON for this group (docs/report-json.md)."""
        data = asdict(self)
        del data["reason"]
        data.update(
            speedup_interval=list(self.speedup_interval),
            decision_code=self.decision_code,
            decision_reason=self.decision_reason,
        )
        data["by_batch"] = {str(b): entry.decision_dict() for b, entry in sorted(self.by_batch.items())}
        return data


@dataclass(frozen=True, kw_only=True)
class PromptSummary:
    """One prompt's outcome: alpha, S(g) for g = 1..G (``speedup_curve[g-1]``), its g* (None when
    nothing is finite), and the replayed rounds at every g."""

    prompt_id: int
    position: int
    task: str
    alpha: float | None
    speedup_curve: list[float | None]
    best_gamma: int | None
    rounds: dict[int, int]


@dataclass(kw_only=True)
class AnalysisSummary:
    """A run's findings: per prompt, per task type and for the workload (None without results)."""

    run_id: int
    gamma_max: int
    sampling: bool
    margin: float
    cost: Cost | None
    costs: dict[int, Cost]
    prompts: list[PromptSummary]
    tasks: dict[str, GroupSummary]
    workload: GroupSummary | None


# ---------------------------------------------------------------- cost of a run


def cost_from_profile(profile: CostProfile, draft_kind: str, *, with_context: bool = True) -> Cost:
    """The cost model of one stored profile; the machinery overhead counts as 0 where a profile from
    before it was measured has none. With the profile's context slopes (none where it measured one
    context), so that each prompt is priced at its own mean context (:meth:`Cost.for_request`): on a
    workload of short and long prompts (33 prompts, 39-2,156 tokens, the embedded SmolLM2 with prompt
    lookup on a 2-core Xeon, ``benchmarks/transformers_transfer.py --workload mixed``) each k's own
    slope (:func:`analyzer.measuring.cost.with_context_slopes`) missed the measured aggregate by
    0.5 / 2.2 / 3.1% at gamma 1, 3, 6, against 4.6 / 4.8 / 5.6% priced at one context (benchmarks/README.md).
    ``with_context=False``: at the profiled context alone (that comparison's baseline)."""
    tokens = max(profile.context_tokens, 1)
    return Cost(
        profile.target_forward_s,
        profile.draft_step_s,
        draft_cost_per_token=draft_kind != "ngram",
        target_prefill_s_per_token=(profile.target_prefill_s or 0.0) / tokens,
        draft_prefill_s_per_token=(profile.draft_prefill_s or 0.0) / tokens,
        round_overhead_s=profile.round_overhead_s or 0.0,
        decode_overhead_s=profile.decode_overhead_s or 0.0,
        context_tokens=profile.context_tokens,
        target_context_slope_s=list(profile.context_slope_s or []) if with_context else [],
        draft_context_slope_s=(profile.draft_context_slope_s or 0.0) if with_context else 0.0,
    )


def cost_for_run(run: AnalysisRun) -> Cost | None:
    """The cost model of a run at its smallest profiled batch size (None before profiling)."""
    profile = run.cost_profile
    if profile is None:
        return None
    return cost_from_profile(profile, run.pair.draft.kind)


def costs_for_run(run: AnalysisRun) -> dict[int, Cost]:
    """The run's cost model per profiled batch size ({} before profiling). Runs from before batch
    sizes were profiled have their one profile at batch 1."""
    costs = {
        link.batch_size: cost_from_profile(link.cost_profile, run.pair.draft.kind)
        for link in run.batch_profiles
    }
    if not costs and run.cost_profile is not None:
        costs[run.cost_profile.batch_size or 1] = cost_from_profile(run.cost_profile, run.pair.draft.kind)
    return costs


# ---------------------------------------------------------------- curves and decisions


def _alpha(result: PromptResult, sampling: bool) -> float:
    if sampling:
        return result.alpha_sampling if result.alpha_sampling is not None else float("nan")
    return alpha_from_matches(result.draft_matches or [])


def _prompt_curve(result: PromptResult, cost: Cost, sampling: bool) -> list[float]:
    if sampling:
        alpha = _alpha(result, sampling)
        at = cost.for_request(result.prompt_tokens, result.output_tokens)
        return [
            iid_speedup(alpha, g.gamma, at) if math.isfinite(alpha) else float("nan")
            for g in result.gamma_counts
        ]
    return [
        predicted_speedup(result.output_tokens, g.drafted_hist, cost, result.prompt_tokens)
        for g in result.gamma_counts
    ]


def _group_curve(results: list[PromptResult], cost: Cost, sampling: bool, gamma_max: int) -> list[float]:
    curve = []
    for g in range(1, gamma_max + 1):
        if sampling:
            spec = 0.0
            greedy = 0.0
            for r in results:
                tokens_per_round = r.gamma_counts[g - 1].expected_tokens_per_round
                at = cost.for_request(r.prompt_tokens, r.output_tokens)
                greedy += r.output_tokens * at.decode_s
                if tokens_per_round:
                    spec += r.output_tokens / tokens_per_round * at.round_s(g)
            curve.append(greedy / spec if spec else float("nan"))
        else:
            curve.append(
                pooled_speedup(
                    [r.output_tokens for r in results],
                    [np.asarray(r.gamma_counts[g - 1].drafted_hist) for r in results],
                    cost,
                    [r.prompt_tokens for r in results],
                )
            )
    return curve


def prompt_times(
    results: list[PromptResult], cost: Cost, sampling: bool, gamma: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt (with output), predicted seconds without and with speculation at ``gamma``; the
    pooled speedup of a group is their sums' ratio (as in ``_group_curve``)."""
    greedy, speculative = [], []
    for r in results:
        if r.output_tokens <= 0:
            continue
        at = cost.for_request(r.prompt_tokens, r.output_tokens)
        if sampling:
            tokens_per_round = r.gamma_counts[gamma - 1].expected_tokens_per_round
            if not tokens_per_round:
                continue
            greedy.append(r.output_tokens * at.decode_s)
            speculative.append(r.output_tokens / tokens_per_round * at.round_s(gamma))
        else:
            target_prefill, draft_prefill = cost.prefill_s(r.prompt_tokens)
            greedy.append(target_prefill + r.output_tokens * at.decode_s)
            speculative.append(
                target_prefill
                + draft_prefill
                + speculative_time_s(r.gamma_counts[gamma - 1].drafted_hist, at)
            )
    return np.array(greedy), np.array(speculative)


def _decision(
    results: list[PromptResult], cost: Cost, sampling: bool, gamma_max: int, margin: float
) -> GroupDecision:
    """g*, S(g*) and its bootstrap interval over the prompts, not yet decided (``speculate`` None):
    :func:`summarize_groups` decides every group with its :class:`PolicyCurve`."""
    curve = _group_curve(results, cost, sampling, gamma_max)
    g_star, s_star = best_gamma(curve)
    greedy, speculative = (
        prompt_times(results, cost, sampling, g_star) if g_star else (np.empty(0), np.empty(0))
    )
    # one prompt has no spread: no interval rather than a zero-width one
    interval = (
        bootstrap_speedup_interval(greedy, speculative) if len(greedy) > 1 else (float("nan"), float("nan"))
    )
    return GroupDecision(  # undecided: summarize_groups decides every group by its PolicyCurve
        best_gamma=g_star,
        predicted_speedup=finite(s_star),
        speedup_interval=(finite(interval[0]), finite(interval[1])),
        speculate=None,
        speedup_curve=[finite(v) for v in curve],
    )


def _fidelity(results: list[PromptResult]) -> dict | None:
    """Replay fidelity of a group: the share of output positions where the teacher-forced target pass
    disagreed with the generated token (pooled and the worst prompt), over the prompts where it was
    measured; None where it was not (float32 and sampling runs)."""
    measured = [r for r in results if r.replay_mismatches is not None]
    if not measured:
        return None
    tokens = sum(r.output_tokens for r in measured)
    mismatches = [(r.replay_mismatches or 0, r.output_tokens) for r in measured]
    shares = [wrong / tokens for wrong, tokens in mismatches if tokens]
    total_wrong = sum(wrong for wrong, _ in mismatches)
    return {
        "prompts": len(measured),
        "positions": tokens,
        "mismatches": int(total_wrong),
        "mismatch_share": finite(total_wrong / tokens) if tokens else None,
        "worst_prompt_share": finite(max(shares)) if shares else None,
        "prompts_with_mismatch": int(sum(1 for wrong, _ in mismatches if wrong)),
    }


def summarize_group(
    results: list[PromptResult],
    cost: Cost | None,
    *,
    gamma_max: int,
    margin: float = DEFAULT_MARGIN,
    sampling: bool = False,
    costs: dict[int, Cost] | None = None,
    measured: dict[int, float] | None = None,
) -> GroupSummary:
    """The summary of any group of one run's results (a task type, the workload): n, alpha mean and
    variance, tier, the pooled S(g) curve, g*, the decision (None while too few prompts decide it),
    at batch 1 and at every batch size in ``costs``; ``measured``: prompt id -> speedup measured by
    validation."""
    measured = measured or {}
    alpha_mean, alpha_var = mean_and_variance([_alpha(r, sampling) for r in results])
    summary = GroupSummary(
        n=len(results),
        alpha_mean=finite(alpha_mean),
        alpha_var=finite(alpha_var) if alpha_var is not None else None,
        alpha_std=finite(math.sqrt(alpha_var)) if alpha_var is not None else None,
        tier=recommendation_tier(alpha_mean, alpha_var),
        output_tokens=int(sum(r.output_tokens for r in results)),
        fidelity=_fidelity(results),
    )
    if cost is None:
        return summary
    by_batch = {
        b: _decision(results, c_b, sampling, gamma_max, margin) for b, c_b in sorted((costs or {}).items())
    }
    decision = _batch_one_decision(results, cost, costs, by_batch, sampling, gamma_max, margin)
    g_star = decision.best_gamma
    validated = [measured[r.prompt_id] for r in results if r.prompt_id in measured]
    iid_curve, leviathan_curve = _comparison_curves(alpha_mean, cost, gamma_max)
    return replace(
        summary,
        **{k: getattr(decision, k) for k in decision.__dataclass_fields__},
        interval_level=INTERVAL_LEVEL,
        al=finite(_acceptance_length(results, g_star, sampling)),
        iid_curve=iid_curve,
        leviathan_curve=leviathan_curve,
        histogram=np.sum([r.gamma_counts[g_star - 1].accepted_hist for r in results], axis=0).tolist()
        if g_star
        else [],
        measured_speedup=finite(float(np.mean(validated))) if validated else None,
        measured_n=len(validated),
        measured_tasks=sorted({r.task_type or UNLABELLED for r in results if r.prompt_id in measured}),
        by_batch=by_batch,
        assistant_defaults=None if sampling else assistant_defaults_price(results, cost),
    )


def _batch_one_decision(
    results: list[PromptResult],
    cost: Cost,
    costs: dict[int, Cost] | None,
    by_batch: dict[int, GroupDecision],
    sampling: bool,
    gamma_max: int,
    margin: float,
) -> GroupDecision:
    """The decision at batch 1: a copy of the one already made with the same profile, else made now."""
    # the batch-1 decision is usually one of those already made (same profile): one bootstrap, not two
    same = next((entry for b, entry in by_batch.items() if (costs or {})[b] == cost), None)
    return (
        replace(same, speedup_curve=list(same.speedup_curve))
        if same is not None
        else _decision(results, cost, sampling, gamma_max, margin)
    )


def _acceptance_length(results: list[PromptResult], g_star: int | None, sampling: bool) -> float:
    """Mean tokens per round at g* (the walks', or sampling's i.i.d. expectation); NaN without a g*."""
    if g_star and not sampling:
        return mean_acceptance_length(
            sum(r.gamma_counts[g_star - 1].accepted for r in results),
            sum(r.gamma_counts[g_star - 1].rounds for r in results),
        )
    if g_star:
        return float(
            np.mean([r.gamma_counts[g_star - 1].expected_tokens_per_round or np.nan for r in results])
        )
    return float("nan")


def _comparison_curves(
    alpha_mean: float, cost: Cost, gamma_max: int
) -> tuple[list[float | None], list[float | None]]:
    """The i.i.d. and Leviathan S(g) curves at the group's mean alpha (None where alpha is unknown)."""
    c = cost.draft_step_s / cost.decode_s if cost.decode_s else 0.0
    known_alpha = math.isfinite(alpha_mean)
    iid_curve = [
        finite(iid_speedup(alpha_mean, g, cost)) if known_alpha else None for g in range(1, gamma_max + 1)
    ]
    leviathan_curve = [
        finite(leviathan_speedup(alpha_mean, g, c)) if known_alpha else None for g in range(1, gamma_max + 1)
    ]
    return iid_curve, leviathan_curve


def group_curve(
    summary: GroupSummary, margin: float, gamma_max: int, fallback: PolicyCurve | None = None
) -> PolicyCurve:
    """The :class:`PolicyCurve` of a summarised group: its S(g) at batch 1 and at every profiled batch
    size, the lower ends of S(g*)'s intervals, its n and the curve whose decision it takes when too
    small (a task: the workload's). What it decides is what is published and routed."""
    return PolicyCurve(
        as_curve(summary.speedup_curve),
        {b: as_curve(entry.speedup_curve) for b, entry in summary.by_batch.items()},
        {b: entry.speedup_interval[0] for b, entry in summary.by_batch.items()},
        summary.speedup_interval[0],
        margin=margin,
        gamma_max=gamma_max,
        n=summary.n,
        fallback=fallback,
    )


def _decide(summary: GroupSummary, curve: PolicyCurve, workload: GroupSummary, cost: Cost | None) -> None:
    """Decide ``summary`` at batch 1 and at every profiled batch size by ``curve``, and say why; a
    group the workload decides (too few prompts) shows the workload's gamma, speedup and interval, the
    ones routed (its reason keeps its own numbers)."""
    entries = [
        (summary, BASE, workload),
        *((e, b, workload.by_batch.get(b)) for b, e in summary.by_batch.items()),
    ]
    for entry, batch, taken in entries:
        point = curve.decide(batch)
        if point is None:  # a batch size the curve does not cover: nothing to decide on
            entry.speculate, entry.decision_basis = False, "task"
            entry.reason = DecisionReason(n=summary.n, margin=curve.margin)
            continue
        entry.speculate, entry.decision_basis = point.speculate, point.basis
        entry.reason = DecisionReason(
            code=point.code,
            speedup=entry.predicted_speedup,
            interval=entry.speedup_interval,
            n=summary.n,
            margin=curve.margin,
            min_prompts=curve.min_prompts,
            workload_speculate=point.speculate if point.basis == "workload" else None,
            workload_gamma=point.gamma if point.basis == "workload" else None,
        )
    summary.tier_note = tier_note(summary, cost)  # read with the group's own g* and acceptance length
    for entry, _, taken in entries:
        if entry.decision_basis == "workload" and taken is not None:
            entry.best_gamma, entry.predicted_speedup = taken.best_gamma, taken.predicted_speedup
            entry.speedup_interval = taken.speedup_interval


def tier_note(summary: GroupSummary, cost: Cost | None) -> str | None:
    """Why the decision and the tier disagree, in words (None when they agree): the tier reads alpha
    alone, the decision also weighs what a round costs on this device."""
    gamma = summary.best_gamma
    if cost is None or not gamma or summary.alpha_mean is None:
        return None
    if summary.speculate == (summary.tier in ("HIGHLY_RECOMMENDED", "RECOMMENDED")):
        return None
    cost_text = (
        f"a round at gamma {gamma} costs {cost.round_s(gamma) / cost.decode_s:.2f}x a decoding step here"
        + (f" and yields {summary.al:.2f} tokens on average" if summary.al else "")
    )
    base = f"the tier reads alpha alone ({summary.alpha_mean:.2f}); the decision weighs the cost: {cost_text}"
    if summary.decision_basis == "workload":
        base += "; and this task has too few prompts, so the workload's decision applies"
    return base


def summarize_groups(
    results: list[PromptResult],
    cost: Cost | None,
    *,
    gamma_max: int,
    margin: float = DEFAULT_MARGIN,
    sampling: bool = False,
    costs: dict[int, Cost] | None = None,
    measured: dict[int, float] | None = None,
) -> tuple[dict[str, GroupSummary], GroupSummary | None]:
    """(per task type, workload) for a set of one run's results, each decided by its
    :class:`PolicyCurve` (:func:`group_curve`), the one rule the router applies: a task too small to
    decide takes the workload's decision (at every batch size), the workload too small itself is a
    point estimate; a validation sample from one task is no workload figure."""
    by_task: dict[str, list[PromptResult]] = defaultdict(list)
    for result in results:
        by_task[result.task_type or UNLABELLED].append(result)

    def summarized(group: list[PromptResult]) -> GroupSummary:
        return summarize_group(
            group, cost, gamma_max=gamma_max, margin=margin, sampling=sampling, costs=costs, measured=measured
        )

    tasks = {task: summarized(group) for task, group in sorted(by_task.items())}
    if not results:
        return tasks, None
    workload = summarized(results)
    if len(by_task) > 1 and len(workload.measured_tasks) == 1:
        workload.measured_speedup = None  # a sample of one task says nothing about the others
    workload_curve = group_curve(workload, margin, gamma_max)
    _decide(workload, workload_curve, workload, cost)
    for summary in tasks.values():
        _decide(summary, group_curve(summary, margin, gamma_max, fallback=workload_curve), workload, cost)
    return tasks, workload


def load_results(session: Session, run_id: int) -> list[PromptResult]:
    """A run's results in prompt order, with their per-gamma counts and prompts loaded."""
    return list(
        session.scalars(
            select(PromptResult)
            .where(PromptResult.run_id == run_id)
            .options(selectinload(PromptResult.gamma_counts), selectinload(PromptResult.prompt))
            .order_by(PromptResult.prompt_id)
        )
    )


def summarize_run(
    session: Session,
    run: AnalysisRun,
    *,
    results: list[PromptResult] | None = None,
    validations: list[ValidationResult] | None = None,
) -> AnalysisSummary:
    """The summary of ``run`` from its stored counts, profiles and validations (pass ``results`` /
    ``validations`` when already loaded)."""
    run_id = run.id
    params = run.run_params
    gamma_max, sampling, margin = int(params.gamma_max), params.sampling, float(params.margin)
    cost, costs = cost_for_run(run), costs_for_run(run)
    results = load_results(session, run_id) if results is None else results
    if validations is None:
        validations = list(session.scalars(select(ValidationResult).where(ValidationResult.run_id == run_id)))
    measured = {v.prompt_id: v.measured_speedup for v in validations if not disturbed(v.others_cpu)}
    prompts = []
    for result in results:
        curve = _prompt_curve(result, cost, sampling) if cost else []
        g_star, _ = best_gamma(curve)
        prompts.append(
            PromptSummary(
                prompt_id=result.prompt_id,
                position=result.prompt.position,
                task=result.task_type or UNLABELLED,
                alpha=finite(_alpha(result, sampling)),
                speedup_curve=[finite(v) for v in curve],
                best_gamma=g_star,
                rounds={g.gamma: g.rounds for g in result.gamma_counts},
            )
        )
    tasks, workload = summarize_groups(
        results, cost, gamma_max=gamma_max, margin=margin, sampling=sampling, costs=costs, measured=measured
    )
    return AnalysisSummary(
        run_id=run_id,
        gamma_max=gamma_max,
        sampling=sampling,
        margin=margin,
        cost=cost,
        costs=costs,
        prompts=prompts,
        tasks=tasks,
        workload=workload,
    )
