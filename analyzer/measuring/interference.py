"""Is the machine quiet enough to time on? Interference detection for cost profiling.

A busy machine spoils a timing (another process holding one of two cores once gave T_t(6)/T_t(1) =
9.3 and flipped the advice). Three signals, calibrated on this project's 2-core machine: the spread of
a point's repeats; the process CPU time our process got per wall second (quiet 0.92-0.99 per torch
thread; with one other busy process 0.51-0.73); and the CPU other processes used, from /proc/stat
(quiet 0-2% of the machine; one busy process 37%). The load average lagged and did not show it.
:func:`judge` turns a matrix of timed repeats into medians and spreads over the repeats that were
not disturbed; :mod:`analyzer.measuring.cost` re-measures what stays disturbed or comes out physically
implausible and records a verdict. :func:`wait_for_quiet` waits, bounded, for a quiet machine before
profiling and validation start.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

SPREAD_TOLERANCE = 0.10  # relative median absolute deviation of a point's repeats ...
MIN_SPREAD_S = 0.0002  # ... once it exceeds timer and scheduler jitter (seconds)
MIN_CPU_SHARE = 0.85  # a repeat's process CPU per wall second, relative to the profile's best repeats
MIN_JUDGED_S = 0.05  # repeats shorter than this are not judged by CPU time (the CPU clock is too coarse)
MAX_OTHERS_CPU = 0.15  # share of the machine's CPU other processes may use while we profile
EXTRA_ROUNDS = 2  # re-measurements of the points interference hit
# physically plausible T(k)/T(1) for k >= 2: one pass over k tokens never takes much less than a pass over
# one (the same weights are read; ~0.9 allows for jitter), nor more than k passes of one each (a
# compute-bound pass is at worst linear in k; 1.5 k allows for cache effects)
MIN_RATIO = 0.9
MAX_RATIO_PER_TOKEN = 1.5
QUIET_WINDOW_S = 2.0  # the window over which the machine's load is judged while waiting for quiet
QUIET_REPORT_EVERY_S = 10.0  # how often a wait for quiet says how it goes
BUSY_PROBE_S = 1.0  # how long the machine is watched before measuring again what its load spoilt
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
    """(busy jiffies of the whole machine, None off Linux; CPU seconds our process has used so far)."""
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
    measured again (up to EXTRA_ROUNDS more rounds, only those k, keeping the cleaner round); so are
    the points whose T(k)/T(1) is physically implausible (:func:`implausible_ratios`), with k = 1,
    taking the new round's values. After a round in which most repeats were starved, the next is measured
    only where the machine is no longer taken a moment later (:func:`still_busy`): under a load that goes
    on, another round would be starved as well and only take longer to say so. The verdict is noisy when
    a point is still hit after that, when a ratio is still implausible, or when other processes used more
    than MAX_OTHERS_CPU of the machine during the repeats kept; remeasured when interference was seen and
    measured around; clean otherwise, with notes in words.
    """
    ks = list(range(1, k_max + 1))
    points = judge(*measure(ks, warmup), threads, on_cpu)
    medians, spread = points.medians, points.spread
    hit = (spread > SPREAD_TOLERANCE) | points.too_few
    first_odd = implausible_ratios(medians)
    remeasured, new_rounds, busy_after = _remeasure_hit_points(
        measure, ks, points, medians, spread, hit, threads, on_cpu
    )
    rounds = [points, *new_rounds]
    starved = sum(p.starved for p in rounds)
    odd_after = implausible_ratios(medians)
    others_share = _others_share(rounds)
    still = [k for k in ks if hit[k - 1]]
    busy = others_share is not None and others_share > MAX_OTHERS_CPU
    notes = _timing_notes(
        starved, first_odd, remeasured, odd_after, still, spread, others_share if busy else None, busy_after
    )
    verdict = "noisy" if still or busy or odd_after else "remeasured" if remeasured or starved else "clean"
    judged = [p.share for p in rounds if p.share is not None]
    quality = TimingQuality(
        [float(v) for v in spread],
        sorted(remeasured),
        float(min(judged)) if judged else None,
        others_share,
        verdict,
        notes,
    )
    return [float(t) for t in medians], quality


