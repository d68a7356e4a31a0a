"""The one report page of an analysis, whatever engine made it: a run (transformers, llama-cpp-python) at
``/runs/N`` and an analysis in llama-server at ``/llama-server/N`` render the same template the same way.

Both kinds store their rows per prompt and option in one table (analyzer/advice/option_rows.py) and decide
each task by one rule over a curve of options. :func:`run_page` and :func:`server_page` read either kind's
report JSON into one :class:`ReportPage`: the header (engine, models, machine), each task's curve over the
options with its interval and decision, each prompt's options, the routing numbers, the plots and the
exports. templates/report.html renders it (:func:`render_report`); what only one kind has (a run's
recommendation, cost table, price comparison and export card; a llama-server analysis' fitted step costs,
validation per setting and pools) comes from the macros of that kind's template, ``ReportPage.sections``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flask import render_template
from markupsafe import Markup

from analyzer.advice.option_rows import gamma_option
from analyzer.analysis.server_text import decision_text
from analyzer.names import DEFAULT_MARGIN
from analyzer.orm import ServerAnalysisRecord
from analyzer.pricing.speedup import INTERVAL_LEVEL, MIN_TASK_PROMPTS, best_gamma
from webui.plots import report_plots, server_plots
from webui.ui import num


@dataclass(frozen=True)
class OptionPoint:
    """One option of a task's curve or of a prompt: its label, the predicted speedup (None: not finite) with
    its interval where the analysis has one, and the speedup measured where validation ran the option."""

    label: str
    speedup: float | None
    low: float | None = None
    high: float | None = None
    measured: float | None = None


def best_option(options: Sequence[OptionPoint]) -> OptionPoint | None:
    """The option of the highest predicted speedup, the first among ties (None: nothing finite), as a run's
    g* is chosen (:func:`analyzer.pricing.speedup.best_gamma`)."""
    position, _ = best_gamma([o.speedup for o in options])
    return options[position - 1] if position is not None else None


@dataclass(frozen=True)
class TaskCurve:
    """A task (or the whole workload) over the options: its prompts, each option's point, the option the one
    rule chose (None: off), the rule's decision in words, and the values of the kind's own columns."""

    task: str
    prompts: int
    options: tuple[OptionPoint, ...]
    chosen: str | None
    rule: str
    facts: tuple[str, ...] = ()


@dataclass(frozen=True)
class PromptRow:
    """One prompt's options: its number in the set (from 1), its ids and task, its token counts, each
    option's predicted and measured speedup, the page that drills into it (None: none), and the values of
    the kind's own columns."""

    number: int
    prompt_id: int
    external_id: str | None
    task: str | None
    prompt_tokens: int | None
    output_tokens: int | None
    options: tuple[OptionPoint, ...]
    url: str | None = None
    facts: tuple[str, ...] = ()

    @property
    def best(self) -> OptionPoint | None:
        """The prompt's best option (None: nothing finite)."""
        return best_option(self.options)


@dataclass(frozen=True)
class Column:
    """A column only one kind's tables have: its heading, and whether it sorts as a number."""

    heading: str
    numeric: bool = False


@dataclass(frozen=True)
class Link:
    """An export: what it is, in words, and where."""

    label: str
    url: str


@dataclass(frozen=True)
class DecisionRule:
    """The one rule's numbers as the page states them: the bar S must clear (1 + margin), the interval's
    level, and the fewest prompts a task decides on alone."""

    bar: float
    level: float = INTERVAL_LEVEL
    min_prompts: int = MIN_TASK_PROMPTS


