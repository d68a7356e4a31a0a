"""The routing decision, in process and without Flask: classify the prompt, look up the task's
published policy (the workload-wide fallback when the classifier is unsure or the task has none),
follow the task's online estimate where feedback has moved it (router/adaptation.py), apply the
request rules (short outputs run without speculation; at a batch size the analysis profiled, or between
two it profiled, the decision follows the S(g) curve measured there; larger batches than the profiles
cover run without speculation above ``max_batch_size``), and return the decision with ready-to-use
engine settings. Everything it needs is loaded once into a Router, so a decision
touches no database; ``observe`` takes a task's new estimate after feedback."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from analyzer.acceptance import expected_tokens_iid
from analyzer.settings import Settings, router_min_confidence, router_pools
from analyzer.speedup import Cost, best_gamma, clears_break_even, interpolate_curves
from router.adaptation import AdaptationConfig, TaskState, initial_state, next_request, speedup_at
from router.classifier import TaskClassifier
from analyzer.prompt_checks import prompt_text
from router.policy import FALLBACK_TASK, PolicySnapshot
from router.route_ids import new_route_id

DEFAULT_MIN_CONFIDENCE = 0.5
@dataclass(frozen=True)
class RouterConfig:
    """Request rules and deployment naming (see the ``router_*`` settings)."""

    min_output_tokens: int = 20
    max_batch_size: int = 8
    min_confidence: float | None = None  # None: the classifier's own threshold, DEFAULT_MIN_CONFIDENCE without one
    pools: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings) -> "RouterConfig":
        """The ``router_*`` settings (raises SettingsError naming a bad one)."""
        return cls(settings.router_min_output_tokens, settings.router_max_batch_size,
                   router_min_confidence(settings), router_pools(settings))

    def pool(self, speculate: bool, gamma: int) -> str:
        """The deployment for this decision: the configured name for "off" or the gamma, else
        "spec-off" / "spec-k<gamma>"."""
        key = f"k{gamma}" if speculate else "off"
        return self.pools.get(key, "spec-off" if not speculate else f"spec-k{gamma}")


@dataclass(frozen=True)
class Decision:
    """What to do for one request, why, and how to do it in each engine."""

    route_id: str
    speculate: bool
    gamma: int
    task_type: str
    confidence: float
    predicted_acceptance: float | None
    expected_speedup: float
    reasons: tuple[str, ...]
    policy_version: int | None
    engine: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The decision as JSON-ready data (engine settings copied, nested ones too)."""
        engine = _copied(self.engine)
        return {"route_id": self.route_id, "speculate": self.speculate, "gamma": self.gamma,
                "task_type": self.task_type, "confidence": self.confidence,
                "predicted_acceptance": self.predicted_acceptance, "expected_speedup": self.expected_speedup,
                "reasons": list(self.reasons), "policy_version": self.policy_version, "engine": engine}


def _copied(value: Any) -> Any:
    """``value`` with every dict in it copied (the decision's settings stay its own)."""
    return {k: _copied(v) for k, v in value.items()} if isinstance(value, dict) else value


@dataclass(frozen=True)
class RouteRequest:
    """One request to decide for: ``prompt`` or chat ``messages``, and what the caller knows of it."""

    prompt: str | None = None
    messages: Sequence[Mapping[str, Any]] | None = None
    max_new_tokens: int | None = None
    batch_size: int | None = None
    temperature: float | None = None


