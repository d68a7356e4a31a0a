"""The recommendation report of one run, derived from the stored raw counts and cost profiles:
per prompt and per task type — acceptance, S(g) for every g and batch size, g* with its interval,
tier and decision with reasons — plus the workload as a whole, replay fidelity, validation and the
entropy table, as a JSON-ready dict (documented shape); CSV and text are in analyzer.report_text."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from analyzer.acceptance import alpha_from_matches, mean_acceptance_length
from analyzer.devices import guarantee_sentence
from analyzer.entropy import ENTROPY_EDGES_NATS, long_run_by_entropy
from analyzer.models import AnalysisRun, CostProfile, PromptResult, ValidationResult
from analyzer.speedup import (
    DEFAULT_MARGIN,
    INTERVAL_LEVEL,
    Cost,
    best_gamma,
    bootstrap_speedup_interval,
    decide,
    iid_speedup,
    leviathan_speedup,
    mean_and_variance,
    pooled_speedup,
    predicted_speedup,
    recommendation_tier,
    should_speculate,
    speculative_time_s,
)

class ReportError(LookupError):
    """The run does not exist or has nothing to report yet."""


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def cost_from_profile(profile: CostProfile, draft_kind: str) -> Cost:
    """The cost model of one stored profile; the machinery overhead counts as 0 where a profile from
    before it was measured has none."""
    tokens = max(profile.context_tokens, 1)
    return Cost(
        profile.target_forward_s,
        profile.draft_step_s,
        draft_cost_per_token=draft_kind != "ngram",
        target_prefill_s_per_token=(profile.target_prefill_s or 0.0) / tokens,
        draft_prefill_s_per_token=(profile.draft_prefill_s or 0.0) / tokens,
        round_overhead_s=profile.round_overhead_s or 0.0,
        decode_overhead_s=profile.decode_overhead_s or 0.0,
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
    costs = {link.batch_size: cost_from_profile(link.cost_profile, run.pair.draft.kind) for link in run.batch_profiles}
    if not costs and run.cost_profile is not None:
        costs[run.cost_profile.batch_size or 1] = cost_for_run(run)
    return costs


def _prompt_curve(result: PromptResult, cost: Cost, sampling: bool) -> list[float]:
    if sampling:
        alpha = result.alpha_sampling if result.alpha_sampling is not None else float("nan")
        return [iid_speedup(alpha, g.gamma, cost) if math.isfinite(alpha) else float("nan") for g in result.gamma_counts]
    return [predicted_speedup(result.output_tokens, g.drafted_hist, cost, result.prompt_tokens)
            for g in result.gamma_counts]


def _group_curve(results: list[PromptResult], cost: Cost, sampling: bool, gamma_max: int) -> list[float]:
    curve = []
    for g in range(1, gamma_max + 1):
        if sampling:
            tokens = sum(r.output_tokens for r in results)
            spec = sum(
                r.output_tokens / r.gamma_counts[g - 1].expected_tokens_per_round * cost.round_s(g)
                for r in results if r.gamma_counts[g - 1].expected_tokens_per_round
            )
            curve.append(tokens * cost.decode_s / spec if spec else float("nan"))
        else:
            curve.append(pooled_speedup(
                [r.output_tokens for r in results], [r.gamma_counts[g - 1].drafted_hist for r in results], cost,
                [r.prompt_tokens for r in results],
            ))
    return curve


def _prompt_times(results: list[PromptResult], cost: Cost, sampling: bool, gamma: int) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt (with output), predicted seconds without and with speculation at ``gamma``; the
    pooled speedup of a group is their sums' ratio (as in ``_group_curve``)."""
    greedy, speculative = [], []
    for r in results:
        if r.output_tokens <= 0:
            continue
        if sampling:
            tokens_per_round = r.gamma_counts[gamma - 1].expected_tokens_per_round
            if not tokens_per_round:
                continue
            greedy.append(r.output_tokens * cost.decode_s)
            speculative.append(r.output_tokens / tokens_per_round * cost.round_s(gamma))
        else:
            target_prefill, draft_prefill = cost.prefill_s(r.prompt_tokens)
            greedy.append(target_prefill + r.output_tokens * cost.decode_s)
            speculative.append(target_prefill + draft_prefill
                               + speculative_time_s(r.gamma_counts[gamma - 1].drafted_hist, cost))
    return np.array(greedy), np.array(speculative)


