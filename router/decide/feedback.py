"""Feedback from the engine after a generation: normalise what it reports to counts, store the event,
and move the task's online estimate (router/decide/adaptation.py) under the active policy set.

Every payload names its request with a ``route_id`` from a decision, or names a ``task_type``, and
carries one of these shapes: one engine's section (router/decide/feedback_formats.py; two are refused), or plain
counts. The serving engines' registry (router/export/serving.py) gives each engine its section. "rounds" are target
verification passes, "drafted" the draft tokens proposed, "accepted" those the target kept:

- llama.cpp server ``timings``: ``{"timings": {"draft_n", "draft_n_accepted", "predicted_n"}}`` →
  drafted = draft_n, accepted = draft_n_accepted, output_tokens = predicted_n, and rounds =
  predicted_n − draft_n_accepted (each target pass emits its accepted drafts plus one token of its own);
  draft counts left out (as llama-server leaves them where nothing was drafted) are 0. A policy set
  published from a llama-server analysis also needs ``predicted_ms`` and ``prompt_n`` (with ``cache_n``
  where the server reused cached prompt tokens): they price the request against plain decoding
  (router/decide/server_adaptation.py); the optional top-level ``setting`` names the pool's setting (the key of
  the decision's pool in the set's ``pools``, as the front door sends it; default: the task's setting in
  force).
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

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from analyzer.db import utcnow
from analyzer.pricing.speedup import Cost
from router.decide.adaptation import AdaptationConfig, TaskState
from router.decide.estimators import TaskEstimator, estimator_of
from router.decide.feedback_body import read_feedback
from router.decide.feedback_formats import FeedbackCounts, FeedbackError
from router.decide.route_ids import PROCESS_KEY, parse_route_id
from router.orm import ClassifierVersion, FeedbackEvent, PolicySet, TaskEstimate
from router.policies.policy import FALLBACK_TASK, PolicyContract, PolicySnapshot
from router.policies.records import analysis_ref, estimate_dict


class UnknownRouteId(FeedbackError):
    """The feedback names a route_id no decision was given (or of a policy set that does not exist)."""

    status, code = 404, "unknown_route_id"


class NoActivePolicy(FeedbackError):
    """Feedback arrived while no policy set is active."""

    status, code = 409, "no_active_policy"


class PolicyNotAdaptive(FeedbackError):
    """Feedback about a policy set without a cost to adapt with: one published from a llama-server analysis
    (each pool's server fixes its setting), or from a run without a cost profile."""

    status, code = 409, "policy_not_adaptive"


def normalise(payload: Any) -> FeedbackCounts:
    """Counts from any accepted payload shape (see the module docstring), checked: FeedbackError naming
    the field for a body router/decide/feedback_body.py refuses, or counts that cannot be."""
    return checked_counts(read_feedback(payload).counts())


def checked_counts(counts: FeedbackCounts) -> FeedbackCounts:
    """``counts`` when a generation can have made them (FeedbackError saying why not)."""
    if counts.accepted > counts.drafted:
        raise FeedbackError(f"accepted ({counts.accepted}) cannot exceed drafted ({counts.drafted})")
    if counts.rounds == 0 and counts.drafted == 0:
        raise FeedbackError(
            "the counts are all zero (rounds 0, drafted 0): such an event tells nothing; send feedback "
            "for requests that generated with speculation on"
        )
    if counts.rounds == 0:
        raise FeedbackError(f"{counts.drafted} drafted tokens need at least one round (rounds 0)")
    return counts


@dataclass(frozen=True)
class FeedbackRequest:
    """One feedback payload, checked and normalised once: the counts, and the policy set version and
    task it is about (from its ``route_id``, or its ``task_type`` under the active set)."""

    counts: FeedbackCounts
    route_id: str | None
    policy_version: int | None  # None: the active policy set
    task: str
    gamma: int | None
    raw: Mapping[str, Any]
    setting: str | None = None  # the llama-server setting the request ran with (None: not said)

    def event(self, policy_set_id: int | None) -> FeedbackEvent:
        """The stored event of this feedback, under policy set ``policy_set_id``."""
        counts = self.counts
        return FeedbackEvent(
            route_id=self.route_id,
            policy_set_id=policy_set_id,
            task_type=self.task,
            engine=counts.engine,
            gamma=self.gamma,
            rounds=counts.rounds,
            drafted=counts.drafted,
            accepted=counts.accepted,
            output_tokens=counts.output_tokens,
            raw=dict(self.raw),
        )


def parse_feedback(payload: Any, key: bytes = PROCESS_KEY) -> FeedbackRequest:
    """Check a payload and normalise its counts (raises FeedbackError naming the field); a route_id
    must verify with ``key`` (the router's: router/decide/route_ids.py)."""
    body = read_feedback(payload)
    counts = checked_counts(body.counts())
    if body.route_id is not None:
        found = parse_route_id(body.route_id, key)
        if found is None:
            raise UnknownRouteId(
                f"unknown route_id {body.route_id!r}: send the route_id of a decision as it was given "
                "(route ids are signed with the server's secret key)"
            )
        version, task = found  # version 0: decided before any policy set was active
        return FeedbackRequest(
            counts, body.route_id, version or None, task, body.gamma, dict(payload), body.setting
        )
    if body.task_type is None:
        raise FeedbackError("give 'route_id' (from a decision) or 'task_type'")
    return FeedbackRequest(counts, None, None, body.task_type, body.gamma, dict(payload), body.setting)


STATE_COLUMNS = (
    "beta_a",
    "beta_b",
    "speculate",
    "gamma",
    "prior_alpha",
    "events",
    "total_rounds",
    "total_drafted",
    "total_accepted",
    "setting",
    "options",
)


def estimate_state(estimate: TaskEstimate) -> TaskState:
    """The adaptation state stored in a TaskEstimate row."""
    return TaskState(**{name: getattr(estimate, name) for name in STATE_COLUMNS})


def store_state(estimate: TaskEstimate, state: TaskState) -> None:
    """Write ``state`` into its TaskEstimate row (the inverse of :func:`estimate_state`)."""
    for name in STATE_COLUMNS:
        setattr(estimate, name, getattr(state, name))


@dataclass(frozen=True)
class PolicyContext:
    """What feedback needs of a policy set, as a loaded Router holds it (saves the queries)."""

    policy_set_id: int
    version: int
    policies: Mapping[str, PolicySnapshot]  # task type (and FALLBACK_TASK) -> its published policy
    cost: Cost | None  # the run's cost profile (None: a llama-server set, priced by its plain step cost)
    classifier_labels: frozenset[str] = frozenset()  # the active classifier's task types
    contract: PolicyContract = PolicyContract()  # the set's gamma_max, margin, engines, draft and cost
    # how its tasks' estimates start and move (router/decide/estimators.py); None: from the policies and cost
    estimator: TaskEstimator | None = None

    def __post_init__(self) -> None:
        if self.estimator is None:
            object.__setattr__(self, "estimator", estimator_of(self.contract, self.policies, self.cost))

    @property
    def known_tasks(self) -> frozenset[str]:
        """Task types feedback may name: those with a published policy and those the classifier predicts."""
        return frozenset(self.policies) - {FALLBACK_TASK} | self.classifier_labels

    def policy(self, task: str) -> PolicySnapshot:
        """The policy that decides for ``task`` (the fallback where it has none)."""
        return self.policies.get(task) or self.policies[FALLBACK_TASK]

    def initial_state(self, task: str, config: AdaptationConfig) -> TaskState:
        """``task``'s state before any feedback: its published decision, its analysis as the prior."""
        assert self.estimator is not None  # policy_context gives none for a set that takes no feedback
        return self.estimator.initial_state(self.policy(task), config)


def active_classifier_labels(session: Session) -> frozenset[str]:
    """The task types of the active classifier version (empty before the first training)."""
    labels = session.scalar(select(ClassifierVersion.labels).where(ClassifierVersion.is_active.is_(True)))
    return frozenset(labels or ())


def policy_context(session: Session, version: int | None = None) -> PolicyContext | None:
    """Policy set ``version`` (the active one for None) as feedback needs it; None when there is none."""
    query = select(PolicySet).options(selectinload(PolicySet.policies))
    policy_set = session.scalar(
        query.where(PolicySet.is_active.is_(True))
        if version is None
        else query.where(PolicySet.version == version)
    )
    if policy_set is None:
        return None
    contract = PolicyContract.of(policy_set)
    context = PolicyContext(
        policy_set.id,
        policy_set.version,
        {p.task_type: PolicySnapshot.of(p) for p in policy_set.policies},
        contract.cost,
        active_classifier_labels(session),
        contract,
    )
    return context if context.estimator is not None else None


@dataclass(frozen=True)
class Recorded:
    """What one feedback event did: the task's estimate row and state under ``policy_set_id``, and
    ``snapshot``, the estimate as the API answers it right after this event (later events of the
    same batch move the row itself)."""

    estimate: TaskEstimate
    state: TaskState
    policy_set_id: int
    snapshot: dict[str, Any]


def _check_adaptive(session: Session, version: int | None) -> None:
    """PolicyNotAdaptive where policy set ``version`` (None: the active one) exists but has nothing to price
    feedback with."""
    query = select(PolicySet)
    found = session.scalar(
        query.where(PolicySet.is_active.is_(True))
        if version is None
        else query.where(PolicySet.version == version)
    )
    if found is not None:
        raise PolicyNotAdaptive(
            f"policy set v{found.version} was published from analysis {analysis_ref(found) or '(deleted)'} without a "
            "cost to adapt with (a run without a cost profile, or a llama-server analysis published before feedback "
            "adapted such sets: publish it again), so it takes no feedback"
        )


def _checked_context(
    session: Session,
    request: FeedbackRequest,
    context: PolicyContext | None,
    loaded: dict[int | None, PolicyContext | None],
) -> PolicyContext:
    """The policy set ``request`` is about, with its task checked; raises FeedbackError and writes
    nothing. ``loaded``: policy sets read from the database so far (by version, None: the active one)."""
    if context is None or (request.policy_version is not None and request.policy_version != context.version):
        if request.policy_version not in loaded:
            loaded[request.policy_version] = policy_context(session, request.policy_version)
        context = loaded[request.policy_version]
    if context is None:
        _check_adaptive(session, request.policy_version)
    if context is None and request.policy_version is not None:
        raise UnknownRouteId(
            f"unknown route_id {request.route_id!r}: policy set v{request.policy_version} does not exist"
        )
    if context is None:
        raise NoActivePolicy("no active policy set; publish one with 'specroute policies publish --run RUN'")
    task = request.task
    if request.route_id is not None and task not in context.policies and task not in context.known_tasks:
        raise UnknownRouteId(
            f"unknown route_id {request.route_id!r}: policy set v{context.version} has no task {task!r}"
        )
    if (
        request.route_id is None and task not in context.known_tasks
    ):  # a made-up task would get an estimate and a metrics label
        known = ", ".join(sorted(context.known_tasks)) or "none yet"
        raise FeedbackError(
            f"unknown task_type {task!r}: name a task type with a published policy or one the "
            f"classifier predicts ({known}), or send the decision's route_id"
        )
    return context


def _estimate_rows(
    session: Session, wanted: Mapping[tuple[int, str], PolicyContext], config: AdaptationConfig
) -> dict[tuple[int, str], TaskEstimate]:
    """The estimate rows of ``wanted`` ((policy set id, task) -> its set), each read and locked once
    (SELECT ... FOR UPDATE, in sorted order), and those missing created from their policy's prior (in
    sorted order): two transactions that want some of the same rows then wait for each other instead
    of deadlocking."""
    rows: dict[tuple[int, str], TaskEstimate] = {}
    by_set: dict[int, list[str]] = {}
    for policy_set_id, task in sorted(wanted):
        by_set.setdefault(policy_set_id, []).append(task)
    for policy_set_id, tasks in by_set.items():
        for estimate in session.scalars(
            select(TaskEstimate)
            .where(TaskEstimate.policy_set_id == policy_set_id, TaskEstimate.task_type.in_(tasks))
            .order_by(TaskEstimate.task_type)
            .with_for_update()
        ):
            rows[(policy_set_id, estimate.task_type)] = estimate
    for key in sorted(wanted):
        if key not in rows:
            estimate = TaskEstimate(policy_set_id=key[0], task_type=key[1])
            store_state(estimate, wanted[key].initial_state(key[1], config))
            session.add(estimate)
            rows[key] = estimate
    return rows


def _apply(
    session: Session,
    request: FeedbackRequest,
    context: PolicyContext,
    estimate: TaskEstimate,
    config: AdaptationConfig,
) -> Recorded:
    """Move ``estimate`` by one checked event and add the event's row."""
    assert context.estimator is not None  # policy_context gives none for a set that takes no feedback
    state = context.estimator.apply(
        request.task, estimate_state(estimate), request.counts, request.setting, config, context.version
    )
    now = utcnow()
    if estimate.decision_since is None or (state.speculate, state.gamma, state.setting) != (
        estimate.speculate,
        estimate.gamma,
        estimate.setting,
    ):
        estimate.decision_since = now  # the decision in force changed (or starts being tracked) now
    store_state(estimate, state)
    estimate.updated_at = now
    session.add(request.event(context.policy_set_id))
    return Recorded(estimate, state, context.policy_set_id, estimate_dict(estimate))


def record_feedback_batch(
    session: Session,
    items: Sequence[tuple[FeedbackRequest, PolicyContext | None]],
    config: AdaptationConfig | None = None,
) -> list[Recorded | FeedbackError]:
    """Store feedback events in the caller's transaction, in the order given: each ``(request,
    context)`` is checked against the policy set its route_id names (the active one for feedback by
    task_type; ``context``: the active set as the caller has it loaded, else it is read), every
    estimate row the events touch is read and locked once, created from the published policy on its
    task's first event, and the events are applied to it one after the other. An event that fails its
    checks comes back as its FeedbackError in its place, with nothing of it stored; the others go on.
    Run it in a transaction begun with ``analyzer.db.lock_for_write`` when other writers may be about."""
    config = config or AdaptationConfig()
    loaded: dict[int | None, PolicyContext | None] = {}
    checked: list[PolicyContext | FeedbackError] = []
    for request, context in items:
        try:
            checked.append(_checked_context(session, request, context, loaded))
        except FeedbackError as exc:
            checked.append(exc)
    rows = _estimate_rows(
        session,
        {(c.policy_set_id, r.task): c for (r, _), c in zip(items, checked) if isinstance(c, PolicyContext)},
        config,
    )
    outcomes: list[Recorded | FeedbackError] = [
        _apply(session, request, context, rows[(context.policy_set_id, request.task)], config)
        if isinstance(context, PolicyContext)
        else context
        for (request, _), context in zip(items, checked)
    ]
    session.flush()
    return outcomes


def record_observation(session: Session, request: FeedbackRequest) -> FeedbackEvent:
    """Store a feedback event that moves no estimate: what a pool reported under a policy set that takes no
    feedback (:class:`PolicyNotAdaptive`), kept with the set its route id names (the active one for feedback
    by task)."""
    query = select(PolicySet.id)
    policy_set_id = session.scalar(
        query.where(PolicySet.is_active.is_(True))
        if request.policy_version is None
        else query.where(PolicySet.version == request.policy_version)
    )
    event = request.event(policy_set_id)
    session.add(event)
    session.flush()
    return event


def record_feedback(
    session: Session,
    request: FeedbackRequest,
    config: AdaptationConfig | None = None,
    context: PolicyContext | None = None,
) -> Recorded:
    """Store one feedback event and update its task's estimate (``record_feedback_batch`` of one;
    raises its FeedbackError)."""
    outcome = record_feedback_batch(session, [(request, context)], config)[0]
    if isinstance(outcome, FeedbackError):
        raise outcome
    return outcome
