"""Routing policies: turn a finished analysis run into a versioned policy set (one policy per task
type plus a workload-wide fallback), keep every set, and keep exactly one active."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from analyzer.advice.option_rows import gamma_option
from analyzer.advice.report import run_advice_withheld
from analyzer.advice.summary import AnalysisSummary, GroupSummary, cost_for_run
from analyzer.advice.summary_store import run_summary
from analyzer.db import utcnow
from analyzer.errors import SpecrouteError
from analyzer.measuring.server_drafting import parse_drafter
from analyzer.models.specs import NGRAM_DEFAULT_MAX, parse_spec
from analyzer.names import DEFAULT_GAMMA_MAX, DEFAULT_MARGIN
from analyzer.orm import AnalysisRun
from analyzer.pricing.policy_curve import PolicyCurve, as_curve
from analyzer.pricing.speedup import Cost
from analyzer.settings import Settings, SettingsError, load_settings
from router.orm import PolicySet, TaskPolicy, activate_only

FALLBACK_TASK = "*"
NO_GAMMA = (
    0  # how the database and the API write "no gamma" (None in the code: analyzer.pricing.speedup.best_gamma)
)
PRIOR_ALPHA_RANGE = (1e-3, 1 - 1e-3)  # the analysis' alpha as a prior: never exactly 0 or 1


@dataclass(frozen=True)
class PolicyContract:
    """Everything the router needs of the run behind a policy set, published with it (the router reads
    no analysis run): the largest gamma the run analysed, the margin its decisions cleared, the engine
    whose cost priced them and the one that measured the acceptance, the draft (its spec kind, "ngram"
    for prompt lookup, and the n-gram size) and the batch-1 cost the decisions were priced with (None:
    none was linked; nothing adapts online without it)."""

    gamma_max: int = DEFAULT_GAMMA_MAX
    margin: float = DEFAULT_MARGIN
    priced_by: str | None = None  # None: no policy set
    measured_by: str | None = None
    draft_kind: str = "ngram"
    ngram_max: int = NGRAM_DEFAULT_MAX
    cost: Cost | None = None
    pools: Mapping[str, str] | None = (
        None  # None: a set stored without pools (the serving process's setting names them)
    )
    plain_cost: Mapping[str, float] | None = None  # a llama-server set's plain step cost (None: a run's set)

    @property
    def by_setting(self) -> bool:
        """A llama-server set that feedback adapts: its tasks move between the settings of its pools."""
        return self.plain_cost is not None and self.pools is not None

    @property
    def published_settings(self) -> frozenset[str]:
        """The llama-server settings the set publishes a pool for ("off" is not one)."""
        return frozenset(self.pools or ()) - {"off"} if self.by_setting else frozenset()

    @classmethod
    def of(cls, policy_set: PolicySet | None) -> "PolicyContract":
        """The contract of a stored policy set (the defaults, engines None, without one)."""
        if policy_set is None:
            return cls()
        options = policy_set.draft_options or {}
        return cls(
            int(policy_set.gamma_max),
            float(policy_set.margin),
            policy_set.priced_by,
            policy_set.measured_by,
            policy_set.draft_kind,
            int(options.get("max_ngram", NGRAM_DEFAULT_MAX)),
            Cost.from_json(policy_set.cost),
            dict(policy_set.pools) if policy_set.pools is not None else None,
            dict(policy_set.plain_cost) if policy_set.plain_cost else None,
        )

    def pool(
        self, speculate: bool, gamma: int, configured: Mapping[str, str], setting: str | None = None
    ) -> str:
        """The deployment this decision goes to: the set's published pools, or (a set published
        before they were) ``configured``, the serving process's SPECROUTE_ROUTER_POOLS."""
        return pool_name(self.pools if self.pools is not None else configured, speculate, gamma, setting)


