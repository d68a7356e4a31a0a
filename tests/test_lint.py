"""The linters CI runs after the tests, run by the quick tier too: a change that ruff would refuse fails
`pytest -m "not slow"` in seconds instead of failing CI after the whole suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ["analyzer", "router", "webui", "migrations", "tests", "benchmarks"]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff_accepts_every_folder_ci_checks(command):
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *command, *FOLDERS], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
