"""The analysis summary as it is stored with its run (``analysis_runs.summary``): serialised to JSON
and back exactly, computed once when a run finishes (its prompts' tasks known by then), completed with
validations without pricing again (its per prompt and gamma rows, analyzer/advice/option_rows.py, written with it),
and read by the report, publishing and the pages through
:func:`run_summary`, which computes it again only when what it was computed from changed."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, replace
from typing import Any, Mapping, Sequence, TypeVar

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from analyzer.advice.option_rows import replace_options, run_option_rows
from analyzer.advice.summary import (
    AnalysisSummary,
    DecisionReason,
    GroupDecision,
    GroupSummary,
    PromptSummary,
    finite,
    summarize_run,
)
from analyzer.measuring.interference import disturbed
from analyzer.orm import AnalysisRun, PromptResult, ValidationResult
from analyzer.pricing.speedup import Cost

# the stored JSON's shape and rule (2: PolicyCurve.decide; 3: transformers' defaults priced; 4: each prompt
# priced at its own context where the profile has context slopes); another is computed again
SUMMARY_FORMAT = 4
FINISHED_STATUSES = ("done", "failed", "cancelled")


def summary_to_json(summary: AnalysisSummary) -> dict[str, Any]:
    """The summary as JSON-ready data (dict keys as strings, tuples as lists; nothing is NaN: curves
    and statistics already hold None where not finite); :func:`summary_from_json` reads it back
    equal."""
    return _plain(asdict(summary))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def summary_from_json(data: Mapping[str, Any]) -> AnalysisSummary:
    """The summary that :func:`summary_to_json` wrote."""
    return AnalysisSummary(
        run_id=data["run_id"],
        gamma_max=data["gamma_max"],
        sampling=data["sampling"],
        margin=data["margin"],
        cost=Cost(**data["cost"]) if data["cost"] is not None else None,
        costs={int(b): Cost(**c) for b, c in data["costs"].items()},
        prompts=[
            PromptSummary(**dict(p, rounds={int(g): r for g, r in p["rounds"].items()}))
            for p in data["prompts"]
        ],
        tasks={task: _group_from_json(group, GroupSummary) for task, group in data["tasks"].items()},
        workload=_group_from_json(data["workload"], GroupSummary) if data["workload"] is not None else None,
    )


_Group = TypeVar("_Group", bound=GroupDecision)


def _group_from_json(data: Mapping[str, Any], kind: type[_Group]) -> _Group:
    values = dict(
        data,
        speedup_interval=tuple(data["speedup_interval"]),
        reason=DecisionReason(**dict(data["reason"], interval=tuple(data["reason"]["interval"]))),
    )
    if "by_batch" in values:
        values["by_batch"] = {
            int(b): _group_from_json(entry, GroupDecision) for b, entry in data["by_batch"].items()
        }
    return kind(**values)


def _summary_basis(
    session: Session,
    run: AnalysisRun,
    results: list[PromptResult] | None,
    validations: list[ValidationResult] | None,
) -> dict[str, Any]:
    """What a run's summary is computed from, to tell a stored one that is still true: the count and
    last id of its results and of its validations (a resumed run adds results, a validation adds
    rows; none is changed in place), and its cost profiles."""

    def count_and_last(rows: list | None, model: type[PromptResult] | type[ValidationResult]) -> list:
        if rows is not None:
            return [len(rows), max((row.id for row in rows), default=None)]
        count, last = session.execute(
            select(func.count(model.id), func.max(model.id)).where(model.run_id == run.id)
        ).one()
        return [int(count), last]

    return {
        "results": count_and_last(results, PromptResult),
        "validations": count_and_last(validations, ValidationResult),
        "cost_profile": run.cost_profile_id,
        "profiles": {str(link.batch_size): link.cost_profile_id for link in run.batch_profiles},
    }


def store_summary(
    session: Session,
    run: AnalysisRun,
    *,
    results: list[PromptResult] | None = None,
    validations: list[ValidationResult] | None = None,
) -> AnalysisSummary:
    """Compute ``run``'s summary and store it with the run (``AnalysisRun.summary``), as when a run
    finishes or is priced anew; the caller commits. A stored summary that differs only by the
    validations added since is completed with them (the curves, g* and bootstrap stay: validation
    measures, it does not price). Returns it."""
    return _store(
        session,
        run,
        _summary_basis(session, run, results, validations),
        results,
        validations,
    )


def _store(
    session: Session,
    run: AnalysisRun,
    basis: dict[str, Any],
    results: list[PromptResult] | None,
    validations: list[ValidationResult] | None,
) -> AnalysisSummary:
    stored = run.summary
    if (
        stored
        and stored.get("format") == SUMMARY_FORMAT
        and {**stored["basis"], "validations": None} == {**basis, "validations": None}
    ):
        if validations is None:
            validations = list(
                session.scalars(select(ValidationResult).where(ValidationResult.run_id == run.id))
            )
        summary = with_validations(summary_from_json(stored["summary"]), validations)
    else:
        summary = summarize_run(session, run, results=results, validations=validations)
        run.price_comparisons = None  # priced from the results as they were (analyzer.analysis.repricing)
    run.summary = {"format": SUMMARY_FORMAT, "basis": basis, "summary": summary_to_json(summary)}
    replace_options(session, run_option_rows(session, run.id, summary.prompts), run_id=run.id)
    return summary


def with_validations(summary: AnalysisSummary, validations: Sequence[ValidationResult]) -> AnalysisSummary:
    """``summary`` with the speedups measured by validation in place (per task and for the workload:
    their mean, count and tasks), exactly as :func:`summarize_groups` sets them; everything priced
    stays as it is."""
    if summary.cost is None:
        return summary
    measured = {v.prompt_id: v.measured_speedup for v in validations if not disturbed(v.others_cpu)}
    members: dict[str, list[int]] = defaultdict(list)
    for prompt in summary.prompts:
        members[prompt.task].append(prompt.prompt_id)
    task_of = {prompt.prompt_id: prompt.task for prompt in summary.prompts}

    def measured_in(group: GroupSummary, ids: list[int]) -> GroupSummary:
        validated = [measured[i] for i in ids if i in measured]
        return replace(
            group,
            measured_speedup=finite(float(np.mean(validated))) if validated else None,
            measured_n=len(validated),
            measured_tasks=sorted({task_of[i] for i in ids if i in measured}),
        )

    tasks = {task: measured_in(group, members[task]) for task, group in summary.tasks.items()}
    workload = summary.workload
    if workload is not None:
        workload = measured_in(workload, list(task_of))
        if len(tasks) > 1 and len(workload.measured_tasks) == 1:
            workload = replace(
                workload, measured_speedup=None
            )  # a sample of one task says nothing about the others
    return replace(summary, tasks=tasks, workload=workload)


def run_summary(
    session: Session,
    run: AnalysisRun,
    *,
    results: list[PromptResult] | None = None,
    validations: list[ValidationResult] | None = None,
) -> AnalysisSummary:
    """``run``'s summary: the stored one while it is still true (same results, validations and cost
    profiles), else computed, and stored when the run is finished (a queued or running run's is
    computed each time: its results are still coming). Pass ``results`` / ``validations`` (all of the
    run's) when already loaded. The report, publishing and the web pages read it."""
    stored = run.summary
    basis = _summary_basis(session, run, results, validations)
    if stored and stored.get("format") == SUMMARY_FORMAT and stored.get("basis") == basis:
        return summary_from_json(stored["summary"])
    if run.status in FINISHED_STATUSES:
        return _store(session, run, basis, results, validations)
    return summarize_run(session, run, results=results, validations=validations)
