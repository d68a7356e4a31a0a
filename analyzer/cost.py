"""Measure the real cost of drafting and verifying on this device.

The cost model (DESIGN.md, "Cost model and speedup") needs T_t(k), the time of one target forward of
k new tokens over a warm KV cache, for k = 1..G, and T_d, the time of one draft step. Both are
measured here, never assumed: on a CPU T_t(k) is far from flat and not even monotonic in k.
"""

from __future__ import annotations

import inspect
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel


@dataclass(frozen=True)
class CostMeasurement:
    """Measured costs of one draft/target pair on one device.

    `target_forward_s[k - 1]` is the median seconds of one target forward of k new tokens over a warm
    KV cache of `context_tokens` tokens, for k = 1..k_max; `draft_step_s` is the median seconds of one
    draft step (one single-token draft forward, or one n-gram lookup, or 0.0 when nothing was timed);
    `target_prefill_s` / `draft_prefill_s` the median seconds of processing the whole context from an
    empty cache (the prompt's share of a request; 0.0 for prompt lookup's draft).
    """

    target_forward_s: list[float]
    draft_step_s: float
    device: str
    threads: int
    context_tokens: int
    repeats: int
    target_prefill_s: float = 0.0
    draft_prefill_s: float = 0.0


def _cpu_model_name() -> str:
    """The CPU's model name from /proc/cpuinfo, or what the platform module knows elsewhere."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown cpu"


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
        return f"cpu: {_cpu_model_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    return f"{device.type}, torch {torch.__version__}"


def _synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that a timer read afterwards includes it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cache_argument(model: PreTrainedModel) -> str:
    """Name of the forward() argument that takes the KV cache (`cache` in transformers 5,
    `past_key_values` before)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def prefill_cache(model: PreTrainedModel, context_ids: list[int]) -> DynamicCache:
    """Run one forward over `context_ids` and return the filled `DynamicCache` of len(context_ids)
    positions. Past recording is switched on so that sliding-window or linear-attention layers can be
    cropped back, as assisted generation does."""
    if not context_ids:
        raise ValueError("context_ids must not be empty")
    cache = DynamicCache(config=model.config)
    input_ids = torch.tensor([context_ids], dtype=torch.long, device=model.device)
    with torch.inference_mode():
        model(input_ids=input_ids, use_cache=True, **{_cache_argument(model): cache})
    cache.activate_past_recording()
    return cache


def _crop_to(cache: DynamicCache, length: int) -> None:
    """Drop cached positions beyond `length` (transformers 5 crops by a negative count to remove)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def time_forward_over_cache(model: PreTrainedModel, cache: DynamicCache, new_ids: list[int]) -> float:
    """Seconds of one forward of `new_ids` (k = len(new_ids) new tokens) on top of `cache`; the cache is
    cropped back to its previous length afterwards, so it is left exactly as it was found."""
    length = cache.get_seq_length()
    input_ids = torch.tensor([new_ids], dtype=torch.long, device=model.device)
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
    model: PreTrainedModel, context_ids: list[int], k_max: int, *, repeats: int = 5, warmup: int = 1
) -> list[float]:
    """Median seconds of one forward of k new tokens over a warm KV cache of `context_ids`, k = 1..k_max.

    Returns T_t(k) as a list whose index k-1 holds k. The context is prefilled once; every timed forward
    of the last k context ids then runs on that same cache and is cropped back, so all timings see
    len(context_ids) cached positions. The k values are interleaved within each repeat (for r: for k),
    so slow drift of the machine (thermal, other load) affects every k alike; `warmup` untimed rounds
    of the same shape come first.
    """
    if k_max < 1:
        raise ValueError(f"k_max must be at least 1, got {k_max}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    cache = prefill_cache(model, context_ids)
    timings = np.empty((repeats, k_max))
    for r in range(warmup + repeats):
        for k in range(1, k_max + 1):
            elapsed = time_forward_over_cache(model, cache, _trailing_ids(context_ids, k))
            if r >= warmup:
                timings[r - warmup, k - 1] = elapsed
    return [float(t) for t in np.median(timings, axis=0)]


def time_draft_model_step(draft_model: PreTrainedModel, context_ids: list[int], *, repeats: int = 5) -> float:
    """Median seconds of one draft step: a single-token forward of the draft over a warm cache of
    `context_ids` (T_d for a model draft; one untimed warm-up step first)."""
    return time_target_forwards(draft_model, context_ids, 1, repeats=repeats)[0]


def time_prefill(model: PreTrainedModel, context_ids: list[int], *, repeats: int = 3) -> float:
    """Median seconds of processing `context_ids` from an empty cache (prompt prefill), after one
    untimed warm-up."""
    return time_callable(lambda: prefill_cache(model, context_ids), repeats=repeats)


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
) -> CostMeasurement:
    """Measure T_t(1..k_max) of the target and T_d of the draft over a cache of `context_ids`.

    T_d comes from `draft_model` (one single-token forward) when given, else from the callable
    `draft_step` (an n-gram lookup, timed with `time_callable`'s own repeat count since it is cheap),
    else it is 0.0. Giving both is ambiguous and raises ValueError.
    """
    if draft_model is not None and draft_step is not None:
        raise ValueError("give draft_model or draft_step, not both")
    target_forward_s = time_target_forwards(target_model, context_ids, k_max, repeats=repeats)
    target_prefill_s = time_prefill(target_model, context_ids)
    draft_prefill_s = 0.0
    if draft_model is not None:
        draft_step_s = time_draft_model_step(draft_model, context_ids, repeats=repeats)
        draft_prefill_s = time_prefill(draft_model, context_ids)
    elif draft_step is not None:
        draft_step_s = time_callable(draft_step)
    else:
        draft_step_s = 0.0
    return CostMeasurement(
        target_prefill_s=target_prefill_s,
        draft_prefill_s=draft_prefill_s,
        target_forward_s=target_forward_s,
        draft_step_s=draft_step_s,
        device=device_description(target_model),
        threads=torch.get_num_threads(),
        context_tokens=len(context_ids),
        repeats=repeats,
    )
