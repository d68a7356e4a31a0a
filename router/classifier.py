"""The task classifier: a scikit-learn Pipeline (word + character TF-IDF and structural features into
a linear model), trained on the labeled prompts in the database or, for a cold start, on the bundled
labeled corpus; scored by stratified cross-validation beside the keyword baseline; persisted as a
version with its record (library versions, training-data hash, labels, scores) and refused on load
when the record does not match what is installed.

The stored artifact is a pickle that specroute itself wrote into its own database; its SHA-256 is
checked before it is loaded. Nothing a user uploads is ever unpickled.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import platform
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from typing import Sequence

import numpy as np
import scipy
import sklearn
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, classification_report, confusion_matrix, f1_score
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import FeatureUnion, Pipeline, make_pipeline
from sklearn.preprocessing import FunctionTransformer, MaxAbsScaler
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from analyzer.ingest import parse_prompt_file
from analyzer.models import Prompt, PromptResult, PromptSet
from router.features import keyword_baseline, prompt_text, structural_features
from router.models import ClassifierVersion, activate_only

CORPUS_FILE = "corpus.jsonl"
MIN_PER_LABEL = 2


class ClassifierError(RuntimeError):
    """Training or loading the classifier is not possible; the message says why and what to do."""


@dataclass(frozen=True)
class TrainingData:
    """Texts and labels to train on, their hash, where they came from, and labels left out for
    having fewer than MIN_PER_LABEL prompts."""

    texts: list[str]
    labels: list[str]
    sha256: str
    source: str
    dropped: dict[str, int]


def make_training_data(texts: list[str], labels: list[str], source: str) -> TrainingData:
    """Training data from parallel texts and labels; labels with fewer than MIN_PER_LABEL prompts
    are left out (and listed), and the hash covers the kept pairs in sorted order."""
    counts = Counter(labels)
    dropped = {label: n for label, n in counts.items() if n < MIN_PER_LABEL}
    kept = [(t, l) for t, l in zip(texts, labels) if l not in dropped]
    digest = hashlib.sha256()
    for text, label in sorted(kept):
        digest.update(json.dumps([text, label], ensure_ascii=False).encode("utf-8"))
    return TrainingData([t for t, _ in kept], [l for _, l in kept], digest.hexdigest(), source, dropped)


def training_data_from_db(session: Session, prompt_set_names: Sequence[str] | None = None) -> TrainingData:
    """The labeled prompts of the named sets (all sets when none are named), one per distinct text."""
    query = select(Prompt.text, Prompt.messages, Prompt.task).where(Prompt.task.is_not(None))
    if prompt_set_names:
        query = query.join(PromptSet).where(PromptSet.name.in_(list(prompt_set_names)))
        missing = set(prompt_set_names) - set(session.scalars(
            select(PromptSet.name).where(PromptSet.name.in_(list(prompt_set_names)))))
        if missing:
            raise ClassifierError(f"no prompt set named {', '.join(sorted(missing))}")
    seen: dict[str, str] = {}
    for text, messages, task in session.execute(query.order_by(Prompt.id)):
        seen.setdefault(prompt_text(text, messages), task)
    source = "prompt sets " + ", ".join(prompt_set_names) if prompt_set_names else "all labeled prompts in the database"
    return make_training_data(list(seen), list(seen.values()), source)


def cold_start_data() -> TrainingData:
    """The bundled labeled corpus (router/data/corpus.jsonl; sources and licenses beside it)."""
    data = resources.files("router.data").joinpath(CORPUS_FILE).read_bytes()
    parsed = parse_prompt_file(data, CORPUS_FILE)
    return make_training_data([prompt_text(p.text, p.messages) for p in parsed.prompts],
                          [p.task for p in parsed.prompts], "bundled corpus")


def build_pipeline(seed: int = 0) -> Pipeline:
    """Word (1-2) and character (2-5, within words) TF-IDF plus scaled structural features into a
    class-balanced multinomial logistic regression, which gives a probability per task."""
    features = FeatureUnion([
        ("words", TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1, max_features=50_000,
                                  lowercase=True)),
        ("chars", TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True, min_df=2,
                                  max_features=100_000)),
        ("structure", make_pipeline(FunctionTransformer(structural_features), MaxAbsScaler())),
    ])
    model = LogisticRegression(C=20.0, max_iter=3000, class_weight="balanced", random_state=seed)
    return Pipeline([("features", features), ("model", model)])


def library_versions() -> dict[str, str]:
    """The versions a persisted classifier is tied to."""
    return {"python": platform.python_version(), "scikit-learn": sklearn.__version__,
            "numpy": np.__version__, "scipy": scipy.__version__}


def evaluate(data: TrainingData, *, seed: int = 0, folds: int = 5) -> dict:
    """Stratified k-fold cross-validated macro-F1, accuracy, per-class report and confusion matrix
    of the pipeline, and the keyword baseline's scores on the same data."""
    labels = sorted(set(data.labels))
    if len(labels) < 2:
        raise ClassifierError("training needs at least two task types with labeled prompts")
    splits = min(folds, min(Counter(data.labels).values()))
    cv = StratifiedKFold(n_splits=splits, shuffle=True, random_state=seed)
    predicted = cross_val_predict(build_pipeline(seed), data.texts, data.labels, cv=cv)
    baseline = [keyword_baseline(t) for t in data.texts]
    report = classification_report(data.labels, predicted, labels=labels, output_dict=True, zero_division=0)
    return {
        "folds": splits,
        "macro_f1": float(f1_score(data.labels, predicted, labels=labels, average="macro", zero_division=0)),
        "accuracy": float(accuracy_score(data.labels, predicted)),
        "per_class": {label: {k: float(report[label][k]) for k in ("precision", "recall", "f1-score", "support")}
                      for label in labels},
        "confusion": {"labels": labels, "matrix": confusion_matrix(data.labels, predicted, labels=labels).tolist()},
        "baseline": {
            "macro_f1": float(f1_score(data.labels, baseline, labels=labels, average="macro", zero_division=0)),
            "accuracy": float(accuracy_score(data.labels, baseline)),
        },
    }


