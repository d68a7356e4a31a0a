"""Analysis runs, their execution: load the pair (:mod:`analyzer.engine.run_models`), tokenize each prompt
once, profile or reuse the cost curves (:mod:`analyzer.pricing.run_costs`), measure every prompt, validate
(running -> done | failed | cancelled), resume. Creating, listing and cancelling runs is
:mod:`analyzer.analysis.run_records` (no torch there).

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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from analyzer.analysis.chunks import (
    ClaimedChunk,
    claim_chunk,
    complete,
    plan_chunks,
    renew,
    renewing_heartbeat,
    take_over,
)
from analyzer.analysis.run_records import (
    UNLABELLED,
    RunNotFound,
    RunParams,
    cancelled,
    error_text,
    finish,
    recording_phases,
    selected_prompts,
    store_finished_summary,
)
from analyzer.analysis.run_validation import validate_run
from analyzer.db import lock_for_write, utcnow
from analyzer.engine.engine_base import LoadedPair
from analyzer.engine.engines import measuring_engine
from analyzer.measuring.acceptance import (
    NgramIndex,
    alpha_from_matches,
    expected_tokens_iid,
    ngram_first_token_matches,
    walk_model_draft,
    walk_ngram,
)
from analyzer.measuring.measure import processed_probabilities, sampling_overlaps
from analyzer.measuring.prompt_encoding import EncodedPrompt
from analyzer.measuring.prompt_passes import PromptPasses
from analyzer.models.tokenizer_match import tokenizer_fingerprint
from analyzer.orm import (
    AnalysisRun,
    GammaCount,
    ModelPair,
    Prompt,
    PromptResult,
)
from analyzer.pricing.run_costs import profile_run_costs
from analyzer.progress import ProgressCallback
from analyzer.run_params import REFUSE, RunError
from analyzer.settings import load_settings

# the prompts longest in characters whose tokens are counted to find the longest request (the context slopes)
LONGEST_CANDIDATES = 8


@dataclass
class CountsAtGamma:
    """One prompt's counts at lookahead ``gamma`` as :class:`GammaCount` stores them: greedy, the
    walk's rounds, drafted and accepted tokens and their histograms; sampling, zeros with the i.i.d.
    ``expected_tokens_per_round`` (None where it is undefined)."""

    gamma: int
    rounds: int
    drafted: int
    accepted: int
    accepted_hist: list[int]
    drafted_hist: list[int]
    position_accepted: list[int]
    expected_tokens_per_round: float | None


@dataclass
class MeasuredPrompt:
    """One prompt's result as :func:`_store` stores it: the prompt, its ids (``prompt_truncated`` when
    cut to the run's limit), the output (ids, text, each token's text), the draft's ``matches`` (N,) of
    0/1, the ``entropies`` (N,) in nats, greedy ``alpha`` and, sampling, ``alpha_sampling``, the
    replay's mismatches, the target's and the draft's seconds, the counts at every g, and the rounds of
    transformers' assisted generation under its defaults (None where not replayed)."""

    prompt: Prompt
    prompt_ids: list[int]
    prompt_truncated: bool
    output_ids: list[int]
    output_text: str
    output_token_texts: list[str]
    matches: list[int]
    entropies: list[float]
    alpha: float
    alpha_sampling: float | None
    replay_mismatches: int | None
    target_time_s: float
    draft_time_s: float
    counts_per_gamma: list[CountsAtGamma]
    assistant_rounds: list[list[int]] | None = None


def _measure_batch(
    loaded_models: LoadedPair, batch: list[tuple[Prompt, EncodedPrompt]], params: RunParams
) -> list[MeasuredPrompt]:
    """Measure a batch of (prompt, its token ids) in the run's engine; one result per prompt."""
    passes = loaded_models.measure_batch([enc for _, enc in batch], params, seed=params.seed + batch[0][0].id)
    return [
        _result(loaded_models, prompt, enc, measured, params)
        for (prompt, enc), measured in zip(batch, passes)
    ]


