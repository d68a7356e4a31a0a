"""The task classifier: cross-validated scores far above the keyword baseline on real labeled prompts,
persisted versions with their record, refusal on a mismatching record, labelling of unlabelled
analysis results, and the train command."""

from __future__ import annotations

import collections
import json
import random
import re
from collections import defaultdict
from pathlib import Path

import pytest
from sqlalchemy import select

from analyzer.orm import AnalysisRun, ModelPair, ModelSpec, Prompt, PromptResult
from analyzer.prompts.prompt_sets import import_prompt_file
from router.classify.cross_validation import evaluate
from router.classify.features import STRUCTURAL_FEATURES, keyword_baseline, structural_features
from router.classify.training import train_classifier
from router.classify.training_data import (
    ClassifierError,
    TrainingData,
    cold_start_data,
    make_training_data,
    training_data_from_db,
)
from router.classify.version_store import load_active, load_version
from router.orm import ClassifierVersion
from tests.conftest import require_shared
from webui.cli import cli

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def subset() -> TrainingData:
    """Up to 25 prompts per task type from the bundled corpus (all 13 types), seeded."""
    corpus = cold_start_data()
    by_label = defaultdict(list)
    for text, label in zip(corpus.texts, corpus.labels):
        by_label[label].append(text)
    rng = random.Random(5)
    texts, labels = [], []
    for label in sorted(by_label):
        chosen = rng.sample(by_label[label], min(25, len(by_label[label])))
        texts += chosen
        labels += [label] * len(chosen)
    return make_training_data(texts, labels, "test subset")


@pytest.mark.parametrize(
    "rules",
    [
        {},  # the pipeline's own: min_df 2, no max_features binding
        {"words__max_features": 300, "chars__max_features": 2000, "chars__min_df": 0.01},  # both rules bind
        {
            "words__max_df": 0.2,
            "words__min_df": 0.0,
            "chars__max_df": 40,
            "words__sublinear_tf": False,
            "chars__norm": "l1",
        },
    ],
    ids=["the pipeline's", "max_features and a fraction min_df", "max_df, min_df 0 and other idf rules"],
)
def test_fold_features_from_terms_counted_once_are_the_pipelines_own(subset, rules):
    """Cross-validation counts every prompt's terms once (router.classify.fold_features): each fold's
    TF-IDF matrices equal the feature union's own fit on the training rows and transform of the held-out
    ones, the same vocabulary (pruned by min_df, max_df and max_features on the training rows) to a last
    bit's rounding, and so do the out-of-fold decision values (the pipeline's own rules)."""
    import numpy as np

    from router.classify.evaluation import grouped_folds, out_of_fold, stratified_folds
    from router.classify.fold_features import FoldFeatures
    from router.classify.pipeline import build_pipeline

    def build():
        pipeline = build_pipeline(0, "tfidf")
        pipeline.named_steps["features"].set_params(**rules)
        return pipeline

    texts = np.asarray(subset.texts[::2], dtype=object)  # 12-13 prompts per task
    task_labels = list(subset.labels[::2])
    groups = [f"g{i % 3}" for i in range(len(texts))]
    folds = stratified_folds(task_labels, 2, 0) + grouped_folds(groups)
    counted = FoldFeatures.of(build(), texts)
    assert counted is not None and set(counted.counted) == {"words", "chars"}
    for train, test in folds:
        fitted, held_out = counted.fold(train, test)
        union = build().named_steps["features"]
        own_fitted = union.fit_transform(list(texts[train]))
        own_held_out = union.transform(list(texts[test]))
        for name, part in union.transformer_list[:2]:
            if f"{name}__max_features" in rules:  # the rule binds
                assert len(part.vocabulary_) == rules[f"{name}__max_features"]
        for ours, theirs in ((fitted, own_fitted), (held_out, own_held_out)):
            ours, theirs = ours.tocsr(), theirs.tocsr()
            ours.sort_indices()
            theirs.sort_indices()
            assert ours.shape == theirs.shape
            assert np.array_equal(ours.indptr, theirs.indptr) and np.array_equal(ours.indices, theirs.indices)
            assert np.allclose(ours.data, theirs.data, rtol=1e-12, atol=1e-15)
    if rules:
        return
    labels = sorted(set(task_labels))
    values, learnable = out_of_fold(build, list(texts), task_labels, folds, labels)
    # each fold fitted by the whole pipeline, as before terms were counted once
    own_values, own_learnable = out_of_fold(
        build, list(texts), task_labels, folds, labels, count_terms_once=False
    )
    assert np.array_equal(learnable, own_learnable) and np.array_equal(
        np.isfinite(values), np.isfinite(own_values)
    )
    finite = np.isfinite(own_values)
    assert np.allclose(values[finite], own_values[finite], rtol=1e-9, atol=1e-9)
    assert np.array_equal(values.argmax(axis=1), own_values.argmax(axis=1))


