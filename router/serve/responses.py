"""The routing API's answers as pydantic models, besides the decision (router/decide/contract.py, which the router
returns in process too): a feedback's estimate, the policy sets, the classifier's record, the health check and
the one error shape. Each endpoint answers one of them, written by :meth:`Answer.to_json` (the views in
router/serve/api.py, the Python client reads them back: router/client.py); router/serve/openapi.py generates
the document's answer schemas from them, and the tests validate every real answer against the document."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from router.decide.contract import ENGINE_NAMES, Answer


class ErrorBody(Answer):
    code: str
    message: str
    details: dict[str, Any]


class Error(Answer):
    """Every error of the API has this shape, with a 4xx status for bad input."""

    error: ErrorBody


class TaskEstimate(Answer):
    """A task's online estimate under the active policy set, moved by feedback."""

    task_type: str
    alpha: float
    prior_alpha: float
    speculate: bool
    gamma: int
    events: int
    total_rounds: int
    total_drafted: int
    total_accepted: int
    decision_since: str | None = Field(
        None, description="when speculate/gamma (or the llama-server setting) last changed (ISO 8601, UTC)"
    )
    setting: str | None = Field(
        None,
        description="A llama-server set: the setting in force (its pool takes the task); null: off, or a "
        "run's set.",
    )
    option: str | None = Field(
        None,
        description="The option in force, the same for every set: a run's gamma ('gamma 4') or a llama-server "
        "setting; null: off.",
    )
    options: dict[str, Any] | None = Field(
        None,
        description="A llama-server set: per setting that served the task, the decayed plain and served "
        "milliseconds of its feedback and its events ({label: {plain_ms, served_ms, events}}).",
    )
    updated_at: str | None = Field(None, description="the last feedback event")


class FeedbackResponse(Answer):
    estimate: TaskEstimate


class BatchDecision(Answer):
    gamma: int
    expected_speedup: float
    speculate: bool
    decision_code: str


class Policy(Answer):
    """One task's published policy."""

    task_type: str
    fallback: bool
    speculate: bool
    gamma: int
    alpha_mean: float
    alpha_var: float | None
    n_prompts: int
    expected_speedup: float
    tier: Literal["HIGHLY_RECOMMENDED", "RECOMMENDED", "CONDITIONAL", "NOT_RECOMMENDED"]
    speedup_interval: Annotated[list[float | None], Field(min_length=2, max_length=2)] | None = Field(
        None,
        description="90% bootstrap interval over the analysed prompts of expected_speedup (nulls for "
        "policies published before intervals).",
    )
    decision_basis: str | None = Field(
        None,
        description="task, or workload when the task had too few prompts to decide (its decision is then "
        "the workload's).",
    )
    decision_reason: str | None = None
    setting: str | None = Field(
        None,
        description="The llama-server drafter setting the task speculates with (a set published from a "
        "llama-server analysis: its pool is keyed by it); null: off, or a set published from a run.",
    )
    option: str | None = Field(
        None,
        description="The option the task speculates with, named as its analysis names its options, the same "
        "for every policy set: a llama-server drafter setting ('ngram-simple 2/4') or a run's gamma "
        "('gamma 4'); null: off.",
    )
    pool: str | None = Field(
        None,
        description="The pool of the set's pools that runs that option (or plain decoding); null: a set "
        "published before sets carried their pools.",
    )
    option_curve: dict[str, Any] | None = Field(
        None,
        description="The task's curve over its analysis' options, the same shape for every policy set "
        "({options: [{label, speedup, low, high}], chosen, code, basis}), decided by the one rule: a llama-server "
        "analysis' drafter settings (the prior its online estimate moves), or a run's gammas (labels 'gamma 1' "
        "..., S(g) at batch 1, the interval at g*). null: a run's policy published before runs' had one.",
    )
    by_batch: dict[str, BatchDecision] | None = Field(
        None,
        description="Per profiled batch size: the best gamma, its predicted speedup and whether to "
        "speculate, by the one decision rule over the published S(g) curve (the report's decision at that "
        "batch size), with the rule's code.",
    )


class PolicySet(Answer):
    """A published policy set's record."""

    version: int
    active: bool
    analysis: str | None = Field(
        None,
        description="The analysis the set was published from, as 'specroute runs list' names it: '7' (a run), "
        "'llama-server:3' (an analysis in llama-server); null: its run is gone.",
    )
    run_id: int | None
    server_analysis_id: int | None = Field(
        None, description="The llama-server analysis the set was published from (run_id is then null)."
    )
    engine: str = Field(description="The same as priced_by (for earlier clients).")
    priced_by: str = Field(
        description=f"The engine whose cost priced the set: {ENGINE_NAMES}, or an engine whose own step "
        "times were imported (a re-priced run)."
    )
    measured_by: str = Field(description=f"The engine that measured the acceptance: {ENGINE_NAMES}.")
    margin: float
    gamma_max: Annotated[int, Field(ge=1)] = Field(
        description="The largest gamma the run analysed: the router prices and adapts over 1..gamma_max."
    )
    draft_kind: str = Field(description="The draft's spec kind (ngram: prompt lookup; else a draft model).")
    draft_options: dict[str, Any] | None = Field(description="The draft's options, e.g. {max_ngram: 2}.")
    cost: dict[str, Any] | None = Field(
        description="The batch-1 cost the decisions were priced with, in seconds (target_forward_s = "
        "T_t(1..K), draft_step_s, ...); null: none was linked."
    )
    pools: dict[str, str] | None = Field(
        description="The deployment each decision goes to, published with the set: keys off and "
        "k1..k<gamma_max> (SPECROUTE_ROUTER_POOLS when it was published, else spec-off / spec-k<gamma>), or "
        "for a set from a llama-server analysis off and each drafter setting it uses (else "
        "http://127.0.0.1:<port>); null: published before pools were, so the serving process's "
        "SPECROUTE_ROUTER_POOLS names them."
    )
    plain_cost: dict[str, Any] | None = Field(
        None,
        description="A set from a llama-server analysis: the plain step cost (step_ms, per_context_ms) its "
        "pools' feedback is priced against; null for a run's set.",
    )
    notes: str | None
    created_at: str
    activated_at: str | None


class ActivePolicySet(PolicySet):
    """The active set, with its policies and their online estimates."""

    policies: list[Policy]
    estimates: list[TaskEstimate]


class Policies(Answer):
    active: ActivePolicySet | None
    versions: list[PolicySet]


class ClassifierRecord(Answer):
    """The active task classifier's version record."""

    version: int
    active: bool
    labels: list[str]
    training_prompt_count: int
    training_data_sha256: str
    library_versions: dict[str, Any]
    created_at: str
    source: str | None
    macro_f1: float | None
    accuracy: float | None
    baseline: dict[str, Any] | None
    per_class: dict[str, Any] | None
    features: Literal["tfidf", "minilm", "tfidf+minilm"] | None = None
    grouped: dict[str, Any] | None = Field(
        None, description="leave-one-source-out scores (null with a single source)"
    )
    calibration: dict[str, Any] | None = Field(
        None, description="temperature, ECE before/after, reliability tables, routing threshold"
    )
    reachability: dict[str, Any] | None = Field(
        None, description="per task: reachable, recall, training prompts, reason"
    )


class Classifier(Answer):
    active: ClassifierRecord | None


class Health(Answer):
    status: Literal["ok"]
    database: Literal["ok"]
    classifier_version: int | None
    policy_version: int | None
