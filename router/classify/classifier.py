"""The task classifier: a scikit-learn Pipeline (word + character TF-IDF and structural features into
a linear model), trained on the labeled prompts in the database or, for a cold start, on the bundled
labeled corpus; scored by stratified cross-validation beside the keyword baseline; persisted as a
version with its record (library versions, training-data hash, labels, scores) and refused on load
when the record does not match what is installed. An adapted version (trained on pseudo-labels too)
becomes active only when it is no worse than the active one on the same held-out folds and had
enough confident pseudo-labels to learn from (:func:`train_classifier`).

The stored artifact is a pickle that specroute itself wrote into its own database; its SHA-256 is
checked before it is loaded. Nothing a user uploads is ever unpickled.
"""

from __future__ import annotations

import hashlib
import pickle
import platform
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import scipy
import sklearn
from sklearn.metrics import accuracy_score, f1_score
from sklearn.pipeline import Pipeline
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from analyzer.advice.summary_store import FINISHED_STATUSES, store_summary
from analyzer.db import lock_for_write
from analyzer.orm import AnalysisRun, PromptResult
from analyzer.prompts.prompt_checks import request_text
from router.classify.encoder import EncoderUnavailable, embedding_cache, encoder_folder, encoder_version
from router.classify.evaluation import (
    MIN_SOURCES,
    calibration,
    catch_all_tasks,
    decision_matrix,
    grouped_folds,
    out_of_fold,
    predictions,
    reachability,
    regressions,
    scores_of,
    softmax,
    stratified_folds,
)
from router.classify.fast_scorer import FastScorer
from router.classify.features import (
    FEATURES_VERSION,
    keyword_baseline,
)
from router.classify.pipeline import DEFAULT_C, build_pipeline, fold_jobs, regularisation
from router.classify.teacher import Progress
from router.classify.training_data import (
    DEFAULT_PSEUDO_CONFIDENCE,
    ClassifierError,
    TrainingData,
    pseudo_label_support,
    trained_on,
)
from router.orm import ClassifierVersion, activate_only

_Folds = list[tuple[np.ndarray, np.ndarray]]  # (training rows, test rows) per fold


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


def evaluate(
    data: TrainingData,
    *,
    seed: int = 0,
    folds: int = 5,
    features: str = "tfidf",
    c: float | None = None,
    progress: Progress | None = None,
    compare_with: tuple[str, float] | None = None,
    jobs: int = 1,
) -> dict:
    """Stratified k-fold CV (macro-F1, accuracy, per-class report, confusion matrix) beside the
    keyword baseline; leave-one-source-out CV when the data has two sources or more (``grouped``);
    the temperature, ECE and routing threshold from the grouped out-of-fold decision values (the
    stratified ones with a single source); per-task reachability and catch-all tasks. ``progress``
    gets a line per fold. ``compare_with``, a (feature set, C) recipe (the active version's), is
    cross-validated too on the very same folds without the pseudo-labels (``comparison``, see
    :func:`_same_fold_comparison`). ``jobs``: how many folds are fitted at once
    (:func:`router.classify.pipeline.fold_jobs`)."""
    labels = sorted(set(data.labels))
    if len(labels) < 2:
        raise ClassifierError("training needs at least two task types with labeled prompts")
    c = regularisation(features, c)
    with embedding_cache():
        return _evaluate(data, labels, seed, folds, features, c, progress, compare_with, jobs)


def _evaluate(
    data: TrainingData,
    labels: list[str],
    seed: int,
    folds: int,
    features: str,
    c: float,
    progress: Progress | None = None,
    compare_with: tuple[str, float] | None = None,
    jobs: int = 1,
) -> dict:
    """The scores of ``evaluate``. Pseudo-labelled rows join every fold's training data (weighted)
    and are never scored: only labels are truth."""
    kinds = data.kind_list()
    scored = np.asarray([i for i, k in enumerate(kinds) if k != "pseudo"], dtype=int)
    pseudo = np.asarray([i for i, k in enumerate(kinds) if k == "pseudo"], dtype=int)
    oof = _scored_out_of_fold(
        data, labels, scored, pseudo, lambda: build_pipeline(seed, features, c), progress, jobs
    )
    texts = [data.texts[i] for i in scored]
    truth_all = [data.labels[i] for i in scored]
    split = stratified_folds(truth_all, folds, seed)
    stratified, _ = oof(split, "stratified")
    scores = scores_of(truth_all, predictions(stratified, labels), labels)
    scores |= {
        "features": features,
        "C": c,
        "folds": len(split),
        "baseline": _baseline_scores(texts, truth_all, labels),
    }
    scored_groups = [data.groups[i] for i in scored]
    calibrate_on, truth = stratified, truth_all
    scores["grouped"] = None
    compared_on = [(split, stratified, "stratified")]  # the folds to compare on, the first that can
    grouped_run, grouped_learnt = _grouped_cv(oof, scored_groups, truth_all, labels)
    if grouped_run is not None:
        compared_on.insert(0, grouped_run)
    if grouped_learnt is not None:
        scores["grouped"], calibrate_on, truth = grouped_learnt
    scores["calibration"] = calibration(calibrate_on, truth, labels) | {
        "on": "leave-one-source-out" if scores["grouped"] else "stratified"
    }
    scores["following"] = _following(
        calibrate_on, truth, labels, scores["calibration"], scored_groups, truth_all
    )
    scores["reachability"] = _reachability(scores, data.labels)
    if compare_with is not None and len(pseudo):
        scores["comparison"] = _comparison(
            data, labels, scored, compared_on, compare_with, seed, progress, jobs
        )
    return scores


