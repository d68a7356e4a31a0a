"""Analyzer-owned tables: prompt sets and prompts, model specs and pairs, analysis runs,
per-prompt results with raw per-gamma counts, validation runs and cost profiles.

Raw counts are stored (rounds, drafted, accepted, histogram, per-position accepted) so that alpha,
the draft acceptance rate, the mean acceptance length and per-position rates can all be derived later.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Optional

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from analyzer.db import Base, utcnow
from analyzer.run_params import RunParams

RUN_STATUSES = ("queued", "running", "done", "failed", "cancelled")
PROMPT_FORMATS = ("txt", "jsonl", "csv")
MODEL_KINDS = ("hf", "gguf", "builtin", "ngram")


def one_of(column: str, values: tuple[str, ...]) -> str:
    """Portable SQL for a CHECK that ``column`` holds one of ``values``."""
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class PromptSet(Base):
    """A named, immutable collection of prompts imported from one file."""

    __tablename__ = "prompt_sets"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    source_filename: Mapped[Optional[str]] = mapped_column(String(255))
    file_format: Mapped[str] = mapped_column(String(8))
    file_sha256: Mapped[str] = mapped_column(String(64))
    prompt_count: Mapped[int] = mapped_column(Integer)
    duplicates_merged: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    prompts: Mapped[list["Prompt"]] = relationship(
        back_populates="prompt_set", order_by="Prompt.position", cascade="all, delete-orphan"
    )

    __table_args__ = (
        CheckConstraint(one_of("file_format", PROMPT_FORMATS), name="file_format"),
        CheckConstraint("prompt_count >= 0", name="prompt_count_nonnegative"),
    )


class Prompt(Base):
    """One prompt of a set: plain text or chat messages, an optional task label, the user's id,
    the line it came from, and a content hash that is unique within the set. An unlabelled prompt may
    carry the teacher's suggested task, its confidence and where the suggestion came from
    (router/classify/teacher.py); a suggestion is not a label until a person accepts it."""

    __tablename__ = "prompts"

    id: Mapped[int] = mapped_column(primary_key=True)
    prompt_set_id: Mapped[int] = mapped_column(ForeignKey("prompt_sets.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    source_line: Mapped[int] = mapped_column(Integer)
    external_id: Mapped[Optional[str]] = mapped_column(String(200))
    text: Mapped[Optional[str]] = mapped_column(Text)
    messages: Mapped[Optional[list[Any]]] = mapped_column(JSON(none_as_null=True))
    task: Mapped[Optional[str]] = mapped_column(String(64), index=True)
    content_hash: Mapped[str] = mapped_column(String(64))
    char_count: Mapped[int] = mapped_column(Integer)
    suggested_task: Mapped[Optional[str]] = mapped_column(String(64))
    suggested_confidence: Mapped[Optional[float]] = mapped_column(Float)
    suggested_by: Mapped[Optional[str]] = mapped_column(String(300))

    prompt_set: Mapped[PromptSet] = relationship(back_populates="prompts")

    __table_args__ = (
        UniqueConstraint("prompt_set_id", "content_hash"),
        UniqueConstraint("prompt_set_id", "position"),
        CheckConstraint(
            "(text IS NOT NULL AND messages IS NULL) OR (text IS NULL AND messages IS NOT NULL)",
            name="text_xor_messages",
        ),
    )


class ModelSpec(Base):
    """A model as the user named it (``hf:...``, ``gguf:...#...``, ``builtin:...``, ``ngram[:...]``)."""

    __tablename__ = "model_specs"

    id: Mapped[int] = mapped_column(primary_key=True)
    spec: Mapped[str] = mapped_column(String(500), unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    display_name: Mapped[str] = mapped_column(String(200))
    tokenizer_sha256: Mapped[Optional[str]] = mapped_column(String(64))
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (CheckConstraint(one_of("kind", MODEL_KINDS), name="kind"),)


class ModelPair(Base):
    """A target model with a drafter (a draft model or model-free n-gram drafting)."""

    __tablename__ = "model_pairs"

    id: Mapped[int] = mapped_column(primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("model_specs.id"), index=True)
    draft_id: Mapped[int] = mapped_column(ForeignKey("model_specs.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    target: Mapped[ModelSpec] = relationship(foreign_keys=[target_id])
    draft: Mapped[ModelSpec] = relationship(foreign_keys=[draft_id])

    __table_args__ = (UniqueConstraint("target_id", "draft_id"),)


class CostProfile(Base):
    """Measured cost of one pair on one device, in one dtype, at one batch size: median seconds of
    one target forward of k new tokens for each of ``batch_size`` sequences over a warm KV cache
    (``target_forward_s[k-1]`` for k = 1..K), of one draft step, and of processing the
    ``context_tokens``-token prompt (target, and a model draft); plus the generation machinery's own
    seconds per speculative round and per plain decoding step (None in profiles from before they were
    measured, which count as 0). Profiles from before dtypes and batch sizes were recorded are
    float32 at batch 1."""

    __tablename__ = "cost_profiles"

    id: Mapped[int] = mapped_column(primary_key=True)
    pair_id: Mapped[int] = mapped_column(ForeignKey("model_pairs.id"), index=True)
    # the engine whose step times these are, the one that prices with it: transformers or llama.cpp for a
    # profile an analysis measured, the benchmark's engine (vllm, sglang, ...) for an imported one; profiles
    # of one engine never price another's runs unless a run is re-priced with them explicitly
    priced_by: Mapped[str] = mapped_column(String(32), default="transformers", server_default="transformers")
    # the registry entry that produced it (analyzer/engine/engines.py): transformers or llama.cpp, or "imported"
    measured_by: Mapped[str] = mapped_column(
        String(32), default="transformers", server_default="transformers"
    )
    # "measured" by an analysis, or "imported" from an engine's own benchmark; the engine's version
    source: Mapped[str] = mapped_column(String(16), default="measured", server_default="measured")
    engine_version: Mapped[Optional[str]] = mapped_column(String(64))
    # how a transformers profile's steps were timed: eager | cuda-graphs (analyzer/engine/engines.py); None for
    # llama.cpp's and imported ones (their engine's own way); a run reuses only its own cost mode's
    cost_mode: Mapped[Optional[str]] = mapped_column(String(16))
    device: Mapped[str] = mapped_column(String(200))
    dtype: Mapped[str] = mapped_column(String(16), default="float32", server_default="float32")
    batch_size: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    round_overhead_s: Mapped[Optional[float]] = mapped_column(Float)
    decode_overhead_s: Mapped[Optional[float]] = mapped_column(Float)
    # relative median absolute deviation of each T_t(k)'s repeats; clean | remeasured | noisy; what was
    # seen (None in profiles from before quality was judged)
    target_forward_spread: Mapped[Optional[list[float]]] = mapped_column(JSON(none_as_null=True))
    quality: Mapped[Optional[str]] = mapped_column(String(16))
    quality_notes: Mapped[Optional[list[str]]] = mapped_column(JSON(none_as_null=True))
    threads: Mapped[Optional[int]] = mapped_column(Integer)
    context_tokens: Mapped[int] = mapped_column(Integer)
    repeats: Mapped[int] = mapped_column(Integer)
    target_forward_s: Mapped[list[float]] = mapped_column(JSON)
    draft_step_s: Mapped[float] = mapped_column(Float)
    target_prefill_s: Mapped[Optional[float]] = mapped_column(Float)
    draft_prefill_s: Mapped[Optional[float]] = mapped_column(Float)
    # measured again at a longer context (the workload's longest prompt plus its new tokens): the seconds each
    # T_t(k) and the draft step add per token of context (None: one context measured, every prompt priced alike)
    long_context_tokens: Mapped[Optional[int]] = mapped_column(Integer)
    context_slope_s: Mapped[Optional[list[float]]] = mapped_column(JSON(none_as_null=True))
    draft_context_slope_s: Mapped[Optional[float]] = mapped_column(Float)
    # each T_t(k) scaled to the target's own forwards in real generation: {"k": their median / timed T_t(k)}
    # for the ks seen there (None: timed alone; analyzer.measuring.cost.calibrated_to_generate)
    generate_ratio: Mapped[Optional[dict[str, Any]]] = mapped_column(JSON(none_as_null=True))
    library_versions: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    pair: Mapped[ModelPair] = relationship()


class RunCostProfile(Base):
    """The cost profile a run uses at one batch size (a run has one per profiled batch size)."""

    __tablename__ = "run_cost_profiles"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("analysis_runs.id", ondelete="CASCADE"), index=True)
    cost_profile_id: Mapped[int] = mapped_column(ForeignKey("cost_profiles.id"), index=True)
    batch_size: Mapped[int] = mapped_column(Integer)

    cost_profile: Mapped[CostProfile] = relationship()

    __table_args__ = (UniqueConstraint("run_id", "batch_size"),)


class AnalysisRun(Base):
    """One analysis of a prompt set with a model pair. Status moves
    queued -> running -> done | failed | cancelled; progress counts finished prompts."""

    __tablename__ = "analysis_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    prompt_set_id: Mapped[int] = mapped_column(ForeignKey("prompt_sets.id"), index=True)
    pair_id: Mapped[int] = mapped_column(ForeignKey("model_pairs.id"), index=True)
    cost_profile_id: Mapped[Optional[int]] = mapped_column(ForeignKey("cost_profiles.id"))
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    # the engine that measured the acceptance (a re-priced run: its source run's) and the engine whose
    # cost profiles priced it (an imported profile's engine after re-pricing: vllm, sglang, ...)
    measured_by: Mapped[str] = mapped_column(
        String(32), default="transformers", server_default="transformers"
    )
    priced_by: Mapped[str] = mapped_column(String(32), default="transformers", server_default="transformers")
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    progress_done: Mapped[int] = mapped_column(Integer, default=0)
    progress_total: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    worker_id: Mapped[Optional[str]] = mapped_column(String(200))
    heartbeat_at: Mapped[Optional[datetime]] = mapped_column()
    device: Mapped[Optional[str]] = mapped_column(String(200))
    dtype: Mapped[Optional[str]] = mapped_column(String(16))  # resolved; None: before dtypes (float32)
    phase: Mapped[Optional[str]] = mapped_column(String(300))  # what the worker is doing now, in words
    library_versions: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # the ids that end the target's output in this run (the n-gram walk cuts proposals before them);
    # None in runs from before they were stored
    eos_token_ids: Mapped[Optional[list[int]]] = mapped_column(JSON(none_as_null=True))
    error: Mapped[Optional[str]] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[Optional[datetime]] = mapped_column()
    finished_at: Mapped[Optional[datetime]] = mapped_column()
    # a re-priced run: its results are copied from this run and priced with another cost profile
    repriced_from_run_id: Mapped[Optional[int]] = mapped_column(Integer)
    # the analysis summary, computed once when the run finished (analyzer.advice.summary.run_summary); None:
    # not computed yet (a run from before it was stored, or an unfinished one)
    summary: Mapped[Optional[dict[str, Any]]] = mapped_column(JSON(none_as_null=True))
    # the run's acceptance priced on other stored profiles of its pair, by profile id (the report's
    # comparison, computed once per profile; dropped whenever the summary is computed anew)
    price_comparisons: Mapped[Optional[dict[str, Any]]] = mapped_column(JSON(none_as_null=True))
    # what the run could not take: {"prompts": [{prompt_id, position, task, tokens, why}]}, the prompts whose
    # tokens and new tokens the context cannot hold (None: it took every prompt)
    left_out: Mapped[Optional[dict[str, Any]]] = mapped_column(JSON(none_as_null=True))
    # what validation took and what stopped it (analyzer.measuring.validation_plan.ValidationPlan.as_json;
    # None: not validated, or validated before validation stopped by its rule)
    validation_plan: Mapped[Optional[dict[str, Any]]] = mapped_column(JSON(none_as_null=True))
    # the task classifier's labels for the run's unlabelled prompts, given when the run was created:
    # {"version": classifier version id, "tasks": {prompt id: task}} (None: no classifier, or none unlabelled)
    task_labels: Mapped[Optional[dict[str, Any]]] = mapped_column(JSON(none_as_null=True))

    prompt_set: Mapped[PromptSet] = relationship()
    pair: Mapped[ModelPair] = relationship()
    cost_profile: Mapped[Optional[CostProfile]] = relationship()
    batch_profiles: Mapped[list[RunCostProfile]] = relationship(
        order_by="RunCostProfile.batch_size", cascade="all, delete-orphan"
    )

    __table_args__ = (
        CheckConstraint(one_of("status", RUN_STATUSES), name="status"),
        CheckConstraint("progress_done >= 0 AND progress_total >= 0", name="progress_nonnegative"),
    )

    @property
    def run_params(self) -> RunParams:
        """The run's parameters, typed (the stored JSON parsed once per access)."""
        return RunParams.from_json(self.params)


CHUNK_KINDS = ("profile", "measure", "validate")
CHUNK_STATUSES = ("pending", "claimed", "done")


class RunChunk(Base):
    """A piece of a run that any worker may claim: the cost profile (once per run, first), a slice
    of the prompts to measure (``prompt_ids``), or the validation (last, once every prompt is
    measured). A claimed chunk whose ``heartbeat_at`` is older than the worker's stale limit is
    claimed again by another worker (the results it stored stay; the rest is measured)."""

    __tablename__ = "run_chunks"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("analysis_runs.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    prompt_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    worker_id: Mapped[Optional[str]] = mapped_column(String(200))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    claimed_at: Mapped[Optional[datetime]] = mapped_column()
    heartbeat_at: Mapped[Optional[datetime]] = mapped_column()
    done_at: Mapped[Optional[datetime]] = mapped_column()

    __table_args__ = (
        UniqueConstraint("run_id", "position"),
        CheckConstraint(one_of("kind", CHUNK_KINDS), name="kind"),
        CheckConstraint(one_of("status", CHUNK_STATUSES), name="status"),
    )


class PromptResult(Base):
    """The measurement of one prompt in one run: lengths, the prompt's token ids as the target saw
    them, the target's output (text, token ids and each token's text), per-position draft matches
    and target entropies, timings, and the task type the prompt was counted under. Results from
    before token ids were stored have None in ``prompt_token_ids`` and ``output_token_texts``."""

    __tablename__ = "prompt_results"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("analysis_runs.id", ondelete="CASCADE"), index=True)
    prompt_id: Mapped[int] = mapped_column(ForeignKey("prompts.id"), index=True)
    task_type: Mapped[Optional[str]] = mapped_column(String(64), index=True)
    task_source: Mapped[Optional[str]] = mapped_column(String(16))
    classifier_version_id: Mapped[Optional[int]] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    prompt_truncated: Mapped[bool] = mapped_column(Boolean, default=False)
    output_tokens: Mapped[int] = mapped_column(Integer)
    output_text: Mapped[Optional[str]] = mapped_column(Text)
    output_token_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    prompt_token_ids: Mapped[Optional[list[int]]] = mapped_column(JSON(none_as_null=True))
    output_token_texts: Mapped[Optional[list[str]]] = mapped_column(JSON(none_as_null=True))
    draft_matches: Mapped[Optional[list[int]]] = mapped_column(JSON(none_as_null=True))
    # transformers with a draft model: [drafted, accepted] of each round of assisted generation under its
    # defaults, replayed exactly (analyzer/measuring/assistant_defaults.py); None: not replayed
    assistant_rounds: Mapped[Optional[list[list[int]]]] = mapped_column(JSON(none_as_null=True))
    entropies: Mapped[list[float]] = mapped_column(JSON, default=list)
    alpha_sampling: Mapped[Optional[float]] = mapped_column(Float)
    # positions where a teacher-forced target pass disagrees with the generated token (replay
    # fidelity; measured in bfloat16/float16 runs, None where not measured)
    replay_mismatches: Mapped[Optional[int]] = mapped_column(Integer)
    target_time_s: Mapped[float] = mapped_column(Float, default=0.0)
    draft_time_s: Mapped[float] = mapped_column(Float, default=0.0)
    total_time_s: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    run: Mapped[AnalysisRun] = relationship()
    prompt: Mapped[Prompt] = relationship()
    gamma_counts: Mapped[list["GammaCount"]] = relationship(
        back_populates="result", order_by="GammaCount.gamma", cascade="all, delete-orphan"
    )

    __table_args__ = (UniqueConstraint("run_id", "prompt_id"),)


class GammaCount(Base):
    """Raw counts of the speculative walk of one prompt at lookahead ``gamma``:
    ``accepted_hist[a]`` = rounds that accepted a drafts (a = 0..gamma);
    ``drafted_hist[k]`` = rounds that drafted k tokens (k = 0..gamma);
    ``position_accepted[k-1]`` = rounds whose k-th draft was accepted (k = 1..gamma)."""

    __tablename__ = "gamma_counts"

    id: Mapped[int] = mapped_column(primary_key=True)
    result_id: Mapped[int] = mapped_column(ForeignKey("prompt_results.id", ondelete="CASCADE"), index=True)
    gamma: Mapped[int] = mapped_column(Integer)
    rounds: Mapped[int] = mapped_column(Integer)
    drafted: Mapped[int] = mapped_column(Integer)
    accepted: Mapped[int] = mapped_column(Integer)
    accepted_hist: Mapped[list[int]] = mapped_column(JSON)
    drafted_hist: Mapped[list[int]] = mapped_column(JSON)
    position_accepted: Mapped[list[int]] = mapped_column(JSON)
    expected_tokens_per_round: Mapped[Optional[float]] = mapped_column(Float)

    result: Mapped[PromptResult] = relationship(back_populates="gamma_counts")

    __table_args__ = (
        UniqueConstraint("result_id", "gamma"),
        CheckConstraint("gamma >= 1", name="gamma_positive"),
        CheckConstraint("accepted <= drafted", name="accepted_le_drafted"),
    )


class ValidationResult(Base):
    """A real speculative generation next to plain greedy for one prompt: measured vs predicted."""

    __tablename__ = "validation_results"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("analysis_runs.id", ondelete="CASCADE"), index=True)
    prompt_id: Mapped[int] = mapped_column(ForeignKey("prompts.id"), index=True)
    gamma: Mapped[int] = mapped_column(Integer)
    greedy_time_s: Mapped[float] = mapped_column(Float)
    speculative_time_s: Mapped[float] = mapped_column(Float)
    measured_speedup: Mapped[float] = mapped_column(Float)
    predicted_speedup: Mapped[float] = mapped_column(Float)
    outputs_identical: Mapped[bool] = mapped_column(Boolean)
    target_forward_passes: Mapped[Optional[int]] = mapped_column(Integer)
    # the replay's rounds at this gamma, and whether the speculative output equals the analysed one
    replayed_rounds: Mapped[Optional[int]] = mapped_column(Integer)
    replay_identical: Mapped[Optional[bool]] = mapped_column(Boolean)
    # the share of the machine's CPU other processes used meanwhile (None: not known); above the
    # interference bar the validation is marked and kept out of the predicted-vs-measured error
    others_cpu: Mapped[Optional[float]] = mapped_column(Float)
    # every timed run in the order it ran (greedy and speculative alternated; None before they were kept):
    # consecutive greedy runs are pairs of identical work, from which the machine's noise is measured
    greedy_times_s: Mapped[Optional[list[float]]] = mapped_column(JSON(none_as_null=True))
    speculative_times_s: Mapped[Optional[list[float]]] = mapped_column(JSON(none_as_null=True))
    # the share of the machine's CPU time the hypervisor took meanwhile (/proc/stat's steal; None: not known)
    steal_share: Mapped[Optional[float]] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("run_id", "prompt_id", "gamma"),)


class ServerAnalysisRecord(Base):
    """An analysis in llama-server (analyzer/analysis/server_analysis.py) of one prompt set: the server's
    build and setup, the drafter settings compared, the step costs fitted from its timings, and per prompt
    and setting the replay's counts, the predicted speedup and, where validated, the server's own run.
    ``prompts`` and ``tasks`` hold those rows as JSON (analyzer/analysis/server_store.py writes them)."""

    __tablename__ = "server_analyses"

    id: Mapped[int] = mapped_column(primary_key=True)
    prompt_set_id: Mapped[int] = mapped_column(ForeignKey("prompt_sets.id"), index=True)
    model: Mapped[str] = mapped_column(String(500))
    draft_model: Mapped[Optional[str]] = mapped_column(String(500))  # the GGUF of draft-simple settings
    server_build: Mapped[str] = mapped_column(String(100))
    machine: Mapped[str] = mapped_column(String(300))
    threads: Mapped[int] = mapped_column(Integer)
    n_ctx: Mapped[int] = mapped_column(Integer)
    n_predict: Mapped[int] = mapped_column(Integer)
    drafters: Mapped[list[str]] = mapped_column(JSON)
    cost: Mapped[dict[str, Any]] = mapped_column(JSON)
    prompts: Mapped[list[Any]] = mapped_column(JSON)
    tasks: Mapped[list[Any]] = mapped_column(JSON)
    validation: Mapped[list[Any]] = mapped_column(JSON)
    calibration_prompts: Mapped[int] = mapped_column(Integer)
    seconds: Mapped[float] = mapped_column(Float)
    validation_seconds: Mapped[float] = mapped_column(Float)
    plain_generation_seconds: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # the machine's run-to-run noise (analyzer/measuring/noise.py NoiseFloor), why the advice is withheld
    # (None: it is not), validation's passes, and the routing numbers (analyzer/advice/routing_ceiling.py)
    noise: Mapped[Optional[dict[str, Any]]] = mapped_column(JSON(none_as_null=True))
    advice_withheld: Mapped[Optional[str]] = mapped_column(Text)
    validation_repeats: Mapped[Optional[int]] = mapped_column(Integer)
    routing: Mapped[Optional[list[Any]]] = mapped_column(JSON(none_as_null=True))
    # what the analysis could not take: {"settings": {label: why}, "prompts": [{"prompt_id", "task", "tokens",
    # "why"}]} (None: it took everything)
    left_out: Mapped[Optional[dict[str, Any]]] = mapped_column(JSON(none_as_null=True))
    # what validation took of the held-out prompts and what stopped it: {validated, held_out, budget_s,
    # spent_s, passes, target, half_width, stopped, why} (analyzer/measuring/validation_plan.py; None: not
    # validated); what stopped calibration where it did (None: stored before it stopped by its rule)
    validation_plan: Mapped[Optional[dict[str, Any]]] = mapped_column(JSON(none_as_null=True))
    calibration_why: Mapped[Optional[str]] = mapped_column(Text)

    prompt_set: Mapped[PromptSet] = relationship()

    __table_args__ = (
        CheckConstraint("threads >= 1 AND n_ctx >= 1 AND n_predict >= 1", name="setup_positive"),
    )


SERVER_JOB_STATUSES = ("queued", "running", "done", "failed", "cancelled")


class ServerAnalysisJob(Base):
    """An analysis in llama-server as queued work (analyzer/analysis/server_jobs.py): the prompt set and the
    parameters asked, its status (queued -> running -> done | failed | cancelled), the worker holding it and its
    heartbeat, progress, the plain generations and passes through the servers made so far (kept for a resume on
    the same machine), why it failed (a message and a code) and, once done, the analysis it stored."""

    __tablename__ = "server_analysis_jobs"

    id: Mapped[int] = mapped_column(primary_key=True)
    prompt_set_id: Mapped[int] = mapped_column(ForeignKey("prompt_sets.id"), index=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    worker_id: Mapped[Optional[str]] = mapped_column(String(200))
    heartbeat_at: Mapped[Optional[datetime]] = mapped_column()
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # {"phase", "done", "total", "line"}: the analysis' last progress line
    progress: Mapped[Optional[dict[str, Any]]] = mapped_column(JSON(none_as_null=True))
    # {"host": the machine, "outputs": {prompt key: the plain generation as server_jobs stores it},
    #  "passes": {"calibration 1 <prompt key>", "validation 2 <prompt key>", ...: the pass's runs}}
    generated: Mapped[Optional[dict[str, Any]]] = mapped_column(JSON(none_as_null=True))
    error: Mapped[Optional[str]] = mapped_column(Text)
    error_code: Mapped[Optional[str]] = mapped_column(String(64))
    analysis_id: Mapped[Optional[int]] = mapped_column(ForeignKey("server_analyses.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[Optional[datetime]] = mapped_column()
    finished_at: Mapped[Optional[datetime]] = mapped_column()

    prompt_set: Mapped[PromptSet] = relationship()

    __table_args__ = (CheckConstraint(one_of("status", SERVER_JOB_STATUSES), name="status"),)


class OptionResult(Base):
    """One prompt under one drafting option of an analysis, in the table every engine shares: a run's gammas
    (``gamma 1`` .. ``gamma G``) and a llama-server analysis' settings (``ngram-simple 2/4`` ...) alike. The
    replay's rounds, drafted and accepted counts, the predicted speedup (None where nothing finite) and, where
    validation ran the option on the prompt, the measured one. Exactly one of ``run_id`` and
    ``server_analysis_id`` names the analysis; ``position`` is the option's place in it (1-based).
    analyzer/advice/option_rows.py writes and reads them."""

    __tablename__ = "option_results"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[Optional[int]] = mapped_column(
        ForeignKey("analysis_runs.id", ondelete="CASCADE"), index=True
    )
    server_analysis_id: Mapped[Optional[int]] = mapped_column(
        ForeignKey("server_analyses.id", ondelete="CASCADE"), index=True
    )
    prompt_id: Mapped[int] = mapped_column(ForeignKey("prompts.id"), index=True)
    task_type: Mapped[Optional[str]] = mapped_column(String(64))
    option: Mapped[str] = mapped_column(String(100))
    position: Mapped[int] = mapped_column(Integer)
    rounds: Mapped[int] = mapped_column(Integer)
    drafted: Mapped[int] = mapped_column(Integer)
    accepted: Mapped[int] = mapped_column(Integer)
    predicted_speedup: Mapped[Optional[float]] = mapped_column(Float)
    measured_speedup: Mapped[Optional[float]] = mapped_column(Float)

    __table_args__ = (
        UniqueConstraint("run_id", "prompt_id", "option"),
        UniqueConstraint("server_analysis_id", "prompt_id", "option"),
        CheckConstraint("(run_id IS NULL) <> (server_analysis_id IS NULL)", name="one_analysis"),
        CheckConstraint("accepted <= drafted AND rounds >= 0 AND position >= 1", name="counts"),
    )