@dataclass(frozen=True)
class ReportPage:
    """What the one report page shows of an analysis of either kind (``run`` or ``llama-server``).

    ``header`` is (name, value) pairs: engine, models, machine, prompt set. ``labels`` are the options in the
    analysis' order; ``tasks`` (and ``workload``, where the kind has a workload curve) are the curves over
    them; ``prompts`` the per-prompt options; ``curve_note`` says in a sentence what this kind's cells hold.
    ``sections`` is the template whose macros (``progress``, ``findings``, ``actions``) add the kind's own
    sections."""

    kind: str
    analysis_id: int
    title: str
    engine: str
    header: tuple[tuple[str, str], ...]
    labels: tuple[str, ...]
    tasks: tuple[TaskCurve, ...]
    prompts: tuple[PromptRow, ...]
    rule: DecisionRule
    curve_note: str
    sections: str
    workload: TaskCurve | None = None
    routing: list[dict[str, Any]] | None = None
    plots: dict[str, Markup] = field(default_factory=dict)
    exports: tuple[Link, ...] = ()
    status: str | None = None
    task_columns: tuple[Column, ...] = ()
    prompt_columns: tuple[Column, ...] = ()


def prompt_rows(
    prompts: Sequence[Mapping[str, Any]],
    labels: Sequence[str],
    *,
    url: Callable[[Mapping[str, Any]], str | None] = lambda prompt: None,
    facts: Callable[[Mapping[str, Any]], tuple[str, ...]] = lambda prompt: (),
) -> tuple[PromptRow, ...]:
    """Each prompt of an analysis' JSON (``prompt_id``, ``task``, the token counts and ``options`` as
    :meth:`analyzer.advice.option_rows.OptionRow.as_json` gives them) as a row over ``labels``, numbered by
    its ``position`` in the set where the kind stores it, else by its place in ``prompts``."""
    rows = []
    for place, prompt in enumerate(prompts):
        stored = {option["label"]: option for option in prompt["options"]}
        options = tuple(
            OptionPoint(
                label,
                stored[label]["predicted_speedup"] if label in stored else None,
                measured=stored[label]["measured_speedup"] if label in stored else None,
            )
            for label in labels
        )
        rows.append(
            PromptRow(
                number=prompt.get("position", place) + 1,
                prompt_id=prompt["prompt_id"],
                external_id=prompt.get("external_id"),
                task=prompt["task"],
                prompt_tokens=prompt.get("prompt_tokens"),
                output_tokens=prompt.get("output_tokens"),
                options=options,
                url=url(prompt),
                facts=facts(prompt),
            )
        )
    return tuple(rows)


def _run_curve(name: str, group: Mapping[str, Any], labels: Sequence[str]) -> TaskCurve:
    """A run's task (or workload) as a curve over its gammas: S(g) at every g, the interval where the run has
    one (at the group's own g*; a group the workload decides shows the workload's g*, so no interval of its
    own), and the decision with its reason."""
    curve = group.get("speedup_curve") or []
    best = group.get("best_gamma")
    low, high = group.get("speedup_interval") or (None, None)
    own = group.get("decision_basis") != "workload"
    options = tuple(
        OptionPoint(
            label,
            curve[g - 1] if g <= len(curve) else None,
            *((low, high) if own and g == best else (None, None)),
        )
        for g, label in enumerate(labels, start=1)
    )
    chosen = gamma_option(best) if group.get("speculate") and best else None
    return TaskCurve(name, group["n"], options, chosen, group.get("decision_reason") or "")


