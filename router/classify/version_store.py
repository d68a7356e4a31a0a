"""The task classifier's versioned store: a fitted pipeline stored as a new ClassifierVersion with its
record (library versions, training-data hash, labels, cross-validated scores), one version made active,
and a version loaded (:class:`router.classify.task_classifier.TaskClassifier`) only when its hash and
record match what is installed; otherwise a ClassifierError says to retrain.

The stored artifact is a pickle that specroute itself wrote into its own database; its SHA-256 is
checked before it is loaded. Nothing a user uploads is ever unpickled.
"""

from __future__ import annotations

import hashlib
import pickle
import platform
from typing import Any

import numpy as np
import scipy
import sklearn
from sklearn.pipeline import Pipeline
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from router.classify.encoder import EncoderUnavailable, encoder_folder, encoder_version
from router.classify.features import FEATURES_VERSION
from router.classify.pipeline import DEFAULT_C
from router.classify.task_classifier import TaskClassifier
from router.classify.training_data import ClassifierError, TrainingData
from router.orm import ClassifierVersion, activate_only


def library_versions(features: str = "tfidf") -> dict[str, str]:
    """The versions a persisted classifier is tied to (with sentence embeddings, also the encoder's)."""
    versions = {
        "python": platform.python_version(),
        "scikit-learn": sklearn.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "specroute-features": FEATURES_VERSION,
    }
    if "minilm" in features:
        versions["sentence-encoder"] = encoder_version()
    return versions


def store_version(
    session: Session, data: TrainingData, pipeline: Pipeline, scores: dict[str, Any], features: str
) -> ClassifierVersion:
    """A new, inactive ClassifierVersion (the next number) of the fitted ``pipeline``, its record and
    ``scores``, added and flushed."""
    artifact = pickle.dumps(pipeline, protocol=pickle.HIGHEST_PROTOCOL)
    latest = session.scalar(select(func.max(ClassifierVersion.version))) or 0
    version = ClassifierVersion(
        version=latest + 1,
        is_active=False,
        labels=sorted(set(data.labels)),
        training_data_sha256=data.sha256,
        training_prompt_count=len(data.texts),
        library_versions=library_versions(features),
        scores={**scores, "source": data.source, "dropped_labels": data.dropped},
        artifact=artifact,
        artifact_sha256=hashlib.sha256(artifact).hexdigest(),
    )
    session.add(version)
    session.flush()
    return version


def version_recipe(record: ClassifierVersion) -> tuple[str, float]:
    """A stored version's feature set and C (the feature set's default when its record has none)."""
    scores = record.scores or {}
    features = scores.get("features", "tfidf")
    return features, float(scores.get("C") or DEFAULT_C.get(features, 1.0))


def activate_version(session: Session, version: int) -> ClassifierVersion:
    """Make ``version`` the one active classifier."""
    chosen = activate_only(session, ClassifierVersion, version)
    if chosen is None:
        raise ClassifierError(f"no classifier version {version}")
    return chosen


def load_version(record: ClassifierVersion) -> TaskClassifier:
    """Load a stored version after checking its hash and that it was trained with the installed
    library versions; otherwise a ClassifierError saying to retrain."""
    if hashlib.sha256(record.artifact).hexdigest() != record.artifact_sha256:
        raise ClassifierError(
            f"classifier version {record.version} is corrupted (hash mismatch); run: specroute train"
        )
    scores = dict(record.scores or {})
    if "minilm" in scores.get("features", "tfidf"):
        try:
            encoder_folder()
        except EncoderUnavailable as exc:
            raise ClassifierError(
                f"classifier version {record.version} uses sentence embeddings: {exc}"
            ) from None
    installed = library_versions(scores.get("features", "tfidf"))
    stored = dict(record.library_versions)
    differing = {
        k: (stored.get(k, "none"), installed.get(k, "none"))
        for k in sorted(set(stored) | set(installed))
        if stored.get(k) != installed.get(k)
    }
    if differing:
        detail = ", ".join(f"{k} {old} (installed {new})" for k, (old, new) in sorted(differing.items()))
        raise ClassifierError(
            f"classifier version {record.version} was trained with {detail}; run: specroute train"
        )
    try:
        pipeline = pickle.loads(record.artifact)  # specroute's own artifact, hash-checked above
    except (AttributeError, ImportError) as exc:  # a class this specroute does not have (another version's)
        raise ClassifierError(
            f"classifier version {record.version} was stored by another version of specroute ({exc}); "
            "run: specroute train"
        ) from None
    calibrated = scores.get("calibration") or {}
    rarely = {
        label: row["reason"]
        for label, row in (scores.get("reachability") or {}).items()
        if not row["reachable"]
    }
    return TaskClassifier(
        record.id,
        record.version,
        list(record.labels),
        pipeline,
        temperature=float(calibrated.get("temperature", 1.0)),
        threshold=calibrated.get("threshold"),
        rarely_reached=rarely,
        catch_all={
            task: float(row["precision"])
            for task, row in ((scores.get("following") or {}).get("tasks") or {}).items()
            if row["catch_all"]
        },
    )


def rarely_reached(session: Session) -> tuple[int | None, dict[str, str]]:
    """The active classifier's version and the tasks it rarely predicts, with the reason (read from
    its stored scores; nothing is unpickled)."""
    record = session.execute(
        select(ClassifierVersion.version, ClassifierVersion.scores).where(
            ClassifierVersion.is_active.is_(True)
        )
    ).first()
    if record is None:
        return None, {}
    marks = (record.scores or {}).get("reachability") or {}
    return record.version, {label: row["reason"] for label, row in marks.items() if not row["reachable"]}


def load_active(session: Session) -> TaskClassifier | None:
    """The active classifier, or None when none has been trained."""
    record = session.scalar(select(ClassifierVersion).where(ClassifierVersion.is_active.is_(True)))
    return load_version(record) if record is not None else None
