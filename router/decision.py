"""The routing decision, in process and without Flask: classify the prompt, look up the task's
published policy (the workload-wide fallback when the classifier is unsure or the task has none),
apply the request rules (short outputs and large batches run without speculation), and return the
decision with ready-to-use engine settings. Everything it needs is loaded once into a Router, so a
decision touches no database."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from router.classifier import TaskClassifier
from router.features import prompt_text
from router.policy import FALLBACK_TASK, PolicySnapshot


@dataclass(frozen=True)
class RouterConfig:
    """Request rules and deployment naming (see the ``router_*`` settings)."""

    min_output_tokens: int = 20
    max_batch_size: int = 8
    min_confidence: float = 0.5
    pools: Mapping[str, str] = field(default_factory=dict)

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
        data = asdict(self)
        data["reasons"] = list(self.reasons)
        return data


class Router:
    """A loaded classifier and policy set; ``route`` decides in well under a millisecond."""

    def __init__(
        self,
        classifier: TaskClassifier | None,
        policies: Mapping[str, PolicySnapshot],
        *,
        policy_version: int | None,
        draft_kind: str = "ngram",
        ngram_max: int = 2,
        config: RouterConfig | None = None,
    ):
        self.classifier = classifier
        self.policies = {task: p for task, p in policies.items() if task != FALLBACK_TASK}
        self.fallback = policies.get(FALLBACK_TASK)
        self.policy_version = policy_version
        self.draft_kind = draft_kind
        self.ngram_max = ngram_max
        self.config = config or RouterConfig()

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
        reasons: list[str] = []
        task, confidence = self._classify(prompt_text(prompt, messages))
        policy = self.policies.get(task)
        if policy is not None and confidence >= self.config.min_confidence:
            reasons.append(f"task {task} (confidence {confidence:.2f}): {policy.tier}, "
                           f"predicted speedup {policy.expected_speedup:.2f}x at gamma {policy.gamma}")
        elif self.fallback is not None:
            why = "no policy for task " + task if policy is None else f"confidence {confidence:.2f} < {self.config.min_confidence}"
            reasons.append(f"{why}: workload-wide policy (predicted speedup {self.fallback.expected_speedup:.2f}x)")
            policy = self.fallback
        speculate = bool(policy and policy.speculate)
        gamma = policy.gamma if speculate else 0
        if policy is None:
            reasons.append("no published policy: speculation off")
        elif not policy.speculate:
            reasons.append("the analysis predicts no gain: speculation off")
        if speculate and max_new_tokens is not None and max_new_tokens < self.config.min_output_tokens:
            speculate, gamma = False, 0
            reasons.append(f"expected output {max_new_tokens} tokens < {self.config.min_output_tokens}: off")
        if speculate and batch_size is not None and batch_size > self.config.max_batch_size:
            speculate, gamma = False, 0
            reasons.append(f"batch size {batch_size} > {self.config.max_batch_size}: the batch already uses the idle compute; off")
        if speculate and temperature:
            reasons.append(f"temperature {temperature}: acceptance was measured greedy; sampling accepts less")
        return Decision(
            route_id=str(uuid.uuid4()),
            speculate=speculate,
            gamma=gamma,
            task_type=task,
            confidence=confidence,
            predicted_acceptance=policy.alpha_mean if policy else None,
            expected_speedup=(policy.expected_speedup if speculate else 1.0) if policy else 1.0,
            reasons=tuple(reasons),
            policy_version=self.policy_version,
            engine=self._engine(speculate, gamma),
        )

    def _classify(self, text: str) -> tuple[str, float]:
        if self.classifier is None:
            return "unlabelled", 0.0
        return self.classifier.predict([text])[0]

    def _engine(self, speculate: bool, gamma: int) -> dict[str, Any]:
        if not speculate:
            transformers = {"assistant_model": False}
        elif self.draft_kind == "ngram":
            transformers = {"prompt_lookup_num_tokens": gamma, "max_matching_ngram_size": self.ngram_max}
        else:
            transformers = {"assistant_model": True, "assistant_generation_config": {
                "num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0}}
        return {"transformers": transformers, "pool": self.config.pool(speculate, gamma)}


def router_from_database(session, config: RouterConfig | None = None) -> Router:
    """A Router over the active classifier and the active policy set (either may be missing:
    without a classifier every prompt is 'unlabelled' and gets the fallback policy)."""
    from analyzer.loading import parse_spec
    from analyzer.models import AnalysisRun
    from router.classifier import load_active
    from router.policy import active_policy_set

    classifier = load_active(session)
    policy_set = active_policy_set(session)
    policies: dict[str, PolicySnapshot] = {}
    draft_kind, ngram_max = "ngram", 2
    if policy_set is not None:
        policies = {p.task_type: PolicySnapshot.of(p) for p in policy_set.policies}
        run = session.get(AnalysisRun, policy_set.run_id) if policy_set.run_id else None
        if run is not None:
            draft = parse_spec(run.pair.draft.spec)
            draft_kind = draft.kind
            ngram_max = int(draft.options.get("max_ngram", 2)) if draft.kind == "ngram" else ngram_max
    return Router(classifier, policies, policy_version=policy_set.version if policy_set else None,
                  draft_kind=draft_kind, ngram_max=ngram_max, config=config)
