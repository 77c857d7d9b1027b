"""The C header contract: valid C, cffi-parsable, ABI version, name table agreement."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from moa_cpp.drafter import native as _native
from moa_cpp.format.names import tensor_map

REPO = Path(__file__).resolve().parents[2]


def test_header_compiles_as_c_and_links(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler is required to check moa.h")
    exe = tmp_path / "test-c"
    lib = Path(str(_native.LIBRARY_PATH))
    import llama_cpp
    llama_lib = Path(llama_cpp.__file__).parent / "lib"
    proc = subprocess.run([cc, "-std=c99", "-Wall", "-Werror", "-I", str(REPO / "native" / "include"),
                           str(REPO / "tests" / "native" / "test-c.c"), str(lib), f"-Wl,-rpath,{lib.parent}",
                           f"-Wl,-rpath,{llama_lib}", "-o", str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_abi_version_matches():
    assert _native.lib.moa_abi_version() == _native.ABI_VERSION


def test_tensor_name_tables_agree():
    lib, ffi = _native.lib, _native.ffi
    native = {ffi.string(lib.moa_gguf_tensor_name(i)).decode() for i in range(lib.moa_gguf_n_tensors())}
    assert native == set(tensor_map())
    assert len(native) == 29


def test_cpu_device_listed():
    lib, ffi = _native.lib, _native.ffi
    names = [ffi.string(lib.moa_device_name(i)).decode() for i in range(lib.moa_device_count())]
    assert any(n.upper().startswith("CPU") for n in names), names


def test_no_error_initially_and_after_bad_call():
    lib, ffi = _native.lib, _native.ffi
    assert lib.moa_state_rollback(ffi.NULL, 0) == -1
    assert "NULL" in _native.last_error()
    assert lib.moa_last_status() == -1


def _run_py(code: str, cache: Path) -> subprocess.CompletedProcess:
    import os
    import sys
    env = dict(os.environ, MOA_CPP_CACHE=str(cache))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_parsed_header_is_cached_and_a_bad_entry_is_rewritten(tmp_path):
    """The header's cffi declarations are parsed once per header text (pycparser was ~50 ms of
    every process): a second process loads the cached module without importing pycparser; the
    first prints nothing on stdout (CLI output stays clean); a corrupt entry is parsed and rewritten."""
    code = ("import sys, moa_cpp.drafter.native as n; assert n.lib.moa_abi_version() == n.ABI_VERSION; "
            "print('parsed' if 'pycparser' in sys.modules else 'cached')")
    first = _run_py(code, tmp_path)
    assert first.returncode == 0 and first.stdout == "parsed\n", first.stderr
    entries = list((tmp_path / "cffi").glob("_moa_cffi_*.py"))
    assert len(entries) == 1 and not list((tmp_path / "cffi").glob("*.tmp"))
    second = _run_py(code, tmp_path)
    assert second.returncode == 0 and second.stdout == "cached\n", second.stderr
    entries[0].write_text("this is not python (")
    third = _run_py(code, tmp_path)
    assert third.returncode == 0 and third.stdout == "parsed\n", third.stderr
    assert _run_py(code, tmp_path).stdout == "cached\n"


@pytest.mark.model
def test_drafter_acceptance_is_the_recorded_prior(tmp_path):
    """moa_model_acceptance returns moa.eval.acceptance as gguf-py reads it; None without the key."""
    import gguf
    import numpy as np

    from moa_cpp.models import registry as models
    from moa_cpp.models.defaults import DEFAULT_DRAFTER
    from moa_cpp.drafter.drafter import DrafterModel
    from moa_cpp.testing.random_drafter import make_random_drafter

    field = gguf.GGUFReader(str(DEFAULT_DRAFTER)).fields["moa.eval.acceptance"]
    recorded = [float(field.parts[i][0]) for i in field.data]
    target = models.smollm2_path()
    shipped = DrafterModel(DEFAULT_DRAFTER, target)
    assert len(recorded) >= 2 and np.allclose(shipped.acceptance(), recorded, rtol=0, atol=0)
    bare = DrafterModel(make_random_drafter(target, tmp_path / "random.gguf"), target)
    assert bare.acceptance() is None
    lib, ffi = _native.lib, _native.ffi
    assert lib.moa_model_acceptance(ffi.NULL, ffi.NULL, 0) < 0 and "NULL" in _native.last_error()