def _scored_out_of_fold(
    data: TrainingData,
    labels: list[str],
    scored: np.ndarray,
    pseudo: np.ndarray,
    build: Callable[[], Pipeline],
    progress: Progress | None,
    jobs: int,
) -> Callable[[_Folds, str], tuple[np.ndarray, np.ndarray]]:
    """A function of (folds of the scored rows, what they are) to the scored rows' out-of-fold decision
    values and learnability, every fold trained with the pseudo-labelled rows too."""
    weights = data.weight_array() if data.weights else None

    def oof(split: _Folds, what: str) -> tuple[np.ndarray, np.ndarray]:
        # out_of_fold says (folds done, folds) before each fold after the first: the line names the fold
        # being fitted, 1/n first (said here) and n/n last
        def said(done: int, total: int) -> None:
            if progress is not None:
                progress(f"cross-validating ({what}): fold {done + 1}/{total}")

        said(0, len(split))
        on_all = [(np.concatenate([scored[train], pseudo]), scored[test]) for train, test in split]
        values, learnable = out_of_fold(build, data.texts, data.labels, on_all, labels, weights, said, jobs)
        return values[scored], learnable[scored]

    return oof


def _baseline_scores(texts: list[str], truth: list[str], labels: list[str]) -> dict[str, float]:
    """Macro-F1 and accuracy of the keyword baseline on ``texts``."""
    baseline = [keyword_baseline(t) for t in texts]
    return {
        "macro_f1": float(f1_score(truth, baseline, labels=labels, average="macro", zero_division=0)),
        "accuracy": float(accuracy_score(truth, baseline)),
    }


def _grouped_cv(
    oof: Callable[[_Folds, str], tuple[np.ndarray, np.ndarray]],
    scored_groups: list[str],
    truth_all: list[str],
    labels: list[str],
) -> tuple[tuple[_Folds, np.ndarray, str] | None, tuple[dict, np.ndarray, list[str]] | None]:
    """Leave-one-source-out CV: (its folds, out-of-fold values, name) or None with a single source, and
    (its scores, the values and truth of the prompts it could learn) or None when fewer than two tasks
    could be learnt."""
    groups = sorted(set(scored_groups))
    if len(groups) < 2:
        return None, None
    by_source = grouped_folds(scored_groups)
    grouped, learnable = oof(by_source, "leave-one-source-out")
    kept = np.nonzero(learnable)[0]
    evaluable = sorted({truth_all[i] for i in kept})
    if len(evaluable) < 2:
        return (by_source, grouped, "leave-one-source-out"), None
    truth = [truth_all[i] for i in kept]
    calibrate_on = grouped[kept]
    scores = scores_of(truth, predictions(calibrate_on, labels), evaluable) | {
        "folds": len(groups),
        "groups": groups,
        "prompts": len(kept),
        "single_source": sorted(set(labels) - set(evaluable)),
    }
    return (by_source, grouped, "leave-one-source-out"), (scores, calibrate_on, truth)


def _following(
    calibrate_on: np.ndarray,
    truth: list[str],
    labels: list[str],
    calibrated: dict,
    scored_groups: list[str],
    truth_all: list[str],
) -> dict:
    """The catch-all tasks (:func:`router.classify.evaluation.catch_all_tasks`), judged for the tasks with
    prompts from MIN_SOURCES sources or more."""
    sources = {label: {g for g, t in zip(scored_groups, truth_all) if t == label} for label in labels}
    judged = {label for label, groups_ in sources.items() if len(groups_) >= MIN_SOURCES}
    return catch_all_tasks(calibrate_on, truth, labels, calibrated, judged) | {
        "on": calibrated["on"],
        "min_sources": MIN_SOURCES,
    }