def _remeasure_hit_points(
    measure: TimingMatrix,
    ks: list[int],
    first: Points,
    medians: np.ndarray,
    spread: np.ndarray,
    hit: np.ndarray,
    threads: int,
    on_cpu: bool,
) -> tuple[set[int], list[Points], float | None]:
    """Measure hit and implausible points again, updating ``medians``, ``spread`` and ``hit`` in place;
    returns the k values measured again, the new rounds, and other processes' share of the machine where
    it stopped because they still took it after a round (``first`` or a new one) whose repeats were mostly
    starved (None otherwise)."""
    remeasured: set[int] = set()
    rounds: list[Points] = []
    last = first
    for _ in range(EXTRA_ROUNDS):
        odd = set(implausible_ratios(medians))
        if odd:
            odd.add(1)  # T(1) may be the disturbed one
        again = [k for k in ks if hit[k - 1] or k in odd]
        if not again:
            break
        if last.too_few and (busy := still_busy()) is not None:
            return remeasured, rounds, busy
        remeasured.update(again)
        new = judge(*measure(again, 0), threads, on_cpu)
        rounds.append(new)
        last = new
        for i, k in enumerate(again):
            new_hit = bool(new.spread[i] > SPREAD_TOLERANCE or new.too_few)
            # an implausible point is replaced whatever its spread: a steady disturbance spreads little
            if k in odd or (new_hit, new.spread[i]) <= (bool(hit[k - 1]), spread[k - 1]):
                medians[k - 1], spread[k - 1], hit[k - 1] = new.medians[i], new.spread[i], new_hit
    return remeasured, rounds, None


def _others_share(rounds: list[Points]) -> float | None:
    """The share of the machine's CPU other processes used during the repeats kept (None: not known)."""
    others_s = [p.kept_others_s for p in rounds if p.kept_others_s is not None]
    kept_wall = sum(p.kept_wall_s for p in rounds)
    if kept_wall > 0 and len(others_s) == len(rounds):
        return min(1.0, sum(others_s) / (kept_wall * (os.cpu_count() or 1)))
    return None


def _timing_notes(
    starved: int,
    first_odd: dict[int, float],
    remeasured: set[int],
    odd_after: dict[int, float],
    still: list[int],
    spread: np.ndarray,
    busy_share: float | None,
    busy_after: float | None = None,
) -> list[str]:
    """What :func:`checked_timings` saw, in words (``busy_share``: others' share when above the bar;
    ``busy_after``: their share after a starved round, where re-measuring stopped for it)."""
    notes = []
    if starved:
        notes.append(
            f"{starved} repeat{'s' if starved != 1 else ''} dropped: another process held the CPU (our "
            f"process got less than {MIN_CPU_SHARE:.0%} of its best repeats' CPU time, or others used more "
            f"than {MAX_OTHERS_CPU:.0%} of the machine)"
        )
    if first_odd:
        notes.append(
            f"T_t(k)/T_t(1) = {_ratios(first_odd)}: physically implausible (a pass over k tokens takes "
            f"{MIN_RATIO:g} to {MAX_RATIO_PER_TOKEN:g} k times a pass over one); re-measured"
        )
    spread_hit = sorted(remeasured - set(first_odd) - ({1} if first_odd else set()))
    if spread_hit:
        notes.append(
            f"k = {_ks(spread_hit)} re-measured: their repeats spread more than "
            f"{SPREAD_TOLERANCE:.0%} or were starved of CPU"
        )
    if odd_after:
        notes.append(f"T_t(k)/T_t(1) = {_ratios(odd_after)} still implausible after re-measuring")
    if still and busy_after is not None:
        notes.append(
            f"k = {_ks(still)} not measured again: other processes still used {busy_after:.0%} of the "
            "machine's CPU after the starved repeats"
        )
    elif still:
        notes.append(
            f"k = {_ks(still)} still spread up to {100 * max(spread[k - 1] for k in still):.0f}% across "
            "repeats after re-measuring"
        )
    if busy_share is not None:
        notes.append(f"other processes used {busy_share:.0%} of the machine's CPU while profiling")
    return notes


def disturbed(others_cpu: float | None) -> bool:
    """Whether a measurement during which other processes used ``others_cpu`` of the machine (None:
    not known) counts as disturbed: kept, but marked and left out of predicted-vs-measured figures."""
    return others_cpu is not None and others_cpu > MAX_OTHERS_CPU


def implausible_ratios(
    medians: list[float] | np.ndarray,
    max_per_token: float = MAX_RATIO_PER_TOKEN,
    tolerance_s: float | None = None,
) -> dict[int, float]:
    """The k >= 2 whose T(k)/T(1) is physically implausible (below MIN_RATIO, or above
    ``max_per_token`` x k, by more than ``tolerance_s`` seconds of timer and scheduler jitter:
    MIN_SPREAD_S unless given), with the ratio: a disturbance that hit T(1) or T(k) and not the other."""
    tolerance = MIN_SPREAD_S if tolerance_s is None else tolerance_s
    values = np.asarray(medians, dtype=np.float64)
    if len(values) < 2 or not values[0] > 0:
        return {}
    first = values[0]
    return {
        k: float(values[k - 1] / first)
        for k in range(2, len(values) + 1)
        if values[k - 1] < MIN_RATIO * first - tolerance
        or values[k - 1] > max_per_token * k * first + tolerance
    }


