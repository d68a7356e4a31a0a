"""The bundled sample is exactly what the documented selection produces from the shared corpus,
and ships with the license rows of every source it uses."""

from __future__ import annotations

import json
from collections import Counter
from importlib import resources

import pytest

from tests.sample_builder import DEFAULT_CORPUS, SAMPLE_DIR, build_sample


def _shipped(name: str) -> str:
    return resources.files("analyzer.sample_data").joinpath(name).read_text("utf-8")


def test_sample_is_reproducible_from_the_corpus():
    if not (DEFAULT_CORPUS / "dev.jsonl").exists():
        pytest.fail(f"the shared corpus is missing at {DEFAULT_CORPUS}")
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
