"""Feedback from the engine after a generation: normalise what it reports to counts, store the event,
and move the task's online estimate (router/adaptation.py) under the active policy set.

Every payload names its request with a ``route_id`` from a decision, or names a ``task_type``, and
carries one of these shapes (the first that is present wins, in this order). "rounds" are target
verification passes, "drafted" the draft tokens proposed, "accepted" those the target kept:

- llama.cpp server ``timings``: ``{"timings": {"draft_n", "draft_n_accepted", "predicted_n"}}`` →
  drafted = draft_n, accepted = draft_n_accepted, output_tokens = predicted_n, and rounds =
  predicted_n − draft_n_accepted (each target pass emits its accepted drafts plus one token of its own).
- vLLM per-request speculative decoding metrics: ``{"speculative_decoding": {...}}`` with
  ``num_drafts`` (alias ``num_spec_steps``: verification passes that carried drafts),
  ``num_draft_tokens`` and ``num_accepted_tokens`` (alias ``num_accepted_draft_tokens``) → rounds,
  drafted, accepted as named. Instead of the accepted count it may carry ``num_accepted_tokens_per_pos``
  (accepted drafts at position 1..k, summed) or an ``acceptance_histogram`` (h[j] = rounds that accepted
  exactly j drafts, j = 0..k: rounds = Σ h[j], accepted = Σ j·h[j], and drafted defaults to k·rounds).
- SGLang ``meta_info`` (``{"meta_info": {...}}``): rounds = ``spec_verify_ct``; accepted =
  ``spec_num_correct_drafts`` (alias ``spec_accept_token_num``), else ``completion_tokens`` −
  ``spec_verify_ct`` (each verification emits one token beyond the accepted drafts; the same as
  (``spec_accept_length`` − 1)·``spec_verify_ct``); drafted = ``spec_num_proposed_drafts`` (alias
  ``spec_draft_token_num``), else accepted / ``spec_accept_rate``, else ``gamma``·rounds when the payload
  gives the ``gamma`` it ran with; output_tokens = ``completion_tokens``.
- plain counts: ``{"rounds", "drafted", "accepted"}`` (optional ``output_tokens``, ``gamma``,
  ``engine``), which is what ``router/client.py`` sends for transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from analyzer.db import utcnow
from analyzer.models import AnalysisRun
from analyzer.report import cost_for_run
from analyzer.speedup import Cost
from router.adaptation import AdaptationConfig, TaskState, apply_feedback, initial_state
from router.models import ClassifierVersion, FeedbackEvent, RouteDecision, TaskEstimate
from router.policy import FALLBACK_TASK, active_policy_set


class FeedbackError(ValueError):
    """A feedback payload that cannot be used; the message names the field. ``code`` says which kind:
    invalid_feedback (the payload), unknown_route_id, or no_active_policy."""

    def __init__(self, message: str, code: str = "invalid_feedback"):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class FeedbackCounts:
    """A generation's speculation, normalised: target passes (rounds), drafted and accepted tokens."""

    engine: str
    rounds: int
    drafted: int
    accepted: int
    output_tokens: int | None = None


MAX_COUNT = 1_000_000_000  # per generation; larger counts are a client bug, and would not fit the columns
MAX_GAMMA = 1_000


def _count(payload: Mapping[str, Any], key: str, where: str = "") -> int:
    value = payload.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise FeedbackError(f"field '{where}{key}' must be an integer from 0 to {MAX_COUNT:,}, got {value!r}")
    return value


def _gamma(payload: Mapping[str, Any]) -> int | None:
    """The request's ``gamma`` when it is a usable lookahead (1..MAX_GAMMA), else None."""
    gamma = payload.get("gamma")
    return gamma if isinstance(gamma, int) and not isinstance(gamma, bool) and 0 < gamma <= MAX_GAMMA else None


def _first(payload: Mapping[str, Any], names: tuple[str, ...], where: str) -> int | None:
    """The count under the first of ``names`` present in ``payload`` (None when none is)."""
    for name in names:
        if payload.get(name) is not None:
            return _count(payload, name, where)
    return None


