"""Analysis runs, their execution: load the pair, profile or reuse the cost curves, measure every
prompt, validate (running -> done | failed | cancelled), resume. Creating, listing and cancelling
runs is :mod:`analyzer.run_records` (no torch there).

Each prompt's result is committed in its own transaction as soon as it is measured, together with
the run's progress, so a killed process loses at most the prompt it was on and a rerun skips
finished prompts (``UNIQUE(run_id, prompt_id)`` guarantees no duplicates). A failure records the
error text on the run and keeps every finished result.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
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
    Placement,
)
from analyzer.loading import (
    LoadedModel,
    ModelSpecRef,
    check_same_tokenizer,
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
    Prompt,
    PromptResult,
    RunCostProfile,
    ValidationResult,
)
from analyzer.run_records import (
    UNLABELLED,
    ProgressCallback,
    RunError,
    RunParams,
    cancelled,
    error_text,
    finish,
    recording_phases,
    selected_prompts,
    validation_sample,
)

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
    progress = recording_phases(session_factory, run_id, progress)
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
            if cancelled(session_factory, run_id):
                return finish(session_factory, run_id, "cancelled")
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
        return finish(session_factory, run_id, "done")
    except BaseException as exc:
        finish(session_factory, run_id, "failed", error=error_text(exc))
        raise


def _device_text(models: _Models) -> str:
    from analyzer.cost import device_description

    return device_description(models.target.model)


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
