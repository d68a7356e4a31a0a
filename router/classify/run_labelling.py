"""Labelling a run with the task classifier: every unlabelled prompt of a run gets the active version's
task type, recorded with the version, and a finished run's stored summary is computed anew
(:func:`label_finished_run`, the one code path every run that stops takes)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from analyzer.advice.summary_store import FINISHED_STATUSES, store_summary
from analyzer.db import lock_for_write
from analyzer.orm import AnalysisRun, PromptResult
from analyzer.prompts.prompt_checks import request_text
from router.classify.task_classifier import TaskClassifier
from router.classify.training_data import ClassifierError
from router.classify.version_store import load_active


def label_run_results(session: Session, run_id: int, classifier: TaskClassifier) -> int:
    """Give every unlabelled prompt of a run the classifier's task type, recording the version;
    returns how many results were labelled. The run's groups change with it, so a finished run's
    stored summary is computed anew (in the caller's transaction)."""
    results = session.scalars(select(PromptResult).where(PromptResult.run_id == run_id))
    unlabelled = [r for r in results if r.task_source != "label"]
    predictions = classifier.predict([request_text(r.prompt.text, r.prompt.messages) for r in unlabelled])
    for result, (task, _confidence) in zip(unlabelled, predictions):
        result.task_type, result.task_source, result.classifier_version_id = (
            task,
            "classifier",
            classifier.version_id,
        )
    run = session.get(AnalysisRun, run_id)
    if unlabelled and run is not None and run.status in FINISHED_STATUSES:
        session.flush()
        store_summary(session, run, relabelled=True)
    return len(unlabelled)


@dataclass(frozen=True)
class RunLabelling:
    """What labelling a run did: how many results got a task, by which classifier version, or why none
    (no classifier trained, or the stored one cannot be loaded)."""

    labelled: int
    classifier_version: int | None
    problem: str | None = None


def label_finished_run(sessions: sessionmaker[Session], run_id: int) -> RunLabelling:
    """The one code path that gives a run's unlabelled prompts the active classifier's task type, in
    its own transaction, when the run has stopped: ``specroute analyze``, ``specroute demo``,
    ``specroute worker`` and the web server's worker thread (runs started from the web UI) all call it."""
    with sessions() as session, session.begin():
        lock_for_write(session)
        unlabelled = session.scalar(
            select(func.count(PromptResult.id)).where(
                PromptResult.run_id == run_id,
                or_(PromptResult.task_source.is_(None), PromptResult.task_source != "label"),
            )
        )
        if not unlabelled:
            return RunLabelling(0, None)
        try:
            classifier = load_active(session)
        except ClassifierError as exc:
            return RunLabelling(0, None, str(exc))
        if classifier is None:
            return RunLabelling(0, None, "no task classifier is trained (run: specroute train)")
        return RunLabelling(label_run_results(session, run_id, classifier), classifier.version)
