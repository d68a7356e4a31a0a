"""Dependencies flow one way (analyzer <- router <- webui) and Flask stays in router/api.py and webui/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"analyzer": {"router", "webui", "flask", "migrations"}, "router": {"webui", "migrations"}}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_rooms_do_not_import_from_rooms_above(room):
    for path in (ROOT / room).rglob("*.py"):
        bad = _imports(path) & FORBIDDEN[room]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_flask_only_in_router_api_and_webui():
    for path in (ROOT / "router").rglob("*.py"):
        if path.name != "api.py":
            assert "flask" not in _imports(path), f"{path.relative_to(ROOT)} imports flask"


def test_benchmarks_do_not_import_the_tests():
    # a benchmark measures the product: what it sets up comes from the product or benchmarks/, not the tests
    benchmark_files = sorted((ROOT / "benchmarks").rglob("*.py"))
    assert benchmark_files
    for path in benchmark_files:
        assert "tests" not in _imports(path), f"{path.relative_to(ROOT)} imports the tests package"