def run_page(
    report: dict[str, Any],
    *,
    status: str | None,
    prompt_url: Callable[[int, int | None], str] | None = None,
    exports: Sequence[Link] = (),
) -> ReportPage:
    """A run's report (:func:`analyzer.advice.report.build_report`) as the one page: its options are its
    gammas; ``prompt_url(prompt_id, gamma)`` links a prompt to its drill-down at its task's g* (None: no
    links, as in the self-contained export)."""
    labels = tuple(gamma_option(g) for g in range(1, report["params"]["gamma_max"] + 1))
    tasks = report["tasks"]

    def url(prompt: Mapping[str, Any]) -> str | None:
        if prompt_url is None:
            return None
        task = tasks.get(prompt["task"]) or {}
        return prompt_url(prompt["prompt_id"], task.get("best_gamma"))

    measured, priced = report["measured_by"], report["priced_by"]
    machine = measured["device"] or "not yet known"
    if priced.get("device") and priced["device"] != measured["device"]:
        machine += f"; priced on {priced['device']}"
    shown, total = len(report["prompts"]), report["progress"]["total"]
    version = f" {priced['engine_version']}" if priced.get("engine_version") else ""
    counted = f"{shown} prompts" if shown == total else f"{shown} of {total} prompts"
    return ReportPage(
        kind="run",
        analysis_id=report["run_id"],
        title=f"Analysis run #{report['run_id']}",
        engine=report["engine"],
        header=(
            ("engine", report["engine"] + version),
            ("target", report["target"]),
            ("draft", report["draft"]),
            ("machine", machine),
            ("prompt set", f"{report['prompt_set']}, {counted}"),
        ),
        labels=labels,
        tasks=tuple(_run_curve(task, group, labels) for task, group in tasks.items()),
        workload=_run_curve("whole workload", report["workload"], labels) if report.get("workload") else None,
        prompts=prompt_rows(report["prompts"], labels, url=url, facts=lambda p: (num(p["alpha"], 3),)),
        rule=DecisionRule(bar=1 + report["params"].get("margin", DEFAULT_MARGIN)),
        curve_note="S(g) at each gamma, with the interval at the group's best gamma (none where the workload "
        "decides for a task: the rule gives the workload's numbers)",
        sections="report_run.html",
        routing=report.get("routing"),
        plots={name: Markup(svg) for name, svg in report_plots(report).items()} if report["prompts"] else {},
        exports=tuple(exports),
        status=status,
        prompt_columns=(Column("alpha", numeric=True),),
    )


def server_page(
    data: Mapping[str, Any],
    record: ServerAnalysisRecord,
    *,
    pools: Mapping[str, str],
    exports: Sequence[Link] = (),
) -> ReportPage:
    """A llama-server analysis as the one page, from its JSON (:func:`analyzer.analysis.server_store.
    server_analysis_json`) and its record (the server's setup, the stored prompt rows the plots read);
    ``pools`` names each task's pool (:func:`analyzer.analysis.server_store.pool_plan`'s routes)."""
    labels = tuple(record.drafters)
    rules = {task["task"]: decision_text(task) for task in record.tasks}
    tasks = tuple(
        TaskCurve(
            task["task"],
            task["prompts"],
            tuple(
                OptionPoint(
                    option["label"],
                    option.get("speedup"),
                    option.get("low"),
                    option.get("high"),
                    (task.get("measured") or {}).get(option["label"]),
                )
                for option in task["options"]
            ),
            task["chosen"],
            rules.get(task["task"], "-"),
            facts=(pools.get(task["task"], ""),),
        )
        for task in data["tasks"]
    )
    drafts = ", ".join(labels) + (f" (draft model {record.draft_model})" if record.draft_model else "")
    return ReportPage(
        kind="llama-server",
        analysis_id=record.id,
        title=f"llama-server analysis #{record.id}",
        engine="llama-server",
        header=(
            ("engine", f"llama-server {record.server_build}"),
            ("target", record.model),
            ("drafts", drafts),
            ("machine", record.machine),
            ("prompt set", f"{record.prompt_set.name}, {len(data['prompts'])} prompts"),
        ),
        labels=labels,
        tasks=tasks,
        prompts=prompt_rows(
            data["prompts"], labels, facts=lambda p: ("yes" if p.get("calibration") else "",)
        ),
        rule=DecisionRule(bar=1 + DEFAULT_MARGIN),
        curve_note="the predicted speedup at every setting with its interval, then the speedup measured "
        "through the servers on the same prompts (the calibration prompts included; summed time over summed time)",
        sections="report_server.html",
        routing=data.get("routing"),
        plots={name: Markup(svg) for name, svg in server_plots(record.prompts).items()},
        exports=tuple(exports),
        task_columns=(Column("pool"),),
        prompt_columns=(Column("calibration"),),
    )


def render_report(page: ReportPage, **sections: Any) -> str:
    """The one report page of ``page``; ``sections``: what the kind's own sections read (the macros of
    ``page.sections``)."""
    return render_template("report.html", page=page, **sections)