def _result(
    loaded_models: LoadedPair,
    prompt: Prompt,
    enc: EncodedPrompt,
    measured: PromptPasses,
    params: RunParams,
) -> MeasuredPrompt:
    """One prompt's result: the walks at every g under the engine's drafting rule (or, sampling, the
    i.i.d. expectation from the overlaps), with the passes that fed them."""
    started = time.perf_counter()
    output, matches, index = measured.output_ids, measured.matches, None
    if matches is None:  # prompt lookup: its matches are found from the output
        ngram_max = loaded_models.ngram_max
        assert ngram_max is not None  # a prompt-lookup pair has its n-gram size
        index = NgramIndex(list(enc.ids) + list(output), ngram_max, loaded_models.eos_ids, loaded_models.rule)
        matches = ngram_first_token_matches(enc.ids, output, index=index)
    alpha_sampling = None
    if params.temperature > 0:
        alpha_sampling = _alpha_sampling(loaded_models, enc, measured, index, params)
        counts_per_gamma = _sampling_counts(alpha_sampling, params.gamma_max)
    else:
        counts_per_gamma = _greedy_counts(loaded_models, enc, output, matches, index, params)
    return MeasuredPrompt(
        prompt=prompt,
        prompt_ids=list(enc.ids),
        prompt_truncated=enc.truncated,
        output_ids=list(output),
        output_text=loaded_models.tokenizer.decode(output, skip_special_tokens=False),
        output_token_texts=loaded_models.token_texts(output),
        matches=np.asarray(matches).astype(int).tolist(),
        entropies=[round(float(e), 5) for e in measured.entropies],
        alpha=alpha_from_matches(matches),
        alpha_sampling=alpha_sampling,
        replay_mismatches=measured.replay_mismatches,
        target_time_s=measured.target_time_s,
        draft_time_s=measured.draft_time_s + time.perf_counter() - started,
        counts_per_gamma=counts_per_gamma,
        assistant_rounds=[list(r) for r in measured.assistant_rounds] if measured.assistant_rounds else None,
    )


def _alpha_sampling(
    loaded_models: LoadedPair,
    enc: EncodedPrompt,
    measured: PromptPasses,
    index: NgramIndex | None,
    params: RunParams,
) -> float:
    """The mean overlap of target and draft distributions over the output (NaN for an empty output)."""
    target_logits = measured.target_logits
    assert target_logits is not None  # both engines keep the target's logits when sampling
    if loaded_models.draft is not None:
        assert measured.draft_logits is not None  # ... and a model draft's
        betas = sampling_overlaps(target_logits, measured.draft_logits, params.temperature, params.top_p)
    else:
        assert index is not None  # prompt lookup: _result built the output's n-gram index
        betas = _ngram_sampling_overlaps(target_logits, enc.ids, measured.output_ids, index, params)
    return float(np.mean(betas)) if betas.size else float("nan")


def _sampling_counts(alpha_sampling: float, gamma_max: int) -> list[CountsAtGamma]:
    """Sampling has no walk: zero counts at every g, with the i.i.d. expected tokens per round."""
    return [
        CountsAtGamma(
            gamma=g,
            rounds=0,
            drafted=0,
            accepted=0,
            accepted_hist=[0] * (g + 1),
            drafted_hist=[0] * (g + 1),
            position_accepted=[0] * g,
            expected_tokens_per_round=expected_tokens_iid(alpha_sampling, g)
            if np.isfinite(alpha_sampling)
            else None,
        )
        for g in range(1, gamma_max + 1)
    ]


