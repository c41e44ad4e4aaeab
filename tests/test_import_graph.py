"""No import cycles among Collector's modules, lazy and type-only imports included.

A cycle hidden in a function-level import works until someone moves the import to the top (or a
module starts to use the name at import time), and then fails with a half-initialised module.
So the graph here has an edge for every ``import`` and ``from ... import`` in a module of
``collector/``, ``flows/`` or ``blocks/``, wherever it sits (module level, function, class,
``try``), read from the source with :mod:`ast`. Imports under ``if TYPE_CHECKING:`` count too:
they never run, but a cycle through one is the same tangle (``ops/metrics`` typed its input with
``run/collection``, which imports the fetch engine, which imports ``ops/metrics``), one edit away
from a runtime cycle. ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else
to ``a.b`` (whose ``__init__`` then says what it imports). The graph must have no cycle; a
failure prints one per tangle, module by module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("collector", "flows", "blocks")


def modules() -> dict[str, Path]:
    """Every module of the packages, by dotted name (a package by its ``__init__``)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of the packages it imports (lazy and type-only imports included)."""
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                    for alias in node.names
                ]
            for target in targets:
                while target and target not in known and "." in target:
                    target = target.rpartition(".")[0]  # import a.b.c of a non-module c
                if target in known and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a list of modules, first == last) per strongly connected component of more
    than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return [_a_cycle(graph, c) for c in components]


def _a_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest cycle through the component's first module (breadth-first)."""
    first = min(component)
    paths = {first: [first]}
    queue = [first]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node] & component):
            if child == first:
                return [*paths[node], first]
            if child not in paths:
                paths[child] = [*paths[node], child]
                queue.append(child)
    raise AssertionError(f"no cycle in {component}")  # pragma: no cover - Tarjan found one


def test_the_import_graph_has_no_cycle() -> None:
    found = cycles(import_graph())
    shown = "\n".join(" -> ".join(c) for c in found)
    assert not found, f"{len(found)} import cycle(s), lazy and type-only imports included:\n{shown}"


def test_the_graph_sees_lazy_imports_and_the_cycle_finder_finds_cycles() -> None:
    graph = import_graph()
    # flows.cli.__init__ imports its commands lazily (Prefect only when a command needs it)
    assert "flows.cli.running" in graph["flows.cli"]
    assert "collector.run.summary" in graph["collector.ops.metrics"]  # under TYPE_CHECKING
    assert "flows.cli._common" in graph["flows.cli.recovery"]  # relative or not, a module
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
