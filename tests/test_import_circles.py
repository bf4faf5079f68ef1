"""The project's import graph: no circles, and imports inside functions only where a module
says why it defers them (something heavy: numba kernels, Kafka, Spark, aiohttp)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.layout import PACKAGES, ROOT, module_name

DEFERRED = re.compile(r"^# Deferred imports: \S", re.M)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = module_name(path)
            if all(part.isidentifier() for part in name.split(".")):
                found[name] = path
    return found


def _imports(tree: ast.Module):
    """(node, inside a function) for every import, leaving out `if TYPE_CHECKING:` blocks."""
    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", "") == "TYPE_CHECKING":
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            yield from walk(child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    yield from walk(tree, False)


def graph() -> tuple[dict[str, set[str]], dict[str, int]]:
    """Module -> project modules it imports; module -> imports it makes inside functions."""
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    deferred: dict[str, int] = {}
    for name, path in mods.items():
        for node, in_function in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif node.level or not node.module:
                continue
            else:
                sub = [f"{node.module}.{a.name}" for a in node.names]
                targets = [t for t in sub if t in mods] or [node.module]
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
            if in_function:
                deferred[name] = deferred.get(name, 0) + 1
    return edges, deferred


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_circles():
    edges, _ = graph()
    assert circles(edges) == []


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_a_package_imports_its_own_parent_package_only_through_modules():
    # an __init__ that imports its submodules and a submodule importing the package would be
    # a circle the graph sees; this checks the graph is built over packages too
    edges, _ = graph()
    assert "cep_core" in edges and "cep_service.stream" in edges


def test_imports_inside_functions_say_why():
    _, deferred = graph()
    silent = sorted(name for name in deferred
                    if not DEFERRED.search(modules()[name].read_text()))
    assert silent == [], (
        "these modules import inside functions without a '# Deferred imports: <why>' line: "
        f"{silent}")
