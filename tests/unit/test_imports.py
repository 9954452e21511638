"""The package's import graph has no cycles, and the PostgreSQL adapter's rooms depend on
each other in one direction only.

The graph is read from the source with ``ast``, not by importing: every
``import context_search...`` and ``from context_search... import`` (relative ones resolved)
is an edge, including imports inside functions, because a deferred import is still a
dependency at run time and deferring one is how a cycle hides. Imports under
``if TYPE_CHECKING:`` are left out: they never run. ``from package import name`` counts as
an edge to the submodule ``package.name`` when that is a module, else to the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import context_search

ROOT = Path(context_search.__file__).parent
PACKAGE = "context_search"
POSTGRES = "context_search.postgres"

#: The rooms of ``context_search.postgres`` and the rooms each may import. A room not named
#: on the right of another may not be imported by it; ``settings`` (names and settings
#: classes) and ``models`` are shared by all.
ALLOWED = {
    "engine": set(),
    "indexes": {"engine"},
    "read": {"engine"},
    "write": {"engine", "indexes", "read"},
    "replicas": {"engine", "read"},
    "operations": {"engine", "indexes", "write"},
    "connector": {"engine", "indexes", "read", "write", "replicas", "operations"},
    "aio": {"engine", "indexes", "read", "write", "replicas", "operations", "connector"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in ROOT.rglob("*.py")}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name.startswith(PACKAGE)}
    base = node.module or ""
    if node.level:
        package = module.split(".")
        if MODULES[module].name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    if not base.startswith(PACKAGE):
        return set()
    return {
        f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
        for alias in node.names
    }


def _imports(module: str) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.update(_targets(module, child))
            visit(child)

    visit(ast.parse(MODULES[module].read_text(encoding="utf-8")))
    return {target for target in found if target != module}


GRAPH = {module: _imports(module) for module in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in graph:
                    continue
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _room(module: str) -> str | None:
    if not module.startswith(POSTGRES + "."):
        return None
    return module.split(".")[2]


def test_the_graph_was_read() -> None:
    assert len(GRAPH) > 50
    # an absolute import, and one of a submodule named in ``from package import module``
    assert (
        "context_search.postgres.read.session" in GRAPH["context_search.postgres.replicas.routed"]
    )
    assert "context_search.postgres.indexes.builds" in GRAPH["context_search.postgres.write.writes"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    assert _cycles(GRAPH) == []


def test_postgres_rooms_import_in_one_direction() -> None:
    rooms = {_room(module) for module in GRAPH if module.startswith(POSTGRES + ".")}
    assert set(ALLOWED) <= rooms  # every room exists as a sub-package
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if (room := _room(module)) in ALLOWED
        for target in targets
        if (other := _room(target)) in ALLOWED and other != room and other not in ALLOWED[room]
    )
    assert wrong == []
