"""Measure the kit's own import graph: cycles, lazy imports, untyped records, file sizes.

Every ``import`` statement of every module under ``trtllm_kit/`` is parsed with ``ast``, wherever it sits: at
module level, inside a function, or under ``if TYPE_CHECKING:``. Only imports of the kit's own modules become
edges. Run ``python scripts/import_graph.py`` for the figures; ``tests/test_import_graph.py`` asserts on them.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "trtllm_kit"
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Edge:
    """One import of a kit module by another.

    Arguments:
        source: the importing module's dotted name.
        target: the imported module's dotted name.
        lazy: the import sits inside a function body.
        type_only: the import sits under ``if TYPE_CHECKING:``.
    """

    source: str
    target: str
    lazy: bool
    type_only: bool


@dataclass
class Graph:
    """The kit's modules, their source lengths and every edge between them."""

    lines: dict[str, int] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)
    any_dicts: int = 0


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _imported(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    """The kit modules one import statement loads (``from pkg import mod`` names the submodule)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = _resolve(module, is_package, node)
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    found = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module and name not in found:
            found.append(name)
    return found


class _Visitor(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: set[str]) -> None:
        self.module, self.is_package, self.known = module, is_package, known
        self.depth = 0
        self.type_only = 0
        self.edges: list[Edge] = []

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self.type_only += 1
            for child in node.body:
                self.visit(child)
            self.type_only -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        for target in _imported(self.module, self.is_package, node, self.known):
            self.edges.append(Edge(self.module, target, self.depth > 0, self.type_only > 0))

    visit_Import = visit_ImportFrom = _import


def build_graph(root: Path = ROOT) -> Graph:
    """Parse every module of the kit under ``root``."""
    paths = sorted((root / PACKAGE).rglob("*.py"))
    names = {module_name(path, root): path for path in paths}
    graph = Graph()
    for name, path in names.items():
        text = path.read_text()
        graph.lines[name] = len(text.splitlines())
        graph.any_dicts += text.count("dict[str, Any]")
        visitor = _Visitor(name, path.name == "__init__.py", set(names))
        visitor.visit(ast.parse(text, filename=str(path)))
        graph.edges.extend(visitor.edges)
    return graph


def subpackage(module: str) -> str:
    """The first level below the kit: ``trtllm_kit.plan`` -> ``build``, ``trtllm_kit.layout`` -> ``layout``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def strongly_connected(nodes: set[str], edges: set[tuple[str, str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one member, largest first."""
    succ: dict[str, list[str]] = {node: [] for node in nodes}
    for source, target in edges:
        if source != target:
            succ[source].append(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in succ[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
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

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return sorted(found, key=lambda c: (-len(c), c))


def module_cycles(graph: Graph) -> list[list[str]]:
    return strongly_connected(set(graph.lines), {(e.source, e.target) for e in graph.edges})


def subpackage_edges(graph: Graph) -> set[tuple[str, str]]:
    return {(subpackage(e.source), subpackage(e.target)) for e in graph.edges}


def subpackage_cycles(graph: Graph) -> list[list[str]]:
    return strongly_connected({subpackage(m) for m in graph.lines}, subpackage_edges(graph))


def mutual_pairs(graph: Graph) -> list[tuple[str, str]]:
    edges = {e for e in subpackage_edges(graph) if e[0] != e[1]}
    return sorted((a, b) for a, b in edges if (b, a) in edges and a < b)


def largest_files(graph: Graph) -> dict[str, tuple[str, int]]:
    best: dict[str, tuple[str, int]] = {}
    for module, count in graph.lines.items():
        package = subpackage(module) if module.count(".") > 1 else "(top)"
        if package not in best or count > best[package][1]:
            best[package] = (module, count)
    return dict(sorted(best.items()))


def main() -> int:
    graph = build_graph()
    kinds = Counter("type_checking" if e.type_only else "function" if e.lazy else "module" for e in graph.edges)
    print(f"modules: {len(graph.lines)}  import edges: {len(graph.edges)}")
    print(f"module-level: {kinds['module']}  function-level: {kinds['function']}", end="  ")
    print(f"TYPE_CHECKING: {kinds['type_checking']}")
    print(f"dict[str, Any]: {graph.any_dicts}")
    pairs = mutual_pairs(graph)
    print(f"subpackage pairs importing each other: {len(pairs)}")
    for a, b in pairs:
        print(f"  {a} <-> {b}")
    cycles = subpackage_cycles(graph)
    print(f"subpackage cycles (strongly connected components): {len(cycles)}")
    for component in cycles:
        print("  " + " ".join(component))
    cycles = module_cycles(graph)
    print(f"module cycles (strongly connected components): {len(cycles)}")
    for component in cycles:
        print(f"  {len(component)}: " + " ".join(m.removeprefix(PACKAGE + ".") for m in component))
    print("largest file per package:")
    for package, (module, count) in largest_files(graph).items():
        print(f"  {package}: {module.removeprefix(PACKAGE + '.')} {count}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
