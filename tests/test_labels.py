"""The user's own labels: set or corrected one prompt at a time and in bulk by filter (services and web
pages), each change one transaction, unknown task names refused; training uses them and they outrank
the bundled corpus for the same text."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from analyzer.orm import Prompt
from analyzer.prompts.prompt_sets import (
    PromptSetNotFound,
    UnknownTaskType,
    get_prompt_set,
    import_prompt_file,
    known_task_types,
    relabel_prompts,
    set_prompt_task,
)
from router.classify.training_data import ClassifierError, cold_start_data
from router.classify.training_request import training_data
from tests.test_webui import token, ui, upload, web  # noqa: F401  (fixtures)
from webui.cli import cli

LINES = [
    {"prompt": "Translate to German: good night", "task": "translation"},
    {"prompt": "Translate to French: thank you"},
    {"prompt": "My card was charged twice", "task": "general"},
    {"prompt": "My card does not work abroad", "task": "general"},
    {"prompt": "Write a haiku about rain", "task": "my_poems"},
]


def jsonl(rows) -> bytes:
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


def labels(session, name: str = "mine") -> list[str | None]:
    with session.begin():
        found = get_prompt_set(session, name)
        return list(
            session.scalars(
                select(Prompt.task).where(Prompt.prompt_set_id == found.id).order_by(Prompt.position)
            )
        )


@pytest.fixture
def mine(session):
    with session.begin():
        import_prompt_file(session, "mine", jsonl(LINES), "mine.jsonl")
    return session


def test_one_prompt_and_a_filtered_bulk_relabel(mine):
    session = mine
    with session.begin():
        assert "my_poems" in known_task_types(session) and "customer_support" in known_task_types(session)
        set_prompt_task(session, get_prompt_set(session, "mine"), 2, "translation")
    assert labels(session) == ["translation", "translation", "general", "general", "my_poems"]
    with session.begin():
        changed = relabel_prompts(
            session,
            get_prompt_set(session, "mine"),
            "customer_support",
            search="my card",
            current_task="general",
        )
    assert changed == 2
    assert labels(session) == [
        "translation",
        "translation",
        "customer_support",
        "customer_support",
        "my_poems",
    ]
    with session.begin():  # relabelling to the label they already have changes nothing
        assert (
            relabel_prompts(session, get_prompt_set(session, "mine"), "customer_support", search="card") == 0
        )
        set_prompt_task(session, get_prompt_set(session, "mine"), 5, " ")  # blank unlabels
    assert labels(session)[4] is None


def test_an_unknown_task_is_refused_and_nothing_changes(mine):
    session = mine
    with pytest.raises(UnknownTaskType, match="unknown task type 'transaltion'; use one of .*translation"):
        with session.begin():
            relabel_prompts(session, get_prompt_set(session, "mine"), "transaltion")
    assert labels(session) == ["translation", None, "general", "general", "my_poems"]
    with pytest.raises(PromptSetNotFound, match="prompt set 'mine' has no prompt #9"):
        with session.begin():
            set_prompt_task(session, get_prompt_set(session, "mine"), 9, "code")


def test_label_editing_through_the_web_pages(web):  # noqa: F811
    upload(web, jsonl(LINES), "mine.jsonl", "mine")
    page = web.get("/prompts/mine").get_data(as_text=True)
    assert 'id="bulk-label"' in page and 'id="task-2"' in page and "Apply to 5" in page
    tok = token(web, "/prompts/mine")
    one = web.post(
        "/prompts/mine/labels",
        data={"csrf_token": tok, "position": "2", "new_task": "translation"},
        follow_redirects=True,
    )
    assert one.status_code == 200 and "prompt #2 is now translation" in one.get_data(as_text=True)
    bulk = web.post(
        "/prompts/mine/labels",
        data={
            "csrf_token": tok,
            "bulk": "1",
            "q": "my card",
            "task": "general",
            "new_task": "customer_support",
        },
        follow_redirects=True,
    )
    assert "2 prompt(s) relabelled customer_support" in bulk.get_data(as_text=True)
    filtered = web.get("/prompts/mine?task=customer_support").get_data(as_text=True)
    assert "2 matching" in filtered and "customer_support 2" in filtered
    bad = web.post("/prompts/mine/labels", data={"csrf_token": tok, "bulk": "1", "new_task": "astrology"})
    assert bad.status_code == 400 and "unknown task type &#39;astrology&#39;" in bad.get_data(as_text=True)
    assert "customer_support 2" in web.get("/prompts/mine").get_data(as_text=True)  # unchanged
    assert web.post("/prompts/mine/labels", data={"csrf_token": tok, "new_task": "code"}).status_code == 400
    assert (
        web.post(
            "/prompts/nope/labels", data={"csrf_token": tok, "position": "1", "new_task": "code"}
        ).status_code
        == 404
    )
    assert (
        web.post("/prompts/mine/labels", data={"position": "1", "new_task": "code"}).status_code == 400
    )  # no CSRF


def test_training_data_your_labels_outrank_the_corpus(session):
    corpus = cold_start_data()
    text, label = corpus.texts[0], corpus.labels[0]
    other = "general" if label != "general" else "code"
    rows = [
        {"prompt": text, "task": other},
        {"prompt": "Book me a table for two tonight", "task": "customer_support"},
        {"prompt": "Reserve a room for Friday", "task": "customer_support"},
    ]
    with session.begin():
        import_prompt_file(session, "mine", jsonl(rows), "mine.jsonl")
    with session.begin():
        both = training_data(session, "both")
        own = training_data(session, "labels")
        only_corpus = training_data(session, "corpus")
    merged = dict(zip(both.texts, both.labels))
    assert merged[text] == other and len(both.texts) == len(corpus.texts) + 2
    assert "(1 relabel a corpus prompt)" in both.source
    assert both.groups[both.texts.index("Reserve a room for Friday")] == "your labels: mine"
    assert both.groups[0] == corpus.groups[0]  # a relabelled corpus prompt keeps its source
    assert own.labels == ["customer_support"] * 2 and own.dropped == {
        other: 1
    }  # alone, one label is too rare
    assert only_corpus.sha256 == corpus.sha256
    with pytest.raises(ClassifierError, match="no prompt set named nope"):
        with session.begin():
            training_data(session, "both", ["nope"])


def test_train_command_on_your_labels_only(runner, tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"prompt": f"Translate to German: sentence {i}", "task": "translation"} for i in range(4)] + [
        {"prompt": f"My order {i} did not arrive", "task": "customer_support"} for i in range(4)
    ]
    path.write_bytes(jsonl(rows))
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    assert runner.invoke(cli, ["prompts", "import", str(path), "--name", "mine"]).exit_code == 0
    result = runner.invoke(cli, ["train", "--data", "labels", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["training_prompt_count"] == 8 and record["scores"]["grouped"] is None
    assert record["scores"]["calibration"]["on"] == "stratified"
    none = runner.invoke(cli, ["train", "--data", "labels", "--prompts", "nope"])
    assert none.exit_code == 1 and "no prompt set named nope" in none.stderr


def test_train_command_reports_unseen_sources_calibration_and_reach(runner, tmp_path):
    """Two labeled prompt sets are two sources: leave-one-source-out CV runs, math (only in the
    second set) is single-source, and every task with fewer than 20 prompts is marked rarely reached."""
    first = [{"prompt": f"Translate to German: sentence {i}", "task": "translation"} for i in range(5)] + [
        {"prompt": f"My order {i} did not arrive", "task": "customer_support"} for i in range(5)
    ]
    second = (
        [{"prompt": f"Please translate into French: line {i}", "task": "translation"} for i in range(4)]
        + [{"prompt": f"The parcel {i} never came, help", "task": "customer_support"} for i in range(4)]
        + [{"prompt": f"What is {i} times {i + 2}?", "task": "math"} for i in range(4)]
    )
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    for name, rows in (("first", first), ("second", second)):
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(jsonl(rows))
        assert runner.invoke(cli, ["prompts", "import", str(path), "--name", name]).exit_code == 0
    result = runner.invoke(cli, ["train", "--data", "labels"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "leave-one-source-out (2 sources, what unseen traffic will see): macro-F1" in out
    assert "single-source, not scored there: math" in out
    assert "RARELY: only 9 training prompts (< 20)" in out and "RARELY: only 4 training prompts (< 20)" in out
    assert "calibration (leave-one-source-out folds): temperature" in out and "routing threshold" in out
