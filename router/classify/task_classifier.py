"""The runtime task classifier: a loaded version's pipeline, which predicts a task type and the
calibrated probability of it (:class:`TaskClassifier`). Loading one from the database, after its checks,
is :mod:`router.classify.version_store`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from sklearn.pipeline import Pipeline

from router.classify.evaluation import decision_matrix, softmax
from router.classify.fast_scorer import FastScorer


@dataclass
class TaskClassifier:
    """A loaded classifier version: predicts a task type and the calibrated probability of it (the
    decision values divided by the version's temperature). Small batches go through the FastScorer;
    large ones through the pipeline itself. ``threshold`` is the confidence the version chose on
    grouped CV (None for a version without scores); ``rarely_reached`` names the tasks it seldom
    predicts, with the reason; ``catch_all`` the tasks whose followed predictions were wrong more often
    than right on unseen sources, with their precision (the router uses the workload policy for them)."""

    version_id: int
    version: int
    labels: list[str]
    pipeline: Pipeline
    fast: FastScorer | None = None
    temperature: float = 1.0
    threshold: float | None = None
    rarely_reached: dict[str, str] = field(default_factory=dict)
    catch_all: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._fast_scorer()

    def _fast_scorer(self) -> FastScorer:
        """The FastScorer of the pipeline (built when none was given)."""
        if self.fast is None:
            self.fast = FastScorer(self.pipeline)
        return self.fast

    def predict(self, texts: Sequence[str]) -> list[tuple[str, float]]:
        """(task type, confidence) for each text."""
        if not texts:
            return []
        if len(texts) <= 64:
            fast = self._fast_scorer()
            probabilities, classes = fast.predict_proba(list(texts), self.temperature), fast.classes_
        else:
            classes = self.pipeline.classes_
            probabilities = softmax(
                decision_matrix(self.pipeline, list(texts), list(classes)), self.temperature
            )
        best = probabilities.argmax(axis=1)
        return [(str(classes[i]), float(probabilities[row, i])) for row, i in enumerate(best)]
