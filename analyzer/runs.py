"""Analysis runs, their execution: load the pair (:mod:`analyzer.run_models`), tokenize each prompt
once, profile or reuse the cost curves (:mod:`analyzer.run_costs`), measure every prompt, validate
(running -> done | failed | cancelled), resume. Creating, listing and cancelling runs is
:mod:`analyzer.run_records` (no torch there).

Each prompt is tokenized once per run and its prompt and output token ids (and each output token's
text) are stored with its result, so the report's drill-down shows exactly what was measured without
a tokenizer, and a resumed run reuses the ids it stored.

Each prompt's result is committed in its own transaction as soon as it is measured, together with
the run's progress, so a killed process loses at most the prompt it was on and a rerun skips
finished prompts (``UNIQUE(run_id, prompt_id)`` guarantees no duplicates). A failure records the
error text on the run and keeps every finished result.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

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
    GammaCount,
    Prompt,
    PromptResult,
    ValidationResult,
)
from analyzer.prompt_encoding import EncodedPrompt
from analyzer.run_costs import library_versions, profile_run_costs
from analyzer.run_models import RunModels, load_run_models
from analyzer.run_records import (
    UNLABELLED,
    ProgressCallback,
    RunNotFound,
    RunParams,
    cancelled,
    error_text,
    finish,
    recording_phases,
    selected_prompts,
    validation_sample,
)
from analyzer.tokenizer_match import tokenizer_fingerprint


def _measure_batch(models: RunModels, batch: list[tuple[Prompt, EncodedPrompt]], params: RunParams) -> list[dict]:
    """Measure a batch of (prompt, its token ids) and return one result dict per prompt."""
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
            "prompt_ids": list(enc.ids),
            "prompt_truncated": enc.truncated,
            "output_ids": list(output),
            "output_text": models.target.tokenizer.decode(output, skip_special_tokens=False),
            "output_token_texts": models.token_texts(output),
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
        prompt_tokens=len(result["prompt_ids"]),
        prompt_truncated=result["prompt_truncated"],
        prompt_token_ids=result["prompt_ids"],
        output_tokens=len(result["output_ids"]),
        output_text=result["output_text"],
        output_token_ids=result["output_ids"],
        output_token_texts=result["output_token_texts"],
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
            raise RunNotFound(f"no analysis run {run_id}")
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
        models = load_run_models(pair, cache_dir, allow_network, placement)
        with session_factory() as session, session.begin():
            run = session.get(AnalysisRun, run_id)
            run.device = _device_text(models)
            run.dtype = placement.dtype
            run.library_versions = library_versions()
            run.eos_token_ids = list(models.eos_ids)
            for spec, loaded in ((run.pair.target, models.target), (run.pair.draft, models.draft)):
                if loaded is not None:
                    spec.tokenizer_sha256 = tokenizer_fingerprint(loaded.tokenizer)
            prompts = selected_prompts(session, run)
            stored_ids = dict(session.execute(select(PromptResult.prompt_id, PromptResult.prompt_token_ids)
                                              .where(PromptResult.run_id == run_id)).all())
        encoded = _tokenize_once(models, [p for p in prompts if stored_ids.get(p.id) is None], params, progress)
        prompt_ids = {**{pid: list(ids) for pid, ids in stored_ids.items() if ids is not None},
                      **{pid: enc.ids for pid, enc in encoded.items()}}
        profile_run_costs(session_factory, run_id, models, params, [prompt_ids[p.id] for p in prompts], progress)
        pending = [p for p in prompts if p.id not in stored_ids]
        done = len(prompts) - len(pending)
        if progress:
            progress(done, len(prompts), "measuring")
        for start in range(0, len(pending), params.batch_size):
            if cancelled(session_factory, run_id):
                return finish(session_factory, run_id, "cancelled")
            batch = [(p, encoded[p.id]) for p in pending[start:start + params.batch_size]]
            results = _measure_batch(models, batch, params)
            with session_factory() as session, session.begin():
                run = session.get(AnalysisRun, run_id)
                for result in results:
                    _store(session, run, result)
            done += len(results)
            if progress:
                progress(done, len(prompts), "measuring")
        if params.validate and params.temperature == 0:
            _validate(session_factory, run_id, models, params, prompt_ids, progress)
        return finish(session_factory, run_id, "done")
    except BaseException as exc:
        finish(session_factory, run_id, "failed", error=error_text(exc))
        raise


def _tokenize_once(models: RunModels, prompts: list[Prompt], params: RunParams,
                   progress: ProgressCallback | None) -> dict[int, EncodedPrompt]:
    """The one tokenization of each prompt in a run (:meth:`RunModels.encode`), by prompt id. The
    cost profile, the measurement and the validation all take the ids from here, and the stored
    result keeps them, so a resumed run reuses the stored ids of the prompts it has measured."""
    if progress and prompts:
        progress(0, 0, f"tokenizing {len(prompts)} prompts")
    return {prompt.id: models.encode(prompt, params) for prompt in prompts}


def _device_text(models: RunModels) -> str:
    from analyzer.cost import device_description

    return device_description(models.target.model)


def _validate(session_factory: sessionmaker, run_id: int, models: RunModels, params: RunParams,
              prompt_ids: dict[int, list[int]], progress: ProgressCallback | None) -> None:
    """Run real speculative decoding at each validated prompt's task g* beside plain greedy, on a
    sample drawn across tasks (:func:`validation_sample`), from the prompt ids the run measured."""
    from analyzer.summary import summarize_run
    from analyzer.validate import validate_prompt

    with session_factory() as session:
        summary = summarize_run(session, session.get(AnalysisRun, run_id))
        validated = set(session.scalars(select(ValidationResult.prompt_id).where(ValidationResult.run_id == run_id)))
        outputs = dict(session.execute(select(PromptResult.prompt_id, PromptResult.output_token_ids)
                                       .where(PromptResult.run_id == run_id)).all())
    already = [p for p in summary.prompts if p.prompt_id in validated]
    chosen = validation_sample(summary, params.validate, already=already)
    for number, prompt in enumerate(chosen, start=1):
        if progress:
            progress(number - 1, len(chosen), "validating with real speculative decoding")
        gamma = summary.tasks[prompt.task].best_gamma or prompt.best_gamma or 1
        measured = validate_prompt(
            models.target.model, list(prompt_ids[prompt.prompt_id]), params.max_new_tokens, gamma=gamma,
            draft_model=models.draft.model if models.draft else None, ngram_max=models.ngram_max,
            eos_token_id=models.eos_ids,
        )
        with session_factory() as session, session.begin():
            session.add(ValidationResult(
                run_id=run_id, prompt_id=prompt.prompt_id, gamma=gamma,
                greedy_time_s=measured.greedy_time_s, speculative_time_s=measured.speculative_time_s,
                measured_speedup=measured.measured_speedup,
                predicted_speedup=float(prompt.speedup_curve[gamma - 1]),
                outputs_identical=measured.outputs_identical,
                target_forward_passes=measured.target_forward_passes,
                replayed_rounds=prompt.rounds.get(gamma),
                replay_identical=measured.speculative_ids == list(outputs.get(prompt.prompt_id) or []),
            ))
    if progress and chosen:
        progress(len(chosen), len(chosen), "validating with real speculative decoding")