def _decision(results: list[PromptResult], cost: Cost, sampling: bool, curve: list[float], margin: float) -> dict:
    """g*, S(g*), its bootstrap interval over the prompts and the decision with its reason;
    ``speculate`` is None when the group is too small to decide (the caller applies the workload's)."""
    g_star, s_star = best_gamma(curve)
    greedy, speculative = _prompt_times(results, cost, sampling, g_star) if g_star else ([], [])
    # one prompt has no spread: no interval rather than a zero-width one
    interval = bootstrap_speedup_interval(greedy, speculative) if len(greedy) > 1 else (float("nan"), float("nan"))
    speculate, why = decide(s_star, interval, len(results), margin) if g_star else (False, "nothing measured")
    return {"best_gamma": g_star or None, "predicted_speedup": _finite(s_star),
            "speedup_interval": [_finite(interval[0]), _finite(interval[1])], "speculate": speculate,
            "decision_basis": "task" if speculate is not None else "workload", "decision_reason": why}


def _alpha(result: PromptResult, sampling: bool) -> float:
    if sampling:
        return result.alpha_sampling if result.alpha_sampling is not None else float("nan")
    return alpha_from_matches(result.draft_matches or [])


def _group_summary(results: list[PromptResult], cost: Cost | None, sampling: bool, gamma_max: int,
                   margin: float, measured: dict[int, float]) -> dict:
    alphas = [_alpha(r, sampling) for r in results]
    alpha_mean, alpha_var = mean_and_variance(alphas)
    summary = {
        "n": len(results),
        "alpha_mean": _finite(alpha_mean),
        "alpha_var": _finite(alpha_var) if alpha_var is not None else None,
        "alpha_std": _finite(math.sqrt(alpha_var)) if alpha_var is not None else None,
        "tier": recommendation_tier(alpha_mean, alpha_var),
        "output_tokens": int(sum(r.output_tokens for r in results)),
    }
    if cost is None:
        summary.update(best_gamma=None, predicted_speedup=None, speculate=False, al=None,
                       speedup_curve=[], iid_curve=[], leviathan_curve=[], histogram=[])
        return summary
    curve = _group_curve(results, cost, sampling, gamma_max)
    g_star, s_star = best_gamma(curve)
    decision = _decision(results, cost, sampling, curve, margin)
    c = cost.draft_step_s / cost.decode_s if cost.decode_s else 0.0
    rounds = sum(r.gamma_counts[g_star - 1].rounds for r in results) if g_star else 0
    accepted = sum(r.gamma_counts[g_star - 1].accepted for r in results) if g_star else 0
    histogram = np.sum([r.gamma_counts[g_star - 1].accepted_hist for r in results], axis=0).tolist() if g_star else []
    validated = [measured[r.prompt_id] for r in results if r.prompt_id in measured]
    validated_tasks = sorted({r.task_type or "unlabelled" for r in results if r.prompt_id in measured})
    summary.update(
        **decision,
        interval_level=INTERVAL_LEVEL,
        al=_finite(mean_acceptance_length(accepted, rounds)) if not sampling else _finite(
            float(np.mean([r.gamma_counts[g_star - 1].expected_tokens_per_round or np.nan for r in results]))),
        speedup_curve=[_finite(v) for v in curve],
        iid_curve=[_finite(iid_speedup(alpha_mean, g, cost)) if math.isfinite(alpha_mean) else None
                   for g in range(1, gamma_max + 1)],
        leviathan_curve=[_finite(leviathan_speedup(alpha_mean, g, c)) if math.isfinite(alpha_mean) else None
                         for g in range(1, gamma_max + 1)],
        histogram=histogram,
        measured_speedup=_finite(float(np.mean(validated))) if validated else None,
        measured_n=len(validated),
        measured_tasks=validated_tasks,
    )
    return summary


