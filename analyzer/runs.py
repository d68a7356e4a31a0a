"""Analysis runs: create a run (queued), execute it (running -> done | failed | cancelled), resume it.

Each prompt's result is committed in its own transaction as soon as it is measured, together with
the run's progress, so a killed process loses at most the prompt it was on and a rerun skips
finished prompts (``UNIQUE(run_id, prompt_id)`` guarantees no duplicates). A failure records the
error text on the run and keeps every finished result.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from analyzer.acceptance import (
    NgramIndex,
    alpha_from_matches,
    expected_tokens_iid,
    ngram_first_token_matches,
    walk_model_draft,
    walk_ngram,
)
from analyzer.db import utcnow
from analyzer.devices import (
    DeviceError,
    Placement,
    check_device_name,
    check_dtype_name,
    default_batch_sizes,
    resolve,
    MAX_PROFILE_BATCH_SIZE,
)
from analyzer.entropy import ENTROPY_EDGES_NATS
from analyzer.loading import (
    LoadedModel,
    ModelSpecRef,
    check_same_tokenizer,
    display_name,
    encode_prompt,
    load_model,
    parse_spec,
    tokenizer_fingerprint,
    context_limit,
)
from analyzer.measure import (
    draft_match_sequence,
    generate_target,
    processed_probabilities,
    sampling_overlaps,
    teacher_forced_logits,
    teacher_forced_mismatches,
)
from analyzer.models import (
    AnalysisRun,
    CostProfile,
    GammaCount,
    ModelPair,
    ModelSpec,
    Prompt,
    PromptResult,
    RunCostProfile,
    ValidationResult,
)
from analyzer.prompt_sets import get_prompt_set

UNLABELLED = "unlabelled"


class RunError(ValueError):
    """A run cannot be created or executed as asked; the message says why."""


@dataclass(frozen=True)
class RunParams:
    """Parameters of an analysis run (stored as JSON on the run)."""

    max_new_tokens: int = 128
    gamma_max: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    validate: int = 0
    limit: int | None = None
    chat_template: bool = True
    batch_size: int = 1
    margin: float = 0.05
    seed: int = 0
    reprofile: bool = False
    max_prompt_tokens: int | None = None
    device: str = "auto"  # auto | cpu | cuda | cuda:N, resolved by the worker that executes the run
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    profile_batch_sizes: tuple[int, ...] | None = None  # None: 1,4,16 on a GPU, 1 on the CPU
    # stored with the run so its entropy table keeps its buckets if the defaults change (None = inf)
    entropy_edges: tuple[float | None, ...] = tuple(e if e != float("inf") else None for e in ENTROPY_EDGES_NATS)

    def check(self) -> "RunParams":
        """Raise :class:`RunError` naming the first parameter out of range."""
        if not 1 <= self.max_new_tokens <= 4096:
            raise RunError("max_new_tokens must be between 1 and 4096")
        if not 1 <= self.gamma_max <= 64:
            raise RunError("gamma_max must be between 1 and 64")
        if self.temperature < 0:
            raise RunError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise RunError("top_p must be in (0, 1]")
        if self.validate < 0 or (self.limit is not None and self.limit < 1):
            raise RunError("validate must be >= 0 and limit >= 1")
        if self.batch_size < 1:
            raise RunError("batch_size must be >= 1")
        if self.batch_size > 1 and self.temperature > 0:
            raise RunError("batching is for greedy runs only (sampling uses one seed per prompt)")
        if self.margin < 0:
            raise RunError("margin must be >= 0")
        try:
            check_device_name(self.device), check_dtype_name(self.dtype)
        except DeviceError as error:
            raise RunError(str(error)) from None
        sizes = self.profile_batch_sizes
        if sizes is not None and (not sizes or any(not 1 <= int(b) <= MAX_PROFILE_BATCH_SIZE for b in sizes)):
            raise RunError(f"profile batch sizes must be integers from 1 to {MAX_PROFILE_BATCH_SIZE}")
        return self

    @classmethod
    def from_json(cls, data: dict) -> "RunParams":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "entropy_edges" in values:
            values["entropy_edges"] = tuple(values["entropy_edges"])
        if values.get("profile_batch_sizes") is not None:
            values["profile_batch_sizes"] = tuple(int(b) for b in values["profile_batch_sizes"])
        return cls(**values)

    def placement(self) -> Placement:
        """The device and dtype this run asks for, resolved on this machine (DeviceError if absent)."""
        return resolve(self.device, self.dtype)

    def batch_sizes(self, placement: Placement) -> tuple[int, ...]:
        """The batch sizes to profile: the ones asked for, else the device's default."""
        return tuple(self.profile_batch_sizes) if self.profile_batch_sizes else default_batch_sizes(placement)


