"""The recommendation report of one run, derived from the stored raw counts and cost profile:
per prompt and per task type — acceptance, S(g) for every g, g*, tier and decision — plus the
workload as a whole and the entropy table. JSON (documented shape), CSV and a text table."""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from analyzer.acceptance import alpha_from_matches, mean_acceptance_length
from analyzer.entropy import ENTROPY_EDGES_NATS, long_run_by_entropy
from analyzer.models import AnalysisRun, PromptResult, ValidationResult
from analyzer.speedup import (
    DEFAULT_MARGIN,
    Cost,
    best_gamma,
    iid_speedup,
    leviathan_speedup,
    mean_and_variance,
    pooled_speedup,
    predicted_speedup,
    recommendation_tier,
    should_speculate,
)

WORKLOAD = "workload"


class ReportError(LookupError):
    """The run does not exist or has nothing to report yet."""


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def cost_for_run(run: AnalysisRun) -> Cost | None:
    """The cost model of a run from its stored profile (None before profiling)."""
    profile = run.cost_profile
    if profile is None:
        return None
    tokens = max(profile.context_tokens, 1)
    return Cost(
        profile.target_forward_s,
        profile.draft_step_s,
        draft_cost_per_token=run.pair.draft.kind != "ngram",
        target_prefill_s_per_token=(profile.target_prefill_s or 0.0) / tokens,
        draft_prefill_s_per_token=(profile.draft_prefill_s or 0.0) / tokens,
    )


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
    c = cost.draft_step_s / cost.decode_s if cost.decode_s else 0.0
    rounds = sum(r.gamma_counts[g_star - 1].rounds for r in results) if g_star else 0
    accepted = sum(r.gamma_counts[g_star - 1].accepted for r in results) if g_star else 0
    histogram = np.sum([r.gamma_counts[g_star - 1].accepted_hist for r in results], axis=0).tolist() if g_star else []
    validated = [measured[r.prompt_id] for r in results if r.prompt_id in measured]
    summary.update(
        best_gamma=g_star or None,
        predicted_speedup=_finite(s_star),
        speculate=should_speculate(s_star, margin),
        al=_finite(mean_acceptance_length(accepted, rounds)) if not sampling else _finite(
            float(np.mean([r.gamma_counts[g_star - 1].expected_tokens_per_round or np.nan for r in results]))),
        speedup_curve=[_finite(v) for v in curve],
        iid_curve=[_finite(iid_speedup(alpha_mean, g, cost)) if math.isfinite(alpha_mean) else None
                   for g in range(1, gamma_max + 1)],
        leviathan_curve=[_finite(leviathan_speedup(alpha_mean, g, c)) if math.isfinite(alpha_mean) else None
                         for g in range(1, gamma_max + 1)],
        histogram=histogram,
        measured_speedup=_finite(float(np.mean(validated))) if validated else None,
    )
    return summary


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
        })
    by_task: dict[str, list[PromptResult]] = defaultdict(list)
    for result in results:
        by_task[result.task_type or "unlabelled"].append(result)
    tasks = {task: _group_summary(group, cost, sampling, gamma_max, margin, measured)
             for task, group in sorted(by_task.items())}
    profile = run.cost_profile
    return {
        "run_id": run.id,
        "status": run.status,
        "error": run.error,
        "progress": {"done": run.progress_done, "total": run.progress_total},
        "prompt_set": run.prompt_set.name,
        "target": run.pair.target.spec,
        "draft": run.pair.draft.spec,
        "mode": "sampling (expectations under i.i.d. acceptance)" if sampling else "greedy (exact replay)",
        "params": params,
        "device": run.device,
        "cost_profile": {
            "target_k_s": list(profile.target_forward_s), "draft_s": profile.draft_step_s,
            "target_prefill_s": profile.target_prefill_s, "draft_prefill_s": profile.draft_prefill_s,
            "device": profile.device, "threads": profile.threads, "context_tokens": profile.context_tokens,
        } if profile else None,
        "prompts": prompts,
        "tasks": tasks,
        "workload": _group_summary(results, cost, sampling, gamma_max, margin, measured) if results else None,
        "entropy_table": long_run_by_entropy(
            [r.draft_matches or [] for r in results], [r.entropies or [] for r in results],
            edges=[float("inf") if e is None else e for e in params.get("entropy_edges") or ENTROPY_EDGES_NATS],
        ) if not sampling else None,
        "validation": [
            {"prompt_id": v.prompt_id, "gamma": v.gamma, "predicted_speedup": v.predicted_speedup,
             "measured_speedup": v.measured_speedup, "outputs_identical": v.outputs_identical,
             "greedy_time_s": v.greedy_time_s, "speculative_time_s": v.speculative_time_s,
             "target_forward_passes": v.target_forward_passes}
            for v in validations
        ],
    }


