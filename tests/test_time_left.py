"""The time an analysis has left (analyzer/measuring/time_left.py), on a fake clock: the unit is one prompt's
generation as measured, later phases count in it, a phase with a budget has the budget unspent left."""

from __future__ import annotations

import pytest

from analyzer.measuring.time_left import TimeLeft


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_generation_sets_the_unit_and_the_later_phases_count_in_it():
    clock = Clock()
    eta = TimeLeft(later={"calibration": 28.0, "validation": 19.5}, clock=clock)
    eta.start("generation", 39)
    assert eta.left_s() is None and eta.words() == ""  # nothing measured yet
    clock.now = 4.0
    eta.step()
    eta.step()  # two prompts in 4 s: 2 s a prompt
    assert eta.unit_s == pytest.approx(2.0)
    assert eta.left_s() == pytest.approx(37 * 2.0 + (28.0 + 19.5) * 2.0)
    assert eta.words() == ", about 3 min left"  # 169 s
    clock.now = 80.0
    eta.start("calibration", 4)
    assert eta.left_s() == pytest.approx(19.5 * eta.unit_s)  # its own estimate left the later ones
    clock.now = 110.0
    eta.step()  # one calibration prompt in 30 s: three more at that pace
    assert eta.left_s() == pytest.approx(3 * 30.0 + 19.5 * eta.unit_s)


def test_a_phase_with_a_budget_has_the_budget_unspent_left_and_never_less_than_nothing():
    clock = Clock()
    eta = TimeLeft(later={"validation": 10.0}, clock=clock)
    eta.start("generation", 1)
    clock.now = 3.0
    eta.step()
    eta.start("validation", 31, budget_s=35.0)
    eta.step(spent_s=12.0)
    assert eta.left_s() == pytest.approx(23.0) and eta.words() == ", about 23 s left"
    eta.step(spent_s=30.0)
    assert eta.left_s() == 0.0