def test_a_training_counts_its_prompts_terms_once_for_all_its_cross_validations(subset, monkeypatch):
    """An adapted training's stratified folds and the active recipe's comparison on the same folds take
    their features from one count of every prompt's terms (pseudo-labelled ones included, each fold's
    vocabulary from its training rows alone): the scores equal those with the terms counted anew for each."""
    from router.classify import cross_validation
    from router.classify.fold_features import FoldFeatures
    from router.classify.training_data import PseudoLabel, with_pseudo_labels

    counts = []
    of = FoldFeatures.of.__func__
    monkeypatch.setattr(FoldFeatures, "of", classmethod(lambda cls, *a: counts.append(1) or of(cls, *a)))
    pseudo = [
        PseudoLabel(f"pretend you are a pirate captain number {i}", "roleplay", 0.9, "up") for i in range(6)
    ]
    adapted = with_pseudo_labels(subset, pseudo, min_confidence=0.5)
    once = evaluate(adapted, folds=3, compare_with=("tfidf", 2.0))
    assert len(counts) == 1 and once["comparison"]["on"] == "stratified" and once["comparison"]["folds"] == 3
    counts.clear()
    monkeypatch.setattr(cross_validation, "counted_terms", lambda build, texts: None)
    each = evaluate(adapted, folds=3, compare_with=("tfidf", 2.0))
    assert len(counts) == 2  # the folds', then the comparison's
    assert json.dumps(once, sort_keys=True) == json.dumps(each, sort_keys=True)


def test_keyword_baseline_rules():
    assert keyword_baseline("```python\nx = 1\n```") == "code"
    assert keyword_baseline('Return JSON like {"a": 1}') == "structured_output"
    assert keyword_baseline("Please summarize this article") == "summarization"
    assert keyword_baseline("Create a poem") == "creative_writing"
    assert keyword_baseline("Who won the 1998 World Cup?") == "general"


def test_structural_features_shape_and_values():
    rows = structural_features(
        ['```def f(): return {"a": 1}```', "Translate to German: hello", "Привет мир?"]
    )
    assert rows.shape == (3, len(STRUCTURAL_FEATURES))
    column = {name: i for i, name in enumerate(STRUCTURAL_FEATURES)}
    assert rows[0, column["code_fences"]] > 0 and rows[0, column["json_keys"]] > 0
    assert rows[1, column["starts_translate"]] == 1.0 and rows[0, column["starts_translate"]] == 0.0
    assert rows[2, column["non_latin_letters"]] > 0.8 and rows[1, column["non_latin_letters"]] == 0.0


@pytest.mark.slow
@pytest.mark.parallel
def test_cross_validated_scores_beat_the_keyword_baseline_by_a_wide_margin(subset):
    scores = evaluate(subset, seed=0)
    assert scores["folds"] == 5 and scores["grouped"] is None  # the subset has no sources: no grouped CV
    assert (
        scores["calibration"]["on"] == "stratified"
        and scores["calibration"]["ece_after"] <= scores["calibration"]["ece_before"]
    )
    assert scores["macro_f1"] >= scores["baseline"]["macro_f1"] + 0.3
    assert scores["accuracy"] >= 0.7
    assert set(scores["per_class"]) == set(subset.labels) and len(scores["per_class"]) == 13
    matrix = scores["confusion"]["matrix"]
    assert sum(map(sum, matrix)) == len(subset.texts)


@pytest.mark.slow
@pytest.mark.parallel
def test_train_persists_versions_with_their_record_and_predicts(session, subset):
    with session.begin():
        first = train_classifier(session, subset)
        second = train_classifier(session, subset)
    with session.begin():
        versions = list(session.scalars(select(ClassifierVersion).order_by(ClassifierVersion.version)))
        assert [(v.version, v.is_active) for v in versions] == [(1, False), (2, True)]
        assert second.training_data_sha256 == first.training_data_sha256 == subset.sha256
        assert {"scikit-learn", "numpy", "python", "scipy"} <= set(second.library_versions)
        assert second.labels == sorted(set(subset.labels)) and second.training_prompt_count == len(
            subset.texts
        )
        classifier = load_active(session)
    assert classifier.version == 2
    predictions = classifier.predict(
        [
            "Translate German to English: Der Hund schläft im Garten.",
            'def add(a, b):\n    """Return the sum of a and b."""\n',
            "I was charged twice for my card payment, what should I do?",
        ]
    )
    assert [task for task, _ in predictions] == ["translation", "code", "customer_support"]
    assert all(0.0 < confidence <= 1.0 for _, confidence in predictions)


