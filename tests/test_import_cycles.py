"""No import cycles in moa_cpp (issues 26, 41): every import of a moa_cpp module by another is an
edge -- at module level or inside a function, relative or absolute (``from . import x`` included),
under ``if TYPE_CHECKING:`` too (an annotation is a dependency as well: a circle through one is
still a circle in the design, and becomes a runtime one the day the name is needed), and through
``importlib.import_module`` / ``__import__`` (a literal name; with a computed name, every string
of the module that names a moa_cpp module, such as a table of subcommand modules). The graph must
have no strongly connected component of more than one module. The walk reads the source (ast):
it needs no model, no native library, and sees lazy imports that importing the package would not."""
from __future__ import annotations

import ast
from pathlib import Path

import moa_cpp

ROOT = Path(moa_cpp.__file__).resolve().parent
_DYNAMIC = ("import_module", "__import__")       # importlib.import_module(name, package), __import__(name)


def _modules() -> dict:
    mods = {}
    for f in ROOT.rglob("*.py"):
        parts = ["moa_cpp", *f.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = f
    return mods


def _absolute(name: str, pkg: str) -> str:
    """``name`` as ``importlib.import_module(name, pkg)`` resolves it ("" if not a moa_cpp name)."""
    if name.startswith("."):
        level = len(name) - len(name.lstrip("."))
        base = pkg.split(".")[: len(pkg.split(".")) - level + 1]
        return ".".join(base + ([name[level:]] if name[level:] else []))
    return name if name.split(".")[0] == "moa_cpp" else ""


def _imports(module: str, is_package: bool, source: str, mods: dict) -> set:
    """The moa_cpp modules that ``module`` (its ``source``) imports, in any of the forms above."""
    pkg = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    out: set = set()
    for node in ast.walk(tree):
        targets: list = []
        if isinstance(node, ast.ImportFrom):
            base = ("." * node.level + (node.module or "")) if node.level else (node.module or "")
            base = _absolute(base, pkg)
            if not base:
                continue
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
            targets = subs if len(subs) == len(node.names) else subs + [base]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.split(".")[0] == "moa_cpp"]
        elif isinstance(node, ast.Call) and node.args and \
                getattr(node.func, "attr", getattr(node.func, "id", None)) in _DYNAMIC:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                targets = [_absolute(arg.value, pkg)]
            else:                                  # computed: any string here that names a module
                targets = [t for t in (_absolute(s, pkg) for s in strings) if t in mods]
        for t in targets:
            while t and t not in mods:
                t = t.rpartition(".")[0]
            if t and t != module:
                out.add(t)
    return out


def _edges(mods: dict) -> dict:
    return {m: _imports(m, f.name == "__init__.py", f.read_text(encoding="utf-8"), mods) for m, f in mods.items()}


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
    assert {"moa_cpp.cli.generate", "moa_cpp.cli.chat"} <= edges["moa_cpp.cli.main"]   # import_module tables
    cycles = _cycles(edges)
    detail = [" -> ".join(c) + ": " + "; ".join(f"{m} imports {sorted(edges[m] & set(c))}" for m in c)
              for c in cycles]
    assert not cycles, "\n".join(detail)


def test_the_walk_finds_a_planted_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]


def test_every_import_form_is_an_edge():
    mods = dict.fromkeys(["moa_cpp", "moa_cpp.p", "moa_cpp.p.m", "moa_cpp.p.a", "moa_cpp.p.b", "moa_cpp.p.c",
                          "moa_cpp.p.d", "moa_cpp.p.e", "moa_cpp.p.f", "moa_cpp.p.g", "moa_cpp.q", "moa_cpp.r"])
    src = '''
import importlib
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from .a import A                     # annotations only: still an edge
from . import b                          # a submodule by "from . import"
TABLE = [".c", "not a module"]


def f():
    import moa_cpp.p.d                   # lazy, absolute
    from ..q import x                    # lazy, relative to the parent package
    importlib.import_module(".e", __package__)
    __import__("moa_cpp.p.f")
    for name in TABLE:
        importlib.import_module(name, __package__)
'''
    got = _imports("moa_cpp.p.m", False, src, mods)
    assert got == {"moa_cpp.p.a", "moa_cpp.p.b", "moa_cpp.p.c", "moa_cpp.p.d", "moa_cpp.p.e", "moa_cpp.p.f",
                   "moa_cpp.q"}, got
