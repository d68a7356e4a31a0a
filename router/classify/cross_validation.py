"""The task classifier's cross-validation (:func:`evaluate`, what ``specroute train`` reports): stratified
k-fold beside the keyword baseline, leave-one-source-out when the data has two sources or more, the
calibration, catch-all tasks and reachability drawn from the out-of-fold decision values, and an adapted
classifier against the active version's recipe on the very same held-out folds. The measures it is made of
(folds, scores, calibration, regressions) are :mod:`router.classify.evaluation`."""

from __future__ import annotations

from collections import Counter
from typing import Callable

import numpy as np
from sklearn.metrics import accuracy_score, f1_score
from sklearn.pipeline import Pipeline

from router.classify.encoder import EncoderUnavailable, embedding_cache
from router.classify.evaluation import (
    MIN_SOURCES,
    calibration,
    catch_all_tasks,
    counted_terms,
    grouped_folds,
    out_of_fold,
    predictions,
    reachability,
    routed_share,
    scores_of,
    stratified_folds,
)
from router.classify.features import keyword_baseline
from router.classify.fold_features import FoldFeatures
from router.classify.pipeline import build_pipeline, fold_jobs, regularisation
from router.classify.teacher import Progress
from router.classify.training_data import ClassifierError, TrainingData

_Folds = list[tuple[np.ndarray, np.ndarray]]  # (training rows, test rows) per fold


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


def _calibrate(
    scores: dict,
    stratified: np.ndarray,
    calibrate_on: np.ndarray,
    truth: list[str],
    labels: list[str],
    scored_groups: list[str],
    truth_all: list[str],
) -> None:
    """Add to ``scores`` the calibration fitted on ``calibrate_on`` (the leave-one-source-out predictions where
    there are several sources, else the stratified ones), the share of traffic the router then routes by task,
    and what following the classifier's tasks does."""
    scores["calibration"] = calibration(calibrate_on, truth, labels) | {
        "on": "leave-one-source-out" if scores["grouped"] else "stratified"
    }
    temperature, threshold = scores["calibration"]["temperature"], scores["calibration"]["threshold"]
    scores["routed_share"] = {  # what share of traffic the router routes by task, at the chosen threshold
        "like_training": routed_share(stratified, temperature, threshold),
        "unseen_sources": routed_share(calibrate_on, temperature, threshold) if scores["grouped"] else None,
    }
    scores["following"] = _following(
        calibrate_on, truth, labels, scores["calibration"], scored_groups, truth_all
    )


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
    build = lambda: build_pipeline(seed, features, c)  # noqa: E731
    counted = counted_terms(build, data.texts)  # once for every cross-validation below
    oof = _scored_out_of_fold(data, labels, scored, pseudo, build, progress, jobs, counted)
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
    _calibrate(scores, stratified, calibrate_on, truth, labels, scored_groups, truth_all)
    scores["reachability"] = _reachability(scores, data.labels)
    if compare_with is not None and len(pseudo):
        scores["comparison"] = _comparison(
            data,
            labels,
            scored,
            compared_on,
            compare_with,
            seed,
            progress,
            jobs,
            counted if compare_with[0] == features else None,
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
    counted: FoldFeatures | None = None,
) -> Callable[[_Folds, str], tuple[np.ndarray, np.ndarray]]:
    """A function of (folds of the scored rows, what they are) to the scored rows' out-of-fold decision
    values and learnability, every fold trained with the pseudo-labelled rows too (``counted``: the
    terms of every row, counted once, :func:`router.classify.evaluation.counted_terms`)."""
    weights = data.weight_array() if data.weights else None

    def oof(split: _Folds, what: str) -> tuple[np.ndarray, np.ndarray]:
        # out_of_fold says (folds done, folds) before each fold after the first: the line names the fold
        # being fitted, 1/n first (said here) and n/n last
        def said(done: int, total: int) -> None:
            if progress is not None:
                progress(f"cross-validating ({what}): fold {done + 1}/{total}")

        said(0, len(split))
        on_all = [(np.concatenate([scored[train], pseudo]), scored[test]) for train, test in split]
        values, learnable = out_of_fold(
            build, data.texts, data.labels, on_all, labels, weights, said, jobs, counted=counted
        )
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
    counted: FoldFeatures | None = None,
) -> dict | None:
    """The adapted classifier against the ``compare_with`` recipe on the first of ``compared_on`` (folds,
    adapted values, name) where two tasks or more could be learnt; its problem when it cannot be fitted.
    ``counted``: the rows' terms counted with that recipe's feature set already (None: counted anew)."""
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
                counted,
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
    counted: FoldFeatures | None = None,
) -> dict | None:
    """The adapted classifier against another recipe (the active version's) on the same held-out
    prompts: ``build`` is fitted on exactly the training side of each of ``split``'s folds (indices
    into the ``scored``, labelled rows) without the pseudo-labels, and both are scored on the prompts
    that recipe could learn (their task was among its training labels; the pseudo-labels may make
    more learnable for the adapted one, which then counts for neither). ``adapted_values`` are the
    adapted classifier's out-of-fold decision values on the scored rows, (len(scored), len(labels)).
    Macro-F1 and per-task recall of both, or None when fewer than two tasks could be learnt.
    ``counted``: every row's terms counted once already with this recipe's feature set (None: counted
    here); a fold's vocabulary comes from its training rows' counts alone, the pseudo-labelled rows' never."""

    def said(done: int, total: int) -> None:  # the fold being fitted, 1/n to n/n (as in _evaluate)
        if progress is not None:
            progress(
                f"cross-validating the active version without pseudo-labels ({what}): fold {done + 1}/{total}"
            )

    weights = data.weight_array() if data.weights else None
    folds_ = [(scored[train], scored[test]) for train, test in split]
    said(0, len(folds_))
    values, learnable = out_of_fold(
        build, data.texts, data.labels, folds_, labels, weights, said, jobs, counted=counted
    )
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
