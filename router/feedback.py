"""Feedback from the engine after a generation: normalise what it reports to counts, store the event,
and move the task's online estimate (router/adaptation.py) under the active policy set.

Every payload names its request with a ``route_id`` from a decision, or names a ``task_type``, and
carries one of these shapes (the first that is present wins, in this order). "rounds" are target
verification passes, "drafted" the draft tokens proposed, "accepted" those the target kept:

- llama.cpp server ``timings``: ``{"timings": {"draft_n", "draft_n_accepted", "predicted_n"}}`` →
  drafted = draft_n, accepted = draft_n_accepted, output_tokens = predicted_n, and rounds =
  predicted_n − draft_n_accepted (each target pass emits its accepted drafts plus one token of its own);
  draft counts left out (as llama-server leaves them where nothing was drafted) are 0. A policy set
  published from a llama-server analysis also needs ``predicted_ms`` and ``prompt_n`` (with ``cache_n``
  where the server reused cached prompt tokens): they price the request against plain decoding
  (router/server_adaptation.py); the optional top-level ``setting`` names the pool's setting (the key of
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
from analyzer.errors import SpecrouteError
from analyzer.pricing.policy_curve import PolicyCurve
from analyzer.pricing.speedup import Cost
from router.adaptation import AdaptationConfig, TaskState, apply_feedback, count_event, initial_state
from router.orm import ClassifierVersion, FeedbackEvent, PolicySet, TaskEstimate
from router.policy import FALLBACK_TASK, PolicyContract, PolicySnapshot
from router.records import estimate_dict
from router.route_ids import PROCESS_KEY, parse_route_id
from router.server_adaptation import (
    OptionPrior,
    PlainCost,
    apply_server_feedback,
    choose_setting,
    initial_server_state,
    option_priors,
    prior_weight_ms,
)


class FeedbackError(SpecrouteError, ValueError):
    """A feedback payload that cannot be used; the message names the field. The subclasses are the
    other kinds: an unknown route_id, no active policy set."""

    status, code = 400, "invalid_feedback"


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


@dataclass(frozen=True)
class FeedbackCounts:
    """A generation's speculation, normalised: target passes (rounds), drafted and accepted tokens."""

    engine: str
    rounds: int
    drafted: int
    accepted: int
    output_tokens: int | None = None
    prompt_tokens: int | None = None  # llama.cpp: prompt_n + cache_n, the context the first step decodes over
    decode_ms: float | None = None  # llama.cpp: predicted_ms, the decoding's time after the first token


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
    return (
        gamma if isinstance(gamma, int) and not isinstance(gamma, bool) and 0 < gamma <= MAX_GAMMA else None
    )


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
    if (
        not isinstance(values, list)
        or not values
        or any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_COUNT for v in values)
    ):
        raise FeedbackError(
            f"field '{where}{key}' must be a non-empty list of integers from 0 to {MAX_COUNT:,}"
        )
    return values


def _llama_cpp(timings: Mapping[str, Any]) -> FeedbackCounts:
    # llama-server leaves the draft counts out where nothing was drafted (a plain server, or a request that
    # found nothing to draft): 0
    drafted = _first(timings, ("draft_n",), "timings.") or 0
    accepted = _first(timings, ("draft_n_accepted",), "timings.") or 0
    produced = _count(timings, "predicted_n", "timings.")
    prompt = _first(timings, ("prompt_n",), "timings.")
    cached = _first(timings, ("cache_n",), "timings.")
    decode_ms = timings.get("predicted_ms")
    if decode_ms is not None and (
        isinstance(decode_ms, bool) or not isinstance(decode_ms, (int, float)) or not 0 <= decode_ms < 1e12
    ):
        raise FeedbackError(
            f"field 'timings.predicted_ms' must be a number of milliseconds, got {decode_ms!r}"
        )
    return FeedbackCounts(
        "llama.cpp",
        max(produced - accepted, 0),
        drafted,
        accepted,
        produced,
        prompt + (cached or 0) if prompt is not None else None,
        float(decode_ms) if decode_ms is not None else None,
    )


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
    if rounds is None or drafted is None or accepted is None:
        missing = next(
            name
            for name, value in (
                ("num_drafts", rounds),
                ("num_draft_tokens", drafted),
                ("num_accepted_tokens", accepted),
            )
            if value is None
        )
        raise FeedbackError(f"field '{where}{missing}' is missing (see the vLLM mapping in the API docs)")
    return FeedbackCounts("vllm", rounds, drafted, accepted, _first(stats, ("num_output_tokens",), where))


