"""The one policy curve: a published S(g) per profiled batch size, and everything decided from it.

:class:`PolicyCurve` owns the S(g) curves of one policy (one per batch size the analysis profiled,
``S(g)`` at g = 1..G, NaN where not finite), the lower end of S(g*)'s interval per batch size, the
margin and the largest gamma the run analysed. It answers, for a batch size and an acceptance rate:

- interpolation: between two profiled batch sizes the curve is linear in b (the measured curve at a
  measured size); outside the profiled range there is no curve;
- the online rescaling: a round's cost does not depend on alpha, only the tokens it yields do, so
  under an online alpha the curve is ``S(g) * E_iid(alpha, g) / E_iid(prior, g)`` with
  ``E_iid(a, g) = (1 - a^(g+1)) / (1 - a)`` (the interval's lower end is scaled alike at g*);
- the decision rule (:func:`analyzer.speedup.clears_break_even`): speculate when S(g*) clears
  1 + margin and the lower end of its interval clears 1.0.

The analysis (per batch size), the report, ``/v1/policies``, the router and the online adaptation
all ask it; nothing else rescales a curve or applies the rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from analyzer.acceptance import expected_tokens_iid
from analyzer.run_params import DEFAULT_MARGIN
from analyzer.speedup import Cost, best_gamma, clears_break_even, iid_speedup


def as_curve(values: Sequence[float | None] | None) -> tuple[float, ...]:
    """A stored S(g) curve as floats, NaN where it was not finite (stored as null)."""
    return tuple(float("nan") if v is None else float(v) for v in (values or ()))


def acceptance_scale(alpha: float, prior_alpha: float, gamma: int) -> float:
    """E_iid(alpha, g) / E_iid(prior_alpha, g): how much more (or less) a round at gamma yields under
    ``alpha`` than under the analysis' ``prior_alpha``."""
    return expected_tokens_iid(alpha, gamma) / expected_tokens_iid(prior_alpha, gamma)


@dataclass(frozen=True)
class CurvePoint:
    """The decision at one batch size and alpha: g* (None when nothing is finite), S(g*) (NaN then),
    the lower end of its interval (None where none was published), whether it clears break-even, the
    profiled batch sizes the curve came from (equal: measured there) and whether alpha moved it."""

    gamma: int | None
    speedup: float
    low: float | None
    speculate: bool
    lower_batch: int
    upper_batch: int
    rescaled: bool = False

    @property
    def measured(self) -> bool:
        """The curve was measured at this batch size (not interpolated)."""
        return self.lower_batch == self.upper_batch


BASE = None  # the batch size argument meaning "the base curve" (the smallest profiled batch size, batch 1)