ProgressCallback = Callable[[int, int, str], None]


def _get_or_create_spec(session: Session, ref: ModelSpecRef) -> ModelSpec:
    spec = session.scalar(select(ModelSpec).where(ModelSpec.spec == ref.canonical))
    if spec is None:
        spec = ModelSpec(spec=ref.canonical, kind=ref.kind, display_name=display_name(ref), details=dict(ref.options))
        session.add(spec)
        session.flush()
    return spec


def get_or_create_pair(session: Session, target: ModelSpecRef, draft: ModelSpecRef) -> ModelPair:
    """The stored pair for these specs, created on first use."""
    target_spec, draft_spec = _get_or_create_spec(session, target), _get_or_create_spec(session, draft)
    pair = session.scalar(
        select(ModelPair).where(ModelPair.target_id == target_spec.id, ModelPair.draft_id == draft_spec.id)
    )
    if pair is None:
        pair = ModelPair(target=target_spec, draft=draft_spec)
        session.add(pair)
        session.flush()
    return pair


def create_run(session: Session, prompt_set_name: str, target: str, draft: str, params: RunParams) -> AnalysisRun:
    """Queue an analysis of the named prompt set with ``target`` and ``draft`` spec strings."""
    params.check()
    target_ref, draft_ref = parse_spec(target), parse_spec(draft)
    if target_ref.kind == "ngram":
        raise RunError("the target must be a model, not 'ngram'")
    prompt_set = get_prompt_set(session, prompt_set_name)
    pair = get_or_create_pair(session, target_ref, draft_ref)
    total = prompt_set.prompt_count if params.limit is None else min(params.limit, prompt_set.prompt_count)
    run = AnalysisRun(
        prompt_set=prompt_set, pair=pair, status="queued", params=asdict(params), progress_total=total
    )
    session.add(run)
    session.flush()
    return run


def selected_prompts(session: Session, run: AnalysisRun) -> list[Prompt]:
    """The run's prompts in file order (the first ``limit`` of the set)."""
    query = select(Prompt).where(Prompt.prompt_set_id == run.prompt_set_id).order_by(Prompt.position)
    if run.params.get("limit"):
        query = query.limit(run.params["limit"])
    return list(session.scalars(query))


def request_cancel(session: Session, run_id: int) -> AnalysisRun:
    """Ask a queued or running run to stop after the prompt it is on."""
    run = session.get(AnalysisRun, run_id)
    if run is None:
        raise RunError(f"no analysis run {run_id}")
    if run.status == "queued":
        run.status, run.finished_at = "cancelled", utcnow()
    elif run.status == "running":
        run.cancel_requested = True
    return run


@dataclass
class _Models:
    target: LoadedModel
    draft: LoadedModel | None
    draft_ref: ModelSpecRef
    eos_ids: list[int]
    pad_id: int

    @property
    def ngram_max(self) -> int | None:
        return int(self.draft_ref.options.get("max_ngram", 2)) if self.draft_ref.kind == "ngram" else None


def _load_models(pair: ModelPair, cache_dir: Path, allow_network: bool, placement: Placement) -> _Models:
    """Load target and draft once, on the run's device in the run's dtype."""
    target_ref, draft_ref = parse_spec(pair.target.spec), parse_spec(pair.draft.spec)
    target = load_model(target_ref, cache_dir=cache_dir, allow_network=allow_network, placement=placement)
    draft = None
    if draft_ref.kind != "ngram":
        draft = load_model(draft_ref, cache_dir=cache_dir, allow_network=allow_network, placement=placement)
        check_same_tokenizer(target.tokenizer, draft.tokenizer, pair.target.spec, pair.draft.spec)
    eos = target.model.generation_config.eos_token_id
    if eos is None:
        eos = target.tokenizer.eos_token_id
    eos_ids = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]
    pad = target.tokenizer.pad_token_id
    pad_id = int(pad if pad is not None else eos_ids[0])
    return _Models(target, draft, draft_ref, eos_ids, pad_id)