def _greedy_counts(
    loaded_models: LoadedPair,
    enc: EncodedPrompt,
    output: list[int],
    matches,
    index: NgramIndex | None,
    params: RunParams,
) -> list[CountsAtGamma]:
    """The walk at every g: over the draft's matches (a model draft, under the engine's rule) or the
    n-gram lookup (prompt lookup)."""
    counts_per_gamma = []
    for g in range(1, params.gamma_max + 1):
        if loaded_models.draft is not None:
            counts = walk_model_draft(matches, g, params.max_new_tokens, loaded_models.rule)
        else:
            counts = walk_ngram(enc.ids, output, g, params.max_new_tokens, index=index)
        counts_per_gamma.append(
            CountsAtGamma(
                gamma=g,
                rounds=counts.rounds,
                drafted=counts.drafted,
                accepted=counts.accepted,
                accepted_hist=counts.accepted_hist.tolist(),
                drafted_hist=counts.drafted_hist.tolist(),
                position_accepted=counts.position_accepted.tolist(),
                expected_tokens_per_round=(counts.output_tokens / counts.rounds) if counts.rounds else None,
            )
        )
    return counts_per_gamma


def _ngram_sampling_overlaps(
    target_logits, prompt_ids, output, index: NgramIndex, params: RunParams
) -> np.ndarray:
    """For prompt lookup the draft distribution is a point mass on the proposed token, so
    beta_i = p_i(proposal) (0 where nothing is proposed)."""
    probs = processed_probabilities(target_logits, params.temperature, params.top_p).numpy()
    betas = np.zeros(len(output), dtype=np.float64)
    for i in range(len(output)):
        proposal = index.propose(len(prompt_ids) + i, 1)
        if proposal:
            betas[i] = probs[i, proposal[0]]
    return betas


def _store(session: Session, run: AnalysisRun, measured: MeasuredPrompt) -> None:
    """Add one prompt's result with its counts at every g, and count it in the run's progress; an unlabelled
    prompt takes the task the classifier gave it when the run was created (``AnalysisRun.task_labels``)."""
    prompt = measured.prompt
    labels = run.task_labels or {}
    given = None if prompt.task else labels.get("tasks", {}).get(str(prompt.id))
    row = PromptResult(
        run_id=run.id,
        prompt_id=prompt.id,
        task_type=prompt.task or given or UNLABELLED,
        task_source="label" if prompt.task else "classifier" if given else None,
        classifier_version_id=labels.get("version") if given else None,
        prompt_tokens=len(measured.prompt_ids),
        prompt_truncated=measured.prompt_truncated,
        prompt_token_ids=measured.prompt_ids,
        output_tokens=len(measured.output_ids),
        output_text=measured.output_text,
        output_token_ids=measured.output_ids,
        output_token_texts=measured.output_token_texts,
        draft_matches=measured.matches,
        assistant_rounds=measured.assistant_rounds,
        entropies=measured.entropies,
        alpha_sampling=measured.alpha_sampling,
        replay_mismatches=measured.replay_mismatches,
        target_time_s=measured.target_time_s,
        draft_time_s=measured.draft_time_s,
        total_time_s=measured.target_time_s + measured.draft_time_s,
    )
    row.gamma_counts = [GammaCount(**asdict(counts)) for counts in measured.counts_per_gamma]
    session.add(row)
    session.flush()
    run.progress_done = AnalysisRun.progress_done + 1  # in SQL: workers storing at once all count
    run.heartbeat_at = utcnow()


