"""Training the task classifier: a scikit-learn Pipeline (word + character TF-IDF and structural features
into a linear model), trained on the labeled prompts in the database or, for a cold start, on the bundled
labeled corpus (pseudo-labels weighted by their confidence); cross-validated
(:mod:`router.classify.cross_validation`) and stored as a new version (:mod:`router.classify.version_store`).
An adapted version (trained on pseudo-labels too) becomes active only when it is no worse than the active
one on the same held-out folds and had enough confident pseudo-labels to learn from
(:mod:`router.classify.activation`, :func:`train_classifier`). Also what a training job says when it ends."""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
from sklearn.pipeline import Pipeline
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from analyzer.db import lock_for_write
from router.classify.activation import activation_message, settle_activation
from router.classify.cross_validation import evaluate
from router.classify.encoder import embedding_cache
from router.classify.pipeline import build_pipeline, regularisation
from router.classify.teacher import Progress
from router.classify.training_data import DEFAULT_PSEUDO_CONFIDENCE, TrainingData, trained_on
from router.classify.version_store import activate_version, store_version, version_recipe
from router.orm import ClassifierVersion


def adapted_fit(
    texts: Sequence[str],
    labels: Sequence[str],
    pseudo: Sequence[tuple[str, str, float]],
    *,
    seed: int = 0,
    min_confidence: float = DEFAULT_PSEUDO_CONFIDENCE,
    features: str = "tfidf",
    c: float | None = None,
    weights: Sequence[float] | None = None,
) -> Pipeline:
    """The serving pipeline fitted on labelled prompts (weight 1, or ``weights``) plus pseudo-labelled
    ones, (text, task, confidence), weighted by their confidence; pseudo-labels below
    ``min_confidence``, and texts that already have a label, are left out."""
    labelled = set(texts)
    kept = [(t, task, w) for t, task, w in pseudo if trained_on(t, w, labelled, min_confidence)]
    sample_weight = list(weights) if weights is not None else [1.0] * len(texts)
    return build_pipeline(seed, features, c).fit(
        list(texts) + [t for t, _, _ in kept],
        list(labels) + [task for _, task, _ in kept],
        model__sample_weight=np.asarray(sample_weight + [w for _, _, w in kept], dtype=np.float64),
    )


def train_classifier(
    session: Session,
    data: TrainingData,
    *,
    seed: int = 0,
    activate: bool = True,
    force_activate: bool = False,
    cross_validate: bool = True,
    features: str = "tfidf",
    c: float | None = None,
    progress: Progress | None = None,
    jobs: int = 1,
) -> ClassifierVersion:
    """Cross-validate, fit on all the data (pseudo-labels weighted by confidence), and store a new
    version (the active one unless told not to), with what it was trained on per task (corpus, your
    labels, pseudo-labels) and, when adapted, how often it agrees with the pseudo-labels.
    ``cross_validate=False`` stores no scores (benchmarks that only need a fitted model; the version
    then has no calibration and no threshold of its own).

    Adapting (``data.adapting()``) never replaces the active version silently: the active version's
    recipe (feature set and C) is cross-validated on the very folds the new one is scored on, fitted
    on each fold's labelled training prompts without the pseudo-labels, and the new version is
    stored but not activated when it is worse there (:func:`router.classify.evaluation.regressions`) or had
    too few confident pseudo-labels (:func:`router.classify.training_data.pseudo_label_support`); the stored
    active artifact itself is not re-scored, because it was fitted on those held-out prompts.
    ``force_activate`` activates it anyway. The verdict, with both versions' numbers, is
    ``scores["activation"]`` (:func:`router.classify.activation.activation_check`,
    :func:`router.classify.activation.activation_message`). Training without pseudo-labels activates as
    before. ``jobs``: how many folds are cross-validated at once (:func:`router.classify.pipeline.fold_jobs`
    turns the setting into it)."""
    active = _active_to_compare(session, data, activate)
    pipeline, scores, activate = _fit_and_settle(
        data,
        active,
        activate=activate,
        force_activate=force_activate,
        seed=seed,
        cross_validate=cross_validate,
        features=features,
        c=c,
        progress=progress,
        jobs=jobs,
    )
    return _store_and_activate(session, data, pipeline, scores, features, activate)


def train_classifier_apart(
    sessions: sessionmaker[Session],
    data: TrainingData,
    *,
    force_activate: bool = False,
    seed: int = 0,
    features: str = "tfidf",
    progress: Progress | None = None,
    jobs: int = 1,
) -> ClassifierVersion:
    """:func:`train_classifier` (activating) in two short transactions of its own: one reads the
    active version, the model is cross-validated and fitted outside any, and one that holds the write
    lock stores (and activates) the new version. Other writers (an analysis, feedback) go on while it
    trains; one long transaction would hold them up or fail at its first write on a snapshot they
    overtook (SQLite)."""
    with sessions() as session, session.begin():
        active = _active_to_compare(session, data, True)
    pipeline, scores, activate = _fit_and_settle(
        data,
        active,
        activate=True,
        force_activate=force_activate,
        seed=seed,
        cross_validate=True,
        features=features,
        c=None,
        progress=progress,
        jobs=jobs,
    )
    with sessions() as session, session.begin():
        lock_for_write(session)
        return _store_and_activate(session, data, pipeline, scores, features, activate)


