"""The import graph: layers point one way. No two packages (rlcore, each tgc_rl/<package>, each top-level
tgc_rl module) import each other, and inside a package no two modules do, directly or around a loop.
Imports inside functions count too; imports for type checking only (`if TYPE_CHECKING:`) count between
packages but not between the modules of one package (a handle may name its client's type)."""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _node(module: str) -> str | None:
    """The package a dotted module name belongs to: rlcore, tgc_rl.<package> or tgc_rl.<module>."""
    parts = module.split(".")
    if parts[0] == "rlcore":
        return "rlcore"
    if parts[0] == "tgc_rl" and len(parts) > 1:
        return f"tgc_rl.{parts[1]}"
    return None


def _sources() -> dict[str, Path]:
    """Every module of rlcore and tgc_rl by dotted name (a package by its `__init__`)."""
    out = {}
    for path in [*ROOT.glob("rlcore/**/*.py"), *ROOT.glob("tgc_rl/**/*.py")]:
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _runtime_nodes(tree: ast.AST):
    """The tree's nodes, leaving out `if TYPE_CHECKING:` blocks (imports for annotations only)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def _imports(path: Path, modules: dict[str, Path], type_checking: bool) -> set[str]:
    """The modules of `modules` that the file imports (with `type_checking`, those under `if TYPE_CHECKING:`
    too): `from a.b import c` is a.b.c when that is a module."""
    return _imports_of(ast.parse(path.read_text()), modules, type_checking)


def _imports_of(tree: ast.AST, modules: dict[str, Path], type_checking: bool = True) -> set[str]:
    out = set()
    for node in ast.walk(tree) if type_checking else _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
            out.update(subs)
            if len(subs) < len(node.names):
                out.add(node.module)
    return out & modules.keys()


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    modules = _sources()
    for name, path in modules.items():
        here = _node(name)
        for there in map(_node, _imports(path, modules, type_checking=True)):
            if here and there and there != here:
                graph[here].add(there)
    return graph


def _module_graph() -> dict[str, set[str]]:
    """Imports between modules of the same package (the package's `__init__` included)."""
    modules = _sources()
    return {
        name: {
            t for t in _imports(path, modules, type_checking=False) if t != name and _node(t) == _node(name)
        }
        for name, path in modules.items()
    }


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
    assert "tgc_rl.learner" in graph and "rlcore" in graph["tgc_rl.learner"]  # the walk sees imports
    assert _cycles(graph) == []


def test_rlcore_imports_no_service():
    assert _graph()["rlcore"] == set()


def test_no_two_modules_of_a_package_import_each_other():
    graph = _module_graph()
    assert "tgc_rl.tasks.base" in graph["tgc_rl.tasks.registry"]  # the walk sees imports
    assert "tgc_rl.rollout.vllm_engine" in graph["tgc_rl.rollout.actor"]  # inside functions too
    assert _cycles(graph) == []


def _client_modules() -> dict[str, Path]:
    """The modules the client distribution ships (clients/pyproject.toml), by dotted name."""
    import tomllib

    paths = tomllib.loads((ROOT / "clients" / "pyproject.toml").read_text())["tool"]["tgc-client"]["modules"]
    names = {v: k for k, v in _sources().items()}
    return {names[ROOT / p]: ROOT / p for p in paths}


def test_the_client_modules_import_only_each_other():
    """The client (SDK, wire layer, CLI) runs without the server and the trainer: its modules import only each
    other; the CLI's local commands import the rest inside their functions (never at module level)."""
    client, modules = _client_modules(), _sources()
    assert {"tgc_rl.sdk", "tgc_rl.wire", "tgc_rl.cli"} <= client.keys()
    outside = {}
    for name, path in client.items():
        if name == "tgc_rl.cli":
            tree = ast.parse(path.read_text())
            top = ast.Module(
                body=[n for n in tree.body if not isinstance(n, ast.FunctionDef | ast.ClassDef)],
                type_ignores=[],
            )
            found = _imports_of(top, modules)
            assert "tgc_rl.trainer.main" in _imports(path, modules, type_checking=True)  # the walk sees them
        else:
            found = _imports(path, modules, type_checking=True)
        if found - client.keys():
            outside[name] = sorted(found - client.keys())
    assert outside == {}
