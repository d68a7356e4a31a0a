"""The cost of drafting and verifying in llama.cpp, from its own decode (DESIGN.md, "Engines").

T_t(k) is one ``llama_decode`` of k tokens over a warm KV cache of the measured context, with the
logits of every position kept (what the speculative loop of llama-cpp-python asks for), the cache
rolled back after each; the draft step is one ``LlamaPromptLookupDecoding`` proposal over the context
(n-gram drafting) or one single-token decode of the draft model; the machinery's time is what
``Llama.generate`` spends outside the decodes and the draft, per plain step and per speculative round.
The same robustness rules as the transformers profile apply (:func:`analyzer.measuring.interference.checked_timings`):
starved repeats dropped, spread points re-measured, a verdict with notes.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter, process_time

import numpy as np

from analyzer.engine.llamacpp_engine import LlamaCppModel, context_size
from analyzer.engine.llamacpp_speculative import GreedyLlamaDraft, prompt_lookup, run_generate
from analyzer.engine.overhead import GenerateCallback, MachineryOverhead, retried_while_busy
from analyzer.measuring.cost import CostMeasurement, time_callable
from analyzer.measuring.interference import checked_timings, interleaved_repeats
from analyzer.models.devices import cpu_model_name

RepeatCallback = Callable[[], None]


def device_text(model: LlamaCppModel) -> str:
    """Where llama.cpp runs, as transformers' profiles say it: the CPU's name, the library, and the threads
    it decodes with (which change T_t(k) as much as the chip does, so profiles are reused per thread count)."""
    return (
        f"cpu: {cpu_model_name()}, llama-cpp-python {model._llama_cpp.__version__}, {model.threads} threads"
    )


def _trailing(context_ids: list[int], k: int) -> list[int]:
    n = len(context_ids)
    return [context_ids[(n - k + i) % n] for i in range(k)]


def _decode_matrix(
    model: LlamaCppModel,
    context_ids: list[int],
    ks: list[int],
    repeats: int,
    warmup: int,
    on_repeat: RepeatCallback | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`analyzer.measuring.interference.interleaved_repeats` of one decode of the last k context ids over the
    cached context, rolled back after each."""
    length = len(context_ids)

    def time_one(k: int) -> tuple[float, float]:
        model.rewind(length)
        tokens = _trailing(context_ids, k)
        cpu_start, start = process_time(), perf_counter()
        model.llm.eval(tokens)
        return perf_counter() - start, process_time() - cpu_start

    try:
        return interleaved_repeats(time_one, ks, repeats, warmup, on_repeat)
    finally:
        model.rewind(length)


def time_decodes_checked(
    model: LlamaCppModel,
    context_ids: list[int],
    k_max: int,
    *,
    repeats: int = 5,
    warmup: int = 1,
    on_repeat: RepeatCallback | None = None,
):
    """T(k) for k = 1..k_max of ``model`` over a warm cache of ``context_ids`` (decoded once here), and
    how trustworthy it is (:func:`analyzer.measuring.interference.checked_timings`)."""
    if k_max < 1:
        raise ValueError(f"k_max must be at least 1, got {k_max}")
    model.rewind(0)
    model.llm.eval(list(context_ids))

    def measure(ks: list[int], rounds_warmup: int):
        return _decode_matrix(model, context_ids, ks, repeats, rounds_warmup, on_repeat)

    return checked_timings(measure, k_max, warmup=warmup, threads=model.threads, on_cpu=True)


def time_prefill(model: LlamaCppModel, context_ids: list[int], repeats: int = 3) -> float:
    """Median seconds of decoding ``context_ids`` from an empty cache (the prompt's pass)."""

    def prefill() -> None:
        model.rewind(0)
        model.llm.eval(list(context_ids))

    return time_callable(prefill, repeats=repeats)


