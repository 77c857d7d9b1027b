"""bench/ is a package of a few entry points over one library: every command in the entry points'
tables imports and answers ``--help``, and neither bench/ nor tests/ reach into the other (or
anywhere) by editing ``sys.path``."""
from __future__ import annotations

import ast
import importlib
import io
import pkgutil
from contextlib import redirect_stdout
from pathlib import Path

import pytest

import bench
from bench import common

REPO = Path(__file__).resolve().parents[1]
ENTRIES = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.ispkg)


def _tables() -> list:
    out = []
    for e in ENTRIES:
        main = REPO / "bench" / e / "__main__.py"
        if main.is_file() and "COMMANDS" in main.read_text():
            table = importlib.import_module(f"bench.{e}.__main__").COMMANDS
            out += [(e, name, mod) for name, (mod, _) in table.items()]
    return out


def test_a_handful_of_entry_points():
    assert {"eval", "costs", "process", "serve", "peers", "remote", "gpu"} <= set(ENTRIES), ENTRIES
    assert len(ENTRIES) <= 8


@pytest.mark.parametrize("entry,name,module", _tables())
def test_every_command_answers_help(entry, name, module, monkeypatch):
    """The dispatcher finds the module and its ``main()`` parses ``--help`` (argparse exits 0)."""
    buf = io.StringIO()
    with redirect_stdout(buf), pytest.raises(SystemExit) as e:
        common.dispatch(entry, {name: (module, "")}, "doc", [name, "--help"])
    assert e.value.code == 0
    assert f"python -m bench.{entry} {name}" in buf.getvalue()     # argparse's prog: the command to type


def test_an_unknown_command_is_refused_with_the_list(capsys):
    table = importlib.import_module("bench.costs.__main__").COMMANDS
    assert common.dispatch("costs", table, "what each piece costs", ["no-such"]) == 2
    out = capsys.readouterr()
    assert "unknown command 'no-such'" in out.err and "loop" in out.out


def _sys_path_edits(path: Path, root: Path = REPO) -> list:
    tree = ast.parse(path.read_text(), str(path))
    hits = []
    for node in ast.walk(tree):
        f = node.func if isinstance(node, ast.Call) else None
        if (isinstance(f, ast.Attribute) and f.attr in ("insert", "append", "extend")
                and isinstance(f.value, ast.Attribute) and f.value.attr == "path"
                and isinstance(f.value.value, ast.Name) and f.value.value.id == "sys"):
            hits.append(f"{path.relative_to(root)}:{node.lineno}")
    return hits


def test_no_sys_path_edits_in_bench_or_tests():
    files = sorted((REPO / "bench").rglob("*.py")) + sorted((REPO / "tests").rglob("*.py"))
    files = [f for f in files if "results" not in f.parts]
    assert len(files) > 50
    hits = [h for f in files for h in _sys_path_edits(f)]
    assert not hits, f"sys.path edited (import by package instead): {hits}"


def test_the_check_sees_a_sys_path_edit(tmp_path):
    """The AST walk is not blind."""
    f = tmp_path / "probe.py"
    f.write_text("import sys\nimport os\nsys.path.insert(0, 'bench')\nos.path.join('a')\n")
    assert _sys_path_edits(f, tmp_path) == ["probe.py:3"]
