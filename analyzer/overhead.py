"""The generation machinery's own time: what real ``generate()`` spends around the model forwards
per plain decoding step and per speculative round (candidate generation, acceptance bookkeeping,
cache cropping, logits processing). On a GPU, where a small model's step takes a few ms, leaving it
out made predictions for prompt lookup about 20% too optimistic.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from time import perf_counter

import numpy as np
import torch
from transformers import PreTrainedModel

from analyzer.cost import _synchronize
from analyzer.interference import EXTRA_ROUNDS, MAX_OTHERS_CPU, machine_reading, others_busy_s

# called after every timed generate() call of an overhead measurement, with the attempt's number (from 1)
GenerateCallback = Callable[[int], None]


@dataclass(frozen=True)
class MachineryOverhead:
    """Seconds per step spent outside the models' forwards, measured in real generate() calls at
    batch 1: `decode_s` per plain greedy step, `round_s` per speculative round (for prompt lookup
    without the lookup itself, which the draft step counts), over `new_tokens` tokens, `repeats`
    runs each (medians); `busy` notes interference seen while measuring (other processes' share of
    the machine above MAX_OTHERS_CPU in every attempt), else None."""

    decode_s: float
    round_s: float
    new_tokens: int
    repeats: int
    busy: str | None = None


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
    on_generate: GenerateCallback | None = None,
) -> MachineryOverhead:
    """The time real generate() spends around the forwards, per step, at batch 1.

    Runs plain greedy decoding and transformers' assisted generation (draft model, or prompt lookup
    with `ngram_max`) at lookahead `gamma` for exactly `new_tokens` tokens (EOS ignored) `repeats`
    times each, alternating; times every forward with :func:`timed_forwards`; and returns the wall
    time minus the forwards' time, per target forward pass (a greedy step, or a speculative round),
    medians over the repeats. For prompt lookup `lookup_s` (one lookup, timed alone as the draft step)
    is taken out of the round overhead so that it is not counted twice. Leaving this overhead out made
    GPU predictions for prompt lookup about 20% too optimistic. While other processes use more than
    MAX_OTHERS_CPU of the machine (/proc/stat) it is measured again, up to EXTRA_ROUNDS more times;
    if they still do, the result says so in ``busy`` (a busy machine once made it 92 ms per round
    against 6.5 ms quiet) and the profile that uses it counts as noisy. ``on_generate(attempt)`` is
    called after every timed generate() call (progress; ``attempt`` counts from 1).
    """
    if repeats < 1 or new_tokens < 1:
        raise ValueError(f"need repeats >= 1 and new_tokens >= 1, got {repeats} and {new_tokens}")
    models = (target_model,) + ((draft_model,) if draft_model is not None else ())
    return retried_while_busy(
        lambda attempt: _overhead_once(
            target_model,
            context_ids,
            models,
            gamma=gamma,
            new_tokens=new_tokens,
            draft_model=draft_model,
            ngram_max=ngram_max,
            lookup_s=lookup_s,
            repeats=repeats,
            on_generate=(lambda: on_generate(attempt)) if on_generate else None,
        )
    )


def retried_while_busy(measure_once: Callable[[int], MachineryOverhead]) -> MachineryOverhead:
    """``measure_once(attempt)`` (attempt 1, 2, ...), measured again while other processes use more
    than MAX_OTHERS_CPU of the machine (/proc/stat), up to EXTRA_ROUNDS more times; the last result
    notes it in ``busy`` when they always did. Shared by every engine's overhead measurement."""
    shares = []
    for attempt in range(1, 2 + EXTRA_ROUNDS):
        before, started = machine_reading(), perf_counter()
        measured = measure_once(attempt)
        used = others_busy_s(before, machine_reading())
        share = (
            min(1.0, used / ((perf_counter() - started) * (os.cpu_count() or 1)))
            if used is not None
            else None
        )
        shares.append(share)
        if share is None or share <= MAX_OTHERS_CPU:
            return measured
    return replace(
        measured,
        busy=f"machinery overhead: other processes used {min(shares):.0%} of the machine's CPU "
        f"in each of {len(shares)} attempts",
    )


def _overhead_once(
    target_model: PreTrainedModel,
    context_ids: list[int],
    models: tuple,
    *,
    gamma: int,
    new_tokens: int,
    draft_model: PreTrainedModel | None,
    ngram_max: int | None,
    lookup_s: float,
    repeats: int,
    on_generate: Callable[[], None] | None = None,
) -> MachineryOverhead:
    """One measurement of :func:`measure_machinery_overhead` (see there)."""
    from analyzer.validate import assisted_generate, greedy_generate

    if target_model.device.type == "cuda":  # both kinds of generate() once, untimed, at these shapes
        greedy_generate(target_model, context_ids, new_tokens, eos_token_id=[])
        assisted_generate(
            target_model,
            context_ids,
            new_tokens,
            gamma=gamma,
            draft_model=draft_model,
            ngram_max=ngram_max,
            eos_token_id=[],
        )
    decode, rounds = [], []
    for r in range(repeats):
        for speculative in (False, True) if r % 2 == 0 else (True, False):
            with timed_forwards(*models) as forward_times:
                _synchronize(target_model.device)
                start = perf_counter()
                if speculative:
                    _, passes = assisted_generate(
                        target_model,
                        context_ids,
                        new_tokens,
                        gamma=gamma,
                        draft_model=draft_model,
                        ngram_max=ngram_max,
                        eos_token_id=[],
                    )
                else:
                    _, passes = greedy_generate(target_model, context_ids, new_tokens, eos_token_id=[])
                _synchronize(target_model.device)
                outside = max(0.0, perf_counter() - start - sum(forward_times)) / max(passes, 1)
            if speculative:
                rounds.append(max(0.0, outside - lookup_s) if draft_model is None else outside)
            else:
                decode.append(outside)
            if on_generate:
                on_generate()
    return MachineryOverhead(
        decode_s=float(np.median(decode)),
        round_s=float(np.median(rounds)),
        new_tokens=new_tokens,
        repeats=repeats,
    )