def profile_llamacpp_costs(
    target: LlamaCppModel,
    context_ids: list[int],
    k_max: int,
    *,
    draft: LlamaCppModel | None = None,
    ngram_max: int | None = None,
    repeats: int = 5,
    on_repeat: RepeatCallback | None = None,
    on_draft_repeat: RepeatCallback | None = None,
) -> CostMeasurement:
    """T_t(1..k_max) of the target and the draft step in llama.cpp over a cache of ``context_ids``
    (batch 1: llama-cpp-python runs one sequence per context). The verify passes run in a context
    that keeps every position's logits, as the speculating server's does; the draft step is one
    single-token decode of ``draft``, or one prompt lookup of llama-cpp-python (``ngram_max``) with a
    full lookahead over the context (its cost is per round, not per drafted token). The prompt's pass
    is timed in both contexts: ``target_prefill_s`` is the plain one's, and ``draft_prefill_s`` what the
    speculating deployment pays beyond it (its context keeps every position's logits, plus the draft
    model's own prompt pass), so S(g) weighs the request's whole time as the two servers spend it."""
    verifier = LlamaCppModel(
        target.path, n_ctx=context_size(len(context_ids), 0, k_max), threads=target.threads, logits_all=True
    )
    try:
        forward_s, quality = time_decodes_checked(
            verifier, context_ids, k_max, repeats=repeats, on_repeat=on_repeat
        )
        speculating_prefill_s = time_prefill(verifier, context_ids)
    finally:
        verifier.close()
    target_prefill_s = time_prefill(target, context_ids)
    # the speculating context computes and keeps the logits of every prompt position too: its prompt
    # pass costs more than the plain one's (10-30% on the embedded model), which the draft's share carries
    draft_prefill_s = max(0.0, speculating_prefill_s - target_prefill_s)
    if draft is not None:
        draft_forward_s, draft_quality = time_decodes_checked(
            draft, context_ids, 1, repeats=repeats, on_repeat=on_draft_repeat or on_repeat
        )
        draft_step_s = draft_forward_s[0]
        quality = quality.combined(draft_quality, "draft step")
        draft_prefill_s += time_prefill(draft, context_ids)
    else:
        lookup = prompt_lookup(max(1, k_max - 1), ngram_max or 2)
        ids = np.asarray(context_ids, dtype=np.intc)
        draft_step_s = time_callable(lambda: lookup(ids))
    return CostMeasurement(
        target_forward_s=forward_s,
        draft_step_s=draft_step_s,
        device=device_text(target),
        threads=target.threads,
        context_tokens=len(context_ids),
        repeats=repeats,
        target_prefill_s=target_prefill_s,
        draft_prefill_s=draft_prefill_s,
        batch_size=1,
        dtype=target.quantization,
        quality=quality,
    )


def measure_llamacpp_overhead(
    target: LlamaCppModel,
    context_ids: list[int],
    *,
    gamma: int,
    new_tokens: int = 32,
    draft: LlamaCppModel | None = None,
    ngram_max: int | None = None,
    repeats: int = 3,
    on_generate: GenerateCallback | None = None,
) -> MachineryOverhead:
    """What ``Llama.generate`` spends outside the target's decodes and the draft, per plain greedy step
    and per speculative round at lookahead ``gamma``, generating exactly ``new_tokens`` tokens (EOS
    ignored) ``repeats`` times each, alternating; medians. Measured again while other processes hold
    the CPU (:func:`analyzer.engine.overhead.retried_while_busy`); ``on_generate(attempt)`` is called after
    every timed generation (progress)."""
    n_ctx = context_size(len(context_ids), new_tokens, gamma)
    drafter = prompt_lookup(gamma, ngram_max or 2) if draft is None else GreedyLlamaDraft(draft, gamma)
    speculative = LlamaCppModel(
        target.path, n_ctx=n_ctx, threads=target.threads, logits_all=True, draft_model=drafter
    )

    def once(attempt: int) -> MachineryOverhead:
        decode: list[float] = []
        rounds: list[float] = []
        for r in range(repeats):
            for model in (target, speculative) if r % 2 == 0 else (speculative, target):
                run = run_generate(model, context_ids, new_tokens, eos_ids=[])
                outside = max(0.0, run.time_s - run.decode_s - run.draft_s) / max(run.passes, 1)
                (rounds if model is speculative else decode).append(outside)
                if on_generate:
                    on_generate(attempt)
        return MachineryOverhead(
            decode_s=float(np.median(decode)),
            round_s=float(np.median(rounds)),
            new_tokens=new_tokens,
            repeats=repeats,
        )

    try:
        return retried_while_busy(once)
    finally:
        speculative.close()
