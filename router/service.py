"""The routing service behind the HTTP API, without Flask: it owns the loaded Router, the decision
log, the metrics and a session factory, and does what each endpoint needs. One instance per server
process (``create_app`` keeps it in ``app.extensions["specroute.router"]``).

The loaded Router follows the database: at most every ``router_refresh_s`` seconds a route request
checks which classifier and policy set are active and reloads when either changed (so
``specroute policies activate`` or a new ``specroute train`` takes effect without a restart), and
takes the tasks' online estimates that other server processes stored since the last check. Feedback
updates the database and this process's Router at once. Feedback naming a route_id that is not
stored yet waits up to ``route_id_wait_s`` for it (another process's decision log writes every
0.2 s).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Mapping, Sequence

from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from analyzer.db import lock_for_write
from analyzer.settings import Settings
from analyzer.speedup import best_gamma, clears_break_even
from router.adaptation import AdaptationConfig
from router.decision import Decision, RouteRequest, Router, RouterConfig, router_from_database
from router.decision_log import DecisionLog
from router.feedback import FeedbackError, PolicyContext, normalise, record_feedback, task_state
from router.metrics import Metrics
from router.models import ClassifierVersion, PolicySet, TaskEstimate
from router.policy import FALLBACK_TASK, active_policy_set, list_policy_sets


class RouterService:
    """Routing, feedback and introspection over one database."""

    def __init__(self, settings: Settings, sessions: sessionmaker[Session], *,
                 adaptation: AdaptationConfig | None = None, decision_log: bool = True, route_id_wait_s: float = 0.0):
        self.settings = settings
        self.sessions = sessions
        self.config = RouterConfig.from_settings(settings)
        self.adaptation = adaptation or AdaptationConfig()
        self.metrics = Metrics()
        self.decision_log = DecisionLog(sessions, on_drop=self.metrics.observe_dropped) if decision_log else None
        self.route_id_wait_s = route_id_wait_s
        self._reload_lock = threading.Lock()
        self._feedback_lock = threading.Lock()
        self._router: Router | None = None
        self._loaded_versions: tuple[int | None, int | None] | None = None
        self._checked_at = 0.0

    # ------------------------------------------------------------------ loading

    def _active_versions(self, session: Session) -> tuple[int | None, int | None]:
        classifier = session.scalar(select(ClassifierVersion.version).where(ClassifierVersion.is_active.is_(True)))
        policy_set = session.scalar(select(PolicySet.version).where(PolicySet.is_active.is_(True)))
        return classifier, policy_set

    def reload(self) -> Router:
        """Load the active classifier, policy set and estimates now."""
        with self._reload_lock, self.sessions() as session:
            self._router = router_from_database(session, self.config, self.adaptation)
            self._loaded_versions = self._active_versions(session)
            self._checked_at = time.monotonic()
            return self._router

    @property
    def router(self) -> Router:
        """The loaded Router, reloaded first when the active versions changed since the last check."""
        router = self._router
        if router is None:
            return self.reload()
        if time.monotonic() - self._checked_at >= self.settings.router_refresh_s:
            self._checked_at = time.monotonic()
            with self.sessions() as session:
                versions = self._active_versions(session)
                if versions != self._loaded_versions:
                    return self.reload()
                if router.policy_set_id is not None:
                    self._take_estimates(session, router)
        return router

    @staticmethod
    def _take_estimates(session: Session, router: Router) -> None:
        """Take every stored estimate that has seen more feedback than this process's copy."""
        for estimate in session.scalars(select(TaskEstimate).where(TaskEstimate.policy_set_id == router.policy_set_id)):
            current = router.states.get(estimate.task_type)
            if current is None or estimate.events > current.events:
                router.observe(estimate.task_type, task_state(estimate))

    # ------------------------------------------------------------------ endpoints

    def route(self, requests: Sequence[RouteRequest]) -> list[Decision]:
        """Decide for the requests, count the decisions and queue them for the log."""
        router = self.router
        decisions = router.route_many(requests)
        self.metrics.observe_decisions(decisions)
        if self.decision_log is not None:
            self.decision_log.add(decisions, policy_set_id=router.policy_set_id,
                                  classifier_version_id=router.classifier.version_id if router.classifier else None)
        return decisions

    def feedback(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Store one feedback event, move its task's estimate, and return the estimate in force."""
        counts = normalise(payload)  # a bad payload fails before anything is touched
        router = self.router
        deadline = time.monotonic() + self.route_id_wait_s
        flushed = False
        while True:
            try:
                with self._feedback_lock, self.sessions() as session, session.begin():
                    lock_for_write(session)  # feedback from other processes waits instead of failing
                    estimate = record_feedback(session, payload, self.adaptation, self._policy_context(router))
                    result, state = estimate_dict(estimate), task_state(estimate)
                break
            except FeedbackError as exc:
                if exc.code != "unknown_route_id":
                    raise
                if not flushed and self.decision_log is not None:  # the decision may still be in our queue
                    self.decision_log.flush()
                    flushed = True
                    continue
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)  # or in another server process's queue
        router.observe(result["task_type"], state)
        self.metrics.observe_feedback(result["task_type"], counts.engine, counts.drafted, counts.accepted, result["alpha"])
        return result

    @staticmethod
    def _policy_context(router: Router) -> PolicyContext | None:
        """The loaded policy set for feedback (None: let feedback read the database)."""
        if router.policy_set_id is None or router.cost is None or router.fallback is None:
            return None
        labels = frozenset(router.classifier.labels) if router.classifier is not None else frozenset()
        return PolicyContext(router.policy_set_id, {**router.policies, FALLBACK_TASK: router.fallback}, router.cost,
                             labels)

    def policies(self) -> dict[str, Any]:
        """The active policy set with its policies and online estimates, and every stored version."""
        with self.sessions() as session:
            active = active_policy_set(session)
            versions = [{"version": p.version, "active": p.is_active, "run_id": p.run_id,
                         "created_at": p.created_at.isoformat(), "notes": p.notes} for p in list_policy_sets(session)]
            if active is None:
                return {"active": None, "versions": versions}
            estimates = session.scalars(select(TaskEstimate).where(TaskEstimate.policy_set_id == active.id)
                                        .order_by(TaskEstimate.task_type))
            return {"active": {
                "version": active.version,
                "run_id": active.run_id,
                "margin": active.margin,
                "activated_at": active.activated_at.isoformat() if active.activated_at else None,
                "policies": [policy_dict(p, active.margin) for p in active.policies],
                "estimates": [estimate_dict(e) for e in estimates],
            }, "versions": versions}

    def classifier(self) -> dict[str, Any]:
        """The active classifier's version record (no artifact), or null before the first training."""
        with self.sessions() as session:
            record = session.scalar(select(ClassifierVersion).where(ClassifierVersion.is_active.is_(True)))
            if record is None:
                return {"active": None}
            scores = record.scores or {}
            return {"active": {
                "version": record.version,
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
            }}

    def health(self) -> dict[str, Any]:
        """Whether the database answers, and what is loaded; raises when the database does not."""
        with self.sessions() as session:
            session.execute(text("SELECT 1"))
        router = self._router
        return {"status": "ok", "database": "ok",
                "classifier_version": router.classifier_version if router else None,
                "policy_version": router.policy_version if router else None}

    def close(self) -> None:
        """Store the queued decisions and stop the log's thread."""
        if self.decision_log is not None:
            self.decision_log.close()