def _active_to_compare(session: Session, data: TrainingData, activate: bool) -> ClassifierVersion | None:
    """The active version, which an adapted one must not be worse than to replace it (None otherwise)."""
    if not (activate and data.adapting()):
        return None
    return session.scalar(select(ClassifierVersion).where(ClassifierVersion.is_active.is_(True)))


def _fit_and_settle(
    data: TrainingData,
    active: ClassifierVersion | None,
    *,
    activate: bool,
    force_activate: bool,
    seed: int,
    cross_validate: bool,
    features: str,
    c: float | None,
    progress: Progress | None,
    jobs: int,
) -> tuple[Pipeline, dict[str, Any], bool]:
    """The fitted pipeline, its scores (with ``training_seconds``, the cross-validations and the final fit
    together) and whether it becomes active; touches no database."""
    c = regularisation(features, c)
    started = time.perf_counter()
    pipeline, scores = _cross_validate_and_fit(
        data,
        seed=seed,
        features=features,
        c=c,
        progress=progress,
        compare_with=version_recipe(active) if active is not None and cross_validate else None,
        cross_validate=cross_validate,
        jobs=jobs,
    )
    scores["training_seconds"] = round(time.perf_counter() - started, 1)
    if activate and data.adapting():
        activate = settle_activation(data, scores, active, force_activate)
    return pipeline, scores, activate


def _store_and_activate(
    session: Session,
    data: TrainingData,
    pipeline: Pipeline,
    scores: dict[str, Any],
    features: str,
    activate: bool,
) -> ClassifierVersion:
    version = store_version(session, data, pipeline, scores, features)
    if activate:
        activate_version(session, version.version)
    return version


def _cross_validate_and_fit(
    data: TrainingData,
    *,
    seed: int,
    features: str,
    c: float,
    progress: Progress | None,
    compare_with: tuple[str, float] | None,
    cross_validate: bool,
    jobs: int,
) -> tuple[Pipeline, dict[str, Any]]:
    """The pipeline fitted on all of ``data`` and its scores: cross-validated
    (:func:`router.classify.cross_validation.evaluate`, or only the recipe without ``cross_validate``),
    with the data's composition and, when adapted, the agreement with the pseudo-labels."""
    with embedding_cache():  # each prompt embedded once across the folds and the final fit
        scores: dict[str, Any] = (
            evaluate(
                data,
                seed=seed,
                features=features,
                c=c,
                progress=progress,
                compare_with=compare_with,
                jobs=jobs,
            )
            if cross_validate
            else {"features": features, "C": c}
        )
        if progress is not None:
            progress(f"fitting on all {len(data.texts)} prompts")
        pipeline = build_pipeline(seed, features, c).fit(
            data.texts, data.labels, model__sample_weight=data.weight_array()
        )
        scores["composition"] = data.composition()
        adaptation = _adaptation(pipeline, data)
        if adaptation is not None:
            scores["adaptation"] = adaptation
    return pipeline, scores


def _adaptation(pipeline: Pipeline, data: TrainingData) -> dict[str, Any] | None:
    """How often the fitted ``pipeline`` agrees with the pseudo-labels it was trained on, overall and
    per task, with how many there were, their sets and mean confidence; None without pseudo-labels."""
    pseudo = [i for i, kind in enumerate(data.kind_list()) if kind == "pseudo"]
    if not pseudo:
        return None
    predicted = pipeline.predict([data.texts[i] for i in pseudo])
    agree = [data.labels[i] == p for i, p in zip(pseudo, predicted)]
    per_class: dict[str, list[bool]] = {}
    for i, same in zip(pseudo, agree):
        per_class.setdefault(data.labels[i], []).append(same)
    return {
        "pseudo_labels": len(pseudo),
        "sets": sorted({data.groups[i].removeprefix("pseudo: ") for i in pseudo}),
        "agreement": float(np.mean(agree)),
        "agreement_per_class": {k: float(np.mean(v)) for k, v in sorted(per_class.items())},
        "mean_confidence": float(np.mean([data.weight_array()[i] for i in pseudo])),
    }


def trained_message(version: ClassifierVersion, source: str, adapt: list[str]) -> str:
    """What a training job says when it ends: the new version's scores, its adaptation and its activation."""
    grouped = version.scores.get("grouped")
    message = (
        f"classifier v{version.version} trained on {version.training_prompt_count} prompts "
        f"({source}): macro-F1 {version.scores['macro_f1']:.3f} stratified"
        + (f", {grouped['macro_f1']:.3f} on unseen sources" if grouped else "")
        + f"; keyword baseline {version.scores['baseline']['macro_f1']:.3f}"
    )
    adaptation = version.scores.get("adaptation")
    if adaptation:
        message += (
            f"; adapted to {', '.join(adaptation['sets'])} with {adaptation['pseudo_labels']} "
            f"pseudo-labels (it agrees with {100 * adaptation['agreement']:.0f}% of them)"
        )
    elif adapt:
        message += f"; no pseudo-labels from {', '.join(adapt)} cleared the confidence bar"
    verdict = activation_message(version)
    if verdict:
        message += f". {verdict}"
        if not version.is_active:
            message += f". Activate v{version.version} below (Versions) if you want it anyway"
    return message
