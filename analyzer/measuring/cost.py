"""Measure the real cost of drafting and verifying on this device.

The cost model (DESIGN.md, "Cost model and speedup") needs T_t(k, b), the time of one target forward
of k new tokens for each of b sequences over a warm KV cache, for k = 1..G+1 and each batch size b,
and T_d, the time of one draft step. Both are measured here, never assumed: on a CPU T_t(k) is far
from flat and not even monotonic in k, on a GPU it is nearly flat up to batch 16. Timings are judged
for interference as they are taken (:mod:`analyzer.measuring.interference`); the machinery's own time around
the forwards is :mod:`analyzer.engine.overhead`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from time import perf_counter, process_time

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel

from analyzer.measuring.interference import TimingQuality, checked_timings, interleaved_repeats
from analyzer.models.devices import cpu_model_name


@dataclass(frozen=True)
class CostMeasurement:
    """Measured costs of one draft/target pair on one device.

    `target_forward_s[k - 1]` is the median seconds of one target forward of k new tokens over a warm
    KV cache of `context_tokens` tokens, for k = 1..k_max; `draft_step_s` is the median seconds of one
    draft step (one single-token draft forward, or one n-gram lookup, or 0.0 when nothing was timed);
    `target_prefill_s` / `draft_prefill_s` the median seconds of processing the whole context from an
    empty cache (the prompt's share of a request; 0.0 for prompt lookup's draft). Every figure is for
    `batch_size` sequences at once, in the model's `dtype`.
    """

    target_forward_s: list[float]
    draft_step_s: float
    device: str
    threads: int
    context_tokens: int
    repeats: int
    target_prefill_s: float = 0.0
    draft_prefill_s: float = 0.0
    batch_size: int = 1
    dtype: str = "float32"
    quality: TimingQuality | None = None
    # measured again over a longer cache (:func:`with_context_slopes`): its length, and the seconds each
    # T_t(k) and the draft step add per token of context (None: one context measured)
    long_context_tokens: int | None = None
    context_slope_s: list[float] | None = None
    draft_context_slope_s: float | None = None
    # scaled to the target's own forwards in real generation (:func:`calibrated_to_generate`): for each k
    # seen there, its median over the timed T_t(k) at the same context (None: not calibrated)
    generate_ratio: dict[int, float] | None = None


# a ratio of generate()'s forward to the timed T_t(k) outside this range says the two measured different
# things (a busy moment, another shape): that k calibrates nothing
GENERATE_RATIO_RANGE = (0.67, 1.5)


def calibrated_to_generate(
    base: CostMeasurement, forward_s: dict[int, float], context_tokens: float
) -> CostMeasurement:
    """``base`` with each T_t(k) scaled to what the target's forwards take inside real generation.

    The profile times each k's forward in turn over one cache (k = 1..k_max interleaved, so that drift hits
    every k alike); generation runs the same shapes back to back. On a 2-core Xeon with SmolLM2-135M the
    plain step inside ``generate()`` took 0.956 of the timed T_t(1) and a gamma-6 round's 7-token forward
    1.00 of T_t(7) (8 prompts, 64 tokens; benchmarks/README.md), so plain decoding was priced 4.5% dear
    against speculation and gamma 6 was over-predicted by 3.6-4.5%. ``forward_s`` are those forwards'
    medians by k (:attr:`analyzer.engine.overhead.MachineryOverhead.forward_s`), taken over a cache of
    about ``context_tokens`` (the timed T_t(k) is moved there along the profile's slopes first). Each k seen
    gets its ratio; a k between two seen ones the ratio interpolated between them, beyond the largest the
    largest's; below the smallest seen k (or with only one seen) nothing changes there. The result stays
    non-decreasing in k."""
    timed = np.asarray(base.target_forward_s, dtype=np.float64)
    slopes = np.asarray(base.context_slope_s or [0.0] * len(timed), dtype=np.float64)
    at_context = timed + slopes * (context_tokens - base.context_tokens)
    low, high = GENERATE_RATIO_RANGE
    ratios = {
        k: float(seconds / at_context[k - 1])
        for k, seconds in sorted(forward_s.items())
        if 1 <= k <= len(timed) and at_context[k - 1] > 0 and low <= seconds / at_context[k - 1] <= high
    }
    if not ratios:
        return base
    seen = sorted(ratios)
    ks = np.arange(1, len(timed) + 1)
    scale = np.interp(ks, seen, [ratios[k] for k in seen])
    if len(seen) == 1:  # one k seen: that k alone
        scale = np.where(ks == seen[0], scale, 1.0)
    scale = np.where(ks < seen[0], 1.0, scale)
    calibrated = np.maximum.accumulate(timed * scale)
    return replace(
        base,
        target_forward_s=[float(t) for t in calibrated],
        generate_ratio={k: round(r, 4) for k, r in ratios.items()},
    )


def with_context_slopes(base: CostMeasurement, long: CostMeasurement) -> CostMeasurement:
    """``base`` with the slopes from it to ``long``, the same measurement over a longer cache: per token of
    context, what each T_t(k) and the draft step add. Each k's own slope (its difference over the span), never
    negative and never below a smaller k's (more rows attend over the same context): measured, the slope grows
    from k = 1 to k = 4 and then saturates (7.7, 21 and 22 µs per token at k = 1, 4, 7 for SmolLM2-135M on a
    2-core Xeon), which a slope linear in k does not follow. ``long``'s timing quality is folded into base's."""
    span = long.context_tokens - base.context_tokens
    if span <= 0:
        raise ValueError(f"the long context ({long.context_tokens}) is not longer than {base.context_tokens}")
    differences = np.asarray(long.target_forward_s, dtype=np.float64) - np.asarray(base.target_forward_s)
    slopes = [float(v) for v in np.maximum.accumulate(np.maximum(differences / span, 0.0))]
    quality = base.quality
    if quality is not None and long.quality is not None:
        quality = quality.combined(long.quality, f"at {long.context_tokens} tokens of context")
    return replace(
        base,
        long_context_tokens=long.context_tokens,
        context_slope_s=slopes,
        draft_context_slope_s=max(0.0, (long.draft_step_s - base.draft_step_s) / span),
        quality=quality,
    )


# Interference thresholds, from this project's 2-core machine: quiet, a forward's process CPU time is
# 0.92-0.99 of wall time x threads and other processes use 0-2% of the CPUs; with one other busy
# process, 0.51-0.73 and 37% (and every forward took twice as long).


def device_description(model: PreTrainedModel) -> str:
    """Describe the device the model's weights live on, for labelling a cost profile.

    A CUDA model gives the GPU's name, e.g. "cuda: NVIDIA H100 80GB HBM3, torch 2.13.0"; a CPU model gives
    the CPU model name and the number of threads torch uses, e.g. "cpu: AMD EPYC 7763 64-Core Processor,
    torch 2.13.0, 2 threads", because on a CPU the thread count changes T_t(k) as much as the chip does.
    """
    device = model.device
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    if device.type == "cpu":
        return f"cpu: {cpu_model_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    return f"{device.type}, torch {torch.__version__}"


def _synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that a timer read afterwards includes it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cache_argument(model: PreTrainedModel) -> str:
    """Name of the forward() argument that takes the KV cache (`cache` in transformers 5,
    `past_key_values` before)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def prefill_cache(model: PreTrainedModel, context_ids: list[int], batch_size: int = 1) -> DynamicCache:
    """Run one forward over `context_ids` (repeated for `batch_size` rows) and return the filled
    `DynamicCache` of len(context_ids) positions. Past recording is switched on so that sliding-window
    or linear-attention layers can be cropped back, as assisted generation does."""
    if not context_ids:
        raise ValueError("context_ids must not be empty")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    cache = DynamicCache(config=model.config)
    input_ids = torch.tensor([context_ids] * batch_size, dtype=torch.long, device=model.device)
    with torch.inference_mode():
        model(input_ids=input_ids, use_cache=True, **{_cache_argument(model): cache})
    cache.activate_past_recording()
    return cache


def _crop_to(cache: DynamicCache, length: int) -> None:
    """Drop cached positions beyond `length` (transformers 5 crops by a negative count to remove)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def time_forward_over_cache(
    model: PreTrainedModel, cache: DynamicCache, new_ids: list[int], batch_size: int = 1
) -> float:
    """Seconds of one forward of `new_ids` (k = len(new_ids) new tokens, for each of `batch_size` rows,
    which must match the cache's rows) on top of `cache`; the cache is cropped back to its previous
    length afterwards, so it is left exactly as it was found."""
    length = cache.get_seq_length()
    input_ids = torch.tensor([new_ids] * batch_size, dtype=torch.long, device=model.device)
    kwargs = {_cache_argument(model): cache}
    try:
        with torch.inference_mode():
            _synchronize(model.device)
            start = perf_counter()
            model(input_ids=input_ids, use_cache=True, **kwargs)
            _synchronize(model.device)
            elapsed = perf_counter() - start
    finally:
        _crop_to(cache, length)
    return elapsed


def _trailing_ids(context_ids: list[int], k: int) -> list[int]:
    """The last k context ids (real tokens for a realistic forward), cycled when the context is shorter."""
    n = len(context_ids)
    return [context_ids[(n - k + i) % n] for i in range(k)]


def time_target_forwards(
    model: PreTrainedModel,
    context_ids: list[int],
    k_max: int,
    *,
    repeats: int = 5,
    warmup: int = 1,
    batch_size: int = 1,
) -> list[float]:
    """Median seconds of one forward of k new tokens over a warm KV cache of `context_ids`, k = 1..k_max,
    for `batch_size` sequences at once (T_t(k, b)); see :func:`time_target_forwards_checked`, which
    also says how trustworthy the numbers are."""
    return time_target_forwards_checked(
        model, context_ids, k_max, repeats=repeats, warmup=warmup, batch_size=batch_size
    )[0]


RepeatCallback = Callable[[], None]
# times T(k) for k = 1..k_max of a model over a context and judges them: the eager
# time_target_forwards_checked, or analyzer.engine.graph_cost's replayed CUDA graphs (the cuda-graphs mode)
ForwardsTimer = Callable[..., "tuple[list[float], TimingQuality]"]


def _timing_matrix(
    model: PreTrainedModel,
    cache: DynamicCache,
    context_ids: list[int],
    ks: list[int],
    repeats: int,
    warmup: int,
    batch_size: int,
    on_repeat: RepeatCallback | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`analyzer.measuring.interference.interleaved_repeats` of one forward of the last k context ids over
    ``cache`` for each k in ``ks``."""

    def time_one(k: int) -> tuple[float, float]:
        cpu_start = process_time()
        elapsed = time_forward_over_cache(model, cache, _trailing_ids(context_ids, k), batch_size)
        return elapsed, process_time() - cpu_start

    return interleaved_repeats(time_one, ks, repeats, warmup, on_repeat)


def check_timing_arguments(k_max: int, repeats: int, warmup: int) -> None:
    """ValueError unless k_max >= 1, repeats >= 1 and warmup >= 0 (every T(k) timer checks these)."""
    if k_max < 1:
        raise ValueError(f"k_max must be at least 1, got {k_max}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")


def time_target_forwards_checked(
    model: PreTrainedModel,
    context_ids: list[int],
    k_max: int,
    *,
    repeats: int = 5,
    warmup: int = 1,
    batch_size: int = 1,
    on_repeat: RepeatCallback | None = None,
) -> tuple[list[float], TimingQuality]:
    """T_t(k, b) for k = 1..k_max, and how trustworthy it is.

    The context is prefilled once; every timed forward of the last k context ids then runs on that
    same cache and is cropped back, so all timings see len(context_ids) cached positions. The k values
    are interleaved within each repeat (for r: for k), so slow drift of the machine affects every k
    alike; `warmup` untimed rounds of the same shape come first. Each T_t(k) is the median of its
    repeats. A repeat in which our process got less process CPU time per wall second than MIN_CPU_SHARE
    of its best repeats (on a CPU), or in which other processes used more than MAX_OTHERS_CPU of the
    machine (from /proc/stat), is dropped. A point is hit by
    interference when its remaining repeats spread more than SPREAD_TOLERANCE (relative median absolute
    deviation beyond MIN_SPREAD_S of jitter), or when fewer than half the repeats were clean; hit
    points are measured again (up to EXTRA_ROUNDS more rounds of `repeats`, only those k), keeping the
    cleaner round. The verdict is noisy when a point is still hit after that, or when other processes
    used more than MAX_OTHERS_CPU of the machine's CPU during the repeats kept; the profile then says
    so and is not reused silently. ``on_repeat`` is called after every pass over the k values (for
    progress).
    """
    check_timing_arguments(k_max, repeats, warmup)
    threads = max(1, torch.get_num_threads())
    on_cpu = model.device.type == "cpu"
    cache = prefill_cache(model, context_ids, batch_size)

    def measure(ks: list[int], rounds_warmup: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _timing_matrix(model, cache, context_ids, ks, repeats, rounds_warmup, batch_size, on_repeat)

    return checked_timings(measure, k_max, warmup=warmup, threads=threads, on_cpu=on_cpu)


def time_draft_model_step(
    draft_model: PreTrainedModel, context_ids: list[int], *, repeats: int = 5, batch_size: int = 1
) -> float:
    """Median seconds of one draft step: a single-token forward of the draft over a warm cache of
    `context_ids` for `batch_size` sequences (T_d for a model draft; one untimed warm-up step first)."""
    return time_target_forwards(draft_model, context_ids, 1, repeats=repeats, batch_size=batch_size)[0]


def time_prefill(
    model: PreTrainedModel, context_ids: list[int], *, repeats: int = 3, batch_size: int = 1
) -> float:
    """Median seconds of processing `context_ids` (for `batch_size` sequences) from an empty cache
    (prompt prefill), after untimed warm-ups (:func:`warmup_rounds`)."""

    def prefill() -> None:
        prefill_cache(model, context_ids, batch_size)
        _synchronize(model.device)

    return time_callable(prefill, repeats=repeats, warmup=warmup_rounds(model))


# untimed rounds of every timed shape before timing on a GPU: CUDA work that runs for the first time
# (kernel selection, allocator growth, new shapes) can make a cold batch-1 step 24.8 ms against 16.9 ms
# warm at batch 4, and a first validation 0.65x against 1.01x in a later run of the same process
GPU_WARMUP_ROUNDS = 3


def warmup_rounds(model: PreTrainedModel) -> int:
    """Untimed rounds before timing ``model``: GPU_WARMUP_ROUNDS on a GPU, 1 elsewhere."""
    return GPU_WARMUP_ROUNDS if model.device.type == "cuda" else 1


def time_callable(fn: Callable[[], object], *, repeats: int = 20, warmup: int = 1) -> float:
    """Median seconds of one call of `fn()` over `repeats` timed calls after `warmup` untimed ones;
    used for the cost of an n-gram lookup, which stands in for the draft step of model-free drafting."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    for _ in range(warmup):
        fn()
    timings = []
    for _ in range(repeats):
        start = perf_counter()
        fn()
        timings.append(perf_counter() - start)
    return float(np.median(timings))


def profile_costs(
    target_model: PreTrainedModel,
    context_ids: list[int],
    k_max: int,
    *,
    draft_model: PreTrainedModel | None = None,
    draft_step: Callable[[], object] | None = None,
    repeats: int = 5,
    batch_size: int = 1,
    on_repeat: RepeatCallback | None = None,
    forwards_checked: ForwardsTimer | None = None,
    on_draft_repeat: RepeatCallback | None = None,
) -> CostMeasurement:
    """Measure T_t(1..k_max, b) of the target and T_d of the draft over a cache of `context_ids`, for
    b = `batch_size` sequences at once.

    T_d comes from `draft_model` (one single-token forward of b rows) when given, else from the
    callable `draft_step` (one n-gram lookup, timed with `time_callable`'s own repeat count since it
    is cheap; each of the b sequences looks up its own, so T_d = b lookups), else it is 0.0. Giving
    both is ambiguous and raises ValueError. ``on_repeat`` is called after every timed pass of the
    target (progress: its warm-up and ``repeats`` passes, more when re-measuring), and
    ``on_draft_repeat`` (default ``on_repeat``) after every one of a draft model.
    The forwards are timed by ``forwards_checked`` (default: eager forwards,
    :func:`time_target_forwards_checked`; the cuda-graphs mode passes replayed graphs); the prefills
    are eager in either mode, as engines run them.
    """
    if draft_model is not None and draft_step is not None:
        raise ValueError("give draft_model or draft_step, not both")
    forwards_checked = forwards_checked or time_target_forwards_checked
    warmup = warmup_rounds(target_model)  # every k, the draft step and the prefill, at this batch size
    timed = partial(forwards_checked, repeats=repeats, warmup=warmup, batch_size=batch_size)
    target_forward_s, quality = timed(target_model, context_ids, k_max, on_repeat=on_repeat)
    target_prefill_s = time_prefill(target_model, context_ids, batch_size=batch_size)
    draft_step_s, draft_prefill_s, draft_quality = _draft_costs(
        draft_model, draft_step, context_ids, timed, warmup, batch_size, on_draft_repeat or on_repeat
    )
    if draft_quality is not None:
        quality = quality.combined(draft_quality, "draft step")
    return CostMeasurement(
        target_prefill_s=target_prefill_s,
        draft_prefill_s=draft_prefill_s,
        target_forward_s=target_forward_s,
        draft_step_s=draft_step_s,
        device=device_description(target_model),
        threads=torch.get_num_threads(),
        context_tokens=len(context_ids),
        repeats=repeats,
        batch_size=batch_size,
        dtype=str(next(target_model.parameters()).dtype).removeprefix("torch."),
        quality=quality,
    )


def _draft_costs(
    draft_model: PreTrainedModel | None,
    draft_step: Callable[[], object] | None,
    context_ids: list[int],
    timed: ForwardsTimer,
    warmup: int,
    batch_size: int,
    on_repeat: RepeatCallback | None,
) -> tuple[float, float, TimingQuality | None]:
    """(T_d, the draft's prefill seconds, a draft model's timing quality) for :func:`profile_costs`."""
    if draft_model is not None:
        draft_forward_s, draft_quality = timed(draft_model, context_ids, 1, on_repeat=on_repeat)
        draft_prefill_s = time_prefill(draft_model, context_ids, batch_size=batch_size)
        return draft_forward_s[0], draft_prefill_s, draft_quality
    if draft_step is not None:
        return batch_size * time_callable(draft_step, warmup=warmup), 0.0, None
    return 0.0, 0.0, None
