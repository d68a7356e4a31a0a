"""Labelling a new run with the task classifier: when a run is created, each of its prompts that carries no
task label gets the active classifier's task type, stored with the run (``AnalysisRun.task_labels``, with the
classifier version); each result takes its prompt's label as the analysis stores it, so the run's summary is
computed once, with every task known, when the run finishes. :func:`label_new_run` is the one code path every
new run takes: ``specroute analyze``, ``specroute demo`` and the web UI's form call it as they store the run."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from analyzer.analysis.run_records import selected_prompts
from analyzer.orm import AnalysisRun
from analyzer.prompts.prompt_checks import request_text
from router.classify.training_data import ClassifierError
from router.classify.version_store import load_active


@dataclass(frozen=True)
class RunLabelling:
    """What labelling a run did: how many prompts got a task, by which classifier version, or why none
    (no classifier trained, or the stored one cannot be loaded)."""

    labelled: int
    classifier_version: int | None
    problem: str | None = None

    def text(self) -> str | None:
        """What to tell the person who started the run (None: nothing to say)."""
        if self.problem:
            return f"unlabelled prompts stay 'unlabelled': {self.problem}"
        if self.labelled:
            return f"classifier v{self.classifier_version} labelled {self.labelled} unlabelled prompt(s)"
        return None


def label_new_run(session: Session, run: AnalysisRun) -> RunLabelling:
    """Give ``run``'s prompts without a task label the active classifier's task type (in the caller's
    transaction, before any of its prompts is measured): ``run.task_labels``."""
    unlabelled = [p for p in selected_prompts(session, run) if not p.task]
    if not unlabelled:
        return RunLabelling(0, None)
    try:
        classifier = load_active(session)
    except ClassifierError as exc:
        return RunLabelling(0, None, str(exc))
    if classifier is None:
        return RunLabelling(0, None, "no task classifier is trained (run: specroute train)")
    predictions = classifier.predict([request_text(p.text, p.messages) for p in unlabelled])
    run.task_labels = {
        "version": classifier.version_id,
        "tasks": {str(p.id): task for p, (task, _confidence) in zip(unlabelled, predictions)},
    }
    return RunLabelling(len(unlabelled), classifier.version)