def _sglang(meta: Mapping[str, Any], gamma: int | None) -> FeedbackCounts:
    where = "meta_info."
    rounds = _count(meta, "spec_verify_ct", where)
    completion = _first(meta, ("completion_tokens",), where)
    accepted = _first(meta, ("spec_num_correct_drafts", "spec_accept_token_num"), where)
    if accepted is None:
        if completion is None:
            raise FeedbackError(
                f"field '{where}completion_tokens' (or '{where}spec_num_correct_drafts') is missing"
            )
        accepted = max(completion - rounds, 0)
    drafted = _first(meta, ("spec_num_proposed_drafts", "spec_draft_token_num"), where)
    rate = meta.get("spec_accept_rate")
    if drafted is None and isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 < rate <= 1:
        drafted = MAX_COUNT if accepted > rate * MAX_COUNT else max(round(accepted / rate), accepted)
    if drafted is None and gamma is not None:
        drafted = min(gamma * rounds, MAX_COUNT)
    if drafted is None:
        raise FeedbackError(
            f"field '{where}spec_num_proposed_drafts' is missing; send it, "
            f"'{where}spec_accept_rate', or the 'gamma' the server ran with"
        )
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
            _engine_name(payload.get("engine")),
            _count(payload, "rounds"),
            _count(payload, "drafted"),
            _count(payload, "accepted"),
            _count(payload, "output_tokens") if output is not None else None,
        )
    else:
        raise FeedbackError(
            "give counts {rounds, drafted, accepted}, llama.cpp 'timings', vLLM "
            "'speculative_decoding' or SGLang 'meta_info'"
        )
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


def _engine_name(value: Any) -> str:
    """The free ``engine`` label of a counts payload: printable text of at most 32 characters."""
    if value is None or value == "":
        return "counts"
    if not isinstance(value, str) or len(value) > 32 or not value.isprintable():
        raise FeedbackError("field 'engine' must be printable text of at most 32 characters")
    return value


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


# the top-level fields a feedback payload may carry (anything else is refused, as in a route body)
FEEDBACK_FIELDS = (
    "route_id",
    "task_type",
    "rounds",
    "drafted",
    "accepted",
    "output_tokens",
    "gamma",
    "engine",
    "timings",
    "speculative_decoding",
    "meta_info",
    "setting",
)


class UnknownFeedbackField(FeedbackError):
    """A feedback payload carries a field that is none of FEEDBACK_FIELDS (a typo would otherwise be
    silently ignored)."""

    code = "unknown_field"


