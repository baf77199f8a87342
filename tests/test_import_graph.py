"""The house's arrows run one way: no import cycle inside `tracker/`, between modules or between
the top-level parts (tracker.model, tracker.backends, tracker.bench, tracker.cli, ...).

Every `import` and `from ... import` counts, also those inside functions (a lazy import is still
an arrow) and relative ones; a package's `__init__` is a module of its own. Only
`importlib.import_module` strings are not followed: the backend registry names its backends that
way on purpose, so that no runtime is imported before it is asked for.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tracker"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the tracker modules it imports (the longest existing prefix of each target)."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in paths}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in paths:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def part(module: str) -> str:
    """The top-level part a module belongs to: tracker.backends.onnxrt -> tracker.backends."""
    return ".".join(module.split(".")[:2])


def test_no_import_cycle_between_modules():
    graph = import_graph()
    assert len(graph) > 80 and "tracker.pipeline" in graph["tracker.cli"]  # the walk sees the house
    assert cycles(graph) == []


def test_no_import_cycle_between_the_parts():
    parts: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        for target in targets:
            if part(target) != part(module):
                parts.setdefault(part(module), set()).add(part(target))
    assert cycles(parts) == []


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
