"""Measures of the code's architecture, for any checkout (two checkouts compared side by side in
docs/architecture.md): engine- or cost-mode-name comparisons outside the engines' own modules (the scan
of tests/test_engine_registry.py), import cycles with imports inside functions counted (the scan of
tests/test_import_cycles.py), product functions over 60 lines, the functions that claim queued work (rows
due by a stale heartbeat, locked skipping those another worker holds), modules and lines per package, the
tables the ORM maps, and the files
mypy checks (so it lives beside them, not in benchmarks/, which measures the product). No timing.

    python -m tests.architecture_metrics [CHECKOUT]   # default: this repository
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))


from tests.test_engine_registry import ENGINE_MODULES, engine_name_comparisons  # noqa: E402
from tests.test_import_cycles import find_cycles, import_sites  # noqa: E402

PACKAGES = ("analyzer", "router", "webui")
LONG = 60


def measure(root: Path) -> dict:
    """The metrics of the checkout at ``root``."""
    comparisons, long_functions, modules, claims, line_counts, tables = {}, [], {}, [], {}, set()
    for package in PACKAGES:
        files = sorted((root / package).rglob("*.py"))
        modules[package] = len(files)
        for path in files:
            relative, source = path.relative_to(root).as_posix(), path.read_text()
            line_counts[package] = line_counts.get(package, 0) + source.count("\n")
            tables.update(re.findall(r'^\s+__tablename__ = "(\w+)"', source, re.M))
            if relative not in ENGINE_MODULES and (lines := engine_name_comparisons(source)):
                comparisons[relative] = len(lines)
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > LONG:
                        long_functions.append((length, f"{relative}:{node.name}"))
                    if _claims(ast.get_source_segment(source, node) or ""):
                        claims.append(f"{relative}:{node.name}")
    graph: dict[str, set[str]] = {}
    for site in import_sites(root, PACKAGES):
        graph.setdefault(site.source, set()).add(site.target)
    # the [tool.mypy] files list (a regex: tomllib is Python 3.11+, specroute runs on 3.10 too)
    block = re.search(r"\[tool\.mypy\].*?files = \[(.*?)\]", (root / "pyproject.toml").read_text(), re.S)
    mypy_files = [
        path
        for entry in (re.findall(r'"([^"]+)"', block.group(1)) if block else [])
        for path in ((root / entry).rglob("*.py") if (root / entry).is_dir() else [root / entry])
    ]  # a folder counts its modules
    return {
        "engine-name comparisons": sum(comparisons.values()),
        "files with them": len(comparisons),
        "import cycles": len(find_cycles(graph)),
        f"functions over {LONG} lines": len(long_functions),
        "claim implementations": sorted(claims),
        "longest": sorted(long_functions, reverse=True)[:5],
        "modules per package": modules,
        "lines per package": line_counts,
        "tables": len(tables),
        "subpackages of analyzer": sorted(p.parent.name for p in (root / "analyzer").glob("*/__init__.py")),
        "mypy files": len(mypy_files),
    }


def _claims(code: str) -> bool:
    """Whether ``code`` claims queued work: it reads rows due by a stale heartbeat, locking them and skipping
    those another worker holds."""
    return "skip_locked=True" in code and "heartbeat_at <" in code


def main() -> None:
    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else HERE
    for name, value in measure(root).items():
        print(f"{name}: {value}")


if __name__ == "__main__":
    main()