def pool_name(pools: Mapping[str, str], speculate: bool, gamma: int, setting: str | None = None) -> str:
    """The deployment named in ``pools`` for a decision: keyed "off", "k<gamma>" when it speculates, or
    the llama-server drafter ``setting`` it speculates with ("ngram-mod 16 2-16"); else the default name
    "spec-off" / "spec-k<gamma>" / "llama-server-<setting, dashed>"."""
    if speculate and setting is not None:
        return pools.get(setting, "llama-server-" + setting.replace(" ", "-").replace("/", "-"))
    key = f"k{gamma}" if speculate else "off"
    return pools.get(key, f"spec-k{gamma}" if speculate else "spec-off")


def published_pools(configured: Mapping[str, str], gamma_max: int) -> dict[str, str]:
    """The pools a policy set publishes: a name for "off" and for every gamma up to ``gamma_max`` (online
    adaptation may move a task to any of them), from ``configured`` (SPECROUTE_ROUTER_POOLS) or the
    default names; a configured key beyond ``gamma_max`` is kept, since it names a deployment too."""
    names = {"off": pool_name(configured, False, 0)}
    names |= {f"k{g}": pool_name(configured, True, g) for g in range(1, gamma_max + 1)}
    return names | dict(configured)


class PolicyError(SpecrouteError, ValueError):
    """A policy set cannot be published or activated as asked; the message says why."""

    status, code = 400, "invalid_policy_request"


def task_policies(summary: AnalysisSummary) -> list[TaskPolicy]:
    """The policy rows of a run's summary: one per task type (one where nothing pays is published
    off, so that the router routes it as the report says rather than by the fallback), and the
    fallback ("*") from the whole workload (none without results or a cost profile). A task decided by
    the workload (too few prompts) keeps its own alpha, n and tier but takes the workload's decision,
    gamma, speedup, interval and curves, so that routing it is routing the workload."""
    workload = summary.workload
    if workload is None or summary.cost is None:
        return []
    rows = [(task, group, False) for task, group in summary.tasks.items()]
    return [
        _policy(task, group, workload, fallback)
        for task, group, fallback in rows + [(FALLBACK_TASK, workload, True)]
    ]


def _policy(task: str, summary: GroupSummary, workload: GroupSummary, fallback: bool) -> TaskPolicy:
    decided = workload if summary.decision_basis == "workload" else summary
    return TaskPolicy(
        task_type=task,
        is_fallback=fallback,
        speculate=bool(decided.speculate),
        gamma=decided.best_gamma or NO_GAMMA,
        alpha_mean=summary.alpha_mean if summary.alpha_mean is not None else 0.0,
        alpha_var=summary.alpha_var,
        n_prompts=summary.n,
        expected_speedup=decided.predicted_speedup or 0.0,
        tier=summary.tier,
        speedup_curve=list(decided.speedup_curve),
        speedup_curves_by_batch={str(b): list(entry.speedup_curve) for b, entry in decided.by_batch.items()}
        or None,
        speedup_low=decided.speedup_interval[0],
        speedup_high=decided.speedup_interval[1],
        speedup_lows_by_batch={str(b): entry.speedup_interval[0] for b, entry in decided.by_batch.items()}
        or None,
        decision_basis=summary.decision_basis,
        decision_reason=summary.decision_reason,
        option_curve=gamma_option_curve(summary, decided),
    )


def gamma_option_curve(summary: GroupSummary, decided: GroupSummary) -> dict[str, Any]:
    """A run's policy as a curve over its options, in the shape a llama-server set's policy has
    (:meth:`analyzer.pricing.option_curve.OptionCurve.as_dict`), so that every policy set shows one curve:
    per gamma the option its rows are labelled by (``gamma 3``, :func:`analyzer.advice.option_rows.gamma_option`),
    S(g) at batch 1, and the interval where the analysis has one (at g*); the option chosen (None: off); the
    rule's code and basis. ``decided`` is the group whose numbers decide (the workload's for a task with
    too few prompts), ``summary`` the task's own."""
    low, high = (v if v is not None and np.isfinite(v) else None for v in decided.speedup_interval)
    best = decided.best_gamma
    return {
        "options": [
            {
                "label": gamma_option(g),
                "speedup": speedup,
                "low": low if g == best else None,
                "high": high if g == best else None,
            }
            for g, speedup in enumerate(decided.speedup_curve, start=1)
        ],
        "chosen": gamma_option(best) if decided.speculate and best is not None else None,
        "code": summary.decision_code,
        "basis": summary.decision_basis,
    }


