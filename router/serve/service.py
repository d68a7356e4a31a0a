"""The routing service behind the HTTP API, without Flask: it owns the loaded Router, the decision
log, the metrics and a session factory, and does what each endpoint needs. One instance per server
process (``create_app`` keeps it in ``app.extensions["specroute.router"]``).

The loaded Router follows the database: at most every ``router_refresh_s`` seconds a route request
checks which classifier and policy set are active and reloads when either changed (so
``specroute policies activate`` or a new ``specroute train`` takes effect without a restart), and
takes the tasks' online estimates that other server processes stored since the last check. Feedback
updates the database and this process's Router at once; it needs no stored decision (the route_id
names its policy set and task), so it works in any process, at once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Mapping, Sequence

from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from analyzer.db import lock_for_write
from analyzer.settings import Settings
from router.decide.adaptation import AdaptationConfig
from router.decide.contract import Decision, RouteRequest
from router.decide.decision import Router, RouterConfig, router_from_database
from router.decide.feedback import (
    FeedbackError,
    FeedbackRequest,
    PolicyContext,
    PolicyNotAdaptive,
    Recorded,
    estimate_state,
    parse_feedback,
    record_observation,
)
from router.orm import ClassifierVersion, PolicySet, TaskEstimate
from router.policies.policy import FALLBACK_TASK, active_policy_set, list_policy_sets
from router.policies.records import classifier_dict, estimate_dict, policy_set_dict
from router.serve.decision_log import DecisionLog
from router.serve.feedback_writer import FeedbackWriter
from router.serve.front_door import feedback_of
from router.serve.metrics import Metrics
from router.serve.responses import Classifier, Health, Policies
from router.serve.responses import TaskEstimate as EstimateAnswer

log = logging.getLogger(__name__)


class RouterService:
    """Routing, feedback and introspection over one database."""

    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        *,
        adaptation: AdaptationConfig | None = None,
        decision_log: bool = True,
        secret_key: str | None = None,
    ):
        self.settings = settings
        self.sessions = sessions
        self.config = RouterConfig.from_settings(settings, secret_key)  # the key signs route ids
        self.adaptation = adaptation or AdaptationConfig()
        self.metrics = Metrics()
        self.decision_log = (
            DecisionLog(sessions, on_drop=self.metrics.observe_dropped) if decision_log else None
        )
        self.feedback_writer = FeedbackWriter(sessions, self.adaptation, on_recorded=self._observe_feedback)
        self._reload_lock = threading.Lock()
        self._router: Router | None = None
        self._loaded_versions: tuple[int | None, int | None] | None = None
        self._checked_at = 0.0

    # ------------------------------------------------------------------ loading

    def _active_versions(self, session: Session) -> tuple[int | None, int | None]:
        classifier = session.scalar(
            select(ClassifierVersion.version).where(ClassifierVersion.is_active.is_(True))
        )
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

    def decides_in_memory(self) -> bool:
        """Whether a route request is decided now without the database: the router is loaded and not due to be
        checked against it (``router_refresh_s``; 0 checks on every request, so never)."""
        return (
            self._router is not None and time.monotonic() - self._checked_at < self.settings.router_refresh_s
        )

    @staticmethod
    def _take_estimates(session: Session, router: Router) -> None:
        """Take every stored estimate that has seen more feedback than this process's copy."""
        for estimate in session.scalars(
            select(TaskEstimate).where(TaskEstimate.policy_set_id == router.policy_set_id)
        ):
            current = router.states.get(estimate.task_type)
            if current is None or estimate.events > current.events:
                router.observe(estimate.task_type, estimate_state(estimate))

    # ------------------------------------------------------------------ endpoints

    def route(self, requests: Sequence[RouteRequest]) -> list[Decision]:
        """Decide for the requests, count the decisions and queue them for the log."""
        router = self.router
        decisions = router.route_many(requests)
        self.metrics.observe_decisions(decisions)
        if self.decision_log is not None:
            self.decision_log.add(
                decisions,
                policy_set_id=router.policy_set_id,
                classifier_version_id=router.classifier.version_id if router.classifier else None,
            )
        return decisions

    def feedback(self, payload: Mapping[str, Any]) -> EstimateAnswer:
        """Store one feedback event, move its task's estimate, and return the estimate right after
        this event. The event is stored by the feedback writer, in one transaction with whatever other
        feedback is pending in this process (group commit); this returns when that has committed."""
        # a bad payload, or a route id this server did not sign, fails before anything is touched
        request = parse_feedback(payload, self.config.route_key)
        recorded = self.feedback_writer.submit(request, self._policy_context(self.router))
        counts = request.counts
        self.metrics.observe_feedback(
            request.task, counts.engine, counts.drafted, counts.accepted, recorded.snapshot["alpha"]
        )
        return EstimateAnswer.model_validate(recorded.snapshot)

    def observe_completion(self, decision: Decision, timings: Mapping[str, Any]) -> None:
        """Store a pool's ``timings`` for a forwarded request (router/serve/front_door.py) as the decision's
        feedback: through :meth:`feedback` where its policy set adapts, as the event alone where the set
        takes no feedback; a payload feedback refuses is logged, never the client's failure."""
        estimator = self.router.estimator
        payload = feedback_of(decision, timings, estimator.option_pools if estimator is not None else None)
        if payload is None:
            return
        try:
            self.feedback(payload)
        except PolicyNotAdaptive:
            with self.sessions() as session, session.begin():
                lock_for_write(session)
                record_observation(session, parse_feedback(payload, self.config.route_key))
        except FeedbackError as exc:
            log.warning("the pool's timings for route %s were not stored: %s", decision.route_id, exc)

    def _observe_feedback(self, request: FeedbackRequest, recorded: Recorded) -> None:
        """The serving Router takes an estimate as soon as its event is committed (called by the
        feedback writer in event order, so a later event's state is never overwritten by an earlier one's)."""
        router = self._router
        if router is not None and recorded.policy_set_id == router.policy_set_id:
            router.observe(request.task, recorded.state)

    @staticmethod
    def _policy_context(router: Router) -> PolicyContext | None:
        """The loaded policy set for feedback (None: let feedback read the database)."""
        if (
            router.policy_set_id is None
            or router.policy_version is None  # set with policy_set_id (router_from_database)
            or router.estimator is None  # the set takes no feedback
            or router.fallback is None
        ):
            return None
        labels = frozenset(router.classifier.labels) if router.classifier is not None else frozenset()
        return PolicyContext(
            router.policy_set_id,
            router.policy_version,
            {**router.policies, FALLBACK_TASK: router.fallback},
            router.cost,
            labels,
            router.contract,
            router.estimator,
        )

    def policies(self) -> Policies:
        """The active policy set with its policies and online estimates, and every stored version."""
        with self.sessions() as session:
            active = active_policy_set(session)
            versions = [policy_set_dict(p, with_policies=False) for p in list_policy_sets(session)]
            if active is None:
                return Policies.model_validate({"active": None, "versions": versions})
            estimates = session.scalars(
                select(TaskEstimate)
                .where(TaskEstimate.policy_set_id == active.id)
                .order_by(TaskEstimate.task_type)
            )
            return Policies.model_validate(
                {
                    "active": {**policy_set_dict(active), "estimates": [estimate_dict(e) for e in estimates]},
                    "versions": versions,
                }
            )

    def classifier(self) -> Classifier:
        """The active classifier's version record (no artifact), or null before the first training."""
        with self.sessions() as session:
            record = session.scalar(select(ClassifierVersion).where(ClassifierVersion.is_active.is_(True)))
            return Classifier.model_validate(
                {"active": classifier_dict(record) if record is not None else None}
            )

    def health(self) -> Health:
        """Whether the database answers, and what is loaded; raises when the database does not."""
        with self.sessions() as session:
            session.execute(text("SELECT 1"))
        try:  # what this process answers with: loaded now if it has not routed yet (one of several workers)
            router: Router | None = self.router
        except Exception:  # noqa: BLE001 - a classifier that cannot load is not a dead database; routes say why
            log.exception("healthz: the active versions could not be loaded")
            router = self._router
        return Health(
            status="ok",
            database="ok",
            classifier_version=router.classifier_version if router else None,
            policy_version=router.policy_version if router else None,
        )

    def close(self) -> None:
        """Store the queued feedback and decisions and stop the writers' threads."""
        self.feedback_writer.close()
        if self.decision_log is not None:
            self.decision_log.close()