@dataclass(frozen=True)
class QuietWait:
    """How a wait for a quiet machine ended: ``quiet`` (a window with other processes' CPU share at
    most MAX_OTHERS_CPU was seen, or the share cannot be read here), the seconds waited, the last
    window's ``others_cpu`` share (None when unknown) and, when the wait gave up, a ``note`` in words."""

    quiet: bool
    waited_s: float
    others_cpu: float | None
    note: str | None = None


def others_share_over(
    seconds: float,
    *,
    reading: Callable[[], tuple[int | None, float]] = machine_reading,
    sleep: Callable[[float], None] = time.sleep,
) -> float | None:
    """The share of the machine's CPU other processes used over the next ``seconds`` (we sleep
    meanwhile); None where /proc/stat cannot be read."""
    before = reading()
    if before[0] is None:
        return None
    sleep(seconds)
    used = others_busy_s(before, reading())
    return None if used is None else min(1.0, used / (seconds * (os.cpu_count() or 1)))


def still_busy(seconds: float = BUSY_PROBE_S) -> float | None:
    """Other processes' share of the machine's CPU over the next ``seconds``
    (:func:`others_share_over`) where it is above MAX_OTHERS_CPU: the machine is still taken, and what is
    measured at once would be disturbed as well. None where it is not, or where /proc/stat cannot be
    read. Asked before measuring again what a busy machine spoilt (a profile's starved round, the
    machinery overhead's busy attempt)."""
    share = others_share_over(seconds)
    return share if share is not None and share > MAX_OTHERS_CPU else None


def wait_for_quiet(
    max_wait_s: float,
    report: Callable[[int, int, str], None] | None = None,
    *,
    what: str = "profiling",
    window_s: float = QUIET_WINDOW_S,
    reading: Callable[[], tuple[int | None, float]] = machine_reading,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> QuietWait:
    """Before timing anything: while other processes use more than MAX_OTHERS_CPU of the machine
    (judged over ``window_s`` windows, /proc/stat), wait, up to ``max_wait_s`` seconds, for a quiet
    window. ``report(waited_s, max_wait_s, line)`` hears of it when the first window is busy and
    every QUIET_REPORT_EVERY_S after ("machine busy: others use 51%; waiting up to 5 min for a
    quiet window before profiling"). Returns at once where the share cannot be read or
    ``max_wait_s`` is 0 (no wait); gives up after ``max_wait_s`` with a note (the caller times
    anyway and the interference checks judge what comes out). Once quiet after a wait it says so
    (``report(0, 0, line)``, a line without a bar)."""
    if max_wait_s <= 0:
        return QuietWait(True, 0.0, None)
    started = clock()
    share = others_share_over(window_s, reading=reading, sleep=sleep)
    last_report, line = None, ""
    while share is not None and share > MAX_OTHERS_CPU:
        waited = clock() - started
        if waited >= max_wait_s:
            return QuietWait(
                False,
                waited,
                share,
                f"machine busy: other processes used {share:.0%} of its CPU after waiting "
                f"{_duration(waited)} for a quiet window; {what} went ahead",
            )
        if report and (last_report is None or waited - last_report >= QUIET_REPORT_EVERY_S):
            line = line or (  # one line (one progress bar of seconds waited), worded at the first window
                f"machine busy: others use {share:.0%}; waiting up to {_duration(max_wait_s)} for a "
                f"quiet window before {what}"
            )
            report(int(waited), int(max_wait_s), line)
            last_report = waited
        share = others_share_over(window_s, reading=reading, sleep=sleep)
    waited = clock() - started
    if report and last_report is not None:
        report(0, 0, f"machine quiet after {_duration(waited)} (others use {share or 0:.0%}); {what}")
    return QuietWait(True, waited, share)


def _duration(seconds: float) -> str:
    """``45 s``, ``5 min``, ``2 min 30 s``."""
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole} s"
    minutes, rest = divmod(whole, 60)
    return f"{minutes} min" + (f" {rest} s" if rest else "")


def _ratios(ratios: dict[int, float]) -> str:
    return ", ".join(f"{ratio:.2f} at k = {k}" for k, ratio in sorted(ratios.items()))


def _ks(values: list[int]) -> str:
    return ", ".join(str(k) for k in values)
