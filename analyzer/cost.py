"""Measure the real cost of drafting and verifying on this device.

The cost model (DESIGN.md, "Cost model and speedup") needs T_t(k, b), the time of one target forward
of k new tokens for each of b sequences over a warm KV cache, for k = 1..G+1 and each batch size b,
T_d, the time of one draft step, and the per-step time of the generation machinery around the
forwards (candidate generation, acceptance bookkeeping, logits processing), which on a GPU is
comparable to a small model's forward. All are measured here, never assumed: on a CPU T_t(k) is far
from flat and not even monotonic in k, on a GPU it is nearly flat up to batch 16.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from time import perf_counter

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel

from analyzer.devices import cpu_model_name


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


@dataclass(frozen=True)
class MachineryOverhead:
    """Seconds per step spent outside the models' forwards, measured in real generate() calls at
    batch 1: `decode_s` per plain greedy step, `round_s` per speculative round (for prompt lookup
    without the lookup itself, which the draft step counts), over `new_tokens` tokens, `repeats`
    runs each (medians)."""

    decode_s: float
    round_s: float
    new_tokens: int
    repeats: int


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


def time_forward_over_cache(model: PreTrainedModel, cache: DynamicCache, new_ids: list[int],
                            batch_size: int = 1) -> float:
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
    model: PreTrainedModel, context_ids: list[int], k_max: int, *, repeats: int = 5, warmup: int = 1,
    batch_size: int = 1,
) -> list[float]:
    """Median seconds of one forward of k new tokens over a warm KV cache of `context_ids`, k = 1..k_max,
    for `batch_size` sequences at once (T_t(k, b)).

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
    cache = prefill_cache(model, context_ids, batch_size)
    timings = np.empty((repeats, k_max))
    for r in range(warmup + repeats):
        for k in range(1, k_max + 1):
            elapsed = time_forward_over_cache(model, cache, _trailing_ids(context_ids, k), batch_size)
            if r >= warmup:
                timings[r - warmup, k - 1] = elapsed
    return [float(t) for t in np.median(timings, axis=0)]


def time_draft_model_step(draft_model: PreTrainedModel, context_ids: list[int], *, repeats: int = 5,
                          batch_size: int = 1) -> float:
    """Median seconds of one draft step: a single-token forward of the draft over a warm cache of
    `context_ids` for `batch_size` sequences (T_d for a model draft; one untimed warm-up step first)."""
    return time_target_forwards(draft_model, context_ids, 1, repeats=repeats, batch_size=batch_size)[0]


def time_prefill(model: PreTrainedModel, context_ids: list[int], *, repeats: int = 3, batch_size: int = 1) -> float:
    """Median seconds of processing `context_ids` (for `batch_size` sequences) from an empty cache
    (prompt prefill), after one untimed warm-up."""

    def prefill() -> None:
        prefill_cache(model, context_ids, batch_size)
        _synchronize(model.device)

    return time_callable(prefill, repeats=repeats)


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
) -> CostMeasurement:
    """Measure T_t(1..k_max, b) of the target and T_d of the draft over a cache of `context_ids`, for
    b = `batch_size` sequences at once.

    T_d comes from `draft_model` (one single-token forward of b rows) when given, else from the
    callable `draft_step` (one n-gram lookup, timed with `time_callable`'s own repeat count since it
    is cheap; each of the b sequences looks up its own, so T_d = b lookups), else it is 0.0. Giving
    both is ambiguous and raises ValueError.
    """
    if draft_model is not None and draft_step is not None:
        raise ValueError("give draft_model or draft_step, not both")
    target_forward_s = time_target_forwards(target_model, context_ids, k_max, repeats=repeats, batch_size=batch_size)
    target_prefill_s = time_prefill(target_model, context_ids, batch_size=batch_size)
    draft_prefill_s = 0.0
    if draft_model is not None:
        draft_step_s = time_draft_model_step(draft_model, context_ids, repeats=repeats, batch_size=batch_size)
        draft_prefill_s = time_prefill(draft_model, context_ids, batch_size=batch_size)
    elif draft_step is not None:
        draft_step_s = batch_size * time_callable(draft_step)
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
        batch_size=batch_size,
        dtype=str(next(target_model.parameters()).dtype).removeprefix("torch."),
    )


@contextlib.contextmanager
def timed_forwards(*models: torch.nn.Module) -> Iterator[list[float]]:
    """Inside the block, append the seconds of every forward call of each model (top-level module)
    to the yielded list; GPU work is synchronised at both ends of each call, so the times are the
    forwards' own. The hooks are removed on exit, even when the block raises."""
    times: list[float] = []
    started: dict[int, float] = {}
    handles = []

    def before(module, args):
        _synchronize(next(module.parameters()).device)
        started[id(module)] = perf_counter()

    def after(module, args, output):
        _synchronize(next(module.parameters()).device)
        times.append(perf_counter() - started.pop(id(module), perf_counter()))

    for model in models:  # first in, last out: other hooks on the model count as its forward
        handles += [model.register_forward_pre_hook(before, prepend=True), model.register_forward_hook(after)]
    try:
        yield times
    finally:
        for handle in handles:
            handle.remove()


def measure_machinery_overhead(
    target_model: PreTrainedModel,
    context_ids: list[int],
    *,
    gamma: int,
    new_tokens: int = 32,
    draft_model: PreTrainedModel | None = None,
    ngram_max: int | None = None,
    lookup_s: float = 0.0,
    repeats: int = 3,
) -> MachineryOverhead:
    """The time real generate() spends around the forwards, per step, at batch 1.

    Runs plain greedy decoding and transformers' assisted generation (draft model, or prompt lookup
    with `ngram_max`) at lookahead `gamma` for exactly `new_tokens` tokens (EOS ignored) `repeats`
    times each, alternating; times every forward with :func:`timed_forwards`; and returns the wall
    time minus the forwards' time, per target forward pass (a greedy step, or a speculative round),
    medians over the repeats. For prompt lookup `lookup_s` (one lookup, timed alone as the draft step)
    is taken out of the round overhead so that it is not counted twice. Leaving this overhead out made
    GPU predictions for prompt lookup about 20% too optimistic.
    """
    from analyzer.validate import assisted_generate, greedy_generate

    if repeats < 1 or new_tokens < 1:
        raise ValueError(f"need repeats >= 1 and new_tokens >= 1, got {repeats} and {new_tokens}")
    models = (target_model,) + ((draft_model,) if draft_model is not None else ())
    decode, rounds = [], []
    for r in range(repeats):
        for speculative in ((False, True) if r % 2 == 0 else (True, False)):
            with timed_forwards(*models) as forward_times:
                _synchronize(target_model.device)
                start = perf_counter()
                if speculative:
                    _, passes = assisted_generate(target_model, context_ids, new_tokens, gamma=gamma,
                                                  draft_model=draft_model, ngram_max=ngram_max, eos_token_id=[])
                else:
                    _, passes = greedy_generate(target_model, context_ids, new_tokens, eos_token_id=[])
                _synchronize(target_model.device)
                outside = max(0.0, perf_counter() - start - sum(forward_times)) / max(passes, 1)
            if speculative:
                rounds.append(max(0.0, outside - lookup_s) if draft_model is None else outside)
            else:
                decode.append(outside)
    return MachineryOverhead(decode_s=float(np.median(decode)), round_s=float(np.median(rounds)),
                             new_tokens=new_tokens, repeats=repeats)
