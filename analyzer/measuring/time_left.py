"""How long an analysis has left, for its progress lines: every phase's estimate in one unit, one prompt's plain
generation, measured as the generation goes.

An analysis is generation (one plain pass of every prompt: the unit), then calibration (a few passes of a
prompt through every server, each about ``runs`` generations of it) and validation (its budget, a share of
the generation, or every held-out prompt's pass where it has none). :class:`TimeLeft` holds the phases still
to come as counts of that unit and the current phase's progress; :meth:`TimeLeft.left_s` adds the current
phase's rest (from its own pace once it has one) to the later phases' counts times the unit. The engines name
the phases and count their steps; no engine is named here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class TimeLeft:
    """The phases to come (name: estimated prompt generations, in order), the current phase (its name, steps
    done and total, its start) and ``unit_s``, one prompt's plain generation in seconds (None until one is
    measured). ``budget_s``: the current phase's budget where it has one (its rest is the budget unspent)."""

    later: dict[str, float] = field(default_factory=dict)
    phase: str = ""
    done: int = 0
    total: int = 0
    started: float = 0.0
    unit_s: float | None = None
    budget_s: float | None = None
    spent_s: float = 0.0
    clock: Callable[[], float] = time.perf_counter

    def start(self, phase: str, total: int, *, budget_s: float | None = None) -> None:
        """Begin ``phase`` of ``total`` steps (its estimate leaves the later phases)."""
        self.later.pop(phase, None)
        self.phase, self.done, self.total, self.budget_s, self.spent_s = phase, 0, total, budget_s, 0.0
        self.started = self.clock()

    def step(self, done: int | None = None, spent_s: float = 0.0) -> None:
        """A step of the current phase is done (``done``: the steps done so far, default one more);
        ``spent_s`` what it cost against the phase's budget."""
        self.done = self.done + 1 if done is None else done
        self.spent_s += spent_s
        if self.phase == "generation" and self.done:
            self.unit_s = (self.clock() - self.started) / self.done

    def left_s(self) -> float | None:
        """The estimated seconds left: the current phase's rest and the later phases' (None: not known yet)."""
        if self.unit_s is None:
            return None
        if self.budget_s is not None:
            current = max(self.budget_s - self.spent_s, 0.0)
        elif self.done:
            current = (self.clock() - self.started) / self.done * max(self.total - self.done, 0)
        else:
            current = 0.0
        return current + self.unit_s * sum(self.later.values())

    def words(self) -> str:
        """ ", about N s left" (or minutes), empty while nothing is known."""
        left = self.left_s()
        if left is None:
            return ""
        return f", about {left:.0f} s left" if left < 120 else f", about {left / 60:.0f} min left"