def parse_feedback(payload: Mapping[str, Any], key: bytes = PROCESS_KEY) -> FeedbackRequest:
    """Check a payload and normalise its counts (raises FeedbackError naming the field); a route_id
    must verify with ``key`` (the router's: router/route_ids.py)."""
    unknown = sorted(set(payload) - set(FEEDBACK_FIELDS))
    if unknown:
        raise UnknownFeedbackField(f"unknown field '{unknown[0]}'; known: {', '.join(FEEDBACK_FIELDS)}")
    counts = normalise(payload)
    setting = payload.get("setting")
    if setting is not None and (not isinstance(setting, str) or not 0 < len(setting) <= 64):
        raise FeedbackError("field 'setting' must be a llama-server setting's label of at most 64 characters")
    route_id, task = payload.get("route_id"), payload.get("task_type")
    if route_id is not None and not isinstance(route_id, str):
        raise FeedbackError(f"field 'route_id' must be a string, got {route_id!r}")
    if task is not None and (not isinstance(task, str) or len(task) > 64):
        raise FeedbackError("field 'task_type' must be a string of at most 64 characters")
    if route_id is not None:
        found = parse_route_id(route_id, key)
        if found is None:
            raise UnknownRouteId(
                f"unknown route_id {route_id!r}: send the route_id of a decision as it was given "
                "(route ids are signed with the server's secret key)"
            )
        version, task = found  # version 0: decided before any policy set was active
        return FeedbackRequest(
            counts, route_id, version or None, task, _gamma(payload), dict(payload), setting
        )
    if not task:
        raise FeedbackError("give 'route_id' (from a decision) or 'task_type'")
    return FeedbackRequest(counts, None, None, task, _gamma(payload), dict(payload), setting)


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
    cost: Cost | None  # None: a llama-server set (contract.by_setting), priced by its plain cost
    classifier_labels: frozenset[str] = frozenset()  # the active classifier's task types
    contract: PolicyContract = PolicyContract()  # the set's gamma_max, margin, engines, draft and cost

    @property
    def known_tasks(self) -> frozenset[str]:
        """Task types feedback may name: those with a published policy and those the classifier predicts."""
        return frozenset(self.policies) - {FALLBACK_TASK} | self.classifier_labels

    def policy(self, task: str) -> PolicySnapshot:
        """The policy that decides for ``task`` (the fallback where it has none)."""
        return self.policies.get(task) or self.policies[FALLBACK_TASK]

    def curve(self, task: str) -> PolicyCurve:
        """The policy curve that ``task``'s estimate moves."""
        return self.policy(task).curve(self.contract, self.cost)

    def priors(self, task: str) -> tuple[OptionPrior, ...]:
        """A llama-server set: ``task``'s published settings as its analysis priced them."""
        return option_priors(self.policy(task).option_curve, self.contract.published_settings)

    def initial_state(self, task: str, config: AdaptationConfig) -> TaskState:
        """``task``'s state before any feedback: its published decision, its analysis as the prior."""
        policy = self.policy(task)
        if self.contract.by_setting:
            return initial_server_state(
                policy.alpha_mean, policy.setting if policy.speculate else None, config
            )
        return initial_state(policy.alpha_mean, policy.speculate, policy.gamma, config)


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
    contract = PolicyContract.of(policy_set)
    if policy_set is None or (contract.cost is None and not contract.by_setting):
        return None
    return PolicyContext(
        policy_set.id,
        policy_set.version,
        {p.task_type: PolicySnapshot.of(p) for p in policy_set.policies},
        contract.cost,
        active_classifier_labels(session),
        contract,
    )


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
    """PolicyNotAdaptive where policy set ``version`` (None: the active one) exists but has no cost."""
    query = select(PolicySet.version, PolicySet.server_analysis_id)
    found = session.execute(
        query.where(PolicySet.is_active.is_(True))
        if version is None
        else query.where(PolicySet.version == version)
    ).first()
    if found is not None:
        source = (
            "a llama-server analysis before feedback adapted such sets (it has no curve over the settings: "
            "publish it again)"
            if found[1]
            else "a run without a cost profile"
        )
        raise PolicyNotAdaptive(
            f"policy set v{found[0]} was published from {source}: it has no cost to adapt with, so it takes no "
            "feedback"
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
    counts = request.counts
    if context.contract.by_setting:
        state = _apply_to_setting(request, context, estimate_state(estimate), config)
    else:
        state = apply_feedback(
            estimate_state(estimate),
            counts.rounds,
            counts.drafted,
            counts.accepted,
            context.curve(request.task),
            config,
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


class UnknownSetting(FeedbackError):
    """Feedback names a llama-server setting the policy set publishes no pool for."""

    code = "unknown_setting"


def _apply_to_setting(
    request: FeedbackRequest, context: PolicyContext, state: TaskState, config: AdaptationConfig
) -> TaskState:
    """A llama-server set's estimate after one pool request (:func:`apply_server_feedback`): its setting is
    the one the payload names, else the one in force (while off: the one a probe goes to, where the request
    drafted something; one that drafted nothing ran on the off pool). A request on the off pool is counted and
    moves no setting; one on a setting moves that setting's estimate, even where it drafted nothing."""
    counts = request.counts
    priors = context.priors(request.task)
    cost = PlainCost.from_json(context.contract.plain_cost)
    assert cost is not None  # contract.by_setting
    weight = prior_weight_ms(cost, config)
    setting = request.setting
    if setting is None:
        setting = state.setting if state.speculate else choose_setting(priors, state, context.contract.margin,
                                                                       config, weight).probe  # fmt: skip
    elif setting == "off" or setting not in {p.label for p in priors}:
        if setting != "off":
            raise UnknownSetting(
                f"unknown setting {setting!r}: policy set v{context.version} publishes pools for "
                f"{', '.join(sorted(p.label for p in priors)) or 'no setting'} (and off) for task {request.task!r}"
            )
        setting = None
    if setting is None or counts.drafted == 0 and request.setting is None and not state.speculate:
        # a plain request: it says nothing about a setting; it is counted
        return count_event(state, counts.rounds, 0, 0)
    missing = next(
        (name for name, value in (("predicted_ms", counts.decode_ms), ("prompt_n", counts.prompt_tokens),
                                  ("predicted_n", counts.output_tokens)) if value is None),
        None,
    )  # fmt: skip
    if missing is not None:
        raise FeedbackError(
            f"field 'timings.{missing}' is missing: feedback to a llama-server policy set (v{context.version}) is "
            "the pool's 'timings' as the server reports them"
        )
    assert (
        counts.decode_ms is not None and counts.prompt_tokens is not None and counts.output_tokens is not None
    )
    return apply_server_feedback(
        state,
        setting=setting,
        drafted=counts.drafted,
        accepted=counts.accepted,
        rounds=counts.rounds,
        plain_ms=cost.plain_ms(counts.prompt_tokens, counts.output_tokens),
        served_ms=counts.decode_ms,
        priors=priors,
        margin=context.contract.margin,
        weight_ms=weight,
        config=config,
    )


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
