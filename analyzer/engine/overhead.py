"""The generation machinery's own time: what real ``generate()`` spends around the model forwards
per plain decoding step and per speculative round (candidate generation, acceptance bookkeeping,
cache cropping, logits processing). On a GPU, where a small model's step takes a few ms, leaving it
out made predictions for prompt lookup about 20% too optimistic.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from time import perf_counter
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers import PreTrainedModel

if TYPE_CHECKING:
    from analyzer.engine.graph_cost import GraphDecoder

from analyzer.measuring.cost import _synchronize
from analyzer.measuring.interference import (
    EXTRA_ROUNDS,
    MAX_OTHERS_CPU,
    machine_reading,
    others_busy_s,
    still_busy,
)

# called after every timed generate() call of an overhead measurement, with the attempt's number (from 1)
GenerateCallback = Callable[[int], None]
# A run's overhead measurement (each engine's LoadedPair.measure_overhead; analyzer/pricing/run_costs.py plans
# its progress): at this lookahead, or at the run's gamma_max when that is smaller
OVERHEAD_GAMMA = 4
# each timed generation of the overhead measurement makes this many tokens (or max_new_tokens, when fewer)
OVERHEAD_NEW_TOKENS = 32
# ... and it times this many plain and as many speculative generations (one attempt; a busy machine retries)
OVERHEAD_REPEATS = 3
# a target forward of k tokens seen in those generations at least this often has its median kept
# (MachineryOverhead.forward_s): a lookahead that prompt lookup rarely fills is not judged on a few forwards
MIN_FORWARDS_SEEN = 8


@dataclass(frozen=True)
class MachineryOverhead:
    """Seconds per step spent outside the models' forwards, measured in real generate() calls at
    batch 1: `decode_s` per plain greedy step, `round_s` per speculative round (for prompt lookup
    without the lookup itself, which the draft step counts), over `new_tokens` tokens, `repeats`
    runs each (medians); `busy` notes interference seen while measuring (other processes' share of
    the machine above MAX_OTHERS_CPU in every attempt), else None. ``forward_s``: the median seconds of
    the target's own forwards of k tokens in those generations (the prompt's prefill left out), for each k
    seen at least MIN_FORWARDS_SEEN times; empty where they were not recorded (the cuda-graphs mode)."""

    decode_s: float
    round_s: float
    new_tokens: int
    repeats: int
    busy: str | None = None
    forward_s: dict[int, float] = field(default_factory=dict)


@contextlib.contextmanager
def sized_forwards(model: torch.nn.Module) -> Iterator[list[tuple[int, float]]]:
    """Inside the block, append (new tokens k, seconds) of every forward call of ``model`` to the
    yielded list, k read from its ``input_ids``; GPU work is synchronised at both ends. The hooks are
    removed on exit."""
    seen: list[tuple[int, float]] = []
    started: list[tuple[int, float]] = []

    def before(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        _synchronize(next(module.parameters()).device)
        started.append((int(ids.shape[-1]) if ids is not None else 0, perf_counter()))

    def after(module, args, kwargs, output):
        _synchronize(next(module.parameters()).device)
        k, start = started.pop()
        seen.append((k, perf_counter() - start))

    handles = [  # first in, last out: other hooks on the model count as its forward
        model.register_forward_pre_hook(before, with_kwargs=True, prepend=True),
        model.register_forward_hook(after, with_kwargs=True),
    ]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def forward_medians(seen: list[tuple[int, float]], at_least: int = MIN_FORWARDS_SEEN) -> dict[int, float]:
    """The median seconds per k of ``seen`` (k, seconds) forwards, for each k seen ``at_least`` times."""
    by_k: dict[int, list[float]] = {}
    for k, seconds in seen:
        by_k.setdefault(k, []).append(seconds)
    return {k: float(np.median(v)) for k, v in sorted(by_k.items()) if k >= 1 and len(v) >= at_least}


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
    if they still do, the result says so in ``busy`` (a busy machine can make it 92 ms per round
    against 6.5 ms quiet) and the profile that uses it counts as noisy. ``on_generate(attempt)`` is
    called after every timed generate() call (progress; ``attempt`` counts from 1).
    """
    if repeats < 1 or new_tokens < 1:
        raise ValueError(f"need repeats >= 1 and new_tokens >= 1, got {repeats} and {new_tokens}")
    models = (target_model,) + ((draft_model,) if draft_model is not None else ())
    calls: list[list[tuple[int, float]]] = []  # each generate() call's target forwards
    measured = overhead_of(
        _generate_call(target_model, context_ids, new_tokens, gamma, draft_model, ngram_max, calls),
        lambda: timed_forwards(*models),
        target_model.device,
        new_tokens=new_tokens,
        lookup_s=lookup_s if draft_model is None else 0.0,
        repeats=repeats,
        on_generate=on_generate,
    )
    if measured.busy:  # forwards slowed by other processes calibrate nothing
        return measured
    # the timed calls of the attempt kept (a busy attempt before it measured again)
    return replace(measured, forward_s=forward_medians([f for call in calls[-2 * repeats :] for f in call]))


