"""The machine's own run-to-run noise, which no other process's CPU explains: measured, reported beside every
error figure, and judged like a busy machine.

Two runs of identical work differ on a virtual machine with nothing else running: on a 2-core AMD EPYC, 250
validation runs whose setting drafted nothing (the same work as plain decoding) measured "speedups" from 0.84
(10th percentile) to 1.13 (90th), while the interference check (other processes' CPU,
:mod:`analyzer.measuring.interference`) saw nothing. The causes a process cannot see in /proc's
per-process counters are the hypervisor's neighbours (steal time, which /proc/stat counts) and the CPU's
clock (its frequency, where the kernel exposes it). So:

- :class:`MachineSample` reads the machine's steal time and CPU frequencies; :func:`steal_share` says how
  much of a span the hypervisor took;
- :func:`noise_floor` turns pairs of identical runs (plain against plain, interleaved with the runs being
  judged) into the error one single-run speedup has against the true 1.0 (``floor``), one run's relative
  noise (``run_error``) and a verdict: noisy above MAX_NOISE_FLOOR, or with steal over MAX_STEAL_SHARE;
- :func:`aggregate_half_width` and :func:`sampled_half_width` say how wide an interval run noise leaves on a
  time-weighted speedup over prompts measured in interleaved passes.
"""

from __future__ import annotations

import glob
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

MAX_NOISE_FLOOR = 0.15  # over this mean error of a one-run speedup on identical work, advice is withheld
MAX_STEAL_SHARE = 0.10  # ... and over this share of the CPU taken by the hypervisor meanwhile
# a prompt's error is "within the noise" up to its noise floor (for its number of runs) plus this
PER_PROMPT_MARGIN = 0.03
FREQUENCY_NOTE = 0.05  # a clock that moved more than this (relative) is named in the notes
Z_95 = 1.959964  # the normal quantile of a two-sided 95% interval


@dataclass(frozen=True)
class MachineSample:
    """One reading of the whole machine: jiffies in total and stolen by the hypervisor (/proc/stat's first
    line; None off Linux) and each CPU's current frequency in MHz (empty where it cannot be read)."""

    total_jiffies: int | None
    steal_jiffies: int | None
    mhz: tuple[float, ...] = ()


def _proc_stat() -> tuple[int | None, int | None]:
    try:
        with open("/proc/stat") as stat:
            values = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None, None
    # user nice system idle iowait irq softirq steal guest guest_nice: guest time is already in user
    return sum(values[:8]), (values[7] if len(values) > 7 else 0)


