"""What a stored analysis says a user should do, in at most eight lines that open its report: per task the
decision and its setting (or off), the workload's expected speedup routed by task, off and with the best single
setting (each with its interval), whether the advice is withheld and why, the machine and its noise, and what was
left out. The text report and the report page both show it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from analyzer.pricing.option_curve import option_curve, stored_option_rows


@dataclass(frozen=True)
class TaskVerdict:
    """One task's decision: its setting (None: off), that setting's predicted speedup and interval."""

    task: str
    option: str | None
    speedup: float | None
    low: float | None
    high: float | None


@dataclass(frozen=True)
class Verdict:
    """The lines a report opens with, as values (see the module's docstring)."""

    tasks: tuple[TaskVerdict, ...]
    routed: tuple[float, float, float] | None  # the workload routed by task: speedup, interval
    best_single: tuple[str, float, float, float] | None  # the best single setting: label, speedup, interval
    withheld: str | None
    machine: str
    noise: str
    left_out: str | None

    def lines(self) -> list[str]:
        """At most eight lines of text."""
        on = [t for t in self.tasks if t.option is not None]
        off = [t.task for t in self.tasks if t.option is None]
        lines = [
            f"Verdict: speculate on {len(on)} of {len(self.tasks)} tasks"
            + ("; every task off: the advice is withheld" if self.withheld else "")
        ]
        if on:
            lines.append(
                "  on: "
                + "; ".join(f"{t.task} with {t.option}, {_speedup(t.speedup, t.low, t.high)}" for t in on)
            )
        if off:
            lines.append(f"  off: {', '.join(off)}")
        workload = [
            f"routed by task {_speedup(*self.routed)}" if self.routed else "routed by task -",
            "off 1.00x",
        ]
        if self.best_single is not None:
            label, value, low, high = self.best_single
            workload.append(f"the best single setting ({label}) {_speedup(value, low, high)}")
        lines.append("The workload, predicted (95% interval over prompts): " + "; ".join(workload))
        withheld = self.withheld or ""
        lines.append(
            (withheld if withheld.startswith("Advice withheld") else f"Advice withheld: {withheld}")
            if withheld
            else "Advice: not withheld"
        )
        lines.append(f"Machine: {self.machine}; {self.noise}")
        if self.left_out:
            lines.append(f"Left out: {self.left_out} (below)")
        return lines[:8]


def _speedup(value: float | None, low: float | None, high: float | None) -> str:
    if value is None:
        return "-"
    if low is None or high is None:
        return f"{value:.2f}x"
    return f"{value:.2f}x [{low:.2f}, {high:.2f}]"


def _finite(value: Any) -> float | None:
    return float(value) if value is not None and np.isfinite(value) else None


def task_verdicts(tasks: Sequence[Mapping[str, Any]]) -> tuple[TaskVerdict, ...]:
    """Each stored task's decision with its option's speedup and interval (from its stored curve)."""
    verdicts = []
    for task in tasks:
        chosen = task.get("chosen")
        options = {o["label"]: o for o in (task.get("curve") or {}).get("options", [])}
        option = options.get(chosen) if chosen else None
        verdicts.append(
            TaskVerdict(
                task["task"],
                chosen,
                _finite(option["speedup"]) if option else None,
                _finite(option.get("low")) if option else None,
                _finite(option.get("high")) if option else None,
            )
        )
    return tuple(verdicts)


def noise_words(noise: Mapping[str, Any] | None) -> str:
    """The machine's noise in a few words: how far two identical runs differ, and the verdict."""
    if not noise or noise.get("floor") is None:
        return "noise not measured"
    return f"two identical runs differ by {noise['floor']:.1%} ({noise['verdict']})"


def server_verdict(record: Any) -> Verdict:
    """The verdict of a stored llama-server analysis (``analyzer.orm.ServerAnalysisRecord``)."""
    routed = None
    overall = (record.routing or [None])[-1]
    if overall:
        routed = (overall["by_task"], *overall["by_task_interval"])
    best_single = None
    if record.prompts and record.drafters:
        _, plain, options, spread = stored_option_rows(record.prompts)
        curve = option_curve(plain, options, list(record.drafters), spread=spread)
        if curve.best is not None:
            low, high = curve.interval_of(curve.best)
            best_single = (curve.best, curve.speedup_of(curve.best), low, high)
    return Verdict(
        task_verdicts(record.tasks),
        routed,
        best_single,
        record.advice_withheld,
        f"{record.machine}, {record.threads} threads",
        noise_words(record.noise),
        left_out_count(record.left_out),
    )


def left_out_count(left_out: Mapping[str, Any] | None) -> str | None:
    """``2 settings, 1 prompt``: how much an analysis left out (None: nothing)."""
    left_out = left_out or {}
    counts = [
        f"{n} {word}{'s' if n > 1 else ''}"
        for n, word in (
            (len(left_out.get("settings") or {}), "setting"),
            (len(left_out.get("prompts") or []), "prompt"),
        )
        if n
    ]
    return ", ".join(counts) or None


def left_out_lines(left_out: Mapping[str, Any] | None) -> list[str]:
    """What an analysis could not take, a line each: the settings whose servers disagreed with their replays
    and the prompts the context could not hold (a run's named by their position in the set)."""
    left_out = left_out or {}
    lines = [f"Left out {label}: {why}" for label, why in (left_out.get("settings") or {}).items()]
    lines += [
        f"Left out prompt {p.get('position', p['prompt_id'])} ({p['task']}): {p['why']}"
        for p in left_out.get("prompts") or []
    ]
    return lines


def run_verdict(report: Mapping[str, Any]) -> Verdict:
    """The verdict of a run's report (:func:`analyzer.advice.report.build_report`'s dict): each task at its
    best gamma where it speculates, the workload routed by task, and the workload's best single gamma."""
    tasks = tuple(
        TaskVerdict(
            task,
            f"gamma {group['best_gamma']}" if group.get("speculate") and group.get("best_gamma") else None,
            _finite(group.get("predicted_speedup")),
            *(_finite(v) for v in (group.get("speedup_interval") or [None, None])),
        )
        for task, group in (report.get("tasks") or {}).items()
    )
    overall = (report.get("routing") or [None])[-1]
    routed = (overall["by_task"], *overall["by_task_interval"]) if overall else None
    workload = report.get("workload") or {}
    best_single = None
    if workload.get("best_gamma") and workload.get("predicted_speedup") is not None:
        low, high = workload.get("speedup_interval") or [None, None]
        best_single = (f"gamma {workload['best_gamma']}", workload["predicted_speedup"], low, high)
    profile = report.get("cost_profile") or {}
    noise = (
        f"its cost profile {profile['quality']}"
        if profile.get("quality")
        else "its cost profile's noise not known"
    )
    return Verdict(
        tasks,
        routed,
        best_single,
        report.get("advice_withheld"),
        f"{report.get('device') or 'device not known'}, {report.get('dtype') or 'float32'}",
        noise,
        left_out_count(report.get("left_out")),
    )
