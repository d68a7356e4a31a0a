"""Predicted speedup from real match sequences and a measured cost curve, the Leviathan closed form
for comparison, best gamma, the recommendation tier and the on/off decision.

Cost model: T_t(k) = seconds of one target forward of k new tokens over a warm KV cache
(``target_forward_s[k-1]``), T_d = seconds of one draft step (a model draft pays it per drafted
token; prompt lookup pays it once per round), o_r / o_d = the generation machinery's own time per
speculative round / per plain decoding step (measured; 0 in profiles from before it was). A round
that drafts k tokens costs draft(k) + T_t(k + 1) + o_r; plain greedy decoding costs T_t(1) + o_d per
token. So for N output tokens

    S(g) = N * (T_t(1) + o_d) / sum_k drafted_hist_g[k] * (draft(k) + T_t(k + 1) + o_r),

which is DESIGN.md's S(g) = E[tokens per round](g) * T_t(1) / (g T_d + T_t(g + 1)) when every round
drafts g tokens, and accounts exactly for rounds that draft fewer (prompt lookup finding nothing,
the end of the budget).

A step's time grows with the context it attends over. A profile measured at a second, longer context
carries the slope of each T_t(k) (and of a draft model's step) per token of context; each request is then
priced at its own mean context, its prompt plus half its output (:meth:`Cost.for_request`): every cost
above is linear in the context, so the mean prices the request's steps exactly up to how its rounds spread
over it. A profile without a slope (one context, or one from before) prices every request alike.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from analyzer.measuring.acceptance import expected_tokens_iid
from analyzer.names import DEFAULT_MARGIN

# the least share of its measured value a step keeps when a context slope prices a shorter context
MIN_CONTEXT_SHARE = 0.5

TIERS = ("HIGHLY_RECOMMENDED", "RECOMMENDED", "CONDITIONAL", "NOT_RECOMMENDED")


@dataclass(frozen=True)
class Cost:
    """A measured cost curve: ``target_forward_s`` shape (K,), k = 1..K; ``draft_step_s``; whether
    the draft cost is paid per drafted token (a model) or per round (prompt lookup); the prompt
    processing cost per prompt token of the target and of a model draft (0 when unknown); and the
    machinery's time per speculative round and per plain decoding step (0 when unknown); and where the
    profile measured a second context, the ``context_tokens`` the curve was measured at and the seconds
    each T_t(k) (``target_context_slope_s``, shape (K,)) and the draft step (``draft_context_slope_s``)
    add per token of context (empty / 0: priced alike at every length)."""

    target_forward_s: Sequence[float]
    draft_step_s: float
    draft_cost_per_token: bool = True
    target_prefill_s_per_token: float = 0.0
    draft_prefill_s_per_token: float = 0.0
    round_overhead_s: float = 0.0
    decode_overhead_s: float = 0.0
    context_tokens: int = 0
    target_context_slope_s: Sequence[float] = ()
    draft_context_slope_s: float = 0.0

    def at_context(self, tokens: float) -> Cost:
        """This cost at a context of ``tokens`` tokens: each T_t(k) and the draft step moved along their
        slopes, never below MIN_CONTEXT_SHARE of the measured value (a slope from two noisy points must not
        price a short prompt's step at nothing). Itself where no slope was measured."""
        if not self.target_context_slope_s:
            return self
        shift = tokens - self.context_tokens
        forwards = [
            max(t + slope * shift, MIN_CONTEXT_SHARE * t)
            for t, slope in zip(self.target_forward_s, self.target_context_slope_s, strict=True)
        ]
        draft = max(
            self.draft_step_s + self.draft_context_slope_s * shift, MIN_CONTEXT_SHARE * self.draft_step_s
        )
        return replace(self, target_forward_s=tuple(forwards), draft_step_s=draft)

    def for_request(self, prompt_tokens: int, output_tokens: int) -> Cost:
        """This cost at a request's mean context: its prompt plus half its output."""
        return self.at_context(prompt_tokens + output_tokens / 2)

    def prefill_s(self, prompt_tokens: int) -> tuple[float, float]:
        """(target, draft) seconds to process a prompt of ``prompt_tokens`` tokens (linear model)."""
        return self.target_prefill_s_per_token * prompt_tokens, self.draft_prefill_s_per_token * prompt_tokens

    def round_s(self, drafted: int) -> float:
        """Seconds of one round that drafts ``drafted`` tokens (0 = a plain decode step + lookup)."""
        if drafted + 1 > len(self.target_forward_s):
            raise ValueError(
                f"cost curve covers k <= {len(self.target_forward_s)}, a round needs {drafted + 1}"
            )
        draft = self.draft_step_s * drafted if self.draft_cost_per_token else self.draft_step_s
        return draft + float(self.target_forward_s[drafted]) + self.round_overhead_s

    @property
    def decode_s(self) -> float:
        """Seconds of one plain greedy decoding step: T_t(1) plus the machinery's per-step time."""
        return float(self.target_forward_s[0]) + self.decode_overhead_s

    def as_json(self) -> dict:
        """This cost as JSON-ready data (a published policy set stores it; :meth:`from_json` reads it); the
        context keys only where a slope was measured, so a cost without one reads as it was stored before."""
        context = {
            "context_tokens": int(self.context_tokens),
            "target_context_slope_s": [float(t) for t in self.target_context_slope_s],
            "draft_context_slope_s": float(self.draft_context_slope_s),
        }
        return {
            "target_forward_s": [float(t) for t in self.target_forward_s],
            "draft_step_s": float(self.draft_step_s),
            "draft_cost_per_token": bool(self.draft_cost_per_token),
            "target_prefill_s_per_token": float(self.target_prefill_s_per_token),
            "draft_prefill_s_per_token": float(self.draft_prefill_s_per_token),
            "round_overhead_s": float(self.round_overhead_s),
            "decode_overhead_s": float(self.decode_overhead_s),
            **(context if self.target_context_slope_s else {}),
        }

    @classmethod
    def from_json(cls, data: dict | None) -> Cost | None:
        """The cost :meth:`as_json` wrote (None for None)."""
        if data is None:
            return None
        return cls(
            tuple(float(t) for t in data["target_forward_s"]),
            float(data["draft_step_s"]),
            bool(data.get("draft_cost_per_token", True)),
            float(data.get("target_prefill_s_per_token", 0.0)),
            float(data.get("draft_prefill_s_per_token", 0.0)),
            float(data.get("round_overhead_s", 0.0)),
            float(data.get("decode_overhead_s", 0.0)),
            int(data.get("context_tokens", 0)),
            tuple(float(t) for t in data.get("target_context_slope_s", ())),
            float(data.get("draft_context_slope_s", 0.0)),
        )


def speculative_time_s(drafted_hist: Sequence[int] | np.ndarray, cost: Cost) -> float:
    """Predicted seconds of the speculative walk: sum_k drafted_hist[k] * round_s(k)."""
    return float(sum(int(count) * cost.round_s(k) for k, count in enumerate(drafted_hist) if count))


def predicted_speedup(
    output_tokens: int, drafted_hist: Sequence[int] | np.ndarray, cost: Cost, prompt_tokens: int = 0
) -> float:
    """End-to-end S(g) of one request: (P_t + N * T_t(1)) / (P_t + P_d + speculative time), where
    P_t, P_d are the target's and a model draft's prompt processing (0 when not profiled, which
    leaves the decode-only S(g) of the module docstring). NaN for an empty output."""
    return pooled_speedup([output_tokens], [drafted_hist], cost, [prompt_tokens])


def pooled_speedup(
    output_tokens: Sequence[int],
    drafted_hists: Sequence[Sequence[int] | np.ndarray],
    cost: Cost,
    prompt_tokens: Sequence[int] | None = None,
) -> float:
    """Throughput speedup of a group of requests: total greedy time over total speculative time, each
    request's steps priced at its own mean context."""
    prompt_tokens = prompt_tokens if prompt_tokens is not None else [0] * len(output_tokens)
    greedy = spec = 0.0
    for n, hist, p in zip(output_tokens, drafted_hists, prompt_tokens):
        if n <= 0:
            continue
        target_prefill, draft_prefill = cost.prefill_s(p)
        at = cost.for_request(p, n)
        greedy += target_prefill + n * at.decode_s
        spec += target_prefill + draft_prefill + speculative_time_s(hist, at)
    return greedy / spec if spec > 0 else float("nan")


def iid_speedup(alpha: float, gamma: int, cost: Cost) -> float:
    """S(g) from the i.i.d. acceptance formula with the real cost curve:
    E_iid(alpha, g) * T_t(1) / round_s(g). Misses burstiness; reported for comparison."""
    return expected_tokens_iid(alpha, gamma) * cost.decode_s / cost.round_s(gamma)


def leviathan_speedup(alpha: float, gamma: int, c: float) -> float:
    """Leviathan et al.'s closed form (1 - a^(g+1)) / ((1 - a)(g c + 1)), which assumes
    T_t(g+1) = T_t(1) and c = T_d / T_t(1)."""
    return expected_tokens_iid(alpha, gamma) / (gamma * c + 1.0)


def best_gamma(speedups: Sequence[float | None]) -> tuple[int | None, float]:
    """(g*, S(g*)) for ``speedups[g-1]`` = S(g), g = 1..G; the smallest g among ties; (None, nan)
    when nothing is finite. "No gamma" is None everywhere in the code; only the API writes it as 0
    (a decision's ``gamma`` when it does not speculate, a batch size without a g*)."""
    values = np.asarray([np.nan if v is None else v for v in speedups], dtype=np.float64)
    finite = np.isfinite(values)
    if not finite.any():
        return None, float("nan")
    index = int(np.argmax(np.where(finite, values, -np.inf)))
    return index + 1, float(values[index])


def should_speculate(best_speedup: float, margin: float = DEFAULT_MARGIN) -> bool:
    """Speculate only when the predicted speedup clears break-even by ``margin``."""
    return bool(np.isfinite(best_speedup) and best_speedup > 1.0 + margin)


MIN_TASK_PROMPTS = 3  # fewer prompts than this: a task's own numbers cannot decide, the workload's do
INTERVAL_LEVEL = 0.90
BOOTSTRAP_RESAMPLES = 2000


def bootstrap_speedup_interval(
    greedy_s: Sequence[float] | np.ndarray,
    speculative_s: Sequence[float] | np.ndarray,
    *,
    level: float = INTERVAL_LEVEL,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval over prompts of the pooled speedup sum(greedy_s) / sum(speculative_s),
    both shape (n,) (per-prompt seconds without and with speculation): the prompts are resampled with
    replacement ``resamples`` times (seeded, so a report is reproducible) and the (1 - level)/2 and
    (1 + level)/2 quantiles of the resampled speedups returned. (nan, nan) for n = 0; for n = 1 the
    interval has zero width (one prompt says nothing about the spread)."""
    greedy, speculative = np.asarray(greedy_s, dtype=np.float64), np.asarray(speculative_s, dtype=np.float64)
    n = len(greedy)
    if n == 0 or not np.all(speculative > 0):
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    ratios = np.empty(resamples)
    block = max(1, 2_000_000 // n)  # bounded memory for large groups
    for start in range(0, resamples, block):
        size = min(block, resamples - start)
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=size)  # (size, n) times each prompt is drawn
        ratios[start : start + size] = (counts @ greedy) / (counts @ speculative)
    low, high = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def clears_break_even(speedup: float, low: float | None, margin: float = DEFAULT_MARGIN) -> bool:
    """The decision rule: S(g*) clears 1 + margin and the lower end of its interval (when there is
    one) clears 1.0. Used by the analysis, the published policies and the router alike."""
    return should_speculate(speedup, margin) and (low is None or not np.isfinite(low) or low > 1.0)


def recommendation_tier(alpha_mean: float, alpha_var: float | None) -> str:
    """The seed's tiers: alpha > 0.7 and variance < 0.05 -> HIGHLY_RECOMMENDED; > 0.5 ->
    RECOMMENDED; > 0.3 -> CONDITIONAL; else NOT_RECOMMENDED. An unknown variance (one prompt)
    cannot earn the top tier."""
    if not np.isfinite(alpha_mean):
        return "NOT_RECOMMENDED"
    if alpha_mean > 0.7 and alpha_var is not None and np.isfinite(alpha_var) and alpha_var < 0.05:
        return "HIGHLY_RECOMMENDED"
    if alpha_mean > 0.5:
        return "RECOMMENDED"
    if alpha_mean > 0.3:
        return "CONDITIONAL"
    return "NOT_RECOMMENDED"


def mean_and_variance(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample variance (numpy, ddof=1) of the finite values; variance None for fewer than 2."""
    array = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    if array.size == 0:
        return float("nan"), None
    return float(array.mean()), (float(array.var(ddof=1)) if array.size > 1 else None)