def cpu_mhz() -> tuple[float, ...]:
    """Each CPU's current frequency in MHz: cpufreq's scaling_cur_freq where the kernel has it, else
    /proc/cpuinfo's "cpu MHz" lines (a virtual machine often shows its host's nominal clock there)."""
    values = []
    for path in sorted(glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq")):
        try:
            with open(path) as source:
                values.append(int(source.read().strip()) / 1000.0)
        except (OSError, ValueError):
            continue
    if values:
        return tuple(values)
    try:
        with open("/proc/cpuinfo") as info:
            return tuple(float(line.split(":")[1]) for line in info if line.startswith("cpu MHz"))
    except (OSError, ValueError, IndexError):
        return ()


def machine_sample() -> MachineSample:
    """The machine now (see :class:`MachineSample`)."""
    total, steal = _proc_stat()
    return MachineSample(total, steal, cpu_mhz())


def steal_share(before: MachineSample, after: MachineSample) -> float | None:
    """The share of the machine's CPU time the hypervisor took between two readings (None: not known)."""
    if None in (before.total_jiffies, after.total_jiffies, before.steal_jiffies, after.steal_jiffies):
        return None
    assert before.total_jiffies is not None and after.total_jiffies is not None  # for mypy
    assert before.steal_jiffies is not None and after.steal_jiffies is not None
    total = after.total_jiffies - before.total_jiffies
    return (after.steal_jiffies - before.steal_jiffies) / total if total > 0 else 0.0


@dataclass(frozen=True)
class NoiseFloor:
    """The machine's run-to-run noise from ``pairs`` pairs of identical runs: ``floor``, the mean absolute
    error of a one-run speedup against the true 1.0 (the mean |log(a / b)|); ``run_error``, one run's mean
    absolute relative error against its expectation (``floor`` / sqrt 2); ``p10`` and ``p90`` of the pairs'
    ratios; ``steal``, the share of the CPU the hypervisor took over the runs; ``frequency_spread`` of the
    CPU clock; ``verdict`` "quiet" or "noisy" (floor over MAX_NOISE_FLOOR or steal over MAX_STEAL_SHARE), or
    "unknown" without two pairs; ``notes`` in words."""

    pairs: int
    floor: float | None
    run_error: float | None
    p10: float | None
    p90: float | None
    steal: float | None
    frequency_spread: float | None
    verdict: str
    notes: list[str] = field(default_factory=list)

    def floor_for(self, repeats: int) -> float | None:
        """The floor of a speedup averaged (in log) over ``repeats`` interleaved repeats: floor / sqrt(n)."""
        return None if self.floor is None else self.floor / math.sqrt(max(repeats, 1))

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def noise_floor(
    first: Sequence[float],
    second: Sequence[float],
    *,
    steal: float | None = None,
    mhz_spread: float | None = None,
) -> NoiseFloor:
    """The noise of this machine from runs of identical work, ``first[i]`` and ``second[i]`` one pair (times
    of any unit, positive), the hypervisor's ``steal`` share over them and the clock's spread."""
    a, b = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    keep = (a > 0) & (b > 0)
    logs = np.log(a[keep] / b[keep])
    notes: list[str] = []
    if steal is not None and steal > 0.01:
        notes.append(f"the hypervisor took {steal:.1%} of the CPU time (steal)")
    if mhz_spread is not None and mhz_spread > FREQUENCY_NOTE:
        notes.append(f"the CPU clock moved by {mhz_spread:.0%} between runs")
    if len(logs) < 2:
        return NoiseFloor(len(logs), None, None, None, None, steal, mhz_spread, "unknown", notes)
    floor = float(np.mean(np.abs(logs)))
    ratios = np.exp(logs)
    noisy = floor > MAX_NOISE_FLOOR or (steal is not None and steal > MAX_STEAL_SHARE)
    if noisy:
        notes.append(
            f"two runs of the same work differ by {floor:.1%} on average (bound {MAX_NOISE_FLOOR:.0%}; "
            f"steal bound {MAX_STEAL_SHARE:.0%}): this machine is too noisy to time advice on"
        )
    return NoiseFloor(
        len(logs),
        floor,
        floor / math.sqrt(2.0),
        float(np.percentile(ratios, 10)),
        float(np.percentile(ratios, 90)),
        steal,
        mhz_spread,
        "noisy" if noisy else "quiet",
        notes,
    )


def aggregate_half_width(run_error: float, weights: Sequence[float], repeats: int) -> float:
    """The 95% half-width (relative) that run noise leaves on a time-weighted speedup over prompts weighted
    ``weights`` (their plain times), each measured in ``repeats`` interleaved (plain, speculative) pairs:
    z sqrt(2) sigma sqrt(sum w^2) / sum w / sqrt(n), sigma = run_error sqrt(pi / 2)."""
    return sampled_half_width(run_error, weights, [repeats] * len(weights))


def sampled_half_width(run_error: float, weights: Sequence[float], passes: Sequence[int]) -> float:
    """:func:`aggregate_half_width` where each prompt has its own number of interleaved passes (``passes``,
    by prompt, each at least 1): z sqrt(2) sigma sqrt(sum w^2 / n) / sum w."""
    w = np.asarray(weights, dtype=np.float64)
    n = np.maximum(np.asarray(passes, dtype=np.float64), 1.0)
    if w.size == 0 or w.sum() <= 0:
        return math.inf
    sigma = run_error * math.sqrt(math.pi / 2.0)
    return Z_95 * math.sqrt(2.0) * sigma * float(np.sqrt(np.sum(w**2 / n)) / np.sum(w))
