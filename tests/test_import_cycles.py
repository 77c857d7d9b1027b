"""No import cycles in moa_cpp (issue 26): every import of a moa_cpp module by another -- at
module level or inside a function, relative or absolute -- is an edge, except imports under
``if TYPE_CHECKING:`` (annotations only, never executed); the graph must have no strongly
connected component of more than one module. The walk reads the source (ast): it needs no
model, no native library, and sees lazy imports that importing the package would not."""
from __future__ import annotations

import ast
from pathlib import Path

import moa_cpp

ROOT = Path(moa_cpp.__file__).resolve().parent


def _modules() -> dict:
    mods = {}
    for f in ROOT.rglob("*.py"):
        parts = ["moa_cpp", *f.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = f
    return mods


def _runtime_nodes(tree: ast.AST):
    """Every node but those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def _edges(mods: dict) -> dict:
    edges: dict = {m: set() for m in mods}
    for m, f in mods.items():
        pkg = m if f.name == "__init__.py" else m.rpartition(".")[0]
        for node in _runtime_nodes(ast.parse(f.read_text(encoding="utf-8"))):
            targets: list = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] +
                                    ([node.module] if node.module else []))
                elif (node.module or "").split(".")[0] == "moa_cpp":
                    base = node.module
                else:
                    continue
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                targets = subs if len(subs) == len(node.names) else subs + [base]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == "moa_cpp"]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m:
                    edges[m].add(t)
    return edges


def _cycles(edges: dict) -> list:
    index: dict = {}
    low: dict = {}
    stack: list = []
    on: set = set()
    out: list = []

    def visit(v):                                       # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    edges = _edges(_modules())
    assert sum(len(e) for e in edges.values()) > 100          # the walk sees the package's imports
    cycles = _cycles(edges)
    detail = [" -> ".join(c) + ": " + "; ".join(f"{m} imports {sorted(edges[m] & set(c))}" for m in c)
              for c in cycles]
    assert not cycles, "\n".join(detail)


def test_the_walk_finds_a_planted_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]
    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import moa_cpp.x\nimport moa_cpp.y\n"
    names = [a.name for n in _runtime_nodes(ast.parse(src)) if isinstance(n, ast.Import) for a in n.names]
    assert names == ["moa_cpp.y"]