def _encode(models: _Models, prompt: Prompt, params: RunParams):
    limit = params.max_prompt_tokens or max(16, context_limit(models.target.model) - params.max_new_tokens)
    return encode_prompt(
        models.target.tokenizer,
        text=prompt.text,
        messages=prompt.messages,
        use_chat_template=params.chat_template,
        max_prompt_tokens=limit,
    )


def _cost_profile(session_factory: sessionmaker, run_id: int, models: _Models, params: RunParams,
                  prompts: list[Prompt], progress: ProgressCallback | None) -> int:
    """For each batch size of the run, reuse the newest cost profile of this pair on this device in
    this dtype at that batch size covering k <= gamma_max + 1 (unless ``reprofile``; never one judged
    noisy: it is passed over, and progress says so), or measure one on a prompt of median length;
    link them to the run and return the smallest batch size's id. The machinery overhead is measured
    once (at batch 1) for the profiles measured now."""
    from analyzer.cost import device_description, profile_costs, time_callable
    from analyzer.overhead import measure_machinery_overhead

    placement = models.target.placement
    device = device_description(models.target.model)
    k_max = params.gamma_max + 1
    sizes = params.batch_sizes(placement)
    chosen: dict[int, int] = {}
    passed_over: list[str] = []
    with session_factory() as session, session.begin():
        run = session.get(AnalysisRun, run_id)
        for link in run.batch_profiles:
            chosen[link.batch_size] = link.cost_profile_id  # a resumed run keeps its profiles
        if not params.reprofile:
            for batch_size in sizes:
                if batch_size in chosen:
                    continue
                for profile in session.scalars(
                    select(CostProfile)
                    .where(CostProfile.pair_id == run.pair_id, CostProfile.device == device,
                           CostProfile.dtype == placement.dtype, CostProfile.batch_size == batch_size)
                    .order_by(CostProfile.id.desc())
                ):
                    if len(profile.target_forward_s) < k_max:
                        continue
                    if profile.quality == "noisy":
                        passed_over.append(f"stored cost profile {profile.id} (batch {batch_size}) was judged noisy "
                                           f"({'; '.join(profile.quality_notes or [])}); not reused")
                        continue
                    chosen[batch_size] = profile.id
                    break
    missing = [b for b in sizes if b not in chosen]
    for note in passed_over:
        if progress:
            progress(0, 0, note)
    if missing:
        encoded = sorted((_encode(models, p, params).ids for p in prompts), key=len)
        context = list(encoded[len(encoded) // 2] if encoded else [models.pad_id] * 32)
        draft_step = _prompt_lookup_step(context, models, params) if models.draft is None else None
        if progress:
            progress(0, 0, f"profiling the machinery overhead of generate() on {placement.device} in {placement.dtype}")
        overhead = measure_machinery_overhead(
            models.target.model, context, gamma=min(4, params.gamma_max),
            new_tokens=min(32, params.max_new_tokens), draft_model=models.draft.model if models.draft else None,
            ngram_max=models.ngram_max, lookup_s=time_callable(draft_step) if draft_step else 0.0,
        )
        for number, batch_size in enumerate(missing, start=1):
            phase = (f"profiling the cost of drafting and verifying at batch size {batch_size} "
                     f"({number} of {len(missing)}) on {placement.device} in {placement.dtype}")
            passes = {"done": 0, "planned": 6 * (2 if models.draft is not None else 1)}  # 1 warm-up + 5 repeats

            def tick() -> None:
                passes["done"] += 1
                passes["planned"] = max(passes["planned"], passes["done"])  # re-measurements add passes
                if progress:
                    progress(passes["done"], passes["planned"], phase)

            if progress:
                progress(0, passes["planned"], phase)
            measured = profile_costs(
                models.target.model, context, k_max, batch_size=batch_size,
                draft_model=models.draft.model if models.draft else None, draft_step=draft_step, on_repeat=tick,
            )
            with session_factory() as session, session.begin():
                run = session.get(AnalysisRun, run_id)
                profile = CostProfile(
                    pair_id=run.pair_id,
                    device=measured.device,
                    dtype=placement.dtype,
                    batch_size=batch_size,
                    threads=measured.threads,
                    context_tokens=measured.context_tokens,
                    repeats=measured.repeats,
                    target_forward_s=list(measured.target_forward_s),
                    draft_step_s=measured.draft_step_s,
                    target_prefill_s=measured.target_prefill_s,
                    draft_prefill_s=measured.draft_prefill_s,
                    round_overhead_s=overhead.round_s,
                    decode_overhead_s=overhead.decode_s,
                    target_forward_spread=measured.quality.spread if measured.quality else None,
                    quality="noisy" if overhead.busy else measured.quality.verdict if measured.quality else None,
                    quality_notes=([overhead.busy] if overhead.busy else []) + (measured.quality.notes if measured.quality else []),
                    library_versions=_library_versions(),
                )
                session.add(profile)
                session.flush()
                chosen[batch_size] = profile.id
            if progress and measured.quality and measured.quality.verdict != "clean":
                progress(0, 0, f"cost profile at batch size {batch_size}: {measured.quality.verdict} — "
                               + "; ".join(measured.quality.notes))
    with session_factory() as session, session.begin():
        run = session.get(AnalysisRun, run_id)
        linked = {link.batch_size for link in run.batch_profiles}
        for batch_size, profile_id in sorted(chosen.items()):
            if batch_size not in linked:
                run.batch_profiles.append(RunCostProfile(batch_size=batch_size, cost_profile_id=profile_id))
        run.cost_profile_id = chosen[min(chosen)]
        return run.cost_profile_id


def _prompt_lookup_step(context: list[int], models: _Models, params: RunParams) -> Callable[[], object]:
    """One prompt-lookup proposal as transformers computes it (a scan of the whole context), which
    is what an engine pays per round; the lookup of our analysis is indexed and not representative."""
    import torch
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    generator = PromptLookupCandidateGenerator(
        eos_token_id=torch.tensor(models.eos_ids, device=models.target.model.device),
        num_output_tokens=params.gamma_max,
        max_matching_ngram_size=models.ngram_max or 2,
        max_length=len(context) + params.max_new_tokens,
    )
    input_ids = torch.tensor([context], dtype=torch.long, device=models.target.model.device)
    return lambda: generator.get_candidates(input_ids)


def _library_versions() -> dict:
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__}


def _measure_batch(models: _Models, batch: list[tuple[Prompt, object]], params: RunParams) -> list[dict]:
    """Measure a batch of (prompt, encoded) and return one result dict per prompt."""
    sampling = params.temperature > 0
    generations = generate_target(
        models.target.model, [enc.ids for _, enc in batch], params.max_new_tokens,
        eos_ids=models.eos_ids, pad_id=models.pad_id, temperature=params.temperature, top_p=params.top_p,
        seed=params.seed + batch[0][0].id, keep_logits=sampling,
    )
    results = []
    for (prompt, enc), generation in zip(batch, generations):
        started = time.perf_counter()
        output = generation.output_ids
        index = None
        if models.draft is not None:
            draft_logits = teacher_forced_logits(models.draft.model, enc.ids, output)
            matches = draft_match_sequence(draft_logits, output)
        else:
            index = NgramIndex(list(enc.ids) + list(output), models.ngram_max, models.eos_ids)
            matches = ngram_first_token_matches(enc.ids, output, index=index)
        alpha_sampling = None
        per_gamma = []
        if sampling:
            if models.draft is not None:
                betas = sampling_overlaps(generation.logits, draft_logits, params.temperature, params.top_p)
            else:
                betas = _ngram_sampling_overlaps(generation.logits, enc.ids, output, index, params)
            alpha_sampling = float(np.mean(betas)) if betas.size else float("nan")
            for g in range(1, params.gamma_max + 1):
                per_gamma.append({"gamma": g, "rounds": 0, "drafted": 0, "accepted": 0,
                                  "accepted_hist": [0] * (g + 1), "drafted_hist": [0] * (g + 1),
                                  "position_accepted": [0] * g,
                                  "expected_tokens_per_round": expected_tokens_iid(alpha_sampling, g)
                                  if np.isfinite(alpha_sampling) else None})
        else:
            for g in range(1, params.gamma_max + 1):
                if models.draft is not None:
                    counts = walk_model_draft(matches, g, params.max_new_tokens)
                else:
                    counts = walk_ngram(enc.ids, output, g, params.max_new_tokens, index=index)
                per_gamma.append({
                    "gamma": g, "rounds": counts.rounds, "drafted": counts.drafted, "accepted": counts.accepted,
                    "accepted_hist": counts.accepted_hist.tolist(), "drafted_hist": counts.drafted_hist.tolist(),
                    "position_accepted": counts.position_accepted.tolist(),
                    "expected_tokens_per_round": (counts.output_tokens / counts.rounds) if counts.rounds else None,
                })
        draft_time = time.perf_counter() - started
        mismatches = None
        if not sampling and models.target.placement.dtype != "float32":
            mismatches = int(teacher_forced_mismatches(models.target.model, enc.ids, output).sum())
        results.append({
            "prompt": prompt,
            "prompt_tokens": len(enc.ids),
            "prompt_truncated": enc.truncated,
            "output_ids": list(output),
            "output_text": models.target.tokenizer.decode(output, skip_special_tokens=False),
            "matches": matches.astype(int).tolist(),
            "entropies": [round(float(e), 5) for e in generation.entropies],
            "alpha": alpha_from_matches(matches),
            "alpha_sampling": alpha_sampling,
            "replay_mismatches": mismatches,
            "target_time_s": generation.time_s,
            "draft_time_s": draft_time,
            "per_gamma": per_gamma,
        })
    return results


def _ngram_sampling_overlaps(target_logits, prompt_ids, output, index: NgramIndex, params: RunParams) -> np.ndarray:
    """For prompt lookup the draft distribution is a point mass on the proposed token, so
    beta_i = p_i(proposal) (0 where nothing is proposed)."""
    probs = processed_probabilities(target_logits, params.temperature, params.top_p).numpy()
    betas = np.zeros(len(output), dtype=np.float64)
    for i in range(len(output)):
        proposal = index.propose(len(prompt_ids) + i, 1)
        if proposal:
            betas[i] = probs[i, proposal[0]]
    return betas


def _store(session: Session, run: AnalysisRun, result: dict) -> None:
    prompt: Prompt = result["prompt"]
    row = PromptResult(
        run_id=run.id,
        prompt_id=prompt.id,
        task_type=prompt.task or UNLABELLED,
        task_source="label" if prompt.task else None,
        prompt_tokens=result["prompt_tokens"],
        prompt_truncated=result["prompt_truncated"],
        output_tokens=len(result["output_ids"]),
        output_text=result["output_text"],
        output_token_ids=result["output_ids"],
        draft_matches=result["matches"],
        entropies=result["entropies"],
        alpha_sampling=result["alpha_sampling"],
        replay_mismatches=result["replay_mismatches"],
        target_time_s=result["target_time_s"],
        draft_time_s=result["draft_time_s"],
        total_time_s=result["target_time_s"] + result["draft_time_s"],
    )
    row.gamma_counts = [GammaCount(**counts) for counts in result["per_gamma"]]
    session.add(row)
    session.flush()
    run.progress_done = session.scalar(
        select(func.count()).select_from(PromptResult).where(PromptResult.run_id == run.id)
    )
    run.heartbeat_at = utcnow()


INTERRUPTED_AFTER_S = 180.0


def shown_status(run: AnalysisRun, now: datetime | None = None) -> str:
    """The status to show: "interrupted" for a run stored as running whose worker has not written a
    heartbeat for INTERRUPTED_AFTER_S (it died or was killed; ``specroute analyze --resume RUN`` or
    any worker after ten minutes picks it up again), else the stored status."""
    if run.status == "running" and run.heartbeat_at is not None:
        heartbeat = run.heartbeat_at if run.heartbeat_at.tzinfo else run.heartbeat_at.replace(tzinfo=timezone.utc)
        if ((now or utcnow()) - heartbeat).total_seconds() > INTERRUPTED_AFTER_S:
            return "interrupted"
    return run.status


def _recording_phases(session_factory: sessionmaker, run_id: int,
                      progress: ProgressCallback | None) -> ProgressCallback:
    """A progress callback that also stores each new phase text on the run (with a heartbeat), so
    that the web UI shows what a worker is doing while it loads models or profiles, then calls
    ``progress``."""
    last: list[str | None] = [None]

    def record(done: int, total: int, phase: str) -> None:
        if phase != last[0]:
            last[0] = phase
            with session_factory() as session, session.begin():
                run = session.get(AnalysisRun, run_id)
                run.phase, run.heartbeat_at = phase[:300], utcnow()
        if progress:
            progress(done, total, phase)

    return record


def execute_run(
    session_factory: sessionmaker,
    run_id: int,
    *,
    cache_dir: Path,
    progress: ProgressCallback | None = None,
    worker_id: str | None = None,
    allow_network: bool = False,
) -> AnalysisRun:
    """Execute (or resume) a run: resolve its device and dtype on this machine, load the pair there
    (hub ids download only with ``allow_network``), profile or reuse the cost curves for each batch
    size, measure every prompt not yet measured, validate, and mark the run done. Returns the run as
    stored at the end. A device or dtype this machine cannot give, or a model that does not fit,
    fails the run with a message saying so (nothing is measured)."""
    worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
    with session_factory() as session, session.begin():
        run = session.get(AnalysisRun, run_id)
        if run is None:
            raise RunError(f"no analysis run {run_id}")
        if run.status == "done":
            return run
        run.status, run.worker_id, run.error, run.cancel_requested = "running", worker_id, None, False
        run.started_at = run.started_at or utcnow()
        run.heartbeat_at = utcnow()
        params = RunParams.from_json(run.params)
        pair = run.pair
        _ = pair.target.spec, pair.draft.spec
    progress = _recording_phases(session_factory, run_id, progress)
    try:
        placement = params.placement()
        if progress:
            progress(0, 0, f"loading {pair.target.spec}" + ("" if pair.draft.kind == "ngram" else f" and {pair.draft.spec}")
                     + f" on {placement.device} ({placement.name}) in {placement.dtype}")
        models = _load_models(pair, cache_dir, allow_network, placement)
        with session_factory() as session, session.begin():
            run = session.get(AnalysisRun, run_id)
            run.device = _device_text(models)
            run.dtype = placement.dtype
            run.library_versions = _library_versions()
            for spec, loaded in ((run.pair.target, models.target), (run.pair.draft, models.draft)):
                if loaded is not None:
                    spec.tokenizer_sha256 = tokenizer_fingerprint(loaded.tokenizer)
            prompts = selected_prompts(session, run)
            done_ids = set(session.scalars(select(PromptResult.prompt_id).where(PromptResult.run_id == run_id)))
        _cost_profile(session_factory, run_id, models, params, prompts, progress)
        pending = [p for p in prompts if p.id not in done_ids]
        done = len(prompts) - len(pending)
        if progress:
            progress(done, len(prompts), "measuring")
        for start in range(0, len(pending), params.batch_size):
            if _cancelled(session_factory, run_id):
                return _finish(session_factory, run_id, "cancelled")
            batch = [(p, _encode(models, p, params)) for p in pending[start:start + params.batch_size]]
            results = _measure_batch(models, batch, params)
            with session_factory() as session, session.begin():
                run = session.get(AnalysisRun, run_id)
                for result in results:
                    _store(session, run, result)
            done += len(results)
            if progress:
                progress(done, len(prompts), "measuring")
        if params.validate and params.temperature == 0:
            _validate(session_factory, run_id, models, params, progress)
        return _finish(session_factory, run_id, "done")
    except BaseException as exc:
        _finish(session_factory, run_id, "failed", error=_error_text(exc))
        raise


def _device_text(models: _Models) -> str:
    from analyzer.cost import device_description

    return device_description(models.target.model)


def _cancelled(session_factory: sessionmaker, run_id: int) -> bool:
    with session_factory() as session:
        return bool(session.scalar(select(AnalysisRun.cancel_requested).where(AnalysisRun.id == run_id)))


def _finish(session_factory: sessionmaker, run_id: int, status: str, error: str | None = None) -> AnalysisRun:
    with session_factory() as session, session.begin():
        run = session.get(AnalysisRun, run_id)
        run.status, run.error, run.finished_at = status, error, utcnow()
        run.cancel_requested, run.phase = False, None
        session.flush()
        return run


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (KeyboardInterrupt); rerun to resume"
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {Path(last[0].filename).name}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"


def validation_sample(report: dict, count: int, *, already: list[dict] = ()) -> list[dict]:
    """Up to ``count`` prompt rows of ``report`` to validate (minus those ``already`` validated),
    stratified: one prompt per task in turn, the tasks predicted to speculate first (highest
    predicted speedup first), then the others (most prompts first); within a task in file order. So
    a sample of N covers min(N, number of tasks) tasks, and the decisions that matter most (where
    speculation is switched on) are checked first."""
    tasks = report["tasks"]
    order = sorted(tasks, key=lambda t: (not tasks[t].get("speculate"), -(tasks[t].get("predicted_speedup") or 0.0)
                                         if tasks[t].get("speculate") else -tasks[t]["n"], t))
    done = {row["prompt_id"] for row in already}
    queues = {t: [r for r in sorted(report["prompts"], key=lambda r: r["position"])
                  if r["task"] == t and r["prompt_id"] not in done] for t in order}
    taken = {t: sum(1 for row in already if row["task"] == t) for t in order}
    chosen: list[dict] = []
    while len(chosen) + len(done) < count and any(queues.values()):
        # the task with the fewest validated so far, ties broken by the order above
        task = min((t for t in order if queues[t]), key=lambda t: (taken[t], order.index(t)))
        chosen.append(queues[task].pop(0))
        taken[task] += 1
    return chosen


def _validate(session_factory: sessionmaker, run_id: int, models: _Models, params: RunParams,
              progress: ProgressCallback | None) -> None:
    """Run real speculative decoding at each validated prompt's task g* beside plain greedy, on a
    sample drawn across tasks (:func:`validation_sample`)."""
    from analyzer.report import build_report
    from analyzer.validate import validate_prompt

    with session_factory() as session:
        report = build_report(session, run_id)
        run = session.get(AnalysisRun, run_id)
        prompts = {p.id: p for p in selected_prompts(session, run)}
        validated = set(session.scalars(select(ValidationResult.prompt_id).where(ValidationResult.run_id == run_id)))
        outputs = dict(session.execute(select(PromptResult.prompt_id, PromptResult.output_token_ids)
                                       .where(PromptResult.run_id == run_id)).all())
    already = [row for row in report["prompts"] if row["prompt_id"] in validated]
    chosen = validation_sample(report, params.validate, already=already)
    for number, row in enumerate(chosen, start=1):
        if progress:
            progress(number - 1, len(chosen), "validating with real speculative decoding")
        task = report["tasks"].get(row["task"]) or {}
        gamma = int(task.get("best_gamma") or row["best_gamma"] or 1)
        enc = _encode(models, prompts[row["prompt_id"]], params)
        measured = validate_prompt(
            models.target.model, list(enc.ids), params.max_new_tokens, gamma=gamma,
            draft_model=models.draft.model if models.draft else None, ngram_max=models.ngram_max,
            eos_token_id=models.eos_ids,
        )
        replayed = row["per_gamma"].get(str(gamma)) or {}
        with session_factory() as session, session.begin():
            session.add(ValidationResult(
                run_id=run_id, prompt_id=row["prompt_id"], gamma=gamma,
                greedy_time_s=measured.greedy_time_s, speculative_time_s=measured.speculative_time_s,
                measured_speedup=measured.measured_speedup,
                predicted_speedup=float(row["predicted_speedup"][str(gamma)]),
                outputs_identical=measured.outputs_identical,
                target_forward_passes=measured.target_forward_passes,
                replayed_rounds=replayed.get("rounds"),
                replay_identical=measured.speculative_ids == list(outputs.get(row["prompt_id"]) or []),
            ))
    if progress and chosen:
        progress(len(chosen), len(chosen), "validating with real speculative decoding")