CSV_COLUMNS = ["prompt_id", "external_id", "task", "prompt_tokens", "output_tokens", "alpha", "best_gamma",
               "predicted_speedup_best", "measured_speedup"]


def report_csv(report: dict) -> str:
    """One CSV row per prompt, plus S(g) columns for every g."""
    gammas = sorted({int(g) for row in report["prompts"] for g in row["predicted_speedup"]})
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS + [f"speedup_g{g}" for g in gammas])
    for row in report["prompts"]:
        best = row["predicted_speedup"].get(str(row["best_gamma"])) if row["best_gamma"] else None
        writer.writerow([row["prompt_id"], row["external_id"] or "", row["task"], row["prompt_tokens"],
                         row["output_tokens"], _fmt(row["alpha"]), row["best_gamma"] or "", _fmt(best),
                         _fmt(row["measured_speedup"])]
                        + [_fmt(row["predicted_speedup"].get(str(g))) for g in gammas])
    return out.getvalue()


def _fmt(value) -> str:
    return "" if value is None else f"{value:.4f}"


def report_text(report: dict) -> str:
    """A plain-text summary: the recommendation in words, then the per-task table."""
    lines = [f"run {report['run_id']} ({report['status']}): {report['target']} with draft {report['draft']}, "
             f"{report['mode']}"]
    if report.get("cost_profile"):
        cp = report["cost_profile"]
        ratios = ", ".join(f"{t / cp['target_k_s'][0]:.2f}" for t in cp["target_k_s"][:8])
        lines.append(f"cost: T_t(1) = {cp['target_k_s'][0] * 1000:.1f} ms, T_t(k)/T_t(1) for k=1..8: {ratios}; "
                     f"draft step {cp['draft_s'] * 1000:.3f} ms on {cp['device']}")
    workload = report.get("workload")
    if workload and workload.get("best_gamma"):
        verdict = "speculate" if workload["speculate"] else "do not speculate"
        lines.append(f"workload: {verdict} (best gamma {workload['best_gamma']}, predicted speedup "
                     f"{workload['predicted_speedup']:.2f}x, alpha {workload['alpha_mean']:.2f})")
    on = [t for t, s in report["tasks"].items() if s["speculate"]]
    lines.append("speculate for: " + (", ".join(on) if on else "no task type") + "\n")
    header = f"{'task':<18} {'n':>3} {'alpha':>6} {'±std':>6} {'AL':>5} {'g*':>3} {'S(g*)':>6} {'meas.':>6}  {'tier':<19} decision"
    lines.append(header)
    for task, s in report["tasks"].items():
        lines.append(
            f"{task:<18} {s['n']:>3} {_num(s['alpha_mean'], 6, 3)} {_num(s['alpha_std'], 6, 3)} {_num(s['al'], 5, 2)} "
            f"{(s['best_gamma'] or 0):>3} {_num(s['predicted_speedup'], 6, 2)} {_num(s.get('measured_speedup'), 6, 2)}  "
            f"{s['tier']:<19} {'speculate' if s['speculate'] else 'off'}"
        )
    return "\n".join(lines)


def _num(value, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"