class LoadedModelCache:
    """The pair a worker has loaded (``loaded``), kept across the chunks of its runs (one pair at a
    time), and the prompts it has tokenized for the loaded pair (each prompt once)."""

    def __init__(self, cache_dir: Path, allow_network: bool = False):
        self.cache_dir, self.allow_network = cache_dir, allow_network
        self.key: tuple | None = None
        self.loaded: LoadedPair | None = None
        self.encoded: dict[int, EncodedPrompt] = {}

    def load(self, pair: ModelPair, params: RunParams, progress: ProgressCallback | None) -> LoadedPair:
        """The run's pair in its engine, on the device and dtype it asks for, loaded unless it already is."""
        engine = measuring_engine(params.engine)
        where, *load_key = engine.load_key(params)
        key = (
            engine.name,
            pair.target.spec,
            pair.draft.spec,
            where,
            params.chat_template,
            params.max_prompt_tokens,
            params.max_new_tokens,
            *load_key,
        )
        if key != self.key:
            self.loaded = self.key = None
            self.encoded = {}
            if progress:
                progress(
                    0,
                    0,
                    f"loading {pair.target.spec}"
                    + ("" if pair.draft.kind == "ngram" else f" and {pair.draft.spec}")
                    + f" {where}",
                )
            self.loaded = engine.load(pair, self.cache_dir, params, allow_network=self.allow_network)
            self.key = key
        assert self.loaded is not None  # set together with self.key
        return self.loaded

    def encode(self, prompt: Prompt, params: RunParams) -> EncodedPrompt:
        """The prompt's token ids under the run's rule (``RunModels.encode``), once per prompt."""
        if prompt.id not in self.encoded:
            assert self.loaded is not None, "load() the run's pair before encoding its prompts"
            self.encoded[prompt.id] = self.loaded.encode(prompt, params)
        return self.encoded[prompt.id]


def execute_run(
    session_factory: sessionmaker,
    run_id: int,
    *,
    cache_dir: Path,
    progress: ProgressCallback | None = None,
    worker_id: str | None = None,
    allow_network: bool = False,
    model_cache: LoadedModelCache | None = None,
    poll_s: float = 0.5,
) -> AnalysisRun:
    """Execute (or resume) a run in this process: take over its unfinished chunks, then claim them
    one after the other (:mod:`analyzer.analysis.chunks`), waiting while other workers hold some, until the
    run is done, failed or cancelled. Returns the run as stored at the end. A device or dtype this
    machine cannot give, or a model that does not fit, fails the run with a message saying so."""
    worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
    model_cache = model_cache or LoadedModelCache(cache_dir, allow_network)
    with session_factory() as session, session.begin():
        lock_for_write(session)
        run = session.get(AnalysisRun, run_id)
        if run is None:
            raise RunNotFound(f"no analysis run {run_id}")
        if run.status == "done":
            return run
        if run.status in ("failed", "cancelled", "running"):  # a resume: whoever held it is gone
            run.status = "queued"
        run.error, run.cancel_requested = None, False
        plan_chunks(session, run)
        take_over(session, run_id)
    while True:
        chunk = claim_chunk(session_factory, worker_id, run_id=run_id)
        if chunk is None:
            with session_factory() as session:
                run = session.get(AnalysisRun, run_id)
                if run.status not in ("queued", "running"):
                    return run
                stop = run.cancel_requested
            if stop:
                return finish(session_factory, run_id, "cancelled")
            time.sleep(poll_s)  # other workers hold the chunks left
            continue
        execute_chunk(session_factory, chunk, worker_id=worker_id, model_cache=model_cache, progress=progress)


