"""The one decision rule at a single point, as the tests of its sentences ask it: a one-gamma
:class:`~analyzer.pricing.policy_curve.PolicyCurve` with S(g*), the interval's lower end, n and a fallback."""

from __future__ import annotations

import math

from analyzer.advice.summary import DecisionReason, finite
from analyzer.pricing.policy_curve import PolicyCurve


def decide_point(
    speedup: float, interval: tuple[float, float], n: int, margin: float
) -> tuple[bool | None, DecisionReason]:
    """(speculate, reason) of a group of ``n`` prompts with S(g*) = ``speedup`` and ``interval``;
    speculate None where the group is too small and its fallback (here: nothing measured) decides."""
    low, high = interval
    curve = PolicyCurve(
        (speedup,), base_low=None if math.isnan(low) else low, margin=margin, n=n, fallback=PolicyCurve(())
    )
    point = curve.decide()
    assert point is not None
    reason = DecisionReason(
        code=point.code, speedup=finite(speedup), interval=(finite(low), finite(high)), n=n, margin=margin
    )
    return (None if point.basis == "workload" else point.speculate), reason
