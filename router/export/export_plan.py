"""What ``specroute export`` hands to an engine, engine-neutral: a run's (or a policy set's) decisions as the
router makes them, per task and per batch size, with where every value came from (:class:`ExportPlan`).
The writers in :mod:`router.export.export_engines` turn one plan into each engine's own terms.

The decisions are the router's own: the plan asks a :class:`router.decide.decision.Router` built from the policy
set (a run's is built as publishing would build it, and not stored) for every task at every batch size
from 1 to just past the largest one anything decides at (the profiled sizes, or the router's
``SPECROUTE_ROUTER_MAX_BATCH_SIZE``). Consecutive batch sizes with one decision form a :class:`Span`; an
engine's per-batch table is the workload's spans, and the pools a per-task deployment needs are the
distinct gammas of every task's spans.

Where neighbouring batch sizes flip between on and off, the flip is a :class:`Cliff` when the intervals
do not settle it: the off side's interval reaches above 1.00x (the data do not say speculating loses
there) or the two sizes' intervals overlap. The exports mark a cliff rather than draw a hard edge. A flip
that the router's batch-size rule makes (nothing profiled above a size) is an edge of what was measured,
said as such."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from analyzer.advice.summary import GroupSummary
from analyzer.advice.summary_store import run_summary
from analyzer.analysis.analysis_ref import RUN, AnalysisRef, resolve_analysis
from analyzer.analysis.server_store import get_server_analysis
from analyzer.engine.engines import pricing_entry
from analyzer.errors import SpecrouteError
from analyzer.models.specs import parse_spec
from analyzer.orm import AnalysisRun, ServerAnalysisRecord
from analyzer.settings import load_settings
from router.decide.contract import RouteRequest
from router.decide.decision import Router, RouterConfig
from router.orm import PolicySet
from router.policies.policy import (
    FALLBACK_TASK,
    PolicyContract,
    PolicySnapshot,
    find_policy_set,
    run_policy_set,
)
from router.policies.records import analysis_ref
from router.policies.server_policy import server_policy_set

Interval = tuple[float | None, float | None]


class ExportError(SpecrouteError, ValueError):
    """An export that cannot be written as asked (no such run or set, an engine that cannot run its
    decisions, ``--strict`` with another engine's prices); the message says why."""

    status, code = 400, "invalid_export"


@dataclass(frozen=True)
class Point:
    """A group at one profiled batch size: S(g*) and its interval."""

    batch: int
    speedup: float | None
    interval: Interval


@dataclass(frozen=True)
class Span:
    """Batch sizes ``low``..``high`` (None: and every larger one) with one decision: ``gamma`` (0: off),
    and where it comes from (``source``: a sentence)."""

    low: int
    high: int | None
    gamma: int
    source: str

    def covers(self, batch: int) -> bool:
        return self.low <= batch and (self.high is None or batch <= self.high)

    @property
    def sizes(self) -> str:
        """``"1"``, ``"2-8"`` or ``"9+"``."""
        if self.high is None:
            return f"{self.low}+"
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"


@dataclass(frozen=True)
class Cliff:
    """A flip between on and off from batch ``last`` to ``last + 1`` that the intervals do not settle."""

    last: int
    text: str


@dataclass(frozen=True)
class GroupPlan:
    """One task's (or, ``task`` "*", the workload's) decisions: at batch 1 (``gamma`` 0: off) with S(g*),
    interval, n and the decision's sentence, its spans over every batch size and its cliffs."""

    task: str
    n: int
    basis: str | None
    gamma: int
    speedup: float | None
    interval: Interval
    reason: str | None
    setting: str | None
    spans: tuple[Span, ...]
    cliffs: tuple[Cliff, ...]
    # transformers' assisted generation under its defaults, priced at batch 1 (the report's
    # ``assistant_defaults``; None: not replayed)
    defaults: dict[str, Any] | None = None

    def gamma_at(self, batch: int) -> int:
        """The decision at ``batch`` (0: off)."""
        return next(span.gamma for span in self.spans if span.covers(batch))

    @property
    def gammas(self) -> set[int]:
        """Every gamma the group speculates with at some batch size."""
        return {span.gamma for span in self.spans if span.gamma}

    def provenance(self) -> dict[str, Any]:
        """Where the group's batch-1 decision came from, as JSON."""
        return {
            "task": self.task,
            "n": self.n,
            "gamma": self.gamma,
            "predicted_speedup": self.speedup,
            "speedup_interval": list(self.interval),
            "decision": self.reason,
        }


@dataclass(frozen=True)
class ExportPlan:
    """A run's or policy set's decisions for an engine's config (module docstring)."""

    source: str  # "run 12" or "policy set v3"
    # the analysis the decisions came from, as ``specroute runs list`` names it (None: its run is gone)
    analysis: str | None
    policy_version: int | None
    target: str
    draft: str
    draft_kind: str  # "ngram" (prompt lookup), "llama-server" (a llama-server drafter setting), or a model's spec kind
    ngram_max: int
    measured_by: str | None
    priced_by: str | None
    priced_on: str  # the profile(s) that priced it, in words
    gamma_max: int
    margin: float
    max_batch_size: int
    profiled: tuple[int, ...]
    workload: GroupPlan
    tasks: tuple[GroupPlan, ...]
    pools: dict[str, str]  # the set's published pools (key -> name or URL)
    # a set published from a llama-server analysis: {"model", "draft_model", "threads", "n_ctx", "build"}
    server: dict[str, Any] | None = None

    @property
    def decides_settings(self) -> bool:
        """Whether the decisions are drafter settings of the engine that measured them (an analysis in
        llama-server: ``--spec-type`` settings), which only an engine that runs them can export, rather
        than a gamma, which every engine takes."""
        return self.server is not None

    @property
    def groups(self) -> tuple[GroupPlan, ...]:
        """The tasks, then the workload."""
        return (*self.tasks, self.workload)

    def tasks_with(self, gamma: int) -> list[str]:
        """The tasks whose decision is ``gamma`` (0: off) at some batch size ("*": the workload's)."""
        return [g.task for g in self.groups if gamma in {span.gamma for span in g.spans}]

    def provenance(self) -> dict[str, Any]:
        """Where the plan's numbers came from, as JSON (every export carries it)."""
        return {
            "source": self.source,
            "analysis": self.analysis,
            "policy_version": self.policy_version,
            "target": self.target,
            "draft": self.draft,
            "measured_by": self.measured_by,
            "priced_by": self.priced_by,
            "priced_on": self.priced_on,
            "margin": self.margin,
            "profiled_batch_sizes": list(self.profiled),
            "router_max_batch_size": self.max_batch_size,
        }


# ---------------------------------------------------------------- building a plan


def plan_for_run(session: Session, run_id: int) -> ExportPlan:
    """The plan of run ``run_id``'s decisions, as publishing it would route them."""
    run = session.get(AnalysisRun, run_id)
    if run is None:
        raise ExportError(f"no analysis run {run_id}")
    return _plan(session, run_policy_set(session, run), run, f"run {run_id}")


def plan_for_server_analysis(session: Session, analysis_id: int) -> ExportPlan:
    """The plan of llama-server analysis ``analysis_id``'s decisions, as publishing it would route them."""
    record = session.get(ServerAnalysisRecord, analysis_id)
    if record is None:
        raise ExportError(f"no llama-server analysis #{analysis_id}")
    return _plan(session, server_policy_set(session, record), None, f"llama-server analysis #{analysis_id}")


def plan_for_analysis(session: Session, ref: AnalysisRef) -> ExportPlan:
    """The plan of the decisions of the analysis ``ref`` names (a job's: the analysis it stored), as publishing
    it would route them, whatever measured it."""
    ref = resolve_analysis(session, ref)
    return plan_for_run(session, ref.id) if ref.kind == RUN else plan_for_server_analysis(session, ref.id)


def plan_for_policy_set(session: Session, version: int | None) -> ExportPlan:
    """The plan of policy set ``version`` (None: the active one), as the router routes it (PolicyError
    where there is no such set)."""
    policy_set = find_policy_set(session, version)
    run = session.get(AnalysisRun, policy_set.run_id) if policy_set.run_id is not None else None
    return _plan(session, policy_set, run, f"policy set v{policy_set.version}")


def _plan(session: Session, policy_set: PolicySet, run: AnalysisRun | None, source: str) -> ExportPlan:
    contract = PolicyContract.of(policy_set)
    snapshots = {p.task_type: PolicySnapshot.of(p) for p in policy_set.policies}
    if FALLBACK_TASK not in snapshots:
        raise ExportError(f"{source} has no workload-wide policy to export")
    max_batch = load_settings().router_max_batch_size
    router = Router(
        None,
        snapshots,
        policy_version=policy_set.version,
        draft_kind=contract.draft_kind,
        ngram_max=contract.ngram_max,
        config=RouterConfig(max_batch_size=max_batch),
        cost=contract.cost,
        contract=contract,
    )
    summary = run_summary(session, run) if run is not None and run.status == "done" else None
    profiled = sorted({int(b) for p in snapshots.values() for b in p.curves_by_batch}) or [1]
    end = max(profiled[-1], max_batch) + 1  # every larger batch size decides as this one
    groups = {}
    for task, snapshot in snapshots.items():
        own = decided = None
        if summary is not None:
            own = decided = summary.workload if task == FALLBACK_TASK else summary.tasks.get(task)
            if own is not None and own.decision_basis == "workload":  # too few prompts: the workload decides
                decided = summary.workload
        groups[task] = _group(router, snapshot, own, decided, profiled, end)
    draft = parse_spec(run.pair.draft.spec) if run is not None else None
    server = None
    if policy_set.server_analysis_id is not None:
        record = get_server_analysis(session, policy_set.server_analysis_id)
        server = {
            "model": record.model,
            "draft_model": record.draft_model,
            "threads": record.threads,
            "n_ctx": record.n_ctx,
            "build": record.server_build,
        }
    return ExportPlan(
        source=source,
        analysis=analysis_ref(policy_set),
        policy_version=policy_set.version,
        target=run.pair.target.spec if run is not None else str(server["model"]) if server else "",
        draft=run.pair.draft.spec if run is not None else ", ".join(record.drafters) if server else "",
        draft_kind=contract.draft_kind,
        ngram_max=contract.ngram_max if draft is None or draft.kind == "ngram" else 0,
        measured_by=policy_set.measured_by,
        priced_by=policy_set.priced_by,
        priced_on=_priced_on(run, server),
        gamma_max=contract.gamma_max,
        margin=contract.margin,
        max_batch_size=max_batch,
        profiled=tuple(profiled),
        workload=groups.pop(FALLBACK_TASK),
        tasks=tuple(groups[t] for t in sorted(groups)),
        pools=dict(policy_set.pools or {}),
        server=server,
    )


def _priced_on(run: AnalysisRun | None, server: dict[str, Any] | None) -> str:
    """The cost profiles that priced ``run``, in words (engine, version, device, dtype, ids)."""
    if server is not None:
        return f"llama-server {server['build']}'s own timings, {server['threads']} threads"
    if run is None:
        return "the policy set's own curves (its run is gone)"
    links = sorted(run.batch_profiles, key=lambda link: link.batch_size)
    profiles = [link.cost_profile for link in links] or ([run.cost_profile] if run.cost_profile else [])
    if not profiles:
        return "no cost profile"
    first = profiles[0]
    version = f" {first.engine_version}" if first.engine_version else ""
    measured = pricing_entry(first.priced_by, first.source).measures  # the imported entry only prices
    source = "measured by specroute" if measured else "imported from the engine's own benchmark"
    ids = ", ".join(f"#{p.id} (batch {p.batch_size or 1})" for p in profiles)
    return f"{first.priced_by}{version} on {first.device}, {first.dtype}, {source}: profiles {ids}"


def _group(
    router: Router,
    snapshot: PolicySnapshot,
    own: GroupSummary | None,
    found: GroupSummary | None,
    profiled: list[int],
    end: int,
) -> GroupPlan:
    """One task's decisions at every batch size 1..``end`` (``end``: and above), merged into spans; ``own``
    is the task's group in the run's summary (its sentence), ``found`` the group that decided it (the
    workload's for a task with too few prompts: its intervals and priced defaults)."""
    decided = [_gamma(router, snapshot.task_type, batch) for batch in range(1, end + 1)]
    points = {b: _point(snapshot, found, b) for b in profiled}
    spans: list[Span] = []
    start = 1
    for batch in range(1, end + 1):
        if batch == end or decided[batch] != decided[batch - 1]:  # decided[batch] is batch + 1's
            high = None if batch == end else batch
            spans.append(Span(start, high, decided[batch - 1], _source(start, high, profiled, router)))
            start = batch + 1
    cliffs = tuple(
        cliff
        for left, right in zip(spans, spans[1:])
        if bool(left.gamma) != bool(right.gamma)
        for cliff in [_cliff(left, right, points, profiled)]
        if cliff is not None
    )
    interval_low, interval_high = snapshot.speedup_interval
    return GroupPlan(
        task=snapshot.task_type,
        n=snapshot.n_prompts,
        basis=snapshot.decision_basis,
        gamma=decided[0],
        speedup=_finite(snapshot.expected_speedup),
        interval=(_finite(interval_low), _finite(interval_high)),
        reason=own.decision_reason if own is not None else None,
        setting=snapshot.setting if snapshot.speculate else None,
        spans=tuple(spans),
        cliffs=cliffs,
        defaults=found.assistant_defaults if found is not None else None,
    )


def _gamma(router: Router, task: str, batch: int) -> int:
    """The router's decision for ``task`` at ``batch`` (0: off), classification aside."""
    decision = router.decide_task(task, RouteRequest.of(batch_size=batch))
    return decision.gamma if decision.speculate else 0


def _point(snapshot: PolicySnapshot, found: GroupSummary | None, batch: int) -> Point:
    """The group's decision at a profiled batch size, with its interval (from the run's summary; only
    the lower end, from the set, where the run is gone)."""
    entry = found.by_batch.get(batch) if found is not None else None
    if entry is None and found is not None and batch == 1:
        entry = found
    if entry is not None:
        return Point(batch, _finite(entry.predicted_speedup), tuple(map(_finite, entry.speedup_interval)))  # type: ignore[arg-type]
    curve = snapshot.curves_by_batch.get(batch) or snapshot.speedup_curve
    finite = [s for s in curve if math.isfinite(s)]
    low = snapshot.lows_by_batch.get(batch, snapshot.speedup_interval[0])
    return Point(batch, max(finite) if finite else None, (_finite(low), None))


def _source(low: int, high: int | None, profiled: list[int], router: Router) -> str:
    """Where a span's decision comes from, in words: the profiled sizes in it, the sizes interpolated
    between profiled ones, and the sizes above the profiled ones (the router's batch-size rule)."""
    top, limit = profiled[-1], router.config.max_batch_size
    last = high if high is not None else max(top, limit) + 1
    parts = []
    measured = [b for b in profiled if low <= b <= last]
    if measured:
        parts.append("measured at batch " + ", ".join(map(str, measured)))
    between = [b for b in range(low, min(last, top) + 1) if b not in profiled]
    if between:
        parts.append(f"interpolated between profiled sizes at {_sizes(between[0], between[-1])}")
    kept = [b for b in range(max(low, top + 1), min(last, limit) + 1)]
    if kept:
        parts.append(
            f"{_sizes(kept[0], kept[-1])} not profiled: the batch-1 decision, up to the router's "
            f"SPECROUTE_ROUTER_MAX_BATCH_SIZE ({limit})"
        )
    if last > max(top, limit):
        parts.append(
            f"above {max(top, limit)}: off, nothing profiled there and above SPECROUTE_ROUTER_MAX_BATCH_SIZE"
        )
    return "; ".join(parts)


def _sizes(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}-{high}"


def _cliff(left: Span, right: Span, points: dict[int, Point], profiled: list[int]) -> Cliff | None:
    """The cliff between two spans that flip on/off (None: the intervals settle it, or the flip is the
    edge of what was profiled)."""
    last = left.high
    assert last is not None
    below = [b for b in profiled if b <= last]
    above = [b for b in profiled if b > last]
    if not below or not above:
        return None
    a, b = points[below[-1]], points[above[0]]
    on, off = (a, b) if left.gamma else (b, a)
    off_high = off.interval[1]
    overlap = None not in (*a.interval, *b.interval) and (
        a.interval[0] <= b.interval[1] and b.interval[0] <= a.interval[1]  # type: ignore[operator]
    )
    may_pay = off_high > 1.0 if off_high is not None else (off.speedup or 0.0) > 1.0
    if not (overlap or may_pay):
        return None
    return Cliff(
        last,
        f"cliff between batch {last} and {last + 1}: on at batch {on.batch} ({_shown(on)}), off at batch "
        f"{off.batch} ({_shown(off)}); the intervals do not settle where speculation stops paying, so "
        f"the edge is not a hard one: profile batch sizes between {a.batch} and {b.batch} "
        f"(specroute costs import) before relying on it",
    )


def _shown(point: Point) -> str:
    low, high = point.interval
    speedup = "n/a" if point.speedup is None else f"{point.speedup:.2f}x"
    if low is None:
        return speedup
    return f"{speedup} [{low:.2f}, {'?' if high is None else f'{high:.2f}'}]"


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)
