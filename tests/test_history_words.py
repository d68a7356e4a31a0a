"""The project speaks of what it does now: no line of the code, tests, docs or benchmarks dates the product by a
numbered period of work or an issue number ("fixed in session 12", "issue 33, point 2"). Every tracked text file
under analyzer/, router/, webui/, migrations/, tests/, benchmarks/ and docs/, and README.md and mkdocs.yml, is
read; CHANGELOG.md (what changed for users) and benchmarks/RESULTS.md and benchmarks/results/ (the record of
measurements) are where dates belong, and are left out."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = (
    "analyzer",
    "router",
    "webui",
    "migrations",
    "tests",
    "benchmarks",
    "docs",
    "README.md",
    "mkdocs.yml",
)
LEFT_OUT_FILES = {"CHANGELOG.md", "benchmarks/RESULTS.md", "tests/test_history_words.py"}
LEFT_OUT_FOLDERS = ("benchmarks/results/",)
HISTORY = re.compile(r"\b(session|issue)s? #?\d+|\bperiods? of work\b", re.IGNORECASE)


def history_words(text: str) -> list[tuple[int, str]]:
    """Each line of ``text`` that names a numbered period of work, an issue number or "period(s) of work": its
    line number (from 1) and the words that matched, in order."""
    return [
        (number, match.group(0))
        for number, line in enumerate(text.splitlines(), 1)
        for match in HISTORY.finditer(line)
    ]


def scanned_files() -> list[str]:
    """The tracked files the scan reads (paths relative to the repository's root, as git lists them)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", *SCANNED], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode("utf-8")
    return [
        path
        for path in listed.split("\0")
        if path and path not in LEFT_OUT_FILES and not path.startswith(LEFT_OUT_FOLDERS)
    ]


def test_history_words_finds_periods_of_work_and_issue_numbers():
    found = history_words(
        'x = 1\n# fixed in session 12\n"""Issue 33, point 2: and issues #7"""\nsessions 3 and 4\n'
        "the periods of work, a period of work\n"
    )
    assert found == [
        (2, "session 12"),
        (3, "Issue 33"),
        (3, "issues #7"),
        (4, "sessions 3"),
        (5, "periods of work"),
        (5, "period of work"),
    ]


def test_history_words_passes_what_is_not_history():
    text = (
        "a browser session 's cookie; session.begin(); sessions()\n"
        "one issue of the report; issues/12905 on GitHub; max-running-requests 4; request 12 of 20\n"
        "the work of a period; session_id 3; sessions, 3 of them\n"
    )
    assert history_words(text) == []


def scan(root: Path, paths: list[str]) -> list[str]:
    """``path:line: words`` for every history word in the text files among ``paths`` (under ``root``)."""
    found = []
    for path in paths:
        data = (root / path).read_bytes()
        if b"\0" in data:
            continue  # binary (a picture, a pickle): no words to read
        text = data.decode("utf-8", errors="replace")
        found += [f"{path}:{number}: {words}" for number, words in history_words(text)]
    return found


def test_a_file_with_history_words_fails_the_scan(tmp_path):
    (tmp_path / "module.py").write_text('"""Routes requests."""\n\n# fixed in session 12\n', encoding="utf-8")
    (tmp_path / "clean.md").write_text("The router decides per request.\n", encoding="utf-8")
    (tmp_path / "picture.png").write_bytes(b"\x89PNG\0 session 12")
    assert scan(tmp_path, ["module.py", "clean.md", "picture.png"]) == ["module.py:3: session 12"]


def test_no_tracked_file_dates_the_product_by_a_period_of_work_or_an_issue():
    files = scanned_files()
    assert "README.md" in files and "tests/conftest.py" in files and "docs/architecture.md" in files
    assert "CHANGELOG.md" not in files and "benchmarks/RESULTS.md" not in files
    found = scan(ROOT, files)
    assert not found, "history words (say what the product does now; the history is git's):\n" + "\n".join(
        found
    )