def _batch_summaries(results: list[PromptResult], costs: dict[int, Cost], sampling: bool, gamma_max: int,
                     margin: float) -> dict[str, dict]:
    """{"<b>": {best_gamma, predicted_speedup, speedup_interval, speculate, decision_basis,
    decision_reason, speedup_curve}} per profiled batch size b, decided as at batch 1. At batch b every
    sequence is assumed to follow the measured match sequences, and a round costs
    draft(k, b) + T_t(k + 1, b) + overhead against T_t(1, b) + overhead per plain step."""
    summaries = {}
    for batch_size, cost in sorted(costs.items()):
        curve = _group_curve(results, cost, sampling, gamma_max)
        summaries[str(batch_size)] = {**_decision(results, cost, sampling, curve, margin),
                                      "speedup_curve": [_finite(v) for v in curve]}
    return summaries


def _apply_workload_decision(summary: dict, workload: dict) -> None:
    """A group too small to decide (speculate None) takes the workload's decision, and says so."""
    if summary.get("speculate") is None:
        summary["speculate"] = bool(workload.get("speculate"))
        summary["decision_basis"] = "workload"
        summary["decision_reason"] += (f" ({'speculate at gamma ' + str(workload['best_gamma']) if workload.get('speculate') else 'off'})")


def _decide_alone(summary: dict, margin: float) -> None:
    """The workload has nothing to fall back to: too few prompts are decided on S(g*) alone, and say so."""
    if summary.get("speculate") is None:
        summary["speculate"] = should_speculate(summary.get("predicted_speedup") or float("nan"), margin)
        summary["decision_basis"] = "point estimate"
        summary["decision_reason"] = (summary["decision_reason"].split(": too few")[0]
                                      + ": too few prompts for an interval; decided on S(g*) alone")


def tier_note(summary: dict, cost: Cost | None) -> str | None:
    """Why the decision and the tier disagree, in words (None when they agree): the tier reads alpha
    alone, the decision also weighs what a round costs on this device."""
    tier, on, gamma = summary.get("tier"), summary.get("speculate"), summary.get("best_gamma")
    if cost is None or not gamma or summary.get("alpha_mean") is None:
        return None
    high = tier in ("HIGHLY_RECOMMENDED", "RECOMMENDED")
    if on == high:
        return None
    tokens = summary.get("al")
    cost_text = (f"a round at gamma {gamma} costs {cost.round_s(gamma) / cost.decode_s:.2f}x a decoding step here"
                 + (f" and yields {tokens:.2f} tokens on average" if tokens else ""))
    base = f"the tier reads alpha alone ({summary['alpha_mean']:.2f}); the decision weighs the cost: {cost_text}"
    if summary.get("decision_basis") == "workload":
        base += "; and this task has too few prompts, so the workload's decision applies"
    return base


def _fidelity(results: list[PromptResult]) -> dict | None:
    """Replay fidelity of a group: the share of output positions where the teacher-forced target pass
    disagreed with the generated token (pooled and the worst prompt), over the prompts where it was
    measured; None where it was not (float32 and sampling runs)."""
    measured = [r for r in results if r.replay_mismatches is not None]
    if not measured:
        return None
    tokens = sum(r.output_tokens for r in measured)
    shares = [r.replay_mismatches / r.output_tokens for r in measured if r.output_tokens]
    return {"prompts": len(measured), "positions": tokens,
            "mismatches": int(sum(r.replay_mismatches for r in measured)),
            "mismatch_share": _finite(sum(r.replay_mismatches for r in measured) / tokens) if tokens else None,
            "worst_prompt_share": _finite(max(shares)) if shares else None,
            "prompts_with_mismatch": int(sum(1 for r in measured if r.replay_mismatches))}