def _generate_call(
    target_model: PreTrainedModel,
    context_ids: list[int],
    new_tokens: int,
    gamma: int,
    draft_model: PreTrainedModel | None,
    ngram_max: int | None,
    calls: list[list[tuple[int, float]]],
) -> Callable[[bool], int]:
    """``generate(speculative)`` for :func:`overhead_of`: plain greedy or assisted generation of exactly
    ``new_tokens`` tokens, its target passes returned and its target forwards after the first appended to
    ``calls`` (the first holds the prompt and, speculating, the first draft)."""
    from analyzer.measuring.validate import assisted_generate, greedy_generate

    def generate(speculative: bool) -> int:
        with sized_forwards(target_model) as seen:
            if speculative:
                passes = assisted_generate(
                    target_model,
                    context_ids,
                    new_tokens,
                    gamma=gamma,
                    draft_model=draft_model,
                    ngram_max=ngram_max,
                    eos_token_id=[],
                )[1]
            else:
                passes = greedy_generate(target_model, context_ids, new_tokens, eos_token_id=[])[1]
        calls.append(seen[1:])
        return passes

    return generate


def measure_graph_overhead(
    decoder: GraphDecoder,
    context_ids: list[int],
    *,
    gamma: int,
    new_tokens: int = 32,
    lookup_s: float = 0.0,
    repeats: int = 3,
    on_generate: GenerateCallback | None = None,
) -> MachineryOverhead:
    """:func:`measure_machinery_overhead` of the cuda-graphs mode: the host time around the replayed
    steps of :class:`analyzer.engine.graph_cost.GraphDecoder`'s greedy and speculative loops (reading each
    step's choice back, drafting by lookup, acceptance), which is what an engine that replays graphs
    pays per step and per round; its caches are sized (and graphs captured) before anything is timed."""
    if repeats < 1 or new_tokens < 1:
        raise ValueError(f"need repeats >= 1 and new_tokens >= 1, got {repeats} and {new_tokens}")
    decoder.prepare_for(context_ids, new_tokens, gamma)

    def generate(speculative: bool) -> int:
        if speculative:
            return decoder.speculative(context_ids, new_tokens, gamma, stop_ids=[])[1]
        return decoder.greedy(context_ids, new_tokens, stop_ids=[])[1]

    return overhead_of(
        generate,
        decoder.timed_forwards,
        decoder.target_model.device,
        new_tokens=new_tokens,
        lookup_s=lookup_s if decoder.draft_model is None else 0.0,
        repeats=repeats,
        on_generate=on_generate,
    )


def overhead_of(
    generate: Callable[[bool], int],
    timed: Callable[[], contextlib.AbstractContextManager[list[float]]],
    device: torch.device,
    *,
    new_tokens: int,
    lookup_s: float,
    repeats: int,
    on_generate: GenerateCallback | None,
) -> MachineryOverhead:
    """The overhead of ``generate(speculative)`` (which returns its target forwards), whose model
    forwards ``timed()`` collects: retried while the machine is busy (:func:`retried_while_busy`)."""
    return retried_while_busy(
        lambda attempt: _overhead_once(
            generate,
            timed,
            device,
            new_tokens=new_tokens,
            lookup_s=lookup_s,
            repeats=repeats,
            on_generate=(lambda: on_generate(attempt)) if on_generate else None,
        )
    )


def retried_while_busy(measure_once: Callable[[int], MachineryOverhead]) -> MachineryOverhead:
    """``measure_once(attempt)`` (attempt 1, 2, ...), measured again while other processes use more
    than MAX_OTHERS_CPU of the machine (/proc/stat), up to EXTRA_ROUNDS more times, and only where they
    no longer do a moment after the busy attempt (:func:`analyzer.measuring.interference.still_busy`: under
    a load that goes on, another attempt would be spoilt as well); the last result notes it in ``busy``
    when they always did. Shared by every engine's overhead measurement."""
    shares: list[float] = []  # what other processes used during each attempt found too busy
    after: float | None = None  # what they used right after the last one, where that stopped the retries
    for attempt in range(1, 2 + EXTRA_ROUNDS):
        before, started = machine_reading(), perf_counter()
        measured = measure_once(attempt)
        used = others_busy_s(before, machine_reading())
        share = (
            min(1.0, used / ((perf_counter() - started) * (os.cpu_count() or 1)))
            if used is not None
            else None
        )
        if share is None or share <= MAX_OTHERS_CPU:
            return measured
        shares.append(share)
        if attempt <= EXTRA_ROUNDS and (after := still_busy()) is not None:
            break
    attempts = f"each of {len(shares)} attempts" if len(shares) > 1 else "1 attempt"
    return replace(
        measured,
        busy=f"machinery overhead: other processes used {min(shares):.0%} of the machine's CPU in {attempts}"
        + (f"; still {after:.0%} right after, so not measured again" if after is not None else ""),
    )


def _overhead_once(
    generate: Callable[[bool], int],
    timed: Callable[[], contextlib.AbstractContextManager[list[float]]],
    device: torch.device,
    *,
    new_tokens: int,
    lookup_s: float,
    repeats: int,
    on_generate: Callable[[], None] | None = None,
) -> MachineryOverhead:
    """One measurement of :func:`overhead_of`: ``repeats`` plain and speculative generations,
    alternating which goes first, each one's wall time minus its forwards' per target forward, less
    ``lookup_s`` per round (prompt lookup's draft step, counted in the profile already); medians."""
    if device.type == "cuda":  # both kinds once, untimed, at these shapes
        generate(False)
        generate(True)
    decode, rounds = [], []
    for r in range(repeats):
        for speculative in (False, True) if r % 2 == 0 else (True, False):
            with timed() as forward_times:
                _synchronize(device)
                start = perf_counter()
                passes = generate(speculative)
                _synchronize(device)
                outside = max(0.0, perf_counter() - start - sum(forward_times)) / max(passes, 1)
            if speculative:
                rounds.append(max(0.0, outside - lookup_s))
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