@pytest.mark.slow
@pytest.mark.parallel
def test_a_version_with_another_library_version_or_a_bad_hash_is_refused(session, subset):
    with session.begin():
        record = train_classifier(session, subset)
        record.library_versions = {**record.library_versions, "scikit-learn": "0.0.1"}
    with pytest.raises(ClassifierError, match=r"scikit-learn 0\.0\.1 \(installed .*\); run: specroute train"):
        load_version(record)
    with session.begin():
        record.library_versions = dict(
            record.library_versions, **{"scikit-learn": __import__("sklearn").__version__}
        )
        record.artifact = record.artifact[:-1] + b"x"
    with pytest.raises(ClassifierError, match="corrupted"):
        load_version(record)
    # stored by a specroute whose model class this one does not have (its artifact names another class)
    import hashlib

    with session.begin():
        stored = train_classifier(session, subset)
        name = b"SinglePrecisionLogisticRegression"
        assert stored.artifact.count(name) == 1
        stored.artifact = stored.artifact.replace(name, b"DoublePrecisionLogisticRegression")
        stored.artifact_sha256 = hashlib.sha256(stored.artifact).hexdigest()
    with pytest.raises(
        ClassifierError,
        match=r"stored by another version of specroute \(.*DoublePrecisionLogisticRegression.*\); run: specroute train",
    ):
        load_version(stored)


def test_training_data_from_the_database_dedupes_and_drops_rare_labels(session):
    lines = [
        {"prompt": "a", "task": "qa"},
        {"prompt": "b", "task": "qa"},
        {"prompt": "c", "task": "math"},
        {"prompt": "d", "task": "math"},
        {"prompt": "e", "task": "rare"},
        {"prompt": "f"},
    ]
    with session.begin():
        import_prompt_file(
            session, "one", "".join(json.dumps(line) + "\n" for line in lines).encode(), "one.jsonl"
        )
        import_prompt_file(session, "two", b'{"prompt": "a", "task": "qa"}\n', "two.jsonl")
        data = training_data_from_db(session)
        assert sorted(zip(data.texts, data.labels)) == [
            ("a", "qa"),
            ("b", "qa"),
            ("c", "math"),
            ("d", "math"),
        ]
        assert data.dropped == {"rare": 1}
        assert training_data_from_db(session, ["two"]).dropped == {"qa": 1}
        with pytest.raises(ClassifierError, match="no prompt set named nope"):
            training_data_from_db(session, ["nope"])


def test_a_training_request_is_refused_at_once_for_what_training_would_refuse(session):
    from router.classify.training_request import check_training_request, training_data

    import_prompt_file(session, "mine", b"a\nb\n", "mine.txt")
    check_training_request(session, "both", ["mine"], adapt=["mine"])  # nothing to refuse
    refusals = [
        (("bogus",), "unknown training data 'bogus'; use one of both, labels, corpus"),
        (("corpus", ["mine"]), "prompt sets were named but the training data is the bundled corpus only"),
        (("both", ["mine", "nope"]), "no prompt set named nope"),
        (("labels", None, ["gone", "mine"]), "no prompt set named gone"),
    ]
    for args, message in refusals:
        with pytest.raises(ClassifierError, match=f"^{re.escape(message)}$"):
            check_training_request(session, *args)
        with pytest.raises(ClassifierError, match=f"^{re.escape(message)}$"):  # training says the same
            training_data(session, *args[:2], **({"adapt": args[2]} if len(args) > 2 else {}))