def validation_summary(rows: list[dict]) -> dict | None:
    """Real speculative decoding against the replay for a group of validation rows: how many, outputs
    identical to plain greedy and to the analysed output, the mean absolute error of target passes
    against replayed rounds (%), mean predicted and measured speedup and their mean absolute relative
    error (%); None for no rows."""
    if not rows:
        return None
    errors = [r["passes_error_pct"] for r in rows if r.get("passes_error_pct") is not None]
    predicted = np.array([r["predicted_speedup"] for r in rows], dtype=np.float64)
    measured = np.array([r["measured_speedup"] for r in rows], dtype=np.float64)
    replay_known = [r["replay_identical"] for r in rows if r.get("replay_identical") is not None]
    return {
        "validated": len(rows),
        "identical": int(sum(bool(r["outputs_identical"]) for r in rows)),
        "replay_identical": int(sum(replay_known)) if replay_known else None,
        "passes_error_pct": _finite(float(np.mean(np.abs(errors)))) if errors else None,
        "passes_equal_rounds": int(sum(1 for e in errors if e == 0)),
        "predicted_speedup": _finite(float(predicted.mean())),
        "measured_speedup": _finite(float(measured.mean())),
        "speedup_error_pct": _finite(float(np.mean(np.abs(predicted - measured) / measured) * 100)),
    }


def summarize_results(results: list[PromptResult], cost: Cost | None, *, gamma_max: int,
                      margin: float = DEFAULT_MARGIN, sampling: bool = False) -> dict:
    """The summary the report gives one task, for any group of results of one run: n, alpha mean and
    variance, tier, pooled S(g) curve, g*, predicted speedup and the speculate decision."""
    return _group_summary(results, cost, sampling, gamma_max, margin, {})