def publish_policies(
    session: Session,
    run_id: int,
    *,
    notes: str | None = None,
    activate: bool | None = None,
    pools: Mapping[str, str] | None = None,
) -> PolicySet:
    """Build a new policy set from run ``run_id`` (which must be done and have results): per task
    {speculate, gamma, alpha estimate with n and variance, expected speedup, tier, S(g) curve, and
    the S(g) curve at every profiled batch size} and a fallback ("*") from the whole workload. The set
    records the run's engine: the one whose cost priced these decisions. ``activate`` None (the
    default) activates it unless the run's advice is withheld (a cost profile measured on a busy
    machine, :func:`analyzer.advice.report.run_advice_withheld`): such a set is stored, not activated, until
    someone activates it explicitly; True or False decide regardless. ``pools`` (the publisher's
    SPECROUTE_ROUTER_POOLS; None: the settings in force) names the deployment of every decision the set
    can make, published with it (:func:`published_pools`)."""
    run = session.get(AnalysisRun, run_id)
    if run is None:
        raise PolicyError(f"no analysis run {run_id}")
    policy_set = run_policy_set(session, run, pools)
    policy_set.version = (session.scalar(select(func.max(PolicySet.version))) or 0) + 1
    policy_set.notes = notes
    session.add(policy_set)
    session.flush()
    if activate is None:
        activate = run_advice_withheld(run) is None
    if activate:
        activate_policy_set(session, policy_set.version)
    return policy_set


def run_policy_set(session: Session, run: AnalysisRun, pools: Mapping[str, str] | None = None) -> PolicySet:
    """The policy set run ``run`` publishes, built and not stored (no version yet): what publishing
    stores and what ``specroute export --run`` writes. PolicyError unless the run is done with results."""
    if run.status != "done":
        raise PolicyError(f"run {run.id} is {run.status}; only a finished run can be published")
    policies = task_policies(run_summary(session, run))
    if not policies:
        raise PolicyError(f"run {run.id} has no measured prompts to publish")
    params = run.run_params
    draft, cost = parse_spec(run.pair.draft.spec), cost_for_run(run)
    policy_set = PolicySet(
        run_id=run.id,
        measured_by=run.measured_by,
        priced_by=run.priced_by,
        margin=params.margin,
        gamma_max=params.gamma_max,
        draft_kind=draft.kind,
        draft_options=dict(draft.options) if draft.kind == "ngram" else {},
        cost=cost.as_json() if cost is not None else None,
        pools=published_pools(router_pools(load_settings()) if pools is None else pools, params.gamma_max),
    )
    policy_set.policies = policies
    return policy_set


def activate_policy_set(session: Session, version: int) -> PolicySet:
    """Make policy set ``version`` the only active one (older sets stay stored)."""
    chosen = activate_only(session, PolicySet, version)
    if chosen is None:
        raise PolicyError(f"no policy set version {version}")
    chosen.activated_at = utcnow()
    return chosen


def find_policy_set(session: Session, version: int | None) -> PolicySet:
    """Policy set ``version`` (None: the active one) with its policies loaded; PolicyError naming what
    is missing otherwise."""
    query = select(PolicySet).options(selectinload(PolicySet.policies))
    policy_set = session.scalar(
        query.where(PolicySet.is_active.is_(True))
        if version is None
        else query.where(PolicySet.version == version)
    )
    if policy_set is None:
        raise PolicyError("no active policy set" if version is None else f"no policy set version {version}")
    return policy_set


def active_policy_set(session: Session) -> PolicySet | None:
    """The active policy set with its policies loaded, or None before the first publish."""
    return session.scalar(
        select(PolicySet).where(PolicySet.is_active.is_(True)).options(selectinload(PolicySet.policies))
    )