def train_classifier(session: Session, data: TrainingData, *, seed: int = 0, activate: bool = True) -> ClassifierVersion:
    """Cross-validate, fit on all the data, and store a new version (the active one unless told not to)."""
    scores = evaluate(data, seed=seed)
    pipeline = build_pipeline(seed).fit(data.texts, data.labels)
    artifact = pickle.dumps(pipeline, protocol=pickle.HIGHEST_PROTOCOL)
    latest = session.scalar(select(func.max(ClassifierVersion.version))) or 0
    version = ClassifierVersion(
        version=latest + 1,
        is_active=False,
        labels=sorted(set(data.labels)),
        training_data_sha256=data.sha256,
        training_prompt_count=len(data.texts),
        library_versions=library_versions(),
        scores={**scores, "source": data.source, "dropped_labels": data.dropped},
        artifact=artifact,
        artifact_sha256=hashlib.sha256(artifact).hexdigest(),
    )
    session.add(version)
    session.flush()
    if activate:
        activate_version(session, version.version)
    return version


def activate_version(session: Session, version: int) -> ClassifierVersion:
    """Make ``version`` the one active classifier."""
    chosen = activate_only(session, ClassifierVersion, version)
    if chosen is None:
        raise ClassifierError(f"no classifier version {version}")
    return chosen


@dataclass
class TaskClassifier:
    """A loaded classifier version: predicts a task type and the probability the model gives it."""

    version_id: int
    version: int
    labels: list[str]
    pipeline: Pipeline

    def predict(self, texts: Sequence[str]) -> list[tuple[str, float]]:
        """(task type, confidence) for each text."""
        if not texts:
            return []
        probabilities = self.pipeline.predict_proba(list(texts))
        classes = self.pipeline.classes_
        best = probabilities.argmax(axis=1)
        return [(str(classes[i]), float(probabilities[row, i])) for row, i in enumerate(best)]


def load_version(record: ClassifierVersion) -> TaskClassifier:
    """Load a stored version after checking its hash and that it was trained with the installed
    library versions; otherwise a ClassifierError saying to retrain."""
    if hashlib.sha256(record.artifact).hexdigest() != record.artifact_sha256:
        raise ClassifierError(f"classifier version {record.version} is corrupted (hash mismatch); run: specroute train")
    installed = library_versions()
    differing = {k: (v, installed.get(k)) for k, v in record.library_versions.items() if installed.get(k) != v}
    if differing:
        detail = ", ".join(f"{k} {old} (installed {new})" for k, (old, new) in sorted(differing.items()))
        raise ClassifierError(f"classifier version {record.version} was trained with {detail}; run: specroute train")
    pipeline = pickle.loads(record.artifact)  # specroute's own artifact, hash-checked above
    return TaskClassifier(record.id, record.version, list(record.labels), pipeline)


def load_active(session: Session) -> TaskClassifier | None:
    """The active classifier, or None when none has been trained."""
    record = session.scalar(select(ClassifierVersion).where(ClassifierVersion.is_active.is_(True)))
    return load_version(record) if record is not None else None


def label_run_results(session: Session, run_id: int, classifier: TaskClassifier) -> int:
    """Give every unlabelled prompt of a run the classifier's task type, recording the version;
    returns how many results were labelled."""
    results = session.scalars(select(PromptResult).where(PromptResult.run_id == run_id))
    unlabelled = [r for r in results if r.task_source != "label"]
    predictions = classifier.predict([prompt_text(r.prompt.text, r.prompt.messages) for r in unlabelled])
    for result, (task, _confidence) in zip(unlabelled, predictions):
        result.task_type, result.task_source, result.classifier_version_id = task, "classifier", classifier.version_id
    return len(unlabelled)
