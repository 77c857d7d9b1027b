"""The C header contract: valid C, cffi-parsable, ABI version, name table agreement."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from moa_cpp import _native
from moa_cpp.gguf_names import tensor_map

REPO = Path(__file__).resolve().parents[1]


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
