"""How good the task classifier is, measured two ways, and what follows from it.

- Stratified k-fold CV: folds mix every source, so it measures prompts that look like the training data.
- Leave-one-source-out CV (grouped by the repository in each prompt's ``source``, so the files of one
  dataset stay together): every source is predicted by a model that never saw it, which is what
  traffic from elsewhere looks like. A prompt whose task has no other source cannot be learnt from the
  other folds: such prompts are left out of the grouped scores (and their tasks listed as having a
  single source) rather than counted as misses; wrong predictions *of* those tasks still count.

From the grouped out-of-fold decision values: a temperature that calibrates the probabilities (the
expected calibration error and a reliability table before and after), the confidence threshold below
which the router should use the workload policy (where following the classifier stops paying: more
of its predictions right than wrong above it), and per task whether the classifier reaches it.

An adapted classifier replaces the active one only if it is no worse on the same held-out prompts
(:func:`regressions`, used by ``router.classify.training.train_classifier``).
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Callable, Sequence

import numpy as np
from joblib import Parallel, delayed
from sklearn.metrics import accuracy_score, classification_report, confusion_matrix, f1_score
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import Pipeline

from router.classify.fold_features import FoldFeatures

MIN_FOLLOWED = 10  # a task the router followed fewer times than this on unseen sources is not judged
MIN_SOURCES = 3  # ... nor one with prompts from fewer sources (its right predictions could hardly show)
MIN_REACH_RECALL = 0.3  # a task predicted for fewer of its prompts (unseen sources) is "rarely reached"
MIN_TRAINING_PROMPTS = 20  # ... as is one with fewer training prompts
ECE_BINS = 10
USER_GROUP = "your labels"
# An adapted version is worse than the active one, on the same held-out folds, when its macro-F1 is lower
# by more than WORSE_MACRO_F1, or when a task's recall falls by LOST_RECALL_DROP or more to below
# MIN_REACH_RECALL (the router would stop reaching it): see regressions() and docs/classifier.md.
WORSE_MACRO_F1 = 0.01
LOST_RECALL_DROP = 0.1


def source_group(source: str | None) -> str:
    """The group of a prompt for grouped CV: the repository part of ``owner/repo:file`` (a prompt
    with no source, such as a user's own label, is in USER_GROUP)."""
    return source.split(":", 1)[0] if source else USER_GROUP


def softmax(scores: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of decision values divided by ``temperature`` (-inf columns get 0)."""
    z = np.asarray(scores, dtype=np.float64) / temperature
    z = z - z.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    return z / z.sum(axis=1, keepdims=True)


def decision_matrix(model, texts: Sequence[str], labels: Sequence[str]) -> np.ndarray:
    """A fitted linear classifier's decision values as a (n, len(labels)) matrix over ``labels``;
    a label the model was not trained on gets -inf. Two classes become [0, d] (softmax = logistic)."""
    return _over_labels(model.decision_function(list(texts)), model.classes_, labels)


def _over_labels(decision, classes: Sequence[str], labels: Sequence[str]) -> np.ndarray:
    """A linear model's ``decision`` values for its ``classes`` as a (n, len(labels)) matrix over ``labels``
    (-inf for the labels it was not trained on; two classes' one column becomes [0, d])."""
    values = np.asarray(decision, dtype=np.float64)
    if values.ndim == 1:
        values = np.column_stack([np.zeros_like(values), values])
    out = np.full((len(values), len(labels)), -np.inf)
    column = {label: i for i, label in enumerate(labels)}
    for j, label in enumerate(classes):
        out[:, column[label]] = values[:, j]
    return out


def out_of_fold(
    build: Callable[[], Pipeline],
    texts: Sequence[str],
    labels: Sequence[str],
    folds: list[tuple[np.ndarray, np.ndarray]],
    all_labels: list[str],
    weights: np.ndarray | None = None,
    progress: Callable[[int, int], None] | None = None,
    jobs: int = 1,
    count_terms_once: bool = True,
    counted: FoldFeatures | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Decision values of every prompt from a model fitted on the other folds (a Pipeline whose last
    step is "model", with ``weights`` as its sample weights when given), and whether its own task was
    among that model's training labels (it can only be predicted if so). A prompt in no test fold
    keeps -inf. ``progress`` is told (folds done, folds) after each fold but the last. ``jobs`` > 1
    fits that many folds at once in worker processes (joblib): the same models, the same values. The TF-IDF
    parts of the pipeline's features count every prompt's terms once for all folds
    (:class:`router.classify.fold_features.FoldFeatures`: the same features to a last bit's rounding);
    ``count_terms_once=False`` fits each fold's whole pipeline instead (tests and benchmarks compare);
    ``counted``: those counts, taken over ``texts`` with the same feature union already (a training's
    other cross-validations reuse them; :func:`counted_terms`)."""
    text_array, label_array = np.asarray(texts, dtype=object), np.asarray(labels, dtype=object)
    scores = np.full((len(text_array), len(all_labels)), -np.inf)
    learnable = np.zeros(len(text_array), dtype=bool)
    if counted is None:
        counted = FoldFeatures.of(build(), text_array) if folds and count_terms_once else None
    tasks = (
        delayed(_counted_fold_values)(
            build, counted, train, test, label_array[train], all_labels, _part(weights, train)
        )
        if counted is not None
        else delayed(_fold_values)(
            build, text_array[train], label_array[train], text_array[test], all_labels, _part(weights, train)
        )
        for train, test in folds
    )
    fitted = (
        Parallel(n_jobs=min(jobs, len(folds)), return_as="generator")(tasks)
        if jobs > 1 and len(folds) > 1
        else (task(*args, **kwargs) for task, args, kwargs in tasks)
    )
    try:
        for done, ((train, test), values) in enumerate(zip(folds, fitted), 1):
            trained = set(label_array[train])
            learnable[test] = [label in trained for label in label_array[test]]
            if values is not None:
                scores[test] = values
            if progress is not None and done < len(folds):
                progress(done, len(folds))  # may raise to cancel (webui/background.py)
    finally:
        with warnings.catch_warnings():  # cancelled on purpose: joblib need not say it dropped the rest
            warnings.filterwarnings("ignore", ".*tasks which were still being processed", UserWarning)
            fitted.close()
    return scores, learnable


def counted_terms(build: Callable[[], Pipeline], texts: Sequence[str]) -> FoldFeatures | None:
    """The terms of ``texts`` counted once for every cross-validation of ``build()``'s feature union over
    them (:meth:`FoldFeatures.of`; None where they cannot be), for :func:`out_of_fold`'s ``counted``."""
    return FoldFeatures.of(build(), np.asarray(texts, dtype=object))


def _part(weights: np.ndarray | None, rows: np.ndarray) -> np.ndarray | None:
    """The weights of ``rows`` (None without weights)."""
    return None if weights is None else weights[rows]


def _fold_values(
    build: Callable[[], Pipeline],
    train_texts: np.ndarray,
    train_labels: np.ndarray,
    test_texts: np.ndarray,
    all_labels: list[str],
    weights: np.ndarray | None,
) -> np.ndarray | None:
    """One fold: ``build()`` fitted on its training side, its decision values on its test side; None
    when the training side has a single task (nothing to learn; the fold's prompts stay unpredicted)."""
    if len(set(train_labels)) < 2:
        return None
    fit_params = {} if weights is None else {"model__sample_weight": weights}
    model = build().fit(list(train_texts), list(train_labels), **fit_params)
    return decision_matrix(model, list(test_texts), all_labels)


def _counted_fold_values(
    build: Callable[[], Pipeline],
    counted: FoldFeatures,
    train: np.ndarray,
    test: np.ndarray,
    train_labels: np.ndarray,
    all_labels: list[str],
    weights: np.ndarray | None,
) -> np.ndarray | None:
    """:func:`_fold_values` with the fold's features from the terms counted once: the pipeline's model
    step fitted on them."""
    if len(set(train_labels)) < 2:
        return None
    fitted, held_out = counted.fold(train, test)
    model = build().named_steps["model"]
    model.fit(fitted, list(train_labels), **({} if weights is None else {"sample_weight": weights}))
    return _over_labels(model.decision_function(held_out), model.classes_, all_labels)


def stratified_folds(labels: Sequence[str], folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Shuffled stratified k-fold splits of ``labels`` (``folds``, or fewer when the rarest label has
    fewer prompts), as (training rows, test rows)."""
    splits = min(folds, min(Counter(labels).values()))
    return list(
        StratifiedKFold(n_splits=splits, shuffle=True, random_state=seed).split(np.zeros(len(labels)), labels)
    )


def grouped_folds(groups: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Leave one group out: one fold per distinct group."""
    group_array = np.asarray(groups, dtype=object)
    indices = np.arange(len(group_array))
    return [(indices[group_array != g], indices[group_array == g]) for g in sorted(set(group_array))]


def predictions(scores: np.ndarray, all_labels: list[str]) -> list[str]:
    """The argmax label per row; a row with no scores (its fold had nothing to learn) is "" (wrong)."""
    best = scores.argmax(axis=1)
    return ["" if not np.isfinite(scores[i]).any() else all_labels[b] for i, b in enumerate(best)]


def scores_of(labels: Sequence[str], predicted: Sequence[str], all_labels: list[str]) -> dict:
    """Macro-F1, accuracy, per-class precision/recall/F1/support and the confusion matrix."""
    report = classification_report(labels, predicted, labels=all_labels, output_dict=True, zero_division=0)
    return {
        "macro_f1": float(f1_score(labels, predicted, labels=all_labels, average="macro", zero_division=0)),
        "accuracy": float(accuracy_score(labels, predicted)),
        "per_class": {
            label: {k: float(report[label][k]) for k in ("precision", "recall", "f1-score", "support")}
            for label in all_labels
        },
        "confusion": {
            "labels": all_labels,
            "matrix": confusion_matrix(labels, predicted, labels=all_labels).tolist(),
        },
    }


def reliability(
    confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS
) -> tuple[float, list[dict]]:
    """Expected calibration error (equal-width confidence bins, weighted by size) and the table."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.searchsorted(edges, confidence, side="right") - 1, 0, bins - 1)
    rows, ece = [], 0.0
    for b in range(bins):
        inside = which == b
        n = int(inside.sum())
        if n == 0:
            continue
        mean_conf, accuracy = float(confidence[inside].mean()), float(correct[inside].mean())
        ece += n / len(confidence) * abs(mean_conf - accuracy)
        rows.append(
            {
                "low": float(edges[b]),
                "high": float(edges[b + 1]),
                "n": n,
                "confidence": mean_conf,
                "accuracy": accuracy,
            }
        )
    return float(ece), rows


def fit_temperature(scores: np.ndarray, truth: np.ndarray) -> float:
    """The temperature whose calibrated confidences have the lowest expected calibration error on
    these out-of-fold predictions (ties: the lower negative log-likelihood). Rows whose true label had
    no score are left out: no temperature can help them. One parameter fitted on out-of-fold values,
    so the "after" figure is only mildly optimistic."""
    usable = np.isfinite(scores[np.arange(len(truth)), truth])
    if usable.sum() < 2:
        return 1.0
    s, t = scores[usable], truth[usable]
    correct = s.argmax(axis=1) == t

    def cost(temperature: float) -> tuple[float, float]:
        p = softmax(s, temperature)
        return (
            round(reliability(p.max(axis=1), correct)[0], 4),
            float(-np.log(np.maximum(p[np.arange(len(t)), t], 1e-300)).mean()),
        )

    grid = np.exp(np.linspace(np.log(0.05), np.log(50.0), 121))
    best = grid[min(range(len(grid)), key=lambda i: cost(float(grid[i])))]
    fine = np.exp(np.linspace(np.log(best) - 0.06, np.log(best) + 0.06, 25))
    return float(fine[min(range(len(fine)), key=lambda i: cost(float(fine[i])))])


def choose_threshold(confidence: np.ndarray, correct: np.ndarray) -> dict:
    """The confidence bar at which following the classifier pays most on these out-of-fold
    predictions: it keeps the most confident predictions up to where (right - wrong) among them peaks
    (ties: the lower bar, which routes more requests), set halfway to the next one; 0.0 when every
    prediction pays, 1.0 when none leaves more right than wrong. With the share of prompts it keeps
    and their precision."""
    order = np.argsort(-confidence, kind="stable")
    net = np.cumsum(np.where(correct[order], 1, -1))
    if len(net) == 0 or net.max() <= 0:
        return {"threshold": 1.0, "coverage": 0.0, "precision": None}
    k = int(np.nonzero(net == net.max())[0].max())
    ranked = confidence[order]
    # halfway to the first prediction left out; when every prediction pays, no bar at all
    threshold = 0.0 if k == len(ranked) - 1 else float(ranked[k] + ranked[k + 1]) / 2
    kept = confidence >= threshold
    return {"threshold": threshold, "coverage": float(kept.mean()), "precision": float(correct[kept].mean())}


def routed_share(scores: np.ndarray, temperature: float, threshold: float) -> float:
    """The share of these out-of-fold predictions (rows of decision values) whose calibrated confidence clears
    the routing ``threshold``: the share of such traffic the router routes by its task rather than by the
    workload's policy."""
    if len(scores) == 0:
        return 0.0
    scored = np.isfinite(scores).any(axis=1, keepdims=True)
    confidence = softmax(np.where(scored, scores, 0.0), temperature).max(axis=1)
    return float(np.mean(confidence >= threshold))


def calibration(scores: np.ndarray, labels: Sequence[str], all_labels: list[str]) -> dict:
    """Temperature, ECE and reliability table before and after, and the routing threshold."""
    index = {label: i for i, label in enumerate(all_labels)}
    truth = np.asarray([index[label] for label in labels])
    scored = np.isfinite(scores).any(axis=1, keepdims=True)  # rows a fold's model predicted at all
    correct = (scores.argmax(axis=1) == truth) & scored[:, 0]
    temperature = fit_temperature(scores, truth)
    usable = np.where(scored, scores, 0.0)  # an unscored row is uniform: its confidence is 1 / classes
    raw, calibrated = softmax(usable).max(axis=1), softmax(usable, temperature).max(axis=1)
    ece_before, table_before = reliability(raw, correct)
    ece_after, table_after = reliability(calibrated, correct)
    return {
        "temperature": temperature,
        "ece_before": ece_before,
        "ece_after": ece_after,
        "reliability_before": table_before,
        "reliability_after": table_after,
        **choose_threshold(calibrated, correct),
    }


def reachability(recall: dict[str, float], training_counts: Counter, unseen: set[str]) -> dict[str, dict]:
    """Per task: reached or not, and why (recall below MIN_REACH_RECALL — on sources left out of
    training for the tasks in ``unseen``, stratified otherwise — or fewer than MIN_TRAINING_PROMPTS
    training prompts)."""
    out = {}
    for label, value in recall.items():
        n, value = int(training_counts.get(label, 0)), float(value)
        where = "on sources left out of training" if label in unseen else "cross-validated"
        why = []
        if n < MIN_TRAINING_PROMPTS:
            why.append(f"only {n} training prompts (< {MIN_TRAINING_PROMPTS})")
        if value < MIN_REACH_RECALL:
            why.append(f"recall {value:.2f} {where} (< {MIN_REACH_RECALL})")
        out[label] = {
            "reachable": not why,
            "recall": value,
            "recall_on": where,
            "training_prompts": n,
            "reason": "; ".join(why),
        }
    return out


def catch_all_tasks(
    scores: np.ndarray, labels: Sequence[str], all_labels: list[str], calibrated: dict, judged: set[str]
) -> dict:
    """Per predicted task, the out-of-fold predictions the router would follow (calibrated confidence
    at or above the routing threshold) and how many were right; a task in ``judged`` followed at least
    MIN_FOLLOWED times and right for fewer than half of them is a **catch-all**: prompts of other tasks
    land in it (typically "general"), so its policy would mostly be applied to the wrong traffic, and
    the router uses the workload-wide policy for it instead. Only tasks with prompts from MIN_SOURCES
    sources or more are judged: on leave-one-source-out folds a task with one or two sources has its
    own prompts left out exactly when they could be predicted right, so its precision there says
    little. ``{"tasks": {task: {...}}, "catch_all": [...], "share": share of all prompts predicted
    (and followed) as a catch-all task}``."""
    index = {label: i for i, label in enumerate(all_labels)}
    truth = np.asarray([index[label] for label in labels])
    scored = np.isfinite(scores).any(axis=1)
    usable = np.where(scored[:, None], scores, 0.0)
    probabilities = softmax(usable, calibrated["temperature"])
    predicted, confidence = probabilities.argmax(axis=1), probabilities.max(axis=1)
    followed = scored & (confidence >= calibrated["threshold"])
    tasks, catch_all, covered = {}, [], 0
    for j, task in enumerate(all_labels):
        mine = followed & (predicted == j)
        n, right = int(mine.sum()), int((mine & (truth == j)).sum())
        if not n:
            continue
        is_catch_all = task in judged and n >= MIN_FOLLOWED and right < n / 2
        tasks[task] = {
            "followed": n,
            "right": right,
            "precision": right / n,
            "judged": task in judged,
            "catch_all": is_catch_all,
        }
        if is_catch_all:
            catch_all.append(task)
            covered += n
    return {"tasks": tasks, "catch_all": catch_all, "share": covered / max(len(truth), 1)}


def regressions(adapted: dict, active: dict) -> list[str]:
    """Why the ``adapted`` classifier is worse than the ``active`` one, both scored on the same held-out
    prompts and tasks (each ``{"macro_f1": float, "recall": {task: float}}``): macro-F1 lower by more
    than WORSE_MACRO_F1 (``adapted < active - WORSE_MACRO_F1``), and every task whose recall fell by
    LOST_RECALL_DROP or more to below MIN_REACH_RECALL. Empty when it is not worse."""
    found = []
    drop = round(active["macro_f1"] - adapted["macro_f1"], 9)  # 0.60 - 0.59 is 0.01, not 0.0100...09
    if drop > WORSE_MACRO_F1:
        found.append(
            f"macro-F1 {adapted['macro_f1']:.3f} adapted vs {active['macro_f1']:.3f} active "
            f"({drop:.3f} lower; tolerance {WORSE_MACRO_F1})"
        )
    for task, before in sorted(active["recall"].items()):
        after = adapted["recall"].get(task, 0.0)
        if after < MIN_REACH_RECALL and round(before - after, 9) >= LOST_RECALL_DROP:
            found.append(
                f"{task} recall {before:.2f} -> {after:.2f} (below {MIN_REACH_RECALL}: rarely reached)"
            )
    return found