@pytest.mark.slow
@pytest.mark.parallel
def test_a_new_runs_unlabelled_prompts_get_the_classifier_task_its_results_and_summary_carry(session, subset):
    """label_new_run gives the prompts without a label the active classifier's task when the run is created;
    each result takes it as the analysis stores it, so the one summary computed at the end groups by it."""
    from analyzer.advice.summary_store import store_summary
    from analyzer.analysis.runs import MeasuredPrompt, _store
    from router.classify.run_labelling import label_new_run

    lines = [
        {"prompt": "Translate German to English: Guten Morgen, wie geht es dir?"},
        {"prompt": "Write a haiku about autumn", "task": "creative_writing"},
    ]
    with session.begin():
        prompt_set, _ = import_prompt_file(
            session, "mixed", "".join(json.dumps(line) + "\n" for line in lines).encode(), "m.jsonl"
        )
        pair = ModelPair(
            target=ModelSpec(spec="hf:t", kind="hf", display_name="t"),
            draft=ModelSpec(spec="ngram", kind="ngram", display_name="n"),
        )
        run = AnalysisRun(prompt_set=prompt_set, pair=pair, params={"max_new_tokens": 4, "gamma_max": 2})
        session.add(run)
        session.flush()
        assert label_new_run(session, run).problem == "no task classifier is trained (run: specroute train)"
        assert run.task_labels is None
        classifier_record = train_classifier(session, subset)
        labelling = label_new_run(session, run)
        translate = next(p for p in prompt_set.prompts if not p.task)
        assert (labelling.labelled, labelling.classifier_version) == (1, classifier_record.version)
        assert run.task_labels == {
            "version": classifier_record.id,
            "tasks": {str(translate.id): "translation"},
        }
        for prompt in prompt_set.prompts:
            _store(session, run, MeasuredPrompt(
                prompt, [1, 2, 3], False, [4, 5], "ab", ["a", "b"], [0, 1], [0.5, 0.5], 0.5, None, None, 0.1, 0.0, [],
            ))  # fmt: skip
        run.status = "done"
        session.flush()
        rows = {r.prompt.text[:9]: r for r in session.scalars(select(PromptResult))}
        assert (rows["Translate"].task_type, rows["Translate"].task_source) == ("translation", "classifier")
        assert rows["Translate"].classifier_version_id == classifier_record.id
        assert (rows["Write a h"].task_type, rows["Write a h"].task_source) == ("creative_writing", "label")
        assert set(store_summary(session, run).tasks) == {"translation", "creative_writing"}


def test_train_command_on_an_imported_labeled_set(runner, tmp_path):
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    assert runner.invoke(cli, ["prompts", "import", "--sample"]).exit_code == 0
    result = runner.invoke(
        cli, ["train", "--data", "labels", "--prompts", "sample", "--json"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["version"] == 1 and len(record["labels"]) == 13 and record["training_prompt_count"] == 64
    assert record["scores"]["folds"] == 4  # the rarest task (roleplay) has 4 prompts
    missing = runner.invoke(cli, ["train", "--prompts", "nope"])
    assert missing.exit_code == 1 and "no prompt set named nope" in missing.stderr


def test_bundled_corpus_is_the_project_corpus_with_its_license_table():
    shipped = (ROOT / "router" / "data" / "corpus.jsonl").read_bytes()
    folder = ROOT.parent / "shared" / "data" / "prompts"
    dev, extra = require_shared(folder / "dev.jsonl"), require_shared(folder / "dev-extra.jsonl")
    assert shipped == dev.read_bytes() + extra.read_bytes()  # reproducible: the two files, in this order
    licenses = (ROOT / "router" / "data" / "LICENSES.md").read_text("utf-8")
    rows = [json.loads(line) for line in shipped.decode().splitlines()]
    for owner in {row["source"].split(":")[0].split("/")[0] for row in rows}:
        assert owner in licenses, owner
    for row in rows:  # share-alike rows keep their license and attribution
        assert row["license"] in licenses
    assert "share-alike" in licenses and "attribution: Han et al. 2022, FOLIO" in licenses


def test_bundled_corpus_covers_every_task_with_several_sources():
    corpus = cold_start_data()
    counts = collections.Counter(corpus.labels)
    assert len(counts) == 13 and min(counts.values()) >= 30  # dev-extra lifted the thin classes
    assert len(corpus.groups) == len(corpus.texts) == 1889
    assert len(set(corpus.groups)) == 16 and "f/awesome-chatgpt-prompts" in corpus.groups


def test_fast_scorer_equals_the_pipeline_probabilities(subset):
    from sklearn.feature_extraction.text import TfidfVectorizer

    from router.classify.fast_scorer import FastScorer, _char_wb_ngrams
    from router.classify.pipeline import build_pipeline

    pipeline = build_pipeline().fit(subset.texts, subset.labels)
    fast = FastScorer(pipeline)
    texts = subset.texts[::3] + ["", "   ", "Übersetze: «Grüße» 你好 世界 ```code```", "x" * 3000, '{"a": 1}']
    expected = pipeline.predict_proba(texts)
    got = fast.predict_proba(texts)
    assert got.shape == expected.shape and list(fast.classes_) == list(pipeline.classes_)
    assert abs(got - expected).max() < 1e-9
    assert abs(fast.predict_proba(texts) - expected).max() < 1e-9  # again, every word's n-grams cached now
    small = FastScorer(pipeline)
    small.char_tables[0].WORD_CACHE_SIZE = 5  # the cache starts over again and again
    assert small.cached_words() > 5 and abs(small.predict_proba(texts) - expected).max() < 1e-9
    char = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5)).build_analyzer()
    for text in texts:  # our char_wb n-grams are scikit-learn's multiset
        assert sorted(_char_wb_ngrams(text.lower(), 2, 5)) == sorted(char(text))
    two = build_pipeline().fit(subset.texts[:40], ["a" if i % 2 else "b" for i in range(40)])
    assert abs(FastScorer(two).predict_proba(texts) - two.predict_proba(texts)).max() < 1e-9


