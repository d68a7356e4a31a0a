"""How a run's steps report progress: a callback told ``(done, total, phase)`` after each unit of work,
``phase`` the text shown (loading, profiling, measuring, validating). The engines' loaded pairs, cost
profiling, validation and the run's bookkeeping all take one, so it lives below all of them."""

from __future__ import annotations

from typing import Callable

ProgressCallback = Callable[[int, int, str], None]
