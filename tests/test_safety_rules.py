"""Rules the code itself must keep (checked on the source, so a change that breaks one fails here):
no ``trust_remote_code`` anywhere but as False, nothing unpickled except the classifier artifact that
specroute wrote and hash-checked, and no ``eval``/``exec``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [
    p for folder in ("analyzer", "router", "webui", "migrations") for p in (ROOT / folder).rglob("*.py")
]


def test_sources_are_found():
    assert len(SOURCES) > 30


def test_trust_remote_code_is_never_enabled():
    for path in SOURCES:
        for match in re.finditer(r"trust_remote_code\s*=\s*(\w+)", path.read_text("utf-8")):
            assert match.group(1) == "False", f"{path}: trust_remote_code={match.group(1)}"


def test_only_the_hash_checked_classifier_artifact_is_unpickled():
    loads = [
        (path.relative_to(ROOT).as_posix(), line.strip())
        for path in SOURCES
        for line in path.read_text("utf-8").splitlines()
        if re.search(r"\bpickle\.loads?\(|\bjoblib\.load\(", line)
    ]
    assert loads == [
        (
            "router/classify/version_store.py",
            "pipeline = pickle.loads(record.artifact)  # specroute's own artifact, hash-checked above",
        )
    ]


def test_no_eval_or_exec():
    for path in SOURCES:
        text = path.read_text("utf-8")
        assert not re.search(r"(?<![\w.])(eval|exec)\(", text), path
