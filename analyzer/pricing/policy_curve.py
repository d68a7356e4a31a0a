"""The one policy curve: a published S(g) per profiled batch size, and everything decided from it.

:class:`PolicyCurve` owns the S(g) curves of one policy (one per batch size the analysis profiled,
``S(g)`` at g = 1..G, NaN where not finite), the lower end of S(g*)'s interval per batch size, the
margin and the largest gamma the run analysed. It answers, for a batch size and an acceptance rate:

- interpolation: between two profiled batch sizes the curve is linear in b (the measured curve at a
  measured size); outside the profiled range there is no curve;
- the online rescaling: a round's cost does not depend on alpha, only the tokens it yields do, so
  under an online alpha the curve is ``S(g) * E_iid(alpha, g) / E_iid(prior, g)`` with
  ``E_iid(a, g) = (1 - a^(g+1)) / (1 - a)`` (the interval's lower end is scaled alike at g*);
- the decision rule (:func:`decision_rule`, applied by :meth:`PolicyCurve.decide`): speculate when
  S(g*) clears 1 + margin and the lower end of its interval clears 1.0; a group of fewer than
  ``min_prompts`` prompts takes its ``fallback``'s decision (a task: the workload's) or, with none, is
  decided on its own numbers as a point estimate; online, a policy that speculates stays on until
  S(g*) falls below 1 + ``off_margin`` (hysteresis), and turns on only under the whole rule.

The analysis (its summary per task and batch size, so the report), the published policies,
``/v1/policies``, the router and the online adaptation all ask it; nothing else rescales a curve or
applies the rule, and the reason text is rendered from the code it returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from analyzer.measuring.acceptance import expected_tokens_iid
from analyzer.names import DEFAULT_MARGIN
from analyzer.pricing.speedup import (
    MIN_TASK_PROMPTS,
    Cost,
    best_gamma,
    clears_break_even,
    iid_speedup,
    should_speculate,
)

# Why a group is speculated or not, as a code (the sentence is rendered from it and its numbers):
DECISION_CODES = (
    "nothing_measured",  # no finite S(g): no cost profile yet, or no output
    "too_few_prompts",  # fewer than min_prompts: the fallback's (workload's) decision applies
    "point_estimate",  # fewer than min_prompts, no fallback and no interval: decided on S(g*) alone
    "below_margin",  # S(g*) does not clear 1 + margin
    "interval_reaches_loss",  # S(g*) clears 1 + margin, but the interval's lower end does not clear 1.0
    "clears",  # S(g*) clears 1 + margin and the interval stays above 1.0
    "kept_on",  # online only: speculating, S(g*) no longer clears the rule but stays above 1 + off_margin
)


def decision_rule(
    speedup: float, low: float | None, margin: float, *, hold: bool | None = None, off_margin: float = 0.0
) -> tuple[bool, str]:
    """(speculate, code of :data:`DECISION_CODES`) for S(g*) = ``speedup`` and the lower end ``low`` of
    its interval (None or NaN: none): on when S(g*) > 1 + margin and low > 1.0. ``hold`` True (an
    online policy that speculates now) keeps it on while S(g*) >= 1 + ``off_margin`` ("kept_on"); turning
    on always takes the whole rule. A NaN S(g*) is "nothing_measured"."""
    if not math.isfinite(speedup):
        return False, "nothing_measured"
    if clears_break_even(speedup, low, margin):
        return True, "clears"
    if hold and speedup >= 1.0 + off_margin:
        return True, "kept_on"
    if not should_speculate(speedup, margin):
        return False, "below_margin"
    return False, "interval_reaches_loss"


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
    the lower end of its interval (None where none was published), whether to speculate, the profiled
    batch sizes the curve came from (equal: measured there), whether alpha moved it, why (``code``, one
    of :data:`DECISION_CODES`) and on what ``basis``: "task" (its own numbers), "workload" (too few
    prompts: its fallback's decision, gamma and speedup) or "point estimate" (too few prompts, no
    fallback)."""

    gamma: int | None
    speedup: float
    low: float | None
    speculate: bool
    lower_batch: int
    upper_batch: int
    rescaled: bool = False
    code: str = "clears"
    basis: str = "task"

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
    published. ``prior_alpha``: the analysis' alpha, the base of the rescaling. ``n``: the prompts the
    curves pool (None: enough to decide), ``min_prompts`` the fewest that decide alone, ``fallback`` the
    curve whose decision a smaller group takes (a task's: the workload's; None: decide alone)."""

    base: tuple[float, ...]
    by_batch: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    lows: Mapping[int, float | None] = field(default_factory=dict)
    base_low: float | None = None
    margin: float = DEFAULT_MARGIN
    gamma_max: int | None = None
    prior_alpha: float = 0.5
    cost: Cost | None = None
    n: int | None = None
    min_prompts: int = MIN_TASK_PROMPTS
    fallback: PolicyCurve | None = None

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

    def decide(
        self,
        batch_size: float | None = BASE,
        alpha: float | None = None,
        prior_alpha: float | None = None,
        *,
        hold: bool | None = None,
        off_margin: float = 0.0,
    ) -> CurvePoint | None:
        """The decision at ``batch_size`` under ``alpha`` (None: the analysis' own, rescaled from
        ``prior_alpha`` as in :meth:`curve`), by the one rule (module docstring): g* of the curve, S(g*),
        the lower end (interpolated between the profiled sizes, scaled at g* like the curve),
        :func:`decision_rule` with ``hold`` and ``off_margin``, its code and basis. A group of fewer than
        ``min_prompts`` takes its fallback's decision. None outside the profiled sizes."""
        small = self.n is not None and self.n < self.min_prompts
        if small and self.fallback is not None:
            taken = self.fallback.decide(batch_size, alpha, prior_alpha, hold=hold, off_margin=off_margin)
            return None if taken is None else replace(taken, code="too_few_prompts", basis="workload")
        span = self._span(batch_size, prior_alpha)
        if span is None:
            return None
        _, lower, upper = span
        prior = self.prior_alpha if prior_alpha is None else prior_alpha
        basis = "point estimate" if small else "task"
        gamma, speedup = best_gamma(self.curve(batch_size, alpha, prior) or ())
        if not gamma:
            return CurvePoint(
                None, float("nan"), None, False, lower, upper, alpha is not None, "nothing_measured", basis
            )
        low = self.base_low if batch_size is BASE else self._low(batch_size, lower, upper)
        if low is not None and not math.isfinite(low):
            low = None
        if low is not None and alpha is not None:
            low *= acceptance_scale(alpha, prior, gamma)
        speculate, code = decision_rule(speedup, low, self.margin, hold=hold, off_margin=off_margin)
        if small and low is None and code != "kept_on":
            code = "point_estimate"  # too few prompts for an interval: decided on S(g*) alone
        return CurvePoint(gamma, speedup, low, speculate, lower, upper, alpha is not None, code, basis)

    def at(
        self, batch_size: float | None = BASE, alpha: float | None = None, prior_alpha: float | None = None
    ) -> CurvePoint | None:
        """:meth:`decide` without hysteresis (the published decision at ``batch_size``)."""
        return self.decide(batch_size, alpha, prior_alpha)

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
