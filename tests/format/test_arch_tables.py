"""Every layer of the stack knows the same target architectures, from one table per layer.

The Python table is ``moa_cpp/format/arch.py`` (TARGET_ARCHS), the C++ one ``native/src/moa-target-arch.cpp``
(read through ``moa_target_arch_count / _name / _flags``). Layers that support only some
architectures say so by a flag of the table, never by a list of their own:

- TLI N > 0 (native loader): ``tli`` -- llama only (a plain llama block, docs/drafter.md#tli);
- the K/V capture: ``capture`` -- verified on llama, qwen2, gemma3 (the tests' targets);
- the trainer's torch target: ``torch_target`` -- llama, qwen2;
- the converter's training snapshots (Format B): ``snapshot_model_type`` -- llama, qwen2;
- Q/K row un-permutation (converter log, torch target, native TLI): ``qk_permuted`` (NORM rope);
- the layer-0 embedding scale (runtime, converter, trainer, native loader): ``sqrt_embd_scale``.
"""
from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest

from moa_cpp.drafter import native as _native
from moa_cpp.format import arch
from moa_cpp.convert import layouts, target_gguf

REPO = Path(__file__).resolve().parents[2]

_FLAGS = {  # Python field -> moa.h enum moa_target_arch_flag
    "qk_permuted": "MOA_TARGET_ARCH_QK_PERMUTED",
    "sqrt_embd_scale": "MOA_TARGET_ARCH_EMBD_SCALE_SQRT",
    "tli": "MOA_TARGET_ARCH_TLI",
    "capture": "MOA_TARGET_ARCH_CAPTURE",
}


def _native_table() -> dict[str, int]:
    lib, ffi = _native.lib, _native.ffi
    return {ffi.string(lib.moa_target_arch_name(i)).decode(): lib.moa_target_arch_flags(i)
            for i in range(lib.moa_target_arch_count())}


def test_native_and_python_tables_know_the_same_architectures():
    native = _native_table()
    assert list(native) == [a.name for a in arch.TARGET_ARCHS]  # same rows, same order
    assert len(set(native)) == len(native)
    lib = _native.lib
    for a in arch.TARGET_ARCHS:
        for field, enum in _FLAGS.items():
            assert bool(native[a.name] & getattr(lib, enum)) == getattr(a, field), (a.name, field)


def test_native_table_out_of_range():
    lib, ffi = _native.lib, _native.ffi
    n = lib.moa_target_arch_count()
    assert ffi.string(lib.moa_target_arch_name(n)) == b"" and lib.moa_target_arch_flags(n) == -1
    assert ffi.string(lib.moa_target_arch_name(-1)) == b"" and lib.moa_target_arch_flags(-1) == -1


def test_declared_subsets():
    """The subsets each layer supports, as the table declares them (module docstring)."""
    assert arch.names_where("tli") == ("llama",)
    assert {"llama", "qwen2", "gemma3", "qwen3", "gpt-oss", "lfm2"} <= set(arch.names_where("capture"))
    assert arch.names_where("torch_target") == ("llama", "qwen2")
    assert layouts.SNAPSHOT_MODEL_TYPES == ("llama", "qwen2")
    assert target_gguf.NORM_ROPE_ARCHS == ("llama", "mistral3", "granite", "deci", "olmo", "granitemoe", "smollm3",
                                           "arcee")
    assert all(a.name.startswith("gemma") == a.sqrt_embd_scale for a in arch.TARGET_ARCHS)
    assert all((a.builtin_chat_template == "gemma") == a.name.startswith("gemma") for a in arch.TARGET_ARCHS)


def test_converter_reads_the_table():
    assert target_gguf.NORM_ROPE_ARCHS == arch.names_where("qk_permuted")
    assert layouts.SNAPSHOT_MODEL_TYPES == tuple(a.snapshot_model_type for a in arch.TARGET_ARCHS
                                                 if a.snapshot_model_type)
    for mt in layouts.SNAPSHOT_MODEL_TYPES:
        assert arch.by_snapshot_model_type(mt).name == mt  # HF model_type == GGUF name for these
    assert arch.by_snapshot_model_type("gpt2") is None


def test_embedding_scale_rule():
    for a in arch.TARGET_ARCHS:
        assert arch.embedding_scale(a.name, 640) == (math.sqrt(640) if a.sqrt_embd_scale else 1.0)
    assert arch.embedding_scale("phi3", 640) == 1.0


def test_unknown_architecture_gets_the_defaults():
    assert not arch.known("mpt") and "mpt" not in _native_table()
    row = arch.lookup("mpt")
    assert row.name == "mpt" and not (row.qk_permuted or row.sqrt_embd_scale or row.tli or row.capture
                                        or row.torch_target or row.snapshot_model_type)


def _tiny_gguf(path: Path, arch_name: str) -> Path:
    import gguf
    w = gguf.GGUFWriter(str(path), arch_name)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("name", [a.name for a in arch.TARGET_ARCHS] + ["phi3"])
def test_torch_target_supports_the_table_subset(tmp_path, name):
    """TorchTarget refuses exactly the architectures the table does not mark torch_target."""
    from moa_cpp.train.target_torch import TorchTarget
    path = _tiny_gguf(tmp_path / "t.gguf", name)
    if arch.lookup(name).torch_target:
        with pytest.raises(Exception) as e:  # past the arch check: this file has no sizes
            TorchTarget.from_gguf(path)
        assert not isinstance(e.value, NotImplementedError)
    else:
        with pytest.raises(NotImplementedError, match=f"supports llama / qwen2 GGUFs only, not '{name}'"):
            TorchTarget.from_gguf(path)


_NAMES = {a.name for a in arch.TARGET_ARCHS}


def _python_literals(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in _NAMES}


@pytest.mark.parametrize("rel", ["moa_cpp/convert/__init__.py", "moa_cpp/convert/layouts.py",
                                 "moa_cpp/convert/target_gguf.py", "moa_cpp/train/target_torch.py",
                                 "moa_cpp/chat_template.py", "moa_cpp/target/target.py"])
def test_python_layers_name_no_architecture(rel):
    """The layers read the table: no architecture name as a string of their own."""
    assert _python_literals(REPO / rel) == set()


@pytest.mark.parametrize("rel", ["native/src/moa-model.cpp", "native/src/moa-capture.cpp",
                                 "native/src/moa-state.cpp", "native/src/moa.cpp"])
def test_native_layers_name_no_architecture(rel):
    text = (REPO / rel).read_text()
    code = re.sub(r"//[^\n]*", "", text)  # comments may name architectures
    found = {m for m in re.findall(r'"([A-Za-z0-9_-]+)"', code) if m in _NAMES}
    assert found == set()


def test_readme_table_is_generated():
    """README.md's architecture table is scripts/readme_archs.py's output for the current tables
    (after a table change: python scripts/readme_archs.py --write)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "readme_archs.py"
    spec = importlib.util.spec_from_file_location("readme_archs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.current(), "README.md lost its generated architecture block"
    assert mod.current() == mod.render(), "README.md's architecture table is stale: python scripts/readme_archs.py --write"
