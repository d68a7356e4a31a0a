"""The bundled sample is exactly what the documented selection produces from the shared corpus,
and ships with the license rows of every source it uses."""

from __future__ import annotations

import json
from collections import Counter
from importlib import resources

from tests.conftest import require_shared
from tests.sample_builder import (
    DEFAULT_CORPUS,
    REVIEWED_OUT,
    SAMPLE_DIR,
    UNFIT_WORDS,
    build_sample,
    fit_to_show,
)


def _shipped(name: str) -> str:
    return resources.files("analyzer.sample_data").joinpath(name).read_text("utf-8")


def test_sample_is_reproducible_from_the_corpus():
    require_shared(DEFAULT_CORPUS / "dev.jsonl")
    jsonl, licenses = build_sample(DEFAULT_CORPUS)
    assert _shipped("sample_prompts.jsonl") == jsonl
    assert _shipped("LICENSES.md") == licenses
    assert (SAMPLE_DIR / "sample_prompts.jsonl").read_text("utf-8") == jsonl


def test_sample_covers_every_task_and_every_source_has_a_license_row():
    rows = [json.loads(line) for line in _shipped("sample_prompts.jsonl").splitlines()]
    per_task = Counter(row["task"] for row in rows)
    assert len(per_task) == 13 and min(per_task.values()) >= 4 and 55 <= len(rows) <= 70
    licenses = _shipped("LICENSES.md")
    for row in rows:
        repo = row["source"].split(":")[0]
        owner = repo.split("/")[0]
        assert repo in licenses or f"| {owner} " in licenses, f"no license row for {repo}"
        assert row["license"].split(" ")[0] in licenses


def test_the_sample_holds_nothing_unfit_to_show_in_a_demo():
    rows = [json.loads(line) for line in _shipped("sample_prompts.jsonl").splitlines()]
    assert not {row["id"] for row in rows} & set(REVIEWED_OUT)
    assert all(fit_to_show(row) for row in rows)
    assert not fit_to_show({"id": "x", "prompt": "Write an EROTIC story"}) and "erotic" in UNFIT_WORDS