def _section(payload: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    section = payload[key]
    if not isinstance(section, Mapping):
        raise FeedbackError(f"field '{key}' must be an object")
    return section


def _count_list(payload: Mapping[str, Any], key: str, where: str) -> list[int]:
    values = payload.get(key)
    if not isinstance(values, list) or not values or any(
            isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_COUNT for v in values):
        raise FeedbackError(f"field '{where}{key}' must be a non-empty list of integers from 0 to {MAX_COUNT:,}")
    return values


def _llama_cpp(timings: Mapping[str, Any]) -> FeedbackCounts:
    drafted = _count(timings, "draft_n", "timings.")
    accepted = _count(timings, "draft_n_accepted", "timings.")
    produced = _count(timings, "predicted_n", "timings.")
    return FeedbackCounts("llama.cpp", max(produced - accepted, 0), drafted, accepted, produced)


def _vllm(stats: Mapping[str, Any]) -> FeedbackCounts:
    where = "speculative_decoding."
    rounds = _first(stats, ("num_drafts", "num_spec_steps"), where)
    drafted = _first(stats, ("num_draft_tokens",), where)
    accepted = _first(stats, ("num_accepted_tokens", "num_accepted_draft_tokens"), where)
    if accepted is None and stats.get("num_accepted_tokens_per_pos") is not None:
        accepted = sum(_count_list(stats, "num_accepted_tokens_per_pos", where))
    if stats.get("acceptance_histogram") is not None:
        histogram = _count_list(stats, "acceptance_histogram", where)
        rounds = sum(histogram) if rounds is None else rounds
        accepted = sum(j * n for j, n in enumerate(histogram)) if accepted is None else accepted
        drafted = (len(histogram) - 1) * sum(histogram) if drafted is None else drafted
    missing = [name for name, value in (("num_drafts", rounds), ("num_draft_tokens", drafted),
                                        ("num_accepted_tokens", accepted)) if value is None]
    if missing:
        raise FeedbackError(f"field '{where}{missing[0]}' is missing (see the vLLM mapping in the API docs)")
    return FeedbackCounts("vllm", rounds, drafted, accepted, _first(stats, ("num_output_tokens",), where))


def _sglang(meta: Mapping[str, Any], gamma: int | None) -> FeedbackCounts:
    where = "meta_info."
    rounds = _count(meta, "spec_verify_ct", where)
    completion = _first(meta, ("completion_tokens",), where)
    accepted = _first(meta, ("spec_num_correct_drafts", "spec_accept_token_num"), where)
    if accepted is None:
        if completion is None:
            raise FeedbackError(f"field '{where}completion_tokens' (or '{where}spec_num_correct_drafts') is missing")
        accepted = max(completion - rounds, 0)
    drafted = _first(meta, ("spec_num_proposed_drafts", "spec_draft_token_num"), where)
    rate = meta.get("spec_accept_rate")
    if drafted is None and isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 < rate <= 1:
        drafted = MAX_COUNT if accepted > rate * MAX_COUNT else max(round(accepted / rate), accepted)
    if drafted is None and gamma is not None:
        drafted = min(gamma * rounds, MAX_COUNT)
    if drafted is None:
        raise FeedbackError(f"field '{where}spec_num_proposed_drafts' is missing; send it, "
                            f"'{where}spec_accept_rate', or the 'gamma' the server ran with")
    return FeedbackCounts("sglang", rounds, drafted, accepted, completion)


def normalise(payload: Mapping[str, Any]) -> FeedbackCounts:
    """Counts from any accepted payload shape (see the module docstring)."""
    if "timings" in payload:
        counts = _llama_cpp(_section(payload, "timings"))
    elif "speculative_decoding" in payload:
        counts = _vllm(_section(payload, "speculative_decoding"))
    elif "meta_info" in payload:
        counts = _sglang(_section(payload, "meta_info"), _gamma(payload))
    elif {"rounds", "drafted", "accepted"} <= set(payload):
        output = payload.get("output_tokens")
        counts = FeedbackCounts(
            str(payload.get("engine") or "counts")[:32], _count(payload, "rounds"), _count(payload, "drafted"),
            _count(payload, "accepted"), _count(payload, "output_tokens") if output is not None else None,
        )
    else:
        raise FeedbackError("give counts {rounds, drafted, accepted}, llama.cpp 'timings', vLLM "
                            "'speculative_decoding' or SGLang 'meta_info'")
    if counts.accepted > counts.drafted:
        raise FeedbackError(f"accepted ({counts.accepted}) cannot exceed drafted ({counts.drafted})")
    return counts


def task_state(estimate: TaskEstimate) -> TaskState:
    """The adaptation state stored in a TaskEstimate row."""
    return TaskState(beta_a=estimate.beta_a, beta_b=estimate.beta_b, speculate=estimate.speculate,
                     gamma=estimate.gamma, prior_alpha=estimate.prior_alpha, burstiness=estimate.burstiness,
                     events=estimate.events, total_rounds=estimate.total_rounds,
                     total_drafted=estimate.total_drafted, total_accepted=estimate.total_accepted)


@dataclass(frozen=True)
class PolicyContext:
    """What feedback needs of a policy set, as a loaded Router holds it (saves the queries)."""

    policy_set_id: int
    policies: Mapping[str, Any]  # task type (and FALLBACK_TASK) -> alpha_mean, speculate, gamma, expected_speedup
    cost: Cost
    classifier_labels: frozenset[str] = frozenset()  # the active classifier's task types

    @property
    def known_tasks(self) -> frozenset[str]:
        """Task types feedback may name: those with a published policy and those the classifier predicts."""
        return frozenset(self.policies) - {FALLBACK_TASK} | self.classifier_labels


def active_classifier_labels(session: Session) -> frozenset[str]:
    """The task types of the active classifier version (empty before the first training)."""
    labels = session.scalar(select(ClassifierVersion.labels).where(ClassifierVersion.is_active.is_(True)))
    return frozenset(labels or ())


def record_feedback(session: Session, payload: Mapping[str, Any], config: AdaptationConfig | None = None,
                    context: PolicyContext | None = None) -> TaskEstimate:
    """Store one feedback event and update its task's estimate under the active policy set
    (created from the published policy on the task's first event); returns the estimate. Run it in
    a transaction begun with ``analyzer.db.lock_for_write`` when other writers may be about.
    ``context``: the policy set as the caller has it loaded (else it is read from the database)."""
    config = config or AdaptationConfig()
    counts = normalise(payload)
    if context is None:
        policy_set = active_policy_set(session)
        if policy_set is None:
            raise FeedbackError("no active policy set; publish one with 'specroute policies publish --run RUN'",
                                "no_active_policy")
        context = PolicyContext(policy_set.id, {p.task_type: p for p in policy_set.policies},
                                cost_for_run(session.get(AnalysisRun, policy_set.run_id)),
                                active_classifier_labels(session))
    route_id = payload.get("route_id")
    if route_id is not None and not isinstance(route_id, str):
        raise FeedbackError(f"field 'route_id' must be a string, got {route_id!r}")
    if payload.get("task_type") is not None and (not isinstance(payload["task_type"], str) or len(payload["task_type"]) > 64):
        raise FeedbackError("field 'task_type' must be a string of at most 64 characters")
    if route_id is not None:
        decision = session.scalar(select(RouteDecision).where(RouteDecision.route_id == str(route_id)))
        if decision is None:
            raise FeedbackError(f"unknown route_id {route_id!r}", "unknown_route_id")
        task = decision.task_type
    elif isinstance(payload.get("task_type"), str) and payload["task_type"]:
        task = payload["task_type"]
        if task not in context.known_tasks:  # a made-up task would get an estimate and a metrics label
            known = ", ".join(sorted(context.known_tasks)) or "none yet"
            raise FeedbackError(f"unknown task_type {task!r}: name a task type with a published policy or one the "
                                f"classifier predicts ({known}), or send the decision's route_id")
    else:
        raise FeedbackError("give 'route_id' (from a decision) or 'task_type'")
    policy = context.policies.get(task) or context.policies[FALLBACK_TASK]
    cost = context.cost
    estimate = session.scalar(select(TaskEstimate).where(  # FOR UPDATE: no lost updates on PostgreSQL
        TaskEstimate.policy_set_id == context.policy_set_id, TaskEstimate.task_type == task).with_for_update())
    if estimate is None:
        start = initial_state(policy.alpha_mean, policy.speculate, policy.gamma, cost, policy.expected_speedup, config)
        estimate = TaskEstimate(policy_set_id=context.policy_set_id, task_type=task, beta_a=start.beta_a, beta_b=start.beta_b,
                                speculate=start.speculate, gamma=start.gamma, prior_alpha=start.prior_alpha,
                                burstiness=start.burstiness, events=0, total_rounds=0, total_drafted=0,
                                total_accepted=0)
        session.add(estimate)
    covered = replace(config, gamma_max=min(config.gamma_max, len(cost.target_forward_s) - 1))
    state = apply_feedback(task_state(estimate), counts.rounds, counts.drafted, counts.accepted, cost, covered)
    now = utcnow()
    if estimate.decision_since is None or (state.speculate, state.gamma) != (estimate.speculate, estimate.gamma):
        estimate.decision_since = now  # the decision in force changed (or starts being tracked) now
    for name in ("beta_a", "beta_b", "speculate", "gamma", "events", "total_rounds", "total_drafted", "total_accepted"):
        setattr(estimate, name, getattr(state, name))
    estimate.updated_at = now
    session.add(FeedbackEvent(route_id=str(route_id) if route_id is not None else None, policy_set_id=context.policy_set_id,
                              task_type=task, engine=counts.engine, gamma=_gamma(payload),
                              rounds=counts.rounds, drafted=counts.drafted, accepted=counts.accepted,
                              output_tokens=counts.output_tokens, raw=dict(payload)))
    session.flush()
    return estimate
