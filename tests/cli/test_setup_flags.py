"""scripts/llama_cpu_flags.sh: the llama-cpp-python build flags scripts/setup.sh adds per CPU.

On Intel CPUs with AMX the native build's AMX kernels crashed (SIGSEGV in
ggml_backend_amx_mul_mat on the first Q4_1 prompt, plain llama_cpp.Llama included): there the build
must be the native one minus AMX; everywhere else it must stay native (no flags).
"""
from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "llama_cpu_flags.sh"
XEON_SPR = ("fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma bmi2 avx2 avx_vnni avx512f avx512dq avx512cd avx512bw "
            "avx512vl avx512vbmi avx512_vnni avx512_bf16 amx_bf16 avx512_fp16 amx_tile amx_int8")
EPYC_ZEN4 = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma bmi2 avx2 avx512f avx512dq avx512cd avx512bw avx512vl"

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="x86 flags")


def _flags(tmp_path: Path, cpu_flags: str, **env: str) -> str:
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: {cpu_flags}\n")
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, check=True,
                       env={"PATH": "/usr/bin:/bin", "MOA_CPUINFO": str(info), **env})
    return r.stdout.split()


def test_amx_cpu_gets_the_native_isa_without_amx(tmp_path: Path) -> None:
    out = _flags(tmp_path, XEON_SPR)
    assert out[0] == "-DGGML_NATIVE=OFF"
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX2=ON",
            "-DGGML_AVX_VNNI=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"} <= set(out)
    assert not [f for f in out if "AMX" in f]


def test_other_cpus_keep_the_native_build(tmp_path: Path) -> None:
    assert _flags(tmp_path, EPYC_ZEN4) == []
    assert _flags(tmp_path, XEON_SPR, MOA_ALLOW_AMX="1") == []


def test_this_machines_build_has_no_amx_kernels() -> None:
    """What setup.sh installed here: no AMX kernels where the script asks for none."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info()
    if subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, check=True).stdout.strip():
        assert b"AMX_INT8 = 1" not in info, info