def execute_chunk(
    session_factory: sessionmaker,
    chunk: ClaimedChunk,
    *,
    worker_id: str,
    model_cache: LoadedModelCache,
    progress: ProgressCallback | None = None,
) -> bool:
    """Do one claimed chunk: the cost profile, the measurement of its prompts (those not stored
    yet; each batch committed and the chunk's heartbeat renewed), or the validation; then mark it
    done (which finishes the run after its last chunk). Returns False when the chunk was left
    unfinished: the run was cancelled (then marked so) or another worker took the chunk over. Any
    error fails the run, with its text, and is raised."""
    run_id = chunk.run_id
    progress = recording_phases(session_factory, run_id, progress)
    try:
        with session_factory() as session:
            run = session.get(AnalysisRun, run_id)
            params, pair = RunParams.from_json(run.params), run.pair
            _ = pair.target.spec, pair.draft.spec
            prompts = [p for p in selected_prompts(session, run)]
        loaded_models = model_cache.load(pair, params, progress)
        _record_machine(session_factory, run_id, loaded_models, params)
        prompts = _fitting_prompts(
            session_factory, run_id, model_cache, loaded_models, prompts, params, progress
        )
        quiet_wait_s = load_settings().quiet_wait_s
        if chunk.kind != "measure":  # long work between batches: the heartbeat is renewed as it goes
            progress = renewing_heartbeat(session_factory, chunk, worker_id, progress)
        if chunk.kind == "profile":
            contexts = _profiled_contexts(model_cache, prompts, params)
            profile_run_costs(
                session_factory, run_id, loaded_models, params, contexts, progress, quiet_wait_s=quiet_wait_s
            )
        elif chunk.kind == "measure":
            if not _measure_chunk(
                session_factory, chunk, worker_id, model_cache, loaded_models, params, prompts, progress
            ):
                return False
        elif params.validate and params.temperature == 0:
            validate_run(session_factory, run_id, loaded_models, params, progress, quiet_wait_s=quiet_wait_s)
        if complete(session_factory, chunk, worker_id):  # this chunk finished the run: its summary, once
            store_finished_summary(session_factory, run_id)
        return True
    except BaseException as exc:
        finish(session_factory, run_id, "failed", error=error_text(exc))
        raise