def _reachability(scores: dict, training_labels: list[str]) -> dict[str, dict]:
    """Per task, whether it is reached: the grouped recall where there is one, the stratified otherwise."""
    recall = {label: row["recall"] for label, row in scores["per_class"].items()}
    if scores["grouped"]:
        recall |= {label: row["recall"] for label, row in scores["grouped"]["per_class"].items()}
    return reachability(
        recall, Counter(training_labels), set(scores["grouped"]["per_class"]) if scores["grouped"] else set()
    )


def _comparison(
    data: TrainingData,
    labels: list[str],
    scored: np.ndarray,
    compared_on: list[tuple[_Folds, np.ndarray, str]],
    compare_with: tuple[str, float],
    seed: int,
    progress: Progress | None,
    jobs: int,
) -> dict | None:
    """The adapted classifier against the ``compare_with`` recipe on the first of ``compared_on`` (folds,
    adapted values, name) where two tasks or more could be learnt; its problem when it cannot be fitted."""
    other_features, other_c = compare_with
    other = lambda: build_pipeline(seed, other_features, other_c)  # noqa: E731
    try:
        for split_, adapted_values, what in compared_on:
            comparison = _same_fold_comparison(
                data,
                labels,
                scored,
                split_,
                adapted_values,
                other,
                what,
                progress,
                fold_jobs(jobs, other_features),
            )
            if comparison is not None:
                return comparison | {"features": other_features, "C": other_c}
    except (ClassifierError, EncoderUnavailable) as exc:  # e.g. its feature set needs the encoder
        return {"problem": str(exc)}
    return None


