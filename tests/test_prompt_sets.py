"""Prompt-set services on a real SQLite file: all-or-nothing imports, listing, paging, deletion."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from analyzer.orm import AnalysisRun, ModelPair, ModelSpec, Prompt, PromptSet
from analyzer.prompts.ingest import PromptFileError
from analyzer.prompts.prompt_sets import (
    PromptSetError,
    PromptSetExists,
    PromptSetInUse,
    PromptSetNotFound,
    delete_prompt_set,
    get_prompt_set,
    import_prompt_file,
    import_sample,
    list_prompt_sets,
    list_prompts,
)


def counts(session) -> tuple[int, int]:
    """Rows in prompt_sets and prompts (read in its own transaction, closed again)."""
    with session.begin():
        return (
            session.scalar(select(func.count()).select_from(PromptSet)),
            session.scalar(select(func.count()).select_from(Prompt)),
        )


def test_import_stores_every_prompt_in_file_order(session):
    data = b'{"prompt": "one", "task": "qa", "id": "a"}\n{"prompt": "two"}\n{"prompt": "one"}\n'
    with session.begin():
        prompt_set, parsed = import_prompt_file(session, "mine", data, "mine.jsonl")
    stored = session.scalars(select(Prompt).order_by(Prompt.position)).all()
    assert [(p.position, p.source_line, p.text, p.task, p.external_id) for p in stored] == [
        (0, 1, "one", "qa", "a"),
        (1, 2, "two", None, None),
    ]
    assert (prompt_set.prompt_count, prompt_set.duplicates_merged, prompt_set.file_format) == (2, 1, "jsonl")
    assert len(parsed.duplicates) == 1


def test_a_file_with_any_error_stores_nothing(session):
    with session.begin():
        import_prompt_file(session, "existing", b"keep me\n", "a.txt")
    before = counts(session)
    bad = b'{"prompt": "fine"}\n' * 100 + b'{"prompt": ""}\n'
    with pytest.raises(PromptFileError):
        with session.begin():
            import_prompt_file(session, "broken", bad, "b.jsonl")
    assert counts(session) == before


def test_duplicate_and_invalid_names_are_refused(session):
    with session.begin():
        import_prompt_file(session, "dup", b"x\n", "a.txt")
    with pytest.raises(PromptSetExists, match="already exists"):
        with session.begin():
            import_prompt_file(session, "dup", b"y\n", "b.txt")
    for bad in ["", "   ", "-leading", "a/b", "x" * 101]:
        with pytest.raises(PromptSetError):
            with session.begin():
                import_prompt_file(session, bad, b"y\n", "b.txt")
    assert counts(session) == (1, 1)


def test_listing_counts_tasks_and_paging_filters(session):
    lines = [
        {"prompt": f"Question number {i}", "task": "qa" if i % 3 else None, "id": f"q{i}"} for i in range(25)
    ]
    data = "".join(json.dumps(o) + "\n" for o in lines).encode()
    with session.begin():
        prompt_set, _ = import_prompt_file(session, "paged", data, "q.jsonl")
        import_sample(session)
    summaries = {s.name: s for s in list_prompt_sets(session)}
    assert summaries["paged"].task_counts == {"qa": 16, None: 9}
    page, total = list_prompts(session, prompt_set, offset=10, limit=5)
    assert total == 25 and [p.text for p in page] == [f"Question number {i}" for i in range(10, 15)]
    page, total = list_prompts(session, prompt_set, search="NUMBER 1")
    assert total == 11  # 1 and 10..19
    page, total = list_prompts(session, prompt_set, task="")
    assert total == 9 and all(p.task is None for p in page)
    page, total = list_prompts(session, prompt_set, search="50%_")
    assert total == 0  # LIKE wildcards in the search are literal


def test_sample_has_every_task_type_and_at_least_four_each(session):
    with session.begin():
        import_sample(session)
    summary = {s.name: s for s in list_prompt_sets(session)}["sample"]
    assert 55 <= summary.prompt_count <= 70
    assert len(summary.task_counts) == 13
    assert min(summary.task_counts.values()) >= 4


def test_delete_removes_prompts_and_is_refused_while_a_run_uses_the_set(session):
    with session.begin():
        import_prompt_file(session, "gone", b"a\nb\n", "a.txt")
        kept, _ = import_prompt_file(session, "used", b"c\n", "c.txt")
        target = ModelSpec(spec="hf:t", kind="hf", display_name="t")
        draft = ModelSpec(spec="ngram", kind="ngram", display_name="ngram")
        pair = ModelPair(target=target, draft=draft)
        session.add(AnalysisRun(prompt_set=kept, pair=pair))
    with session.begin():
        delete_prompt_set(session, "gone")
    assert counts(session) == (1, 1)
    with pytest.raises(PromptSetInUse):
        with session.begin():
            delete_prompt_set(session, "used")
    with pytest.raises(PromptSetNotFound, match="known: used"):
        get_prompt_set(session, "gone")