def build_report(session: Session, run_id: int) -> dict:
    """The report of run ``run_id`` (see README "Analysis report JSON" for the shape)."""
    run = session.get(AnalysisRun, run_id)
    if run is None:
        raise ReportError(f"no analysis run {run_id}")
    params = run.params
    gamma_max = int(params.get("gamma_max", 16))
    sampling = float(params.get("temperature", 0.0)) > 0
    margin = float(params.get("margin", 0.05))
    cost = cost_for_run(run)
    costs = costs_for_run(run)
    results = list(session.scalars(
        select(PromptResult).where(PromptResult.run_id == run_id)
        .options(selectinload(PromptResult.gamma_counts), selectinload(PromptResult.prompt))
        .order_by(PromptResult.prompt_id)
    ))
    validations = list(session.scalars(select(ValidationResult).where(ValidationResult.run_id == run_id)))
    measured = {v.prompt_id: v.measured_speedup for v in validations}
    prompts = []
    for result in results:
        curve = _prompt_curve(result, cost, sampling) if cost else []
        g_star, _ = best_gamma(curve) if curve else (0, float("nan"))
        prompts.append({
            "prompt_id": result.prompt_id,
            "external_id": result.prompt.external_id,
            "position": result.prompt.position,
            "task": result.task_type,
            "prompt_tokens": result.prompt_tokens,
            "prompt_truncated": result.prompt_truncated,
            "output_tokens": result.output_tokens,
            "per_gamma": {
                str(g.gamma): {"rounds": g.rounds, "drafted": g.drafted, "accepted": g.accepted,
                               "histogram": g.accepted_hist, "drafted_histogram": g.drafted_hist,
                               "position_accepted": g.position_accepted,
                               "expected_tokens_per_round": _finite(g.expected_tokens_per_round)}
                for g in result.gamma_counts
            },
            "alpha": _finite(_alpha(result, sampling)),
            "predicted_speedup": {str(g): _finite(v) for g, v in enumerate(curve, start=1)},
            "best_gamma": g_star or None,
            "measured_speedup": _finite(measured.get(result.prompt_id)),
            "replay_mismatch_share": _finite(result.replay_mismatches / result.output_tokens)
            if result.replay_mismatches is not None and result.output_tokens else None,
        })
    by_task: dict[str, list[PromptResult]] = defaultdict(list)
    for result in results:
        by_task[result.task_type or "unlabelled"].append(result)
    tasks = {task: _group_summary(group, cost, sampling, gamma_max, margin, measured)
             for task, group in sorted(by_task.items())}
    workload = _group_summary(results, cost, sampling, gamma_max, margin, measured) if results else None
    if workload is not None and len(by_task) > 1 and len(workload.get("measured_tasks") or []) == 1:
        # a sample of one task says nothing about the others: not a workload figure
        workload["measured_speedup"] = None
    for summary, group in [(tasks[t], g) for t, g in sorted(by_task.items())] + ([(workload, results)] if workload else []):
        summary["by_batch"] = _batch_summaries(group, costs, sampling, gamma_max, margin) if costs else {}
        summary["fidelity"] = _fidelity(group)
    if workload is not None:
        for summary in [workload] + list(workload["by_batch"].values()):
            _decide_alone(summary, margin)
        for summary in tasks.values():
            _apply_workload_decision(summary, workload)
            for batch, entry in summary["by_batch"].items():
                _apply_workload_decision(entry, workload["by_batch"][batch])
    for summary in list(tasks.values()) + ([workload] if workload else []):
        summary["tier_note"] = tier_note(summary, cost)
    task_of = {r.prompt_id: r.task_type or "unlabelled" for r in results}
    rounds_at = {(r.prompt_id, g.gamma): g.rounds for r in results for g in r.gamma_counts}
    validation_rows = [
        {"prompt_id": v.prompt_id, "task": task_of.get(v.prompt_id), "gamma": v.gamma,
         "predicted_speedup": v.predicted_speedup, "measured_speedup": v.measured_speedup,
         "outputs_identical": v.outputs_identical, "replay_identical": v.replay_identical,
         "greedy_time_s": v.greedy_time_s, "speculative_time_s": v.speculative_time_s,
         "target_forward_passes": v.target_forward_passes,
         "replayed_rounds": v.replayed_rounds if v.replayed_rounds is not None else rounds_at.get((v.prompt_id, v.gamma)),
         "passes_error_pct": None}
        for v in validations
    ]
    for row in validation_rows:
        if row["target_forward_passes"] is not None and row["replayed_rounds"]:
            row["passes_error_pct"] = 100.0 * (row["target_forward_passes"] - row["replayed_rounds"]) / row["replayed_rounds"]
    by_task_rows: dict[str, list[dict]] = defaultdict(list)
    for row in validation_rows:
        by_task_rows[row["task"]].append(row)
    dtype = run.dtype or "float32"
    run_fidelity = dict(workload["fidelity"] or {}) if workload else {}
    run_fidelity.update(validation_summary(validation_rows) or {})
    profile = run.cost_profile
    return {
        "run_id": run.id,
        "status": run.status,
        "error": run.error,
        "progress": {"done": run.progress_done, "total": run.progress_total},
        "prompt_set": run.prompt_set.name,
        "target": run.pair.target.spec,
        "draft": run.pair.draft.spec,
        "mode": "sampling (expectations under i.i.d. acceptance)" if sampling else
        "greedy (exact replay)" if dtype == "float32" else f"greedy (replay estimate in {dtype})",
        "params": params,
        "device": run.device,
        "dtype": dtype,
        "guarantee": guarantee_sentence(dtype, sampling=sampling, fidelity=run_fidelity),
        "cost_profile": _profile_dict(profile) if profile else None,
        "cost_profiles": {str(link.batch_size): _profile_dict(link.cost_profile) for link in run.batch_profiles}
        or ({str(profile.batch_size or 1): _profile_dict(profile)} if profile else {}),
        "prompts": prompts,
        "tasks": tasks,
        "workload": workload,
        "entropy_table": long_run_by_entropy(
            [r.draft_matches or [] for r in results], [r.entropies or [] for r in results],
            edges=[float("inf") if e is None else e for e in params.get("entropy_edges") or ENTROPY_EDGES_NATS],
        ) if not sampling else None,
        "validation": validation_rows,
        "validation_summary": {"run": validation_summary(validation_rows),
                               "tasks": {t: validation_summary(rows) for t, rows in sorted(by_task_rows.items())}},
    }


def _profile_dict(profile: CostProfile) -> dict:
    return {
        "target_k_s": list(profile.target_forward_s), "draft_s": profile.draft_step_s,
        "target_prefill_s": profile.target_prefill_s, "draft_prefill_s": profile.draft_prefill_s,
        "round_overhead_s": profile.round_overhead_s, "decode_overhead_s": profile.decode_overhead_s,
        "device": profile.device, "dtype": profile.dtype or "float32", "batch_size": profile.batch_size or 1,
        "quality": profile.quality, "quality_notes": list(profile.quality_notes or []),
        "spread": list(profile.target_forward_spread) if profile.target_forward_spread is not None else None,
        "threads": profile.threads, "context_tokens": profile.context_tokens,
    }