def policy_dict(policy, margin: float = 0.05) -> dict[str, Any]:
    """A TaskPolicy as JSON, with the best gamma, speedup and decision at each profiled batch size
    (the router's rule: S clears 1 + margin and the published lower end clears 1.0)."""
    by_batch = {}
    lows = policy.speedup_lows_by_batch or {}
    for batch, curve in sorted((policy.speedup_curves_by_batch or {}).items(), key=lambda item: int(item[0])):
        gamma, speedup = best_gamma(curve)
        by_batch[str(batch)] = {"gamma": gamma, "expected_speedup": speedup if gamma else 1.0,
                                "speculate": bool(gamma) and clears_break_even(speedup, lows.get(batch), margin)}
    return {"task_type": policy.task_type, "fallback": policy.is_fallback, "speculate": policy.speculate,
            "gamma": policy.gamma, "alpha_mean": policy.alpha_mean, "alpha_var": policy.alpha_var,
            "n_prompts": policy.n_prompts, "expected_speedup": policy.expected_speedup, "tier": policy.tier,
            "speedup_interval": [policy.speedup_low, policy.speedup_high], "decision_basis": policy.decision_basis,
            "decision_reason": policy.decision_reason, "by_batch": by_batch}


def estimate_dict(estimate: TaskEstimate) -> dict[str, Any]:
    """A TaskEstimate as JSON (alpha is the posterior mean)."""
    return {"task_type": estimate.task_type, "alpha": estimate.beta_a / (estimate.beta_a + estimate.beta_b),
            "prior_alpha": estimate.prior_alpha, "speculate": estimate.speculate, "gamma": estimate.gamma,
            "events": estimate.events, "total_rounds": estimate.total_rounds,
            "total_drafted": estimate.total_drafted, "total_accepted": estimate.total_accepted,
            "decision_since": estimate.decision_since.isoformat(timespec="seconds") if estimate.decision_since else None,
            "updated_at": estimate.updated_at.isoformat(timespec="seconds") if estimate.updated_at else None}