def _same_fold_comparison(
    data: TrainingData,
    labels: list[str],
    scored: np.ndarray,
    split: list[tuple[np.ndarray, np.ndarray]],
    adapted_values: np.ndarray,
    build,
    what: str,
    progress: Progress | None,
    jobs: int = 1,
) -> dict | None:
    """The adapted classifier against another recipe (the active version's) on the same held-out
    prompts: ``build`` is fitted on exactly the training side of each of ``split``'s folds (indices
    into the ``scored``, labelled rows) without the pseudo-labels, and both are scored on the prompts
    that recipe could learn (their task was among its training labels; the pseudo-labels may make
    more learnable for the adapted one, which then counts for neither). ``adapted_values`` are the
    adapted classifier's out-of-fold decision values on the scored rows, (len(scored), len(labels)).
    Macro-F1 and per-task recall of both, or None when fewer than two tasks could be learnt."""

    def said(done: int, total: int) -> None:  # the fold being fitted, 1/n to n/n (as in _evaluate)
        if progress is not None:
            progress(
                f"cross-validating the active version without pseudo-labels ({what}): fold {done + 1}/{total}"
            )

    weights = data.weight_array() if data.weights else None
    folds_ = [(scored[train], scored[test]) for train, test in split]
    said(0, len(folds_))
    values, learnable = out_of_fold(build, data.texts, data.labels, folds_, labels, weights, said, jobs)
    values, learnable = values[scored], learnable[scored]
    kept = np.nonzero(learnable)[0]
    truth_all = [data.labels[i] for i in scored]
    truth = [truth_all[i] for i in kept]
    evaluable = sorted(set(truth))
    if len(evaluable) < 2:
        return None

    def summary(matrix: np.ndarray) -> dict:
        result = scores_of(truth, predictions(matrix[kept], labels), evaluable)
        return {
            "macro_f1": result["macro_f1"],
            "recall": {task: row["recall"] for task, row in result["per_class"].items()},
        }

    return {
        "on": what,
        "folds": len(split),
        "prompts": len(kept),
        "adapted": summary(adapted_values),
        "active": summary(values),
    }


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
    ``scores["activation"]`` (:func:`activation_check`, :func:`activation_message`). Training
    without pseudo-labels activates as before. ``jobs``: how many folds are cross-validated at once
    (:func:`router.classify.pipeline.fold_jobs` turns the setting into it)."""
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
    """The fitted pipeline, its scores and whether it becomes active; touches no database."""
    c = regularisation(features, c)
    pipeline, scores = _cross_validate_and_fit(
        data,
        seed=seed,
        features=features,
        c=c,
        progress=progress,
        compare_with=_recipe(active) if active is not None and cross_validate else None,
        cross_validate=cross_validate,
        jobs=jobs,
    )
    if activate and data.adapting():
        activate = _settle_activation(data, scores, active, force_activate)
    return pipeline, scores, activate


def _store_and_activate(
    session: Session,
    data: TrainingData,
    pipeline: Pipeline,
    scores: dict[str, Any],
    features: str,
    activate: bool,
) -> ClassifierVersion:
    version = _store_version(session, data, pipeline, scores, features)
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
    """The pipeline fitted on all of ``data`` and its scores: cross-validated (:func:`evaluate`, or
    only the recipe without ``cross_validate``), with the data's composition and, when adapted, the
    agreement with the pseudo-labels."""
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


def _settle_activation(
    data: TrainingData, scores: dict[str, Any], active: ClassifierVersion | None, force_activate: bool
) -> bool:
    """Whether the adapted version becomes active (:func:`activation_check`, or ``force_activate``);
    the verdict goes into ``scores["activation"]``, with the comparison it was made on."""
    check = activation_check(data, scores, active)
    scores.pop("comparison", None)  # kept, with what it compared, in the check
    withheld = bool(check["reasons"])
    scores["activation"] = check | {
        "activated": not withheld or force_activate,
        "forced": withheld and force_activate,
    }
    return scores["activation"]["activated"]


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


def _store_version(
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


def _recipe(record: ClassifierVersion) -> tuple[str, float]:
    """A stored version's feature set and C (the feature set's default when its record has none)."""
    scores = record.scores or {}
    features = scores.get("features", "tfidf")
    return features, float(scores.get("C") or DEFAULT_C.get(features, 1.0))


def activation_check(data: TrainingData, scores: dict, active: ClassifierVersion | None) -> dict:
    """Why an adapted version (trained on ``data``, cross-validated into ``scores``) must not replace
    ``active``: too few confident pseudo-labels, worse than it on the same held-out folds
    (``scores["comparison"]``), or no comparison at all (not cross-validated, or the active recipe
    could not be fitted). ``{"previous": active version or None, "reasons": [...], "pseudo": ...,
    "comparison": ...}``; no reasons when nothing is active (nothing to keep)."""
    support = pseudo_label_support(data)
    comparison = scores.get("comparison")
    check: dict[str, Any] = {"previous": None, "reasons": [], "pseudo": support, "comparison": None}
    if active is None:
        return check
    check["previous"] = active.version
    reasons = [support["too_few"]] if support["too_few"] else []
    if comparison and "problem" not in comparison:
        comparison = comparison | {
            # the active version's own data (it added no labels since) or its recipe on today's labels
            "same_data": active.training_data_sha256 == data.without_pseudo_labels().sha256,
            "active_adapted": "adaptation" in (active.scores or {}),
        }
        check["comparison"] = comparison
        worse = regressions(comparison["adapted"], comparison["active"])
        if worse:
            reasons.append(f"worse than v{active.version}: " + "; ".join(worse))
    elif support["count"]:
        why = (
            comparison["problem"]
            if comparison
            else "not cross-validated"
            if "macro_f1" not in scores
            else "fewer than two tasks could be learnt on its folds"
        )
        reasons.append(f"not compared with v{active.version} on the same held-out folds ({why})")
    check["reasons"] = reasons
    return check


def activation_message(version: ClassifierVersion) -> str | None:
    """What became of an adapted version, in a line or two with both versions' numbers: activated
    (better or no worse than the active one on the same folds, or nothing was active), activated by
    force despite the reasons, or NOT activated and why. None for a version trained without adapting."""
    check = (version.scores or {}).get("activation")
    if check is None:
        return None
    previous, reasons, comparison = check["previous"], check["reasons"], check["comparison"]
    if previous is None:
        head = f"classifier v{version.version} activated: no version was active to compare it with"
    elif not check["activated"]:
        head = f"classifier v{version.version} NOT activated (v{previous} stays active): " + "; ".join(
            reasons
        )
    elif check["forced"]:
        head = f"classifier v{version.version} activated because you forced it, although: " + "; ".join(
            reasons
        )
    else:
        head = f"classifier v{version.version} activated: no worse than v{previous}"
    if comparison:
        head += (
            f". Same {comparison['folds']} {comparison['on']} folds ({comparison['prompts']} labelled "
            f"prompts): macro-F1 {comparison['adapted']['macro_f1']:.3f} adapted vs "
            f"{comparison['active']['macro_f1']:.3f} for v{previous}"
            + (
                " re-trained fold by fold on its own training data"
                if comparison["same_data"] and not comparison["active_adapted"]
                else f"'s recipe ({comparison['features']}, C {comparison['C']:g}) re-trained fold by fold "
                "on today's labelled prompts, without pseudo-labels"
            )
        )
    return head


def activate_version(session: Session, version: int) -> ClassifierVersion:
    """Make ``version`` the one active classifier."""
    chosen = activate_only(session, ClassifierVersion, version)
    if chosen is None:
        raise ClassifierError(f"no classifier version {version}")
    return chosen


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
    pipeline = pickle.loads(record.artifact)  # specroute's own artifact, hash-checked above
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
