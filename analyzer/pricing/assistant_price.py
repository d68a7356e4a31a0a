"""What transformers' assisted generation pays under its defaults: the rounds the replay found
(:mod:`analyzer.measuring.assistant_defaults`, stored per prompt result) priced with the run's cost
profile, pooled over a group of prompts like the fixed-gamma curve, with the same bootstrap interval.
``specroute export --for transformers`` exports the defaults where they beat the fixed gamma's S(g*)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from analyzer.measuring.assistant_defaults import TRANSFORMERS_DEFAULTS
from analyzer.orm import PromptResult
from analyzer.pricing.speedup import Cost, bootstrap_speedup_interval, speculative_time_s


def drafted_histogram(rounds: Sequence[Sequence[int]]) -> np.ndarray:
    """hist[k] = the rounds that drafted k tokens."""
    drafted = [int(d) for d, _ in rounds]
    hist = np.zeros(max(drafted, default=0) + 1, dtype=np.int64)
    for d in drafted:
        hist[d] += 1
    return hist


def assistant_defaults_price(results: Sequence[PromptResult], cost: Cost) -> dict[str, Any] | None:
    """The pooled speedup of transformers' defaults over ``results`` at ``cost``, with its bootstrap
    interval and what it drafts per round: {"settings", "speedup", "speedup_interval", "prompts",
    "rounds", "drafted", "accepted"}. None where a prompt has no replayed rounds (not a transformers run
    with a draft model, or from before they were replayed) or the cost curve stops short of the widest
    round."""
    with_output = [r for r in results if r.output_tokens > 0]
    if not with_output or any(r.assistant_rounds is None for r in with_output):
        return None
    hists = [drafted_histogram(r.assistant_rounds or []) for r in with_output]
    if max(len(h) for h in hists) > len(cost.target_forward_s):
        return None  # a round drafted more than the profile verifies
    greedy, speculative = [], []
    for r, hist in zip(with_output, hists):
        target_prefill, draft_prefill = cost.prefill_s(r.prompt_tokens)
        at = cost.for_request(r.prompt_tokens, r.output_tokens)
        greedy.append(target_prefill + r.output_tokens * at.decode_s)
        speculative.append(target_prefill + draft_prefill + speculative_time_s(hist, at))
    low, high = (
        bootstrap_speedup_interval(greedy, speculative) if len(greedy) > 1 else (float("nan"), float("nan"))
    )
    rounds = [tuple(x) for r in with_output for x in (r.assistant_rounds or [])]
    return {
        "settings": TRANSFORMERS_DEFAULTS.label,
        "speedup": float(sum(greedy) / sum(speculative)),
        "speedup_interval": [_finite(low), _finite(high)],
        "prompts": len(with_output),
        "rounds": len(rounds),
        "drafted": int(sum(d for d, _ in rounds)),
        "accepted": int(sum(a for _, a in rounds)),
    }


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None