@dataclass(frozen=True)
class PolicyCurve:
    """One policy's published S(g) curves and the rule that decides from them (module docstring).

    ``base``: S(g) for g = 1..G at the smallest profiled batch size (batch 1), the curve the online
    estimate follows (NaN where not finite). ``by_batch``: batch size -> S(g) at every profiled batch
    size (empty for policies from before batch sizes were profiled). ``lows``: batch size -> the lower
    end of S(g*)'s interval (None: not published); ``base_low`` the base curve's. ``gamma_max``: the
    largest gamma the run analysed (None: the curves' length). ``cost``: the run's batch-1 cost, which
    bounds the gammas priced on the base curve and gives the i.i.d. curve where nothing finite was
    published. ``prior_alpha``: the analysis' alpha, the base of the rescaling."""

    base: tuple[float, ...]
    by_batch: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    lows: Mapping[int, float | None] = field(default_factory=dict)
    base_low: float | None = None
    margin: float = DEFAULT_MARGIN
    gamma_max: int | None = None
    prior_alpha: float = 0.5
    cost: Cost | None = None

    @property
    def top_gamma(self) -> int:
        """The largest gamma priced on the base curve: gamma_max, within the cost curve's k <= K."""
        top = self.gamma_max if self.gamma_max is not None else len(self.base)
        if self.cost is not None:
            top = min(top, len(self.cost.target_forward_s) - 1)
        return top

    @property
    def batch_sizes(self) -> list[int]:
        """The profiled batch sizes with a curve, ascending (empty: the base curve only)."""
        return sorted(b for b, curve in self.by_batch.items() if len(curve))

    def covers(self, batch_size: float) -> bool:
        """Whether the profiled batch sizes span ``batch_size`` (measured there or between two)."""
        sizes = self.batch_sizes
        return bool(sizes) and sizes[0] <= batch_size <= sizes[-1]

    def curve(
        self, batch_size: float | None = BASE, alpha: float | None = None, prior_alpha: float | None = None
    ) -> tuple[float, ...] | None:
        """S(g) for g = 1..G at ``batch_size`` (BASE: the base curve; else interpolated between the
        profiled sizes) under ``alpha`` (None: the analysis' own), rescaled from ``prior_alpha`` (None:
        the curve's own; an online estimate passes its prior); None outside the profiled sizes."""
        span = self._span(batch_size, prior_alpha)
        if span is None:
            return None
        curve = span[0]
        if alpha is None:
            return curve
        prior = self.prior_alpha if prior_alpha is None else prior_alpha
        return tuple(s * acceptance_scale(alpha, prior, g) for g, s in enumerate(curve, start=1))

    def speedup(
        self,
        gamma: int,
        batch_size: float | None = BASE,
        alpha: float | None = None,
        prior_alpha: float | None = None,
    ) -> float:
        """S(gamma) at ``batch_size`` under ``alpha`` (rescaled from ``prior_alpha`` as in :meth:`curve`);
        NaN outside the curve (the router's per-request point: no whole curve is rescaled)."""
        span = self._span(batch_size, prior_alpha)
        if span is None or not 1 <= gamma <= len(span[0]):
            return float("nan")
        value = span[0][gamma - 1]
        if alpha is None:
            return float(value)
        return float(
            value * acceptance_scale(alpha, self.prior_alpha if prior_alpha is None else prior_alpha, gamma)
        )

    def at(
        self, batch_size: float | None = BASE, alpha: float | None = None, prior_alpha: float | None = None
    ) -> CurvePoint | None:
        """The decision at ``batch_size`` under ``alpha`` (None: the analysis' own, rescaled from
        ``prior_alpha`` as in :meth:`curve`): g* of the curve, S(g*), the lower end (interpolated between
        the profiled sizes, scaled at g* like the curve) and the rule. None outside the profiled sizes."""
        span = self._span(batch_size, prior_alpha)
        if span is None:
            return None
        _, lower, upper = span
        prior = self.prior_alpha if prior_alpha is None else prior_alpha
        gamma, speedup = best_gamma(self.curve(batch_size, alpha, prior) or ())
        if not gamma:
            return CurvePoint(None, float("nan"), None, False, lower, upper, alpha is not None)
        low = self.base_low if batch_size is BASE else self._low(batch_size, lower, upper)
        if low is not None and alpha is not None:
            low *= acceptance_scale(alpha, prior, gamma)
        return CurvePoint(
            gamma, speedup, low, clears_break_even(speedup, low, self.margin), lower, upper, alpha is not None
        )

    # ---------------------------------------------------------------- internals

    def _span(
        self, batch_size: float | None, prior_alpha: float | None = None
    ) -> tuple[tuple[float, ...], int, int] | None:
        """(S(g) at ``batch_size``, the profiled size below, the one above); the base curve for BASE."""
        if batch_size is BASE:
            base = tuple(float(v) for v in self.base[: self.top_gamma])
            if not any(math.isfinite(v) for v in base) and self.cost is not None:
                base = self._iid(self.prior_alpha if prior_alpha is None else prior_alpha)
            smallest = self.batch_sizes[0] if self.batch_sizes else 1
            return base, smallest, smallest
        sizes = self.batch_sizes
        if not sizes or not sizes[0] <= batch_size <= sizes[-1]:
            return None
        upper = next(b for b in sizes if b >= batch_size)
        lower = max(b for b in sizes if b <= batch_size)
        top = self.gamma_max if self.gamma_max is not None else None
        low_curve, high_curve = self.by_batch[lower][:top], self.by_batch[upper][:top]
        width = min(len(low_curve), len(high_curve))
        if upper == lower:
            return tuple(float(v) for v in low_curve[:width]), lower, upper
        weight = (batch_size - lower) / (upper - lower)
        return (
            tuple(float((1 - weight) * low_curve[i] + weight * high_curve[i]) for i in range(width)),
            lower,
            upper,
        )

    def _iid(self, prior_alpha: float) -> tuple[float, ...]:
        """S(g) from the i.i.d. formula at the prior alpha with the batch-1 cost (nothing was published)."""
        assert self.cost is not None
        return tuple(iid_speedup(prior_alpha, g, self.cost) for g in range(1, self.top_gamma + 1))

    def _low(self, batch_size: float, lower: int, upper: int) -> float | None:
        """The published lower end of S(g*) at ``batch_size``, linear between the profiled sizes
        around it; None where the policy has none."""
        low_at, high_at = self.lows.get(lower), self.lows.get(upper)
        if low_at is None or high_at is None:
            return None
        if upper == lower:
            return float(low_at)
        weight = (batch_size - lower) / (upper - lower)
        return float((1 - weight) * low_at + weight * high_at)
