"""Router-owned tables, on the analyzer's declarative base: classifier versions, versioned
routing policy sets with one policy per task type, per-task online estimates, logged routing
decisions, the feedback engines send back, and the web UI's background jobs (training, suggestions)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Optional, TypeVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    select,
    text,
    update,
)
from sqlalchemy.orm import Mapped, Session, mapped_column, relationship

from analyzer.db import Base, utcnow
from analyzer.names import DEFAULT_GAMMA_MAX, DEFAULT_MARGIN
from analyzer.orm import one_of
from analyzer.pricing.speedup import TIERS


class ClassifierVersion(Base):
    """A trained task classifier with its version record. ``artifact`` is produced by specroute
    itself (never uploaded) and is loaded only when ``library_versions`` match those installed and
    ``artifact_sha256`` matches the bytes."""

    __tablename__ = "classifier_versions"

    id: Mapped[int] = mapped_column(primary_key=True)
    version: Mapped[int] = mapped_column(Integer, unique=True)
    is_active: Mapped[bool] = mapped_column(Boolean, default=False)
    labels: Mapped[list[str]] = mapped_column()
    training_data_sha256: Mapped[str] = mapped_column(String(64))
    training_prompt_count: Mapped[int] = mapped_column(Integer)
    library_versions: Mapped[dict[str, Any]] = mapped_column()
    scores: Mapped[dict[str, Any]] = mapped_column(default=dict)
    artifact: Mapped[bytes] = mapped_column(LargeBinary)
    artifact_sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class PolicySet(Base):
    """A versioned set of per-task routing policies published from one analysis run.
    Exactly one set is active at a time; older ones are kept and can be re-activated."""

    __tablename__ = "policy_sets"

    id: Mapped[int] = mapped_column(primary_key=True)
    version: Mapped[int] = mapped_column(Integer, unique=True)
    run_id: Mapped[Optional[int]] = mapped_column(ForeignKey("analysis_runs.id"), index=True)
    # a set published from an analysis in llama-server (analyzer.orm.ServerAnalysisRecord) names it here
    # instead of a run; not a foreign key (migration 0021 says why), checked when publishing
    server_analysis_id: Mapped[Optional[int]] = mapped_column(Integer, index=True)
    # the engine that measured the run's acceptance, and the engine whose cost priced the policies
    measured_by: Mapped[str] = mapped_column(
        String(32), default="transformers", server_default="transformers"
    )
    priced_by: Mapped[str] = mapped_column(String(32), default="transformers", server_default="transformers")
    # what the router needs beyond the curves, published with them (it reads no analysis run): the
    # draft's kind (a spec kind: ngram is prompt lookup) and options ({"max_ngram": 2}), and the batch-1
    # cost the decisions were priced with (analyzer.pricing.speedup.Cost.as_json; None: none was linked)
    draft_kind: Mapped[str] = mapped_column(String(16), default="ngram", server_default="ngram")
    draft_options: Mapped[Optional[dict[str, Any]]] = mapped_column()
    cost: Mapped[Optional[dict[str, Any]]] = mapped_column()
    # the deployment per decision ("off", "k<gamma>") as SPECROUTE_ROUTER_POOLS named them at publishing;
    # None (sets published before revision 0019): the serving process's own setting names them
    pools: Mapped[Optional[dict[str, Any]]] = mapped_column()
    # a llama-server analysis' plain step cost ({"step_ms", "per_context_ms"}): prices a pool's request as
    # plain decoding would have run it, for feedback (router/decide/server_adaptation.py); None: a run's set
    plain_cost: Mapped[Optional[dict[str, Any]]] = mapped_column()
    is_active: Mapped[bool] = mapped_column(Boolean, default=False)
    margin: Mapped[float] = mapped_column(Float, default=DEFAULT_MARGIN)
    # the largest gamma the run analysed: the router prices and adapts over g = 1..gamma_max
    gamma_max: Mapped[int] = mapped_column(
        Integer, default=DEFAULT_GAMMA_MAX, server_default=str(DEFAULT_GAMMA_MAX)
    )
    notes: Mapped[Optional[str]] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    activated_at: Mapped[Optional[datetime]] = mapped_column()

    policies: Mapped[list["TaskPolicy"]] = relationship(
        back_populates="policy_set", order_by="TaskPolicy.task_type", cascade="all, delete-orphan"
    )


class TaskPolicy(Base):
    """The published decision for one task type (``is_fallback`` marks the workload-wide one)."""

    __tablename__ = "task_policies"

    id: Mapped[int] = mapped_column(primary_key=True)
    policy_set_id: Mapped[int] = mapped_column(ForeignKey("policy_sets.id", ondelete="CASCADE"), index=True)
    task_type: Mapped[str] = mapped_column(String(64))
    is_fallback: Mapped[bool] = mapped_column(Boolean, default=False)
    speculate: Mapped[bool] = mapped_column(Boolean)
    gamma: Mapped[int] = mapped_column(Integer)
    alpha_mean: Mapped[float] = mapped_column(Float)
    alpha_var: Mapped[Optional[float]] = mapped_column(Float)
    n_prompts: Mapped[int] = mapped_column(Integer)
    expected_speedup: Mapped[float] = mapped_column(Float)
    tier: Mapped[str] = mapped_column(String(24))
    speedup_curve: Mapped[list[float]] = mapped_column(default=list)
    # {"<batch size>": [S(1), S(2), ...]} for every profiled batch size; None: batch 1 only
    speedup_curves_by_batch: Mapped[Optional[dict[str, Any]]] = mapped_column()
    # the bootstrap interval of expected_speedup, and what decided: "task", or "workload" for a task
    # with too few prompts (its speculate, gamma, speedup and curves are then the workload's)
    speedup_low: Mapped[Optional[float]] = mapped_column(Float)
    speedup_high: Mapped[Optional[float]] = mapped_column(Float)
    # {"<batch size>": the interval's lower end at that size's best gamma}
    speedup_lows_by_batch: Mapped[Optional[dict[str, Any]]] = mapped_column()
    decision_basis: Mapped[Optional[str]] = mapped_column(String(16))
    decision_reason: Mapped[Optional[str]] = mapped_column(Text)
    # the llama-server drafter setting it speculates with ("ngram-mod 16 2-16"; None: off, or a set
    # published from an analysis run, whose decision is a gamma): the router names the pool by it
    setting: Mapped[Optional[str]] = mapped_column(String(64))
    # its curve over its analysis' options (analyzer/pricing/option_curve.py OptionCurve.as_dict): a llama-server
    # analysis' settings (the prior feedback moves), or a run's gammas (router/policies/policy.py
    # gamma_option_curve; the router adapts its speedup_curve); None: a run's set stored without one
    option_curve: Mapped[Optional[dict[str, Any]]] = mapped_column()

    policy_set: Mapped[PolicySet] = relationship(back_populates="policies")

    __table_args__ = (
        UniqueConstraint("policy_set_id", "task_type"),
        CheckConstraint(one_of("tier", TIERS), name="tier"),
        CheckConstraint("gamma >= 0", name="gamma_nonnegative"),
    )


class TaskEstimate(Base):
    """Online state of one task under one policy set: a decayed Beta posterior of alpha
    (``beta_a``, ``beta_b``), the gamma in force, and whether speculation is on."""

    __tablename__ = "task_estimates"

    id: Mapped[int] = mapped_column(primary_key=True)
    policy_set_id: Mapped[int] = mapped_column(ForeignKey("policy_sets.id", ondelete="CASCADE"), index=True)
    task_type: Mapped[str] = mapped_column(String(64))
    beta_a: Mapped[float] = mapped_column(Float)
    beta_b: Mapped[float] = mapped_column(Float)
    prior_alpha: Mapped[float] = mapped_column(Float)
    speculate: Mapped[bool] = mapped_column(Boolean)
    gamma: Mapped[int] = mapped_column(Integer)
    # running totals outgrow 32 bits on a busy server (PostgreSQL INTEGER): 64-bit
    events: Mapped[int] = mapped_column(BigInteger, default=0)
    total_rounds: Mapped[int] = mapped_column(BigInteger, default=0)
    total_drafted: Mapped[int] = mapped_column(BigInteger, default=0)
    total_accepted: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    # when the decision in force (speculate, gamma) last changed; None: not recorded for this estimate
    decision_since: Mapped[Optional[datetime]] = mapped_column()
    # under a llama-server set: the setting in force (None: off) and, per setting, the decayed plain and
    # served milliseconds and the events of its feedback ({label: [plain_ms, served_ms, events]})
    setting: Mapped[Optional[str]] = mapped_column(String(64))
    options: Mapped[Optional[dict[str, Any]]] = mapped_column()

    __table_args__ = (UniqueConstraint("policy_set_id", "task_type"),)


ROUTE_ID_LENGTH = 128  # v<version>-<32 hex>-<task of up to 64 characters>


class RouteDecision(Base):
    """A decision the router gave, kept for the record (the decision log); feedback does not read it:
    its ``route_id`` names the policy set version and task (router.decide.decision.new_route_id)."""

    __tablename__ = "route_decisions"

    id: Mapped[int] = mapped_column(primary_key=True)
    route_id: Mapped[str] = mapped_column(String(ROUTE_ID_LENGTH), unique=True)
    policy_set_id: Mapped[Optional[int]] = mapped_column(ForeignKey("policy_sets.id"), index=True)
    classifier_version_id: Mapped[Optional[int]] = mapped_column(ForeignKey("classifier_versions.id"))
    task_type: Mapped[str] = mapped_column(String(64))
    confidence: Mapped[float] = mapped_column(Float)
    speculate: Mapped[bool] = mapped_column(Boolean)
    gamma: Mapped[int] = mapped_column(Integer)
    expected_speedup: Mapped[float] = mapped_column(Float)
    reasons: Mapped[list[Any]] = mapped_column(
        default=list
    )  # [{"code", **params}] (router/decide/reasons.py)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)  # for pruning by age


class FeedbackEvent(Base):
    """What an engine observed for one generation, normalised to counts; ``raw`` keeps the
    payload as sent (engine-specific fields included)."""

    __tablename__ = "feedback_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    route_id: Mapped[Optional[str]] = mapped_column(String(ROUTE_ID_LENGTH), index=True)
    policy_set_id: Mapped[Optional[int]] = mapped_column(ForeignKey("policy_sets.id"), index=True)
    task_type: Mapped[str] = mapped_column(String(64), index=True)
    engine: Mapped[str] = mapped_column(String(32))
    gamma: Mapped[Optional[int]] = mapped_column(Integer)
    rounds: Mapped[int] = mapped_column(Integer)
    drafted: Mapped[int] = mapped_column(Integer)
    accepted: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[Optional[int]] = mapped_column(Integer)
    raw: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        CheckConstraint("rounds >= 0 AND drafted >= 0 AND accepted >= 0", name="counts_nonnegative"),
        CheckConstraint("accepted <= drafted", name="accepted_le_drafted"),
    )


BACKGROUND_JOB_STATUSES = ("queued", "running", "done", "failed")


ACTIVE_JOB = "status IN ('queued', 'running')"


class BackgroundJob(Base):
    """Work the web UI starts and does not wait for (router/serve/jobs.py): classifier training (``kind``
    "train") and task suggestions for a prompt set ("suggest"), with their parameters. One job per ``key`` is
    queued or running at a time, across every server process; the process that queued it runs it at once
    and keeps its heartbeat, and any worker takes over a queued job or one whose heartbeat stopped (its
    process died or shut down); a unique index on ``key`` over the queued and running jobs keeps it so even when
    two processes queue at once. ``progress`` is its last progress line; ``message`` or ``error`` its
    outcome."""

    __tablename__ = "background_jobs"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(200), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    worker_id: Mapped[Optional[str]] = mapped_column(String(200))
    heartbeat_at: Mapped[Optional[datetime]] = mapped_column()
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    progress: Mapped[Optional[str]] = mapped_column(Text)
    message: Mapped[Optional[str]] = mapped_column(Text)
    error: Mapped[Optional[str]] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[Optional[datetime]] = mapped_column()
    finished_at: Mapped[Optional[datetime]] = mapped_column()

    __table_args__ = (
        CheckConstraint(one_of("status", BACKGROUND_JOB_STATUSES), name="status"),
        # one active job per key, kept by the database whichever process queues (router/serve/jobs.py)
        Index(
            "uq_background_jobs_active_key",
            "key",
            unique=True,
            sqlite_where=text(ACTIVE_JOB),
            postgresql_where=text(ACTIVE_JOB),
        ),
    )


Versioned = TypeVar("Versioned", ClassifierVersion, PolicySet)


def activate_only(session: Session, model: type[Versioned], version: int) -> Versioned | None:
    """Mark the row of ``model`` with this ``version`` active and every other row inactive (the
    caller's transaction makes the switch atomic); None when there is no such version."""
    chosen: Versioned | None = session.scalar(select(model).where(model.version == version))
    if chosen is not None:
        session.execute(update(model).values(is_active=False))
        chosen.is_active = True
    return chosen
