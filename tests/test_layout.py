"""Dependencies flow one way (analyzer <- router <- webui) and Flask stays in router/serve/api.py and webui/."""

from __future__ import annotations

import ast
import re
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


# analyzer/'s subpackages, each importing only those before it (imports inside functions included); the
# modules left at analyzer/'s top level are the vocabulary they share (docs/architecture.md)
ANALYZER_LAYERS = ("prompts", "models", "measuring", "engine", "pricing", "advice", "analysis")
# analyzer/'s top-level modules, the shared bottom, in their order: each imports only those before it and no
# subpackage (names.py imports nothing of the project)
FOUNDATIONS = (
    "__init__", "names", "errors", "progress", "checks", "json_input", "run_params", "db", "orm", "settings",
)  # fmt: skip


def _imports_of(path: Path, package: str) -> set[str]:
    """The modules of ``package`` (analyzer, router) that ``path`` imports anywhere in it, dotted (``from
    <package> import x`` included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names if alias.name.startswith(f"{package}.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == package:
                names |= {f"{package}.{alias.name}" for alias in node.names}
            elif node.module.startswith(f"{package}."):
                names.add(node.module)
    return names


def _analyzer_imports(path: Path) -> set[str]:
    return _imports_of(path, "analyzer")


def test_analyzer_is_its_documented_subpackages_and_they_import_down_the_layers():
    top = {path.stem for path in (ROOT / "analyzer").glob("*.py")}
    assert top == set(FOUNDATIONS)
    downward = []
    for position, stem in enumerate(FOUNDATIONS):
        below = {f"analyzer.{name}" for name in FOUNDATIONS[:position]}
        found = _analyzer_imports(ROOT / "analyzer" / f"{stem}.py") - below
        downward += [f"analyzer/{stem}.py imports {name}" for name in sorted(found)]
    assert downward == []  # the bottom imports nothing above it, in a subpackage or beside it
    packages = {path.parent.name for path in (ROOT / "analyzer").glob("*/__init__.py")}
    assert packages == set(ANALYZER_LAYERS) | {"sample_data"}  # sample_data: package data, no code
    assert _upward_imports("analyzer", ANALYZER_LAYERS) == []


def _upward_imports(room: str, layers: tuple[str, ...]) -> list[str]:
    """Each import of a later layer by a module of ``room``'s subpackage ``layers[i]``; asserts that
    docs/architecture.md draws every layer and names every module in it (as a word of its own)."""
    architecture = (ROOT / "docs" / "architecture.md").read_text("utf-8")
    upward = []
    for layer, package in enumerate(layers):
        assert f"  {package}/ " in architecture, f"docs/architecture.md does not draw {room}/{package}/"
        for path in sorted((ROOT / room / package).glob("*.py")):
            if path.stem != "__init__":
                named = re.search(rf"(?<![\w/]){re.escape(path.name)}", architecture)
                assert named, f"docs/architecture.md does not name {path.name}"
            for name in _imports_of(path, room):
                parts = name.split(".")
                if parts[1] in layers and layers.index(parts[1]) > layer:
                    upward.append(f"{path.relative_to(ROOT)} imports {name}")
    return upward


def test_every_module_says_what_it_is_for_in_its_first_line():
    missing = []
    for room in ("analyzer", "router", "webui"):
        for path in sorted((ROOT / room).rglob("*.py")):
            docstring = ast.get_docstring(ast.parse(path.read_text("utf-8")))
            if path.stem != "__main__" and not (docstring and docstring.split("\n")[0].strip()):
                missing.append(str(path.relative_to(ROOT)))
    assert missing == []


# router/'s subpackages, each importing only those before it (imports inside functions included); the modules
# left at router/'s top level: orm.py and strict_json.py, the bottom every subpackage may import, and client.py,
# the applications' client, which reads the API's answers into the API's own models and imports nothing else of
# the subpackages (and none imports it)
ROUTER_LAYERS = ("classify", "policies", "decide", "serve", "export")
ROUTER_BOTTOM = {"__init__", "orm", "strict_json"}
CLIENT_IMPORTS = {"router.decide.contract", "router.serve.responses"}


def test_router_is_its_documented_subpackages_and_they_import_down_the_layers():
    top = {path.stem for path in (ROOT / "router").glob("*.py")}
    assert top == ROUTER_BOTTOM | {"client"}
    packages = {path.parent.name for path in (ROOT / "router").glob("*/__init__.py")}
    assert packages == set(ROUTER_LAYERS) | {"data"}  # data: the bundled corpus, no code
    upward = [
        f"router/{stem}.py imports {name}"
        for stem in sorted(ROUTER_BOTTOM - {"__init__"})
        for name in _imports_of(ROOT / "router" / f"{stem}.py", "router")
        if name.split(".")[1] in ROUTER_LAYERS
    ]
    assert upward + _upward_imports("router", ROUTER_LAYERS) == []
    client = {
        name
        for name in _imports_of(ROOT / "router" / "client.py", "router")
        if name.split(".")[1] in ROUTER_LAYERS
    }
    assert client == CLIENT_IMPORTS  # the models of the answers, nothing that serves or decides
    importers = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "router").rglob("*.py")
        if "router.client" in _imports_of(path, "router")
    ]
    assert importers == []
