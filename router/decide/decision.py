"""The routing decision, in process and without Flask: classify the prompt, look up the task's
published policy (the workload-wide fallback when the classifier is unsure or the task has none),
follow the task's online estimate where feedback has moved it (router/decide/adaptation.py), apply the
request rules (short outputs run without speculation; at a batch size the analysis profiled, or between
two it profiled, the decision follows the S(g) curve measured there; larger batches than the profiles
cover run without speculation above ``max_batch_size``), and return the decision with ready-to-use
engine settings. Everything it needs is loaded once into a Router, so a decision
touches no database; ``observe`` takes a task's new estimate after feedback."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from analyzer.engine.engines import SERVING
from analyzer.pricing.policy_curve import CurvePoint, PolicyCurve
from analyzer.pricing.speedup import Cost
from analyzer.settings import Settings, router_min_confidence
from router.classify.task_classifier import TaskClassifier
from router.classify.version_store import load_active
from router.decide.adaptation import AdaptationConfig, TaskState, next_request
from router.decide.contract import Decision, EngineTerms, RouteRequest
from router.decide.estimators import Chosen, estimator_of
from router.decide.feedback import estimate_state
from router.decide.reasons import Reason, reason
from router.decide.route_ids import PROCESS_KEY, new_route_id, route_key
from router.orm import TaskEstimate
from router.policies.policy import (
    FALLBACK_TASK,
    NO_GAMMA,
    PolicyContract,
    PolicySnapshot,
    active_policy_set,
    router_pools,
)

DEFAULT_MIN_CONFIDENCE = 0.5


@dataclass(frozen=True)
class RouterConfig:
    """Request rules and deployment naming (see the ``router_*`` settings)."""

    min_output_tokens: int = 20
    max_batch_size: int = 8
    min_confidence: float | None = (
        None  # None: the classifier's own threshold, DEFAULT_MIN_CONFIDENCE without one
    )
    # the server's SPECROUTE_ROUTER_POOLS: names the pools of a policy set published without its own
    pools: Mapping[str, str] = field(default_factory=dict)
    route_key: bytes = PROCESS_KEY  # signs route ids (router/decide/route_ids.py): the server's secret key

    @classmethod
    def from_settings(cls, settings: Settings, secret_key: str | None = None) -> "RouterConfig":
        """The ``router_*`` settings (raises SettingsError naming a bad one); ``secret_key`` signs
        the route ids (the server's key; none: this process's own)."""
        return cls(
            settings.router_min_output_tokens,
            settings.router_max_batch_size,
            router_min_confidence(settings),
            router_pools(settings),
            route_key(secret_key),
        )


@dataclass
class _Choice:
    """A decision while it is being made: speculate, gamma, the alpha and speedup it expects, why."""

    speculate: bool
    gamma: int
    alpha: float | None
    expected: float
    reasons: list[Reason]
    setting: str | None = None  # a llama-server set: the setting it speculates with


class Router:
    """A loaded classifier, policy set and per-task online states; ``route`` decides in well under
    a millisecond and is safe to call from several threads. ``contract``: what the policy set's run
    fixed (gamma_max, margin, engine); the online estimates adapt under it."""

    def __init__(
        self,
        classifier: TaskClassifier | None,
        policies: Mapping[str, PolicySnapshot],
        *,
        policy_version: int | None,
        draft_kind: str = "ngram",
        ngram_max: int = 2,
        config: RouterConfig | None = None,
        cost: Cost | None = None,
        states: Mapping[str, TaskState] | None = None,
        adaptation: AdaptationConfig | None = None,
        policy_set_id: int | None = None,
        contract: PolicyContract | None = None,
    ):
        self.classifier = classifier
        self.policies = {task: p for task, p in policies.items() if task != FALLBACK_TASK}
        self.fallback = policies.get(FALLBACK_TASK)
        self.policy_version = policy_version
        self.policy_set_id = policy_set_id
        self.draft_kind = draft_kind
        self.ngram_max = ngram_max
        self.config = config or RouterConfig()
        self.cost = cost
        self.contract = contract or PolicyContract()
        self.adaptation = adaptation or AdaptationConfig()
        self.curves = {task: p.curve(self.contract, cost) for task, p in policies.items()}
        # where the set's costs come from, so how its tasks' estimates decide and move (None: no feedback)
        self.estimator = estimator_of(self.contract, policies, cost)
        self.states: dict[str, TaskState] = {}
        if self.estimator is not None:
            for task, p in policies.items():  # its published decision, its analysis as the prior
                self.states[task] = self.estimator.initial_state(p, self.adaptation)
        self.states.update(states or {})
        self._lock = threading.Lock()

    @property
    def margin(self) -> float:
        return self.contract.margin

    @property
    def priced_by(self) -> str | None:
        """The engine whose cost priced the policies (None: no policy set)."""
        return self.contract.priced_by

    @property
    def classifier_version(self) -> int | None:
        return self.classifier.version if self.classifier is not None else None

    def route(
        self,
        prompt: str | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        *,
        max_new_tokens: int | None = None,
        batch_size: int | None = None,
        temperature: float | None = None,
    ) -> Decision:
        """Decide for one request (give ``prompt`` or chat ``messages``)."""
        request = RouteRequest.of(
            prompt, messages, max_new_tokens=max_new_tokens, batch_size=batch_size, temperature=temperature
        )
        return self.route_many([request])[0]

    def route_many(self, requests: Sequence[RouteRequest]) -> list[Decision]:
        """Decide for many requests; the classifier sees them as one batch."""
        classified = self._classify([r.classified_text() for r in requests])
        return [self._decide(r, task, confidence) for r, (task, confidence) in zip(requests, classified)]

    def decide_task(self, task: str, request: RouteRequest) -> Decision:
        """The decision for a request already known to be of ``task`` (no classification; what
        ``specroute export`` writes an engine's per-batch settings from)."""
        return self._decide(request, task, 1.0)

    def observe(self, task: str, state: TaskState) -> None:
        """Take a task's estimate after feedback (the count of requests while off stays ours)."""
        with self._lock:
            current = self.states.get(task)
            keep = current.requests_while_off if current is not None else 0
            self.states[task] = replace(state, requests_while_off=keep)

    def curve_of(self, task: str) -> PolicyCurve | None:
        """The policy curve that ``task``'s decisions and estimate follow (the fallback's where it has
        none; None without a policy set)."""
        return self.curves.get(task) or self.curves.get(FALLBACK_TASK)

    def _classify(self, texts: list[str]) -> list[tuple[str, float]]:
        if self.classifier is None:
            return [("unlabelled", 0.0)] * len(texts)
        return self.classifier.predict(texts)

    @property
    def min_confidence(self) -> float:
        """The confidence bar in force: the configured one, else the classifier's own threshold."""
        if self.config.min_confidence is not None:
            return self.config.min_confidence
        if self.classifier is not None and self.classifier.threshold is not None:
            return float(self.classifier.threshold)
        return DEFAULT_MIN_CONFIDENCE

    def _catch_all(self, task: str) -> bool:
        """Whether the active classifier's ``task`` is a catch-all (its followed predictions on unseen
        sources were wrong more often than right): the workload policy decides for it."""
        return self.classifier is not None and task in self.classifier.catch_all

    # ---------------------------------------------------------------- the decision, step by step

    def _decide(self, request: RouteRequest, task: str, confidence: float) -> Decision:
        """Which policy decides, what it published, what feedback made of it, then the request's rules."""
        confident = confidence >= self.min_confidence and not self._catch_all(task)
        key = task if confident and (task in self.policies or task in self.states) else FALLBACK_TASK
        policy = self.policies.get(key) or self.fallback
        choice = _Choice(
            bool(policy and policy.speculate),
            policy.gamma if policy else NO_GAMMA,
            policy.alpha_mean if policy else None,
            policy.expected_speedup if policy else 1.0,
            self._policy_reasons(task, confidence, key, policy),
            policy.setting if policy else None,
        )
        state = self._follow_estimate(key, choice)
        self._request_rules(request, policy, state, choice)
        gamma = choice.gamma if choice.speculate else NO_GAMMA
        return Decision(
            route_id=new_route_id(self.policy_version, key, self.config.route_key),
            speculate=choice.speculate,
            gamma=gamma,
            task_type=task,
            confidence=confidence,
            predicted_acceptance=choice.alpha,
            expected_speedup=float(choice.expected) if choice.speculate else 1.0,
            reasons=[r.text for r in choice.reasons],
            reason_codes=choice.reasons,
            policy_version=self.policy_version,
            engine=EngineTerms.model_validate(self._engine(choice.speculate, gamma, choice.setting)),
        )

    def _policy_reasons(
        self, task: str, confidence: float, key: str, policy: PolicySnapshot | None
    ) -> list[Reason]:
        """Which policy decides and why that one: exactly one of ``POLICY_CODES`` (``no_policy``
        comes from the request rules when there is no policy set), then what else the classifier
        says about the task."""
        found: list[Reason] = []
        if policy is not None and key == task and task in self.policies:
            low, high = policy.speedup_interval
            shown = dict(
                task=task,
                confidence=confidence,
                gamma=policy.gamma,
                speedup=policy.expected_speedup,
                low=low,
                high=high,
            )
            if policy.decision_basis == "workload":
                found.append(reason("task_too_few_prompts", n_prompts=policy.n_prompts, **shown))
            else:
                found.append(reason("task_policy", tier=policy.tier, **shown))
        elif policy is not None:  # the workload-wide policy decides: say why the task's own does not
            cause = (
                "no_classifier"
                if self.classifier is None
                else "low_confidence"
                if confidence < self.min_confidence
                else "catch_all"
                if self._catch_all(task)
                else "no_task_policy"
            )
            extra = (
                {"precision": self.classifier.catch_all[task]}
                if cause == "catch_all" and self.classifier
                else {}
            )
            found.append(
                reason(
                    "workload_policy",
                    cause=cause,
                    task=task,
                    confidence=confidence,
                    min_confidence=self.min_confidence,
                    speedup=policy.expected_speedup,
                    **extra,
                )
            )
        classifier = self.classifier
        rarely = classifier.rarely_reached.get(task) if classifier is not None else None
        if classifier is not None and rarely:
            found.append(
                reason("rarely_reached", classifier_version=classifier.version, task=task, detail=rarely)
            )
        return found

    def _follow_estimate(self, key: str, choice: _Choice) -> TaskState | None:
        """The online estimate of ``key`` decides where there is one (probes included), as the set's estimator
        says (:mod:`router.decide.estimators`): the gamma or setting in force and the speedup it expects."""
        state = self.states.get(key)
        if state is None:
            return None
        with self._lock:
            state, speculate, gamma = next_request(self.states[key], self.adaptation)
            self.states[key] = state
        chosen = (
            self.estimator.choose(key, state, speculate, gamma, self.adaptation)
            if self.estimator is not None
            else Chosen(speculate, gamma, None, state.alpha, None)  # estimates given to a set without a cost
        )
        choice.speculate, choice.gamma, choice.setting = chosen.speculate, chosen.gamma, chosen.setting
        choice.alpha = chosen.alpha
        if chosen.expected is not None:
            choice.expected = chosen.expected
        self._estimate_reason(state, choice)
        if choice.speculate and not state.speculate:
            choice.reasons.append(reason("probe", probe_every=self.adaptation.probe_every))
        return state

    @staticmethod
    def _estimate_reason(state: TaskState, choice: _Choice) -> None:
        """Say that feedback moved the task's estimate, where it has."""
        if state.events:
            choice.reasons.append(
                reason(
                    "online_estimate",
                    events=state.events,
                    alpha=state.alpha,
                    gamma=state.gamma,
                    speculate=state.speculate,
                )
            )

    def _request_rules(
        self, request: RouteRequest, policy: PolicySnapshot | None, state: TaskState | None, choice: _Choice
    ) -> None:
        """The request's own rules: its batch size's curve, short outputs, unprofiled batches, sampling."""
        batch_size = request.batch
        point = self._at_batch_size(policy, state, batch_size)
        if point is not None and point.gamma is None:  # the curve covers the batch size, nothing pays there
            choice.speculate, choice.gamma = False, NO_GAMMA
            choice.reasons.append(reason("no_predicted_gain"))
        elif point is not None and point.gamma is not None:
            choice.speculate, choice.gamma, choice.expected = point.speculate, point.gamma, point.speedup
            choice.reasons.append(
                reason(
                    "batch_size_curve",
                    batch_size=batch_size,
                    lower=point.lower_batch,
                    upper=point.upper_batch,
                    alpha=state.alpha if point.rescaled and state is not None else None,
                    gamma=point.gamma,
                    speedup=point.speedup,
                    low=point.low,
                    speculate=point.speculate,
                    decision=point.code,
                    margin=self.margin,
                )
            )
        elif policy is None:
            choice.reasons.append(reason("no_policy"))
        elif not choice.speculate:
            choice.reasons.append(reason("no_predicted_gain"))
        if (
            choice.speculate
            and request.max_new_tokens is not None
            and request.max_new_tokens < self.config.min_output_tokens
        ):
            choice.speculate = False
            choice.reasons.append(
                reason(
                    "short_output",
                    max_new_tokens=request.max_new_tokens,
                    min_output_tokens=self.config.min_output_tokens,
                )
            )
        if (
            point is None
            and choice.speculate
            and batch_size is not None
            and batch_size > self.config.max_batch_size
        ):
            choice.speculate = False
            choice.reasons.append(
                reason(
                    "batch_not_profiled",
                    batch_size=batch_size,
                    max_batch_size=self.config.max_batch_size,
                )
            )
        if choice.speculate and request.temperature:
            choice.reasons.append(reason("sampling", temperature=request.temperature))

    def _at_batch_size(
        self, policy: PolicySnapshot | None, state: TaskState | None, batch_size: int | None
    ) -> CurvePoint | None:
        """The policy curve's decision (:meth:`PolicyCurve.decide`, the rule the report applies) at a
        request batch size above 1 that the published per-batch curves cover (measured there, or linear
        between the two profiled sizes around it), under the task's online alpha once feedback has moved
        it; None where no profile covers the batch size. Its gamma is None where nothing pays there."""
        if policy is None or batch_size is None or batch_size <= 1 or len(policy.curves_by_batch) < 2:
            return None
        curve = self.curve_of(policy.task_type)  # built once per loaded policy set, not per request
        if curve is None:
            return None
        if state is not None and state.events > 0:  # feedback moved alpha: rescale from the estimate's prior
            return curve.decide(batch_size, state.alpha, state.prior_alpha)
        return curve.decide(batch_size)

    def _engine(self, speculate: bool, gamma: int, setting: str | None) -> dict[str, Any]:
        """The decision in each serving engine's own terms (asked of the registry: see
        :meth:`analyzer.engine.engine_base.ServingEngine.decision_settings`), the pool to send it to, and the
        engines that priced and measured the policies; ``setting``: the llama-server drafter setting the
        deciding policy names (used only where the decision speculates)."""
        setting = setting if speculate else None
        pool = self.contract.pool(speculate, gamma, self.config.pools, setting)
        settings = {
            name: engine.decision_settings(speculate, gamma, self.draft_kind, self.ngram_max, pool, setting)
            for name, engine in SERVING.items()
        }
        return {name: value for name, value in settings.items() if value is not None} | {
            "pool": pool,
            "priced_by": self.priced_by,
            "measured_by": self.contract.measured_by,
        }


DECISION_KEYS = ("pool", "priced_by", "measured_by")  # a decision's ``engine`` keys that name no engine


def router_from_database(
    session: Session, config: RouterConfig | None = None, adaptation: AdaptationConfig | None = None
) -> Router:
    """A Router over the active classifier, the active policy set and its tasks' online estimates
    (either may be missing: without a classifier every prompt is 'unlabelled' and gets the fallback
    policy; without a policy set nothing speculates)."""
    classifier = load_active(session)
    policy_set = active_policy_set(session)
    policies: dict[str, PolicySnapshot] = {}
    states: dict[str, TaskState] = {}
    contract = PolicyContract.of(policy_set)  # the whole contract: no analysis run is read
    if policy_set is not None:
        policies = {p.task_type: PolicySnapshot.of(p) for p in policy_set.policies}
        states = {
            e.task_type: estimate_state(e)
            for e in session.scalars(select(TaskEstimate).where(TaskEstimate.policy_set_id == policy_set.id))
        }
    return Router(
        classifier,
        policies,
        policy_version=policy_set.version if policy_set else None,
        policy_set_id=policy_set.id if policy_set else None,
        draft_kind=contract.draft_kind,
        ngram_max=contract.ngram_max,
        config=config,
        cost=contract.cost,
        states=states,
        adaptation=adaptation,
        contract=contract,
    )