def list_policy_sets(session: Session) -> list[PolicySet]:
    """Every policy set, newest first, with policies loaded."""
    return list(
        session.scalars(
            select(PolicySet).order_by(PolicySet.version.desc()).options(selectinload(PolicySet.policies))
        )
    )


@dataclass(frozen=True)
class PolicySnapshot:
    """An immutable copy of one task's policy, for the decision path (no database access there);
    ``speedup_curve[g-1]`` is the published S(g) at batch 1 (NaN where not finite);
    ``curves_by_batch`` maps each profiled batch size to its S(g) curve (empty: batch 1 only)."""

    task_type: str
    speculate: bool
    gamma: int
    alpha_mean: float
    alpha_var: float | None
    n_prompts: int
    expected_speedup: float
    tier: str
    speedup_curve: tuple[float, ...]
    curves_by_batch: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    speedup_interval: tuple[float | None, float | None] = (None, None)
    decision_basis: str | None = None
    lows_by_batch: Mapping[int, float | None] = field(default_factory=dict)
    setting: str | None = None  # the llama-server drafter setting (router/policies/server_policy.py)
    option_curve: Mapping | None = (
        None  # its curve over its analysis' options (None: a run's set stored without one)
    )

    @classmethod
    def of(cls, policy: TaskPolicy) -> "PolicySnapshot":
        curves = {int(b): as_curve(curve) for b, curve in (policy.speedup_curves_by_batch or {}).items()}
        return cls(
            policy.task_type,
            policy.speculate,
            policy.gamma,
            policy.alpha_mean,
            policy.alpha_var,
            policy.n_prompts,
            policy.expected_speedup,
            policy.tier,
            as_curve(policy.speedup_curve),
            curves,
            (policy.speedup_low, policy.speedup_high),
            policy.decision_basis,
            {int(b): low for b, low in (policy.speedup_lows_by_batch or {}).items()},
            policy.setting,
            policy.option_curve,
        )

    @property
    def prior_alpha(self) -> float:
        """The analysis' alpha as the online estimate's prior (kept inside PRIOR_ALPHA_RANGE)."""
        return float(np.clip(self.alpha_mean, *PRIOR_ALPHA_RANGE))

    def curve(self, contract: PolicyContract, cost: Cost | None = None) -> PolicyCurve:
        """This policy's :class:`PolicyCurve` under the policy set's contract (``cost``: the run's
        batch-1 cost, which bounds the gammas priced and prices policies published without a curve)."""
        return PolicyCurve(
            self.speedup_curve,
            self.curves_by_batch,
            self.lows_by_batch,
            self.speedup_interval[0],
            margin=contract.margin,
            gamma_max=contract.gamma_max,
            prior_alpha=self.prior_alpha,
            cost=cost,
        )


def router_pools(settings: Settings) -> dict[str, str]:
    """The parsed ``SPECROUTE_ROUTER_POOLS`` mapping (the settings hold its text; the router reads it here);
    a SettingsError names what is wrong with it."""
    import json

    if not settings.router_pools.strip():
        return {}
    try:
        pools = json.loads(settings.router_pools)
    except ValueError as exc:
        raise SettingsError(f"SPECROUTE_ROUTER_POOLS: not valid JSON ({exc})") from None
    if not isinstance(pools, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in pools.items()
    ):
        raise SettingsError("SPECROUTE_ROUTER_POOLS: expected a JSON object of strings")
    bad = [
        k
        for k in pools
        if k != "off" and not (k.startswith("k") and k[1:].isdigit()) and not _is_drafter_label(k)
    ]
    if bad:
        raise SettingsError(
            "SPECROUTE_ROUTER_POOLS: keys must be 'off', 'k<gamma>' or a llama-server drafter setting "
            f"('ngram-mod 16 2-16'), got {', '.join(bad)}"
        )
    return pools


def _is_drafter_label(text: str) -> bool:
    """Whether ``text`` is a llama-server drafter setting's label."""
    try:
        return parse_drafter(text).label == text
    except ValueError:
        return False
