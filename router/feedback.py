"""Feedback from the engine after a generation: normalise what it reports to counts, store the event,
and move the task's online estimate (router/adaptation.py) under the active policy set.

Accepted payloads (a ``route_id`` from a decision, or a ``task_type``, is required with each):
- counts: ``{"rounds", "drafted", "accepted"}`` (optional ``output_tokens``, ``gamma``);
- llama.cpp server ``timings``: ``{"timings": {"draft_n", "draft_n_accepted", "predicted_n"}}`` →
  drafted = draft_n, accepted = draft_n_accepted, output_tokens = predicted_n, and rounds =
  predicted_n − draft_n_accepted (every target pass emits its accepted drafts plus one token).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from analyzer.db import utcnow
from analyzer.models import AnalysisRun
from analyzer.report import cost_for_run
from router.adaptation import AdaptationConfig, TaskState, apply_feedback, initial_state
from router.models import FeedbackEvent, RouteDecision, TaskEstimate
from router.policy import FALLBACK_TASK, active_policy_set


class FeedbackError(ValueError):
    """A feedback payload that cannot be used; the message names the field."""


@dataclass(frozen=True)
class FeedbackCounts:
    """A generation's speculation, normalised: target passes (rounds), drafted and accepted tokens."""

    engine: str
    rounds: int
    drafted: int
    accepted: int
    output_tokens: int | None = None


def _count(payload: Mapping[str, Any], key: str, where: str = "") -> int:
    value = payload.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FeedbackError(f"field '{where}{key}' must be a non-negative integer, got {value!r}")
    return value


def normalise(payload: Mapping[str, Any]) -> FeedbackCounts:
    """Counts from any accepted payload shape (see the module docstring)."""
    if "timings" in payload:
        timings = payload["timings"]
        if not isinstance(timings, Mapping):
            raise FeedbackError("field 'timings' must be an object")
        drafted = _count(timings, "draft_n", "timings.")
        accepted = _count(timings, "draft_n_accepted", "timings.")
        produced = _count(timings, "predicted_n", "timings.")
        counts = FeedbackCounts("llama.cpp", max(produced - accepted, 0), drafted, accepted, produced)
    elif {"rounds", "drafted", "accepted"} <= set(payload):
        output = payload.get("output_tokens")
        counts = FeedbackCounts(
            str(payload.get("engine") or "counts"), _count(payload, "rounds"), _count(payload, "drafted"),
            _count(payload, "accepted"), _count(payload, "output_tokens") if output is not None else None,
        )
    else:
        raise FeedbackError("give counts {rounds, drafted, accepted} or llama.cpp 'timings'")
    if counts.accepted > counts.drafted:
        raise FeedbackError(f"accepted ({counts.accepted}) cannot exceed drafted ({counts.drafted})")
    return counts


def _state(estimate: TaskEstimate) -> TaskState:
    return TaskState(beta_a=estimate.beta_a, beta_b=estimate.beta_b, speculate=estimate.speculate,
                     gamma=estimate.gamma, prior_alpha=estimate.prior_alpha, burstiness=estimate.burstiness,
                     events=estimate.events, total_rounds=estimate.total_rounds,
                     total_drafted=estimate.total_drafted, total_accepted=estimate.total_accepted)


def record_feedback(session: Session, payload: Mapping[str, Any], config: AdaptationConfig | None = None) -> TaskEstimate:
    """Store one feedback event and update its task's estimate under the active policy set
    (created from the published policy on the task's first event); returns the estimate."""
    config = config or AdaptationConfig()
    counts = normalise(payload)
    policy_set = active_policy_set(session)
    if policy_set is None:
        raise FeedbackError("no active policy set; publish one with 'specroute policies publish --run RUN'")
    route_id = payload.get("route_id")
    if route_id is not None:
        decision = session.scalar(select(RouteDecision).where(RouteDecision.route_id == str(route_id)))
        if decision is None:
            raise FeedbackError(f"unknown route_id {route_id!r}")
        task = decision.task_type
    elif isinstance(payload.get("task_type"), str) and payload["task_type"]:
        task = payload["task_type"]
    else:
        raise FeedbackError("give 'route_id' (from a decision) or 'task_type'")
    policies = {p.task_type: p for p in policy_set.policies}
    policy = policies.get(task) or policies[FALLBACK_TASK]
    run = session.get(AnalysisRun, policy_set.run_id)
    cost = cost_for_run(run)
    estimate = session.scalar(select(TaskEstimate).where(
        TaskEstimate.policy_set_id == policy_set.id, TaskEstimate.task_type == task))
    if estimate is None:
        start = initial_state(policy.alpha_mean, policy.speculate, policy.gamma, cost, policy.expected_speedup, config)
        estimate = TaskEstimate(policy_set_id=policy_set.id, task_type=task, beta_a=start.beta_a, beta_b=start.beta_b,
                                speculate=start.speculate, gamma=start.gamma, prior_alpha=start.prior_alpha,
                                burstiness=start.burstiness, events=0, total_rounds=0, total_drafted=0,
                                total_accepted=0)
        session.add(estimate)
    covered = replace(config, gamma_max=min(config.gamma_max, len(cost.target_forward_s) - 1))
    state = apply_feedback(_state(estimate), counts.rounds, counts.drafted, counts.accepted, cost, covered)
    for name in ("beta_a", "beta_b", "speculate", "gamma", "events", "total_rounds", "total_drafted", "total_accepted"):
        setattr(estimate, name, getattr(state, name))
    estimate.updated_at = utcnow()
    session.add(FeedbackEvent(route_id=str(route_id) if route_id is not None else None, policy_set_id=policy_set.id,
                              task_type=task, engine=counts.engine, gamma=payload.get("gamma") if isinstance(payload.get("gamma"), int) else None,
                              rounds=counts.rounds, drafted=counts.drafted, accepted=counts.accepted,
                              output_tokens=counts.output_tokens, raw=dict(payload)))
    session.flush()
    return estimate