def _profiled_contexts(
    model_cache: LoadedModelCache, prompts: list[Prompt], params: RunParams
) -> list[list[int]]:
    """The contexts the cost profile is measured over: the median prompt's (twice), then the longest one's
    request (the context slopes); the longest in tokens among the longest in characters (code and prose differ
    by 1.5x per character). Empty without prompts."""
    by_length = sorted(prompts, key=_prompt_chars)
    if not by_length:
        return []
    median = model_cache.encode(by_length[len(by_length) // 2], params).ids
    longest = max((model_cache.encode(p, params).ids for p in by_length[-LONGEST_CANDIDATES:]), key=len)
    return [median, median, longest]


class PromptsTooLong(RunError):
    """Prompts whose tokens and new tokens the run's context cannot hold (every one named)."""

    code = "prompt_too_long"


def _fitting_prompts(
    session_factory: sessionmaker,
    run_id: int,
    model_cache: LoadedModelCache,
    loaded_models: LoadedPair,
    prompts: list[Prompt],
    params: RunParams,
    progress: ProgressCallback | None,
) -> list[Prompt]:
    """The run's prompts whose tokens and new tokens its context holds, every prompt counted before anything
    is generated (once per worker). A run that sets ``max_prompt_tokens`` keeps each prompt's last tokens
    instead: it leaves nothing out. The others are left out (``long_prompts`` leave-out: stored on the run,
    which counts the rest) or refuse the run, every one named (refuse), as for an analysis in llama-server.
    A prompt with a stored result is not counted again."""
    if params.max_prompt_tokens:
        return prompts
    limit = loaded_models.prompt_limit(params)
    with session_factory() as session:  # a prompt measured already fits (a resumed run reuses its stored ids)
        stored = set(session.scalars(select(PromptResult.prompt_id).where(PromptResult.run_id == run_id)))
    long = []
    for prompt in prompts:
        if prompt.id in stored:
            continue
        encoded = model_cache.encode(prompt, params)
        if encoded.truncated:
            long.append((prompt, encoded.original_tokens))
    if not long:
        return prompts
    room = f"the context holds {limit} prompt tokens beside {params.max_new_tokens} new ones"
    named = "; ".join(
        f"prompt {p.position + 1} ({p.task or UNLABELLED}) has {tokens} tokens" for p, tokens in long
    )
    if params.long_prompts == REFUSE or len(long) == len(prompts):
        head = (
            f"none of the {len(prompts)} prompts fits"
            if len(long) == len(prompts)
            else f"{len(long)} of the {len(prompts)} prompts do not fit"
        )
        others = "" if len(long) == len(prompts) else ", or --long-prompts leave-out to analyze the others"
        raise PromptsTooLong(
            f"{head} the run's context: {room}; {named}. Give fewer --max-new-tokens, or a larger --ctx where "
            f"the engine has one (llama.cpp, llama-server){others}"
        )
    if _store_left_out(session_factory, run_id, long, room, len(prompts) - len(long)) and progress:
        progress(0, 0, f"left out {len(long)} prompts too long for the context: {named}")
    kept = {p.id for p, _ in long}
    return [p for p in prompts if p.id not in kept]


def _store_left_out(
    session_factory: sessionmaker, run_id: int, long: list[tuple[Prompt, int]], room: str, total: int
) -> bool:
    """Store the prompts left out as too long (each with its tokens and why) on the run, which counts the
    ``total`` others; whether this is the first time (a resumed run stored them already)."""
    entries = [
        {
            "prompt_id": p.id,
            "position": p.position + 1,
            "task": p.task or UNLABELLED,
            "tokens": tokens,
            "why": f"{tokens} tokens, where {room}",
        }
        for p, tokens in long
    ]
    with session_factory() as session, session.begin():
        lock_for_write(session)
        run = session.get(AnalysisRun, run_id)
        first = run.left_out != {"prompts": entries}
        if first:
            run.left_out = {"prompts": entries}
            run.progress_total = total
    return first


def _prompt_chars(prompt: Prompt) -> int:
    return len(prompt.text or "") + sum(len(str(m.get("content", ""))) for m in prompt.messages or [])


def _record_machine(
    session_factory: sessionmaker,
    run_id: int,
    loaded_models: LoadedPair,
    params: RunParams,
) -> None:
    """Store on the run where it is measured: device, dtype (for llama.cpp the weights' type as
    shipped), library versions, EOS ids, tokenizers."""
    with session_factory() as session, session.begin():
        lock_for_write(session)
        run = session.get(AnalysisRun, run_id)
        run.device = loaded_models.device_text()
        run.dtype = loaded_models.dtype_text()
        run.library_versions = loaded_models.library_versions()
        run.eos_token_ids = list(loaded_models.eos_ids)
        for spec, tokenizer in zip((run.pair.target, run.pair.draft), loaded_models.tokenizers()):
            if tokenizer is not None:
                spec.tokenizer_sha256 = tokenizer_fingerprint(tokenizer)


def _measure_chunk(
    session_factory: sessionmaker,
    chunk: ClaimedChunk,
    worker_id: str,
    model_cache: LoadedModelCache,
    loaded_models: LoadedPair,
    params: RunParams,
    prompts: list[Prompt],
    progress: ProgressCallback | None,
) -> bool:
    """Measure the chunk's prompts that have no result yet, a batch at a time, in ``loaded_models``
    (the cache's loaded pair); False when the run was cancelled (marked so here) or the chunk is no
    longer this worker's."""
    mine = set(chunk.prompt_ids)
    with session_factory() as session:
        stored = set(
            session.scalars(select(PromptResult.prompt_id).where(PromptResult.run_id == chunk.run_id))
        )
    pending = [p for p in prompts if p.id in mine and p.id not in stored]
    where = "measuring"
    for start in range(0, len(pending), params.batch_size):
        if not renew(session_factory, chunk, worker_id):
            if cancelled(session_factory, chunk.run_id):
                finish(session_factory, chunk.run_id, "cancelled")
            return False
        batch = [(p, model_cache.encode(p, params)) for p in pending[start : start + params.batch_size]]
        results = _measure_batch(loaded_models, batch, params)
        try:
            with session_factory() as session, session.begin():
                lock_for_write(session)
                run = session.get(AnalysisRun, chunk.run_id)
                for result in results:
                    _store(session, run, result)
                session.flush()  # the increments, in SQL; reading the run now loads the counts
                done, total = run.progress_done, run.progress_total
        except IntegrityError:  # a worker this chunk was taken from stored them after all
            continue
        if progress:
            progress(done, total, where)
    return True