class Router:
    """A loaded classifier, policy set and per-task online states; ``route`` decides in well under
    a millisecond and is safe to call from several threads."""

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
        margin: float = 0.05,
        priced_by: str | None = None,
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
        self.adaptation = adaptation or AdaptationConfig()
        self.margin = margin
        self.priced_by = priced_by  # the engine whose cost priced the policies (None: no policy set)
        self.states: dict[str, TaskState] = {}
        if cost is not None:  # every policy starts from its published decision, the analysis as prior
            for task, p in policies.items():
                self.states[task] = initial_state(p.alpha_mean, p.speculate, p.gamma, p.speedup_curve, self.adaptation)
        self.states.update(states or {})
        self._lock = threading.Lock()

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
        request = RouteRequest(prompt, messages, max_new_tokens, batch_size, temperature)
        return self.route_many([request])[0]

    def route_many(self, requests: Sequence[RouteRequest]) -> list[Decision]:
        """Decide for many requests; the classifier sees them as one batch."""
        classified = self._classify([prompt_text(r.prompt, r.messages) for r in requests])
        return [self._decide(r, task, confidence) for r, (task, confidence) in zip(requests, classified)]

    def observe(self, task: str, state: TaskState) -> None:
        """Take a task's estimate after feedback (the count of requests while off stays ours)."""
        with self._lock:
            current = self.states.get(task)
            keep = current.requests_while_off if current is not None else 0
            self.states[task] = TaskState(**{**asdict(state), "requests_while_off": keep})

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

    def _decide(self, request: RouteRequest, task: str, confidence: float) -> Decision:
        reasons: list[str] = []
        bar = self.min_confidence
        confident = confidence >= bar
        key = task if confident and (task in self.policies or task in self.states) else FALLBACK_TASK
        policy = self.policies.get(key) or self.fallback
        if key == task and policy is not None and task in self.policies:
            if policy.decision_basis == "workload":
                reasons.append(f"task {task} (confidence {confidence:.2f}): only {policy.n_prompts} prompts in the analysis, "
                               f"too few to decide: the workload's decision applies ({policy.predicted_text()} at gamma "
                               f"{policy.gamma})")
            else:
                reasons.append(f"task {task} (confidence {confidence:.2f}): {policy.tier}, "
                               f"analysis predicts {policy.predicted_text()} at gamma {policy.gamma}")
        rarely = self.classifier.rarely_reached.get(task) if self.classifier is not None else None
        if rarely:
            reasons.append(f"classifier v{self.classifier.version} rarely predicts {task} ({rarely}): most {task} "
                           "traffic is routed by another task's policy")
        elif policy is not None:
            why = ("no task classifier trained" if self.classifier is None else
                   f"confidence {confidence:.2f} < {bar:.2f}" if not confident else f"no policy for task {task}")
            reasons.append(f"{why}: workload-wide policy (analysis predicts {policy.expected_speedup:.2f}x)")
        speculate, gamma = bool(policy and policy.speculate), policy.gamma if policy else 0
        alpha = policy.alpha_mean if policy else None
        expected = policy.expected_speedup if policy else 1.0
        state = self.states.get(key)
        if state is not None:
            with self._lock:
                state, speculate, gamma = next_request(self.states[key], self.adaptation)
                self.states[key] = state
            alpha = state.alpha
            if self.cost is not None:
                expected = speedup_at(state, gamma, self.cost, self.adaptation.gamma_max)
            if state.events:
                reasons.append(f"online estimate after {state.events} feedback events: alpha {state.alpha:.2f}, "
                               f"gamma {state.gamma}, speculation {'on' if state.speculate else 'off'}")
            if speculate and not state.speculate:
                reasons.append(f"probe: every {self.adaptation.probe_every}th request of an 'off' task speculates "
                               "so that feedback can turn it back on")
        batch_rule = self._at_batch_size(policy, state, request.batch_size)
        if batch_rule is not None:
            speculate, gamma, expected, reason = batch_rule
            reasons.append(reason)
        elif policy is None:
            reasons.append("no published policy: speculation off")
        elif not speculate:
            reasons.append("no predicted gain: speculation off")
        if speculate and request.max_new_tokens is not None and request.max_new_tokens < self.config.min_output_tokens:
            speculate = False
            reasons.append(f"expected output {request.max_new_tokens} tokens < {self.config.min_output_tokens}: off")
        if batch_rule is None and speculate and request.batch_size is not None \
                and request.batch_size > self.config.max_batch_size:
            speculate = False
            reasons.append(f"batch size {request.batch_size} > {self.config.max_batch_size} and no cost profile covers "
                           "it: the batch already uses the idle compute; off")
        if speculate and request.temperature:
            reasons.append(f"temperature {request.temperature}: acceptance was measured greedy; sampling accepts less")
        gamma = gamma if speculate else 0
        return Decision(
            route_id=new_route_id(self.policy_version, key),
            speculate=speculate,
            gamma=gamma,
            task_type=task,
            confidence=confidence,
            predicted_acceptance=alpha,
            expected_speedup=float(expected) if speculate else 1.0,
            reasons=tuple(reasons),
            policy_version=self.policy_version,
            engine=self._engine(speculate, gamma),
        )

    def _at_batch_size(self, policy: PolicySnapshot | None, state: TaskState | None,
                       batch_size: int | None) -> tuple[bool, int, float, str] | None:
        """(speculate, gamma, S(gamma), reason) at a request batch size above 1 that the published
        per-batch curves cover (measured there, or linear between the two profiled sizes around it),
        the curve scaled by E[tokens/round] under the task's online alpha over that under the analysis'
        alpha once feedback has moved it; None where no profile covers the batch size. As in the
        analysis, speculation needs S(gamma) > 1 + margin and the interval's lower end (published per
        batch size, interpolated and scaled alike) > 1.0."""
        if policy is None or batch_size is None or batch_size <= 1 or len(policy.curves_by_batch) < 2:
            return None
        found = interpolate_curves(policy.curves_by_batch, batch_size)
        if found is None:
            return None
        curve, lower, upper = found
        low = self._lower_end(policy, batch_size, lower, upper)
        adjusted = ""
        if state is not None and state.events:
            curve = [s * expected_tokens_iid(state.alpha, g) / expected_tokens_iid(state.prior_alpha, g)
                     for g, s in enumerate(curve, start=1)]
            adjusted = f", adjusted to the online alpha {state.alpha:.2f}"
        g_best, s_best = best_gamma(curve)
        if g_best == 0:
            return None
        if low is not None and state is not None and state.events:
            low *= expected_tokens_iid(state.alpha, g_best) / expected_tokens_iid(state.prior_alpha, g_best)
        speculate = clears_break_even(s_best, low, self.margin)
        where = (f"measured at batch size {lower}" if lower == upper else
                 f"interpolated between profiled batch sizes {lower} and {upper}")
        interval = f" (interval from {low:.2f}x)" if low is not None else ""
        why = ("on" if speculate else f"off (needs > {1 + self.margin:.2f}x)" if s_best <= 1.0 + self.margin
               else "off (the interval reaches a loss)")
        return (speculate, g_best, s_best,
                f"batch size {batch_size}: S(g) {where}{adjusted}: best gamma {g_best} at {s_best:.2f}x{interval}, "
                f"speculation {why}")

    @staticmethod
    def _lower_end(policy: PolicySnapshot, batch_size: int, lower: int, upper: int) -> float | None:
        """The published lower end of S(g*) at ``batch_size``, linear between the profiled sizes
        around it; None where the policy has none (published before intervals, or one prompt)."""
        low_at, high_at = policy.lows_by_batch.get(lower), policy.lows_by_batch.get(upper)
        if low_at is None or high_at is None:
            return None
        if upper == lower:
            return float(low_at)
        weight = (batch_size - lower) / (upper - lower)
        return float((1 - weight) * low_at + weight * high_at)

    def _engine(self, speculate: bool, gamma: int) -> dict[str, Any]:
        """The decision's settings per engine, the pool to send it to, and the engine that priced it."""
        pool = self.config.pool(speculate, gamma)
        return {"transformers": self._transformers_settings(speculate, gamma),
                "llama.cpp": {"pool": pool, "speculative": self._llama_cpp_speculative(speculate, gamma)},
                "pool": pool, "priced_by": self.priced_by}

    def _transformers_settings(self, speculate: bool, gamma: int) -> dict[str, Any]:
        """generate() settings: no assistant, prompt lookup, or a draft model at a constant gamma."""
        if not speculate:
            return {"assistant_model": False}
        if self.draft_kind == "ngram":
            return {"prompt_lookup_num_tokens": gamma, "max_matching_ngram_size": self.ngram_max}
        return {"assistant_model": True, "assistant_generation_config": {
            "num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0}}

    def _llama_cpp_speculative(self, speculate: bool, gamma: int) -> dict[str, Any] | None:
        """What the llama.cpp pool speculates with (llama.cpp fixes it per server, so the pool names it):
        prompt lookup or a draft model, at most ``gamma`` drafted tokens; None when not speculating."""
        if not speculate:
            return None
        return {"draft": "prompt-lookup" if self.draft_kind == "ngram" else "model", "n_max": gamma}


def router_from_database(session, config: RouterConfig | None = None,
                         adaptation: AdaptationConfig | None = None) -> Router:
    """A Router over the active classifier, the active policy set and its tasks' online estimates
    (either may be missing: without a classifier every prompt is 'unlabelled' and gets the fallback
    policy; without a policy set nothing speculates)."""
    from sqlalchemy import select

    from analyzer.specs import parse_spec
    from analyzer.orm import AnalysisRun
    from analyzer.summary import cost_for_run
    from router.classifier import load_active
    from router.feedback import estimate_state
    from router.orm import TaskEstimate
    from router.policy import active_policy_set

    classifier = load_active(session)
    policy_set = active_policy_set(session)
    policies: dict[str, PolicySnapshot] = {}
    states: dict[str, TaskState] = {}
    draft_kind, ngram_max, cost = "ngram", 2, None
    if policy_set is not None:
        policies = {p.task_type: PolicySnapshot.of(p) for p in policy_set.policies}
        fallback = policies.get(FALLBACK_TASK)
        states = {e.task_type: estimate_state(e, (policies.get(e.task_type) or fallback).speedup_curve)
                  for e in session.scalars(select(TaskEstimate).where(TaskEstimate.policy_set_id == policy_set.id))}
        run = session.get(AnalysisRun, policy_set.run_id) if policy_set.run_id else None
        if run is not None:
            draft = parse_spec(run.pair.draft.spec)
            draft_kind = draft.kind
            ngram_max = int(draft.options.get("max_ngram", 2)) if draft.kind == "ngram" else ngram_max
            cost = cost_for_run(run)
    return Router(classifier, policies, policy_version=policy_set.version if policy_set else None,
                  policy_set_id=policy_set.id if policy_set else None, draft_kind=draft_kind, ngram_max=ngram_max,
                  config=config, cost=cost, states=states, adaptation=adaptation,
                  margin=policy_set.margin if policy_set is not None else 0.05,
                  priced_by=policy_set.engine if policy_set is not None else None)
