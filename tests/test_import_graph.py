"""The import graph of workbench/: no circles, no edges back up, verl only where it belongs.

Every import statement counts, inside functions too (a lazy import is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"
# verl is imported only by the runner (inside verl's processes) and by verl_config (its config schema).
VERL_IMPORTERS = ("workbench.runner", "workbench.verl_config")
# Edges that would point back up: the runner lives inside verl and knows the store, control and the knob table,
# never the plan, the session or the supervisor above it; the engine never imports a view.
FORBIDDEN = {
    "workbench.runner": ("workbench.plan", "workbench.session", "workbench.supervisor", "workbench.cli"),
    "workbench.replay": ("workbench.supervisor", "workbench.session"),
    "workbench.advisor": ("workbench.session",),
    "workbench.advice": ("workbench.session", "workbench.advisor"),
    "workbench.memory": ("workbench.session", "workbench.advisor", "workbench.predict"),
    # The CLI is a view: it reads and controls sessions through Session, never the processes behind it.
    "workbench.cli": ("workbench.supervisor", "workbench.replay", "workbench.runner", "workbench.boundary"),
}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(workbench modules this module imports, top-level packages it imports)."""
    inside, outside = set(), set()
    base_parts = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(base_parts[: len(base_parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        for target in targets:
            if target.split(".")[0] != "workbench":
                outside.add(target.split(".")[0])
                continue
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                inside.add(target)
    return inside, outside


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    modules = _modules()
    edges, external = {}, {}
    for name, path in modules.items():
        edges[name], external[name] = _imports(name, path, modules)
    return edges, external


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read(graph):
    edges, _ = graph
    assert "workbench.session" in edges and "workbench.store" in edges["workbench.session"]
    assert "workbench.boundary" in edges["workbench.runner.trainer"]


def test_there_are_no_import_circles(graph):
    edges, _ = graph
    assert _circles(edges) == []


def test_a_circle_would_be_found():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_edge_points_back_up(graph):
    edges, _ = graph
    back = [(module, target) for module, targets in edges.items() for prefix, banned in FORBIDDEN.items()
            if module == prefix or module.startswith(prefix + ".") for target in targets
            if any(target == b or target.startswith(b + ".") for b in banned)]
    assert back == []


def test_verl_is_imported_only_by_the_runner_and_verl_config(graph):
    _, external = graph
    importers = sorted(m for m, packages in external.items() if "verl" in packages)
    assert importers, "the runner imports verl: the graph must see it"
    assert [m for m in importers if not any(m == p or m.startswith(p + ".") for p in VERL_IMPORTERS)] == []


def test_the_engine_imports_no_view(graph):
    _, external = graph
    views = [m for m, packages in external.items() if packages & {"ipywidgets", "plotly", "widgets"}]
    assert views == []


def test_every_engine_module_stays_readable():
    """Keep each module of workbench/ under 600 lines (DEVELOPERS.md), and Session a thin face (issue 18)."""
    lines = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert {name: n for name, n in lines.items() if n > 600} == {}
    assert lines["workbench.session"] <= 450