def test_the_model_is_solved_in_single_precision_and_predicts_in_double(subset):
    """The pipeline's logistic regression solves on a float32 copy of its features (the coefficients
    scikit-learn's own LogisticRegression finds on that copy, bit for bit) and keeps them as float64, so the
    pipeline predicts in double precision; against the double-precision solve, the same predictions."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from router.classify.pipeline import build_pipeline

    pipeline = build_pipeline().fit(subset.texts, subset.labels)
    model = pipeline.named_steps["model"]
    features = pipeline.named_steps["features"].transform(subset.texts)
    assert features.dtype == np.float64
    assert model.coef_.dtype == model.intercept_.dtype == np.float64
    assert pipeline.decision_function(subset.texts[:5]).dtype == np.float64
    params = model.get_params()
    single = LogisticRegression(**params).fit(features.astype(np.float32), subset.labels)
    assert single.coef_.dtype == np.float32  # what scikit-learn solves in, given float32
    assert np.array_equal(model.coef_, single.coef_.astype(np.float64))
    assert np.array_equal(model.intercept_, single.intercept_.astype(np.float64))
    double = LogisticRegression(**params).fit(features, subset.labels)
    assert double.coef_.dtype == np.float64 and not np.array_equal(model.coef_, double.coef_)
    assert np.abs(model.decision_function(features) - double.decision_function(features)).max() < 1e-3
    assert list(model.predict(features)) == list(double.predict(features))


def test_analyze_and_the_web_form_label_a_new_runs_prompts_with_the_classifier(runner, subset):
    """``specroute analyze`` and the web UI's form store a new run with its unlabelled prompts' tasks (the one
    code path, label_new_run), and say so; a run whose prompts all carry labels needs no classifier."""
    from analyzer.db import make_engine, make_session_factory
    from analyzer.settings import load_settings
    from webui.app import create_app

    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    url = load_settings().resolved_database_url()
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        version = train_classifier(session, subset, cross_validate=False)
        version_id, version_number = version.id, version.version
        import_prompt_file(
            session,
            "web",
            b'{"prompt": "Translate German to English: Guten Morgen, wie geht es dir?"}\n'
            b'{"prompt": "Write a haiku about autumn", "task": "creative_writing"}\n',
            "web.jsonl",
        )
        import_prompt_file(
            session, "labelled", b'{"prompt": "Write a haiku", "task": "creative_writing"}\n', "l.jsonl"
        )
    queued = [
        runner.invoke(
            cli,
            ["analyze", "--prompts", name, "--target", "hf:/nowhere/target", "--draft", "ngram", "--queue"],
        )
        for name in ("web", "labelled")
    ]
    assert [q.exit_code for q in queued] == [0, 0], queued[0].stderr
    said = f"classifier v{version_number} labelled 1 unlabelled prompt(s)"
    assert said in queued[0].stderr and "classifier" not in queued[1].stderr
    app = create_app({"database_url": url, "ui_worker": False, "models": "hf:/nowhere/target,ngram"})
    try:
        client = app.test_client()
        page = client.get("/runs/new").get_data(as_text=True)
        token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
        form = {"csrf_token": token, "prompt_set": "web", "target": "hf:/nowhere/target", "draft": "ngram"}
        posted = client.post("/runs", data=form, follow_redirects=True)
        assert posted.status_code == 200 and said in posted.get_data(as_text=True)
    finally:
        app.extensions["specroute.close"]()
    with sessions() as session:
        by_cli, labelled, by_form = session.scalars(select(AnalysisRun).order_by(AnalysisRun.id)).all()
        translate = session.scalars(select(Prompt).where(Prompt.text.startswith("Translate"))).one()
        given = {"version": version_id, "tasks": {str(translate.id): "translation"}}
        assert by_cli.task_labels == given and by_form.task_labels == given
        assert labelled.task_labels is None  # every prompt labelled: nothing for the classifier
    engine.dispose()
