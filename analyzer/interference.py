"""Is the machine quiet enough to time on? Interference detection for cost profiling.

A busy machine spoils a timing (another process holding one of two cores once gave T_t(6)/T_t(1) =
9.3 and flipped the advice). Three signals, calibrated on this project's 2-core machine: the spread of
a point's repeats; the process CPU time our process got per wall second (quiet 0.92-0.99 per torch
thread; with one other busy process 0.51-0.73); and the CPU other processes used, from /proc/stat
(quiet 0-2% of the machine; one busy process 37%). The load average lagged and did not show it.
:func:`judge` turns a matrix of timed repeats into medians and spreads over the repeats that were
not disturbed; :mod:`analyzer.cost` re-measures what stays disturbed and records a verdict.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

SPREAD_TOLERANCE = 0.10  # relative median absolute deviation of a point's repeats ...
MIN_SPREAD_S = 0.0002  # ... once it exceeds timer and scheduler jitter (seconds)
MIN_CPU_SHARE = 0.85  # a repeat's process CPU per wall second, relative to the profile's best repeats
MIN_JUDGED_S = 0.05  # repeats shorter than this are not judged by CPU time (the CPU clock is too coarse)
MAX_OTHERS_CPU = 0.15  # share of the machine's CPU other processes may use while we profile
EXTRA_ROUNDS = 2  # re-measurements of the points interference hit
QUALITY_ORDER = ("clean", "remeasured", "noisy")


@dataclass(frozen=True)
class TimingQuality:
    """How trustworthy a set of timings is. ``spread`` holds each point's relative median absolute
    deviation over its repeats (k = 1..K); ``remeasured`` the k values measured again because
    interference hit them; ``cpu_share`` the lowest median process CPU time per wall second per torch
    thread over a round of repeats (CPU devices, repeats long enough to judge; None otherwise);
    ``others_cpu`` the share of the machine's CPU that other processes used during the repeats kept
    (from /proc/stat; None elsewhere); ``verdict`` clean (nothing hit), remeasured (hit, and the
    re-measurement or the repeats kept were clean) or noisy (still hit, or the machine was busy);
    ``notes`` say what was seen, in words."""

    spread: list[float] = field(default_factory=list)
    remeasured: list[int] = field(default_factory=list)
    cpu_share: float | None = None
    others_cpu: float | None = None
    verdict: str = "clean"
    notes: list[str] = field(default_factory=list)

    def combined(self, other: "TimingQuality", label: str) -> "TimingQuality":
        """This quality with ``other``'s (a second set of timings, e.g. the draft step) folded in:
        the worse verdict, both sets of notes (the other's prefixed with ``label``)."""
        verdict = max(self.verdict, other.verdict, key=QUALITY_ORDER.index)
        return TimingQuality(
            self.spread,
            self.remeasured,
            self.cpu_share,
            self.others_cpu,
            verdict,
            self.notes + [f"{label}: {note}" for note in other.notes],
        )


def _busy_jiffies() -> int | None:
    """CPU time (clock ticks, every CPU) the machine has spent busy since boot; None off Linux."""
    try:
        with open("/proc/stat") as stat:
            values = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(values) - values[3] - (values[4] if len(values) > 4 else 0)  # minus idle and iowait


def others_busy_s(before: tuple[int | None, float], after: tuple[int | None, float]) -> float | None:
    """CPU seconds other processes used between two (busy jiffies, our CPU seconds) readings."""
    if before[0] is None or after[0] is None:
        return None
    return max(0.0, (after[0] - before[0]) / os.sysconf("SC_CLK_TCK") - (after[1] - before[1]))


def machine_reading() -> tuple[int | None, float]:
    ours = os.times()
    return _busy_jiffies(), ours.user + ours.system


def relative_spread(wall: np.ndarray) -> np.ndarray:
    """Per column: median absolute deviation / median of the repeats (0 for one repeat, and 0 while
    the deviation is within MIN_SPREAD_S of jitter)."""
    median = np.median(wall, axis=0)
    deviation = np.median(np.abs(wall - median), axis=0)
    return np.where(deviation > MIN_SPREAD_S, deviation / np.where(median > 0, median, 1.0), 0.0)


@dataclass
class Points:
    """Timings of some k values: medians and spreads over the repeats our process was not starved in."""

    medians: np.ndarray
    spread: np.ndarray
    starved: int  # repeats dropped because our process got too little CPU in them, or others used much
    too_few: bool  # fewer than half the repeats were clean: every point counts as hit
    share: float | None  # median process CPU per wall second per thread over the judged repeats
    kept_wall_s: float  # wall seconds of the repeats kept ...
    kept_others_s: float | None  # ... and the CPU seconds other processes used during them


def judge(wall: np.ndarray, cpu: np.ndarray, others: np.ndarray, threads: int, on_cpu: bool) -> Points:
    """Drop the repeats (rows) in which our process got less than MIN_CPU_SHARE of the CPU per wall
    second that its best repeats got, or in which other processes used more than MAX_OTHERS_CPU of
    the machine (only rows long enough to judge, MIN_JUDGED_S), then take medians and spreads of the
    rest."""
    cores = os.cpu_count() or 1
    row_wall = wall.sum(axis=1)
    row_share = cpu.sum(axis=1) / np.where(row_wall > 0, row_wall, np.inf) / threads
    judged = row_wall >= MIN_JUDGED_S
    starved = np.zeros(len(wall), dtype=bool)
    if on_cpu and judged.any():
        starved = judged & (row_share < MIN_CPU_SHARE * row_share[judged].max())
    with np.errstate(invalid="ignore"):
        starved |= judged & (others / (np.where(row_wall > 0, row_wall, np.inf) * cores) > MAX_OTHERS_CPU)
    too_few = int((~starved).sum()) < (len(wall) + 1) // 2
    keep = np.ones(len(wall), dtype=bool) if too_few else ~starved
    kept_others = None if np.isnan(others[keep]).any() else float(others[keep].sum())
    share = float(np.median(row_share[judged])) if on_cpu and judged.any() else None
    return Points(
        np.median(wall[keep], axis=0),
        relative_spread(wall[keep]),
        int(starved.sum()),
        too_few,
        share,
        float(row_wall[keep].sum()),
        kept_others,
    )


TimingMatrix = Callable[[list[int], int], tuple[np.ndarray, np.ndarray, np.ndarray]]


def interleaved_repeats(
    time_one: Callable[[int], tuple[float, float]],
    ks: list[int],
    repeats: int,
    warmup: int,
    on_repeat: Callable[[], None] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(wall seconds, process CPU seconds), shape (repeats, len(ks)), of ``time_one(k)`` (which times one
    call of k new tokens and returns both) for each k, interleaved (for r: for k) after ``warmup``
    untimed rounds; and the CPU seconds other processes used during each repeat, shape (repeats,) (NaN
    where /proc/stat is unreadable). ``on_repeat`` is called after every pass over the ks (progress)."""
    wall, cpu = np.empty((repeats, len(ks))), np.empty((repeats, len(ks)))
    others = np.full(repeats, np.nan)
    for r in range(warmup + repeats):
        before = machine_reading()
        for i, k in enumerate(ks):
            elapsed, used_cpu = time_one(k)
            if r >= warmup:
                wall[r - warmup, i], cpu[r - warmup, i] = elapsed, used_cpu
        used = others_busy_s(before, machine_reading())
        if r >= warmup and used is not None:
            others[r - warmup] = used
        if on_repeat:
            on_repeat()
    return wall, cpu, others


def checked_timings(
    measure: TimingMatrix, k_max: int, *, warmup: int, threads: int, on_cpu: bool
) -> tuple[list[float], TimingQuality]:
    """Medians of T(k) for k = 1..k_max and how trustworthy they are, whatever engine times them.

    ``measure(ks, warmup)`` returns (wall seconds, process CPU seconds) of shape (repeats, len(ks)),
    interleaved over ks within each repeat after ``warmup`` untimed rounds, and the CPU seconds other
    processes used per repeat (NaN where unknown). :func:`judge` drops the starved repeats; points
    whose repeats spread more than SPREAD_TOLERANCE, or that kept fewer than half their repeats, are
    measured again (up to EXTRA_ROUNDS more rounds, only those k, keeping the cleaner round). The
    verdict is noisy when a point is still hit after that, or when other processes used more than
    MAX_OTHERS_CPU of the machine during the repeats kept; remeasured when interference was seen and
    measured around; clean otherwise, with notes in words.
    """
    ks = list(range(1, k_max + 1))
    points = judge(*measure(ks, warmup), threads, on_cpu)
    medians, spread = points.medians, points.spread
    hit = (spread > SPREAD_TOLERANCE) | points.too_few
    starved, shares, rounds = points.starved, [points.share], [points]
    remeasured: set[int] = set()
    for _ in range(EXTRA_ROUNDS):
        again = [k for k in ks if hit[k - 1]]
        if not again:
            break
        remeasured.update(again)
        new = judge(*measure(again, 0), threads, on_cpu)
        starved += new.starved
        shares.append(new.share)
        rounds.append(new)
        for i, k in enumerate(again):
            new_hit = bool(new.spread[i] > SPREAD_TOLERANCE or new.too_few)
            if (new_hit, new.spread[i]) <= (bool(hit[k - 1]), spread[k - 1]):
                medians[k - 1], spread[k - 1], hit[k - 1] = new.medians[i], new.spread[i], new_hit
    others_s = [p.kept_others_s for p in rounds]
    kept_wall = sum(p.kept_wall_s for p in rounds)
    others_share = (
        min(1.0, sum(others_s) / (kept_wall * (os.cpu_count() or 1)))
        if kept_wall > 0 and None not in others_s
        else None
    )
    still = [k for k in ks if hit[k - 1]]
    notes = []
    if starved:
        notes.append(
            f"{starved} repeat{'s' if starved != 1 else ''} dropped: another process held the CPU (our "
            f"process got less than {MIN_CPU_SHARE:.0%} of its best repeats' CPU time, or others used more "
            f"than {MAX_OTHERS_CPU:.0%} of the machine)"
        )
    if remeasured:
        notes.append(
            f"k = {_ks(sorted(remeasured))} re-measured: their repeats spread more than "
            f"{SPREAD_TOLERANCE:.0%} or were starved of CPU"
        )
    if still:
        notes.append(
            f"k = {_ks(still)} still spread up to {100 * max(spread[k - 1] for k in still):.0f}% across "
            "repeats after re-measuring"
        )
    busy = others_share is not None and others_share > MAX_OTHERS_CPU
    if busy:
        notes.append(f"other processes used {others_share:.0%} of the machine's CPU while profiling")
    verdict = "noisy" if still or busy else "remeasured" if remeasured or starved else "clean"
    judged = [v for v in shares if v is not None]
    quality = TimingQuality(
        [float(v) for v in spread],
        sorted(remeasured),
        float(min(judged)) if judged else None,
        others_share,
        verdict,
        notes,
    )
    return [float(t) for t in medians], quality


def _ks(values: list[int]) -> str:
    return ", ".join(str(k) for k in values)
