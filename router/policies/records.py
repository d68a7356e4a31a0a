"""The router's stored records as JSON-ready data, one serialiser per record, shared by the API, the
web pages and the command line: policy sets with their policies, online estimates, classifier
versions."""

from __future__ import annotations

from typing import Any

from analyzer.advice.option_rows import gamma_option
from analyzer.analysis.analysis_ref import RUN, SERVER, AnalysisRef
from router.orm import ClassifierVersion, PolicySet, TaskEstimate, TaskPolicy
from router.policies.policy import NO_GAMMA, PolicyContract, PolicySnapshot, pool_name


def option_name(speculate: bool, gamma: int, setting: str | None) -> str | None:
    """The option a policy (or an estimate) speculates with, named as its analysis names its options, the
    same for every policy set: a llama-server drafter setting ("ngram-simple 2/4") or a run's gamma
    ("gamma 4"); None: off."""
    return (setting or gamma_option(gamma)) if speculate else None


def analysis_ref(policy_set: PolicySet) -> str | None:
    """The analysis a set was published from, as ``specroute runs list`` names it (None: its run is gone)."""
    if policy_set.server_analysis_id is not None:
        return str(AnalysisRef(SERVER, policy_set.server_analysis_id))
    return str(AnalysisRef(RUN, policy_set.run_id)) if policy_set.run_id is not None else None


def policy_dict(
    policy: TaskPolicy, contract: PolicyContract | None = None, pools: dict[str, str] | None = None
) -> dict[str, Any]:
    """A TaskPolicy, with the best gamma, speedup and decision at each profiled batch size, as its
    policy curve decides them under the set's contract (the router's rule); ``option`` and ``pool``, the
    option it publishes and the pool of the set's ``pools`` that runs it, in the same terms for every set."""
    curve = PolicySnapshot.of(policy).curve(contract or PolicyContract())
    by_batch = {}
    for batch in curve.batch_sizes:
        point = curve.decide(batch)
        gamma = point.gamma if point is not None and point.gamma is not None else NO_GAMMA
        by_batch[str(batch)] = {
            "gamma": gamma,
            "expected_speedup": point.speedup if point is not None and gamma else 1.0,
            "speculate": bool(gamma) and point is not None and point.speculate,
            "decision_code": point.code if point is not None else "nothing_measured",
        }
    return {
        "task_type": policy.task_type,
        "fallback": policy.is_fallback,
        "speculate": policy.speculate,
        "gamma": policy.gamma,
        "alpha_mean": policy.alpha_mean,
        "alpha_var": policy.alpha_var,
        "n_prompts": policy.n_prompts,
        "expected_speedup": policy.expected_speedup,
        "tier": policy.tier,
        "speedup_interval": [policy.speedup_low, policy.speedup_high],
        "decision_basis": policy.decision_basis,
        "decision_reason": policy.decision_reason,
        "setting": policy.setting,
        "option": option_name(policy.speculate, policy.gamma, policy.setting),
        "pool": pool_name(pools, policy.speculate, policy.gamma, policy.setting)
        if pools is not None
        else None,
        "option_curve": policy.option_curve,
        "by_batch": by_batch,
    }


def policy_set_dict(policy_set: PolicySet, *, with_policies: bool = True) -> dict[str, Any]:
    """A policy set: version, whether active, its analysis (``analysis``, as ``specroute runs list`` names it;
    ``run_id`` or ``server_analysis_id`` by kind), the engines that
    measured and priced it, its margin, gamma_max, draft and batch-1 cost (the contract the router
    decides under), a llama-server set's plain step cost (what its feedback is priced against), notes, times
    and (``with_policies``) its policies, the fallback ("*") last.
    ``engine`` repeats ``priced_by`` for clients that read that name."""
    data: dict[str, Any] = {
        "version": policy_set.version,
        "active": policy_set.is_active,
        "analysis": analysis_ref(policy_set),
        "run_id": policy_set.run_id,
        "server_analysis_id": policy_set.server_analysis_id,
        "engine": policy_set.priced_by,
        "priced_by": policy_set.priced_by,
        "measured_by": policy_set.measured_by,
        "margin": policy_set.margin,
        "gamma_max": policy_set.gamma_max,
        "draft_kind": policy_set.draft_kind,
        "draft_options": dict(policy_set.draft_options or {}),
        "cost": policy_set.cost,
        "pools": policy_set.pools,
        "plain_cost": policy_set.plain_cost,
        "notes": policy_set.notes,
        "created_at": policy_set.created_at.isoformat(timespec="seconds"),
        "activated_at": policy_set.activated_at.isoformat(timespec="seconds")
        if policy_set.activated_at
        else None,
    }
    if with_policies:
        contract = PolicyContract.of(policy_set)
        data["policies"] = [policy_dict(p, contract, policy_set.pools) for p in policy_set.policies]
    return data


def estimate_dict(estimate: TaskEstimate) -> dict[str, Any]:
    """A TaskEstimate (alpha is the posterior mean; ``option`` the option in force, named as a policy's is)."""
    return {
        "task_type": estimate.task_type,
        "alpha": estimate.beta_a / (estimate.beta_a + estimate.beta_b),
        "prior_alpha": estimate.prior_alpha,
        "speculate": estimate.speculate,
        "gamma": estimate.gamma,
        "events": estimate.events,
        "total_rounds": estimate.total_rounds,
        "total_drafted": estimate.total_drafted,
        "total_accepted": estimate.total_accepted,
        "decision_since": estimate.decision_since.isoformat(timespec="seconds")
        if estimate.decision_since
        else None,
        "updated_at": estimate.updated_at.isoformat(timespec="seconds") if estimate.updated_at else None,
        "setting": estimate.setting,
        "option": option_name(estimate.speculate, estimate.gamma, estimate.setting),
        "options": {
            label: {"plain_ms": values[0], "served_ms": values[1], "events": int(values[2])}
            for label, values in estimate.options.items()
        }
        if estimate.options is not None
        else None,
    }


def classifier_dict(record: ClassifierVersion) -> dict[str, Any]:
    """A classifier version's record (no artifact): labels, training data, library versions, and its
    scores (stratified and leave-one-source-out CV, baseline, per class, calibration, reachability)."""
    scores = record.scores or {}
    return {
        "version": record.version,
        "active": record.is_active,
        "labels": list(record.labels),
        "training_prompt_count": record.training_prompt_count,
        "training_data_sha256": record.training_data_sha256,
        "library_versions": dict(record.library_versions),
        "created_at": record.created_at.isoformat(),
        "source": scores.get("source"),
        "macro_f1": scores.get("macro_f1"),
        "accuracy": scores.get("accuracy"),
        "baseline": scores.get("baseline"),
        "per_class": scores.get("per_class"),
        "features": scores.get("features", "tfidf"),
        "grouped": scores.get("grouped"),
        "calibration": scores.get("calibration"),
        "reachability": scores.get("reachability"),
    }
