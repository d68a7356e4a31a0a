"""Policy sets from an analysis in llama-server (analyzer/analysis/server_analysis.py): per task the
drafter setting it chose (or off), a workload-wide fallback, and the pool that runs each setting.

llama-server fixes its speculative settings per process (per-request ones are compiled out of it), so
a deployment that speculates for some tasks runs one server per distinct setting, a pool, plus a plain
one. The set publishes the pool of every decision it can make, keyed by the setting's label ("off",
"ngram-mod 16 2-16"): SPECROUTE_ROUTER_POOLS where the publisher named it, else a llama-server on this
machine at ``http://127.0.0.1:<port>``, ports counted from ``first_port`` in the order of
:func:`pool_keys`. ``specroute pools plan`` prints the command line of each pool from the set, and
``specroute pools start`` runs them (:mod:`analyzer.engine.llama_server_pools`).

Each policy carries its curve over the analysis' settings (:mod:`analyzer.pricing.option_curve`), decided by
the one rule every engine shares, and the set carries the analysis' plain step cost: feedback from the pools
(llama-server's ``timings``) moves each task's estimate per setting and, where it crosses the rule, sends
the task to another pool the set publishes (:mod:`router.decide.server_adaptation`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from analyzer.analysis.server_store import get_server_analysis
from analyzer.engine.llama_server_pools import Pool, PoolPlan, pool_flags
from analyzer.measuring.server_drafting import parse_drafter
from analyzer.names import DEFAULT_MARGIN, LLAMA_SERVER
from analyzer.orm import ServerAnalysisRecord
from analyzer.pricing.option_curve import OptionCurve, spread_words, stored_option_rows, task_option_curves
from analyzer.pricing.speedup import mean_and_variance, recommendation_tier
from analyzer.settings import load_settings
from router.orm import PolicySet, TaskPolicy
from router.policies.policy import (
    FALLBACK_TASK,
    NO_GAMMA,
    PolicyError,
    activate_policy_set,
    find_policy_set,
    router_pools,
)

OFF = "off"
DEFAULT_FIRST_PORT = 8081


def option_curves(record: ServerAnalysisRecord) -> tuple[dict[str, OptionCurve], OptionCurve]:
    """Each task's curve over the analysis' settings and the workload's, decided by the one rule
    (:func:`analyzer.pricing.option_curve.task_option_curves`), from the stored prompt rows."""
    tasks, plain, options, spread = stored_option_rows(record.prompts)
    return task_option_curves(tasks, plain, options, record.drafters, spread=spread)


def workload_choice(record: ServerAnalysisRecord) -> tuple[dict[str, float], str | None]:
    """Every setting's predicted speedup over the whole workload, and the setting the one rule chooses
    there (None: off; always off where the analysis' advice is withheld)."""
    _, workload = option_curves(record)
    predicted = dict(zip(workload.labels, workload.speedups))
    return predicted, workload.chosen if record.advice_withheld is None else None


def pool_keys(chosen: Sequence[str | None]) -> list[str]:
    """The pools a set of choices needs: "off" (a request the rules keep plain goes there too), then
    each distinct setting by its label, sorted."""
    return [OFF, *sorted({label for label in chosen if label is not None})]


def server_pools(keys: Sequence[str], configured: Mapping[str, str], first_port: int) -> dict[str, str]:
    """Each pool key's deployment: ``configured`` (SPECROUTE_ROUTER_POOLS) where it names the key, else
    a llama-server on this machine, ``http://127.0.0.1:<first_port + position>``."""
    return {key: configured.get(key, f"http://127.0.0.1:{first_port + i}") for i, key in enumerate(keys)}


def _policy(record: ServerAnalysisRecord, task: str, rows: list[dict[str, Any]], curve: OptionCurve,
            fallback: bool) -> TaskPolicy:  # fmt: skip
    """One task's policy from its curve over the settings: the setting the rule chose (None: off, and off
    everywhere where the analysis' advice is withheld), the replay's acceptance of that setting over the
    task's prompts (its mean and variance over prompts that drafted; 0 for off), the tier they earn, the
    interval of the chosen (else the best) setting's speedup, and the curve itself for the online estimate."""
    chosen = curve.chosen if record.advice_withheld is None else None
    shown = chosen or curve.best
    predicted = curve.speedup_of(shown) if shown is not None else 1.0
    low, high = curve.interval_of(shown) if shown is not None else (None, None)
    index = record.drafters.index(chosen) if chosen is not None else None
    rates = []
    for row in rows:
        setting = row["settings"][index] if index is not None else None
        if setting is not None and setting["draft_n"] > 0:
            rates.append(setting["draft_n_accepted"] / setting["draft_n"])
    alpha, variance = mean_and_variance(rates)
    alpha = alpha if np.isfinite(alpha) else 0.0
    return TaskPolicy(
        task_type=task,
        is_fallback=fallback,
        speculate=chosen is not None,
        gamma=_gamma(chosen),
        alpha_mean=float(alpha),
        alpha_var=variance,
        n_prompts=len(rows),
        expected_speedup=float(predicted) if chosen is not None else 1.0,
        tier=recommendation_tier(alpha, variance) if chosen is not None else "NOT_RECOMMENDED",
        speedup_curve=[],
        speedup_low=_finite(low),
        speedup_high=_finite(high),
        decision_basis="workload" if curve.point.basis == "workload" else "task",
        decision_reason=_reason(record, curve, chosen, shown, predicted, low),
        setting=chosen,
        # withheld advice: no curve, so feedback never turns the task on (router/decide/server_adaptation.py)
        option_curve=curve.as_dict() if record.advice_withheld is None else None,
    )


def _finite(value: float | None) -> float | None:
    return float(value) if value is not None and np.isfinite(value) else None


def _reason(record: ServerAnalysisRecord, curve: OptionCurve, chosen: str | None, shown: str | None,
            predicted: float, low: float | None) -> str:  # fmt: skip
    """Why the policy speculates with its setting or not, in the rule's terms."""
    if record.advice_withheld is not None:
        return f"advice withheld: {record.advice_withheld}"
    if shown is None:
        return "no setting was priced"
    low_text = f", interval from {low:.2f}x" if low is not None and np.isfinite(low) else ""
    low_text += spread_words(dict(zip(curve.labels, curve.fit_errors)).get(shown)) if low_text else ""
    basis = (
        f" (fewer than {curve.curve.min_prompts} prompts: the workload's decision)"
        if curve.point.basis == "workload"
        else ""
    )
    if chosen is not None:
        bar = 1 + curve.curve.margin
        return f"{chosen} predicts {predicted:.2f}x in llama-server{low_text}, clearing {bar:.2f}x and 1.0{basis}"
    return f"best setting {shown} predicts {predicted:.2f}x{low_text}: {curve.point.code.replace('_', ' ')}{basis}"


def plain_cost(record: ServerAnalysisRecord) -> dict[str, float] | None:
    """The analysis' plain step cost (every drafter family shares the plain server's fit), which prices a
    pool's request as plain decoding would have run it; None where no cost was fitted."""
    for cost in record.cost.values():
        return {"step_ms": float(cost["plain_step_ms"]), "per_context_ms": float(cost["per_context_ms"])}
    return None


def _gamma(label: str | None) -> int:
    """The most tokens a setting drafts per round (the decision's gamma); NO_GAMMA for off."""
    return NO_GAMMA if label is None else parse_drafter(label).max_draft


def server_policy_set(
    session: Session, record: ServerAnalysisRecord, pools: Mapping[str, str] | None = None,
    first_port: int = DEFAULT_FIRST_PORT,
) -> PolicySet:  # fmt: skip
    """The policy set llama-server analysis ``record`` publishes, built and not stored (no version yet): a
    policy per task as the analysis chose, a fallback ("*") from the whole workload (:func:`workload_choice`),
    and the pools (:func:`server_pools`; ``pools`` None: SPECROUTE_ROUTER_POOLS in force). What publishing
    stores and what ``specroute export --analysis llama-server:ID`` writes, as ``run_policy_set`` is for a run."""
    if not record.tasks:
        raise PolicyError(f"llama-server analysis #{record.id} has no tasks to publish")
    rows_of: dict[str, list[dict[str, Any]]] = {}
    for row in record.prompts:
        rows_of.setdefault(row["task"], []).append(row)
    curves, workload = option_curves(record)
    policies = [_policy(record, task, rows_of[task], curve, False) for task, curve in curves.items()]
    policies.append(_policy(record, FALLBACK_TASK, record.prompts, workload, True))
    keys = pool_keys([p.setting for p in policies])
    policy_set = PolicySet(
        run_id=None,
        server_analysis_id=record.id,
        measured_by=LLAMA_SERVER,
        priced_by=LLAMA_SERVER,
        margin=DEFAULT_MARGIN,
        gamma_max=max([p.gamma for p in policies] + [1]),
        draft_kind=LLAMA_SERVER,  # each task's drafter is its policy's setting
        draft_options={},
        cost=None,
        plain_cost=plain_cost(record),
        pools=server_pools(keys, router_pools(load_settings()) if pools is None else pools, first_port),
    )
    policy_set.policies = policies
    return policy_set


def publish_server_policies(
    session: Session,
    analysis_id: int,
    *,
    notes: str | None = None,
    activate: bool | None = None,
    pools: Mapping[str, str] | None = None,
    first_port: int = DEFAULT_FIRST_PORT,
) -> PolicySet:
    """A new policy set from llama-server analysis ``analysis_id`` (:func:`server_policy_set`), stored with the
    next version. ``activate`` None (the default) activates it unless the analysis' advice is withheld (a
    step-cost fit that missed its bound, or a machine too noisy to time on: every task is off there, and the set
    is stored, not activated); True or False decide regardless."""
    record = get_server_analysis(session, analysis_id)
    policy_set = server_policy_set(session, record, pools, first_port)
    policy_set.version = (session.scalar(select(func.max(PolicySet.version))) or 0) + 1
    policy_set.notes = notes
    session.add(policy_set)
    session.flush()
    if activate is None:
        activate = record.advice_withheld is None
    if activate:
        activate_policy_set(session, policy_set.version)
    return policy_set


def policy_set_plan(session: Session, version: int | None = None) -> PoolPlan:
    """The pools of policy set ``version`` (None: the active one): per key of its published pools, the URL,
    the flags and the tasks whose policies go there. PolicyError where there is no such set, or where it
    was not published from a llama-server analysis (its decisions are then a gamma, not a setting)."""
    policy_set = find_policy_set(session, version)
    if policy_set.server_analysis_id is None:
        raise PolicyError(
            f"policy set v{policy_set.version} was published from analysis run {policy_set.run_id}, not from a "
            "llama-server analysis, so it names no llama-server pools: publish one with 'specroute policies "
            "publish --analysis llama-server:ID'"
        )
    record = get_server_analysis(session, policy_set.server_analysis_id)
    published = dict(policy_set.pools or {})
    keys = pool_keys([p.setting for p in policy_set.policies])
    pools = []
    for key in keys:
        tasks = [
            p.task_type
            for p in policy_set.policies
            if (p.setting if p.speculate else None) == (None if key == OFF else key)
        ]
        pools.append(Pool(key, published.get(key, key), pool_flags(key, record.draft_model), tasks))
    return PoolPlan(
        policy_set.version, record.id, record.model, record.draft_model, record.threads, record.n_ctx, pools
    )
