"""No import cycles among analyzer/, router/ and webui/, imports inside functions included.

Every ``import`` and ``from ... import`` in every module counts, wherever it stands (module level, inside
a function or a method, under ``try``), except those in the body of an ``if TYPE_CHECKING:`` block:
those never execute, so they cannot take part in a cycle at run time and are left out of the graph.

Nodes are modules; a package's ``__init__`` is the module named for the package. ``from a.b import c``
is an edge to ``a.b.c`` when that is a module, else to ``a.b`` (``c`` is read from the package).
Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``, so it adds edges to them too, except
to a package that contains the importing module: that package was imported before the importer ran,
and Python does not run it again. Relative imports are resolved against the importing module's package.
A cycle is a strongly connected component of more than one module, or a module that imports itself.
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("analyzer", "router", "webui")


@dataclass(frozen=True)
class ImportSite:
    """One place that makes module `source` import module `target`: the file and line of the statement."""

    source: str
    target: str
    path: str
    line: int


def module_name(path: Path, root: Path) -> str:
    """The dotted module name of a .py file under `root` (``a/b/__init__.py`` is ``a.b``)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in `tree` that can execute: all of them but those in the body of an
    ``if TYPE_CHECKING:`` (its ``else`` branch does run)."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return sorted(found, key=lambda node: node.lineno)


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_sites(root: Path, packages: tuple[str, ...]) -> list[ImportSite]:
    """Every runtime import between modules of `packages` (directories under `root`), one site per
    (statement, target module)."""
    paths = {module_name(path, root): path for package in packages for path in (root / package).rglob("*.py")}
    modules = set(paths)
    sites: list[ImportSite] = []
    for source, path in sorted(paths.items()):
        is_package = path.name == "__init__.py"
        own_packages = set(_ancestors(source)) | ({source} if is_package else set())
        relative_to = source if is_package else source.rpartition(".")[0]
        for node in _runtime_imports(ast.parse(path.read_text("utf-8"), filename=str(path))):
            explicit: set[str] = set()
            implied: set[str] = set()
            if isinstance(node, ast.Import):
                for alias in node.names:
                    explicit.add(alias.name)
                    implied.update(_ancestors(alias.name))
            else:
                if node.level:
                    base_parts = relative_to.split(".")[: len(relative_to.split(".")) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                implied.update(_ancestors(base))
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    if submodule in modules:
                        explicit.add(submodule)
                        implied.add(base)
                    else:
                        explicit.add(base)
            # the importer's own packages are already in sys.modules when it runs: no edge unless it reads
            # a name from one of them (an explicit edge)
            targets = explicit | (implied - own_packages)
            for target in sorted(targets & modules):
                sites.append(ImportSite(source, target, str(path.relative_to(root)), node.lineno))
    return sites


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the strongly connected components of `graph` (node -> successors;
    successors need not be keys), each sorted, in reverse topological order of the condensation."""
    nodes = sorted(set(graph) | {succ for succs in graph.values() for succ in succs})
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for start in nodes:
        if start in index:
            continue
        index[start] = lowlink[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(sorted(graph.get(start, ()))))]
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = lowlink[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.get(succ, ())))))
                    break
                if succ in on_stack:
                    lowlink[node] = min(lowlink[node], index[succ])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    lowlink[parent] = min(lowlink[parent], lowlink[node])
                if lowlink[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def _shortest_path(graph: dict[str, set[str]], start: str, goal: str, allowed: set[str]) -> list[str]:
    previous: dict[str, str] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        node = queue.popleft()
        if node == goal:
            path = [goal]
            while path[-1] != start:
                path.append(previous[path[-1]])
            return path[::-1]
        for succ in sorted(graph.get(node, ())):
            if succ in allowed and succ not in seen:
                seen.add(succ)
                previous[succ] = node
                queue.append(succ)
    raise AssertionError(f"{goal} is not reachable from {start} inside {sorted(allowed)}")


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles of `graph` as node paths whose last node is the first, covering every edge that lies on a
    cycle: each self-loop, and for each edge u -> v inside a strongly connected component of more than
    one node that no listed cycle uses yet, u -> v followed by a shortest way back from v to u; sorted."""
    cycles: list[list[str]] = []
    for component in strongly_connected_components(graph):
        members = set(component)
        if len(component) == 1:
            if component[0] in graph.get(component[0], ()):
                cycles.append([component[0], component[0]])
            continue
        covered: set[tuple[str, str]] = set()
        for node in component:
            for succ in sorted(graph.get(node, set()) & members):
                if (node, succ) in covered:
                    continue
                cycle = [node] + _shortest_path(graph, succ, node, members)
                covered.update(zip(cycle, cycle[1:], strict=False))
                cycles.append(cycle)
    return sorted(cycles)


def _describe(cycle: list[str], sites: dict[tuple[str, str], list[ImportSite]]) -> str:
    steps = []
    for source, target in zip(cycle, cycle[1:], strict=False):
        where = ", ".join(f"{site.path}:{site.line}" for site in sites[source, target])
        steps.append(f"    {source} -> {target}  ({where})")
    return " -> ".join(cycle) + "\n" + "\n".join(steps)


def test_no_import_cycles():
    sites = import_sites(ROOT, PACKAGES)
    graph: dict[str, set[str]] = {}
    by_edge: dict[tuple[str, str], list[ImportSite]] = {}
    for site in sites:
        graph.setdefault(site.source, set()).add(site.target)
        by_edge.setdefault((site.source, site.target), []).append(site)
    assert (
        len(graph) > 50 and ("analyzer.analysis.runs", "analyzer.analysis.run_records") in by_edge
    )  # the scan found imports
    cycles = find_cycles(graph)
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n".join(_describe(c, by_edge) for c in cycles)


def test_cycle_finder_on_a_synthetic_graph():
    graph = {"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": {"e"}, "e": set(), "f": {"f"}, "g": {"a"}}
    assert sorted(strongly_connected_components(graph)) == [["a", "b", "c"], ["d"], ["e"], ["f"], ["g"]]
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["f", "f"]]
    two_loops = {"x": {"y", "z"}, "y": {"x"}, "z": {"x"}}
    assert find_cycles(two_loops) == [["x", "y", "x"], ["x", "z", "x"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_import_scan_on_a_synthetic_package(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "sub/__init__.py": "from pkg import a\n",
        "sub/deep.py": "from . import sibling\nfrom ..a import VALUE\nfrom pkg.sub import NAME\n",
        "sub/sibling.py": "",
        "a.py": (
            "from typing import TYPE_CHECKING\nimport os\nif TYPE_CHECKING:\n    import pkg.b\nelse:\n"
            "    import pkg.c\n\ndef f():\n    from pkg import b\n    import pkg.sub.deep\n"
        ),
        "b.py": "from pkg.a import f\n",
        "c.py": "",
    }
    for name, text in files.items():
        (package / name).write_text(text, "utf-8")
    edges = {(s.source, s.target, s.line) for s in import_sites(tmp_path, ("pkg",))}
    assert edges == {
        ("pkg.sub", "pkg.a", 1),
        # modules taken from the own package pkg.sub: no edge to it; a name read from it (line 3): one
        ("pkg.sub.deep", "pkg.sub.sibling", 1),
        ("pkg.sub.deep", "pkg.a", 2),
        ("pkg.sub.deep", "pkg.sub", 3),
        # the else branch of TYPE_CHECKING runs; its body (pkg.b, line 4) does not
        ("pkg.a", "pkg.c", 6),
        ("pkg.a", "pkg.b", 9),
        # importing pkg.sub.deep runs pkg/sub/__init__.py too
        ("pkg.a", "pkg.sub.deep", 10),
        ("pkg.a", "pkg.sub", 10),
        ("pkg.b", "pkg.a", 1),
    }
    graph: dict[str, set[str]] = {}
    for source, target, _ in edges:
        graph.setdefault(source, set()).add(target)
    assert find_cycles(graph) == [
        ["pkg.a", "pkg.b", "pkg.a"],
        ["pkg.a", "pkg.sub", "pkg.a"],
        ["pkg.a", "pkg.sub.deep", "pkg.a"],
        ["pkg.sub.deep", "pkg.sub", "pkg.a", "pkg.sub.deep"],
    ]
