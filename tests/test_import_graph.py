"""The import graph of the packages (rlcore, each services/<package>, each top-level services module): layers
point one way, so no two packages import each other, directly or around a loop (imports inside functions
count too)."""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _node(module: str) -> str | None:
    """The package a dotted module name belongs to: rlcore, services.<package> or services.<module>."""
    parts = module.split(".")
    if parts[0] == "rlcore":
        return "rlcore"
    if parts[0] == "services" and len(parts) > 1:
        return f"services.{parts[1]}"
    return None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in [*ROOT.glob("rlcore/**/*.py"), *ROOT.glob("services/**/*.py")]:
        here = _node(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            for t in targets:
                there = _node(t)
                if here and there and there != here:
                    graph[here].add(there)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                out.append(sorted([v, *comp]))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def test_no_two_packages_import_each_other():
    graph = _graph()
    assert "services.learner" in graph and "rlcore" in graph["services.learner"]  # the walk sees imports
    assert _cycles(graph) == []


def test_rlcore_imports_no_service():
    assert _graph()["rlcore"] == set()
