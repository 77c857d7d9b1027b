"""Thin cffi binding of ``native/include/moa.h`` (ABI mode).

The header is the single source of truth: it is read at import, stripped of preprocessor
lines and the ``MOA_API`` macro, and fed to ``ffi.cdef`` (once per header text: the parsed form is
cached, see :func:`_make_ffi`). ``llama_cpp`` is imported first so
that libmoa's ``libggml.so`` / ``libllama.so`` dependencies resolve (by SONAME) to the copies
llama-cpp-python already loaded: one ggml per process.
"""
from __future__ import annotations

import os
import re
import sys
from itertools import chain
from pathlib import Path
from typing import Iterator

import llama_cpp  # noqa: F401  (must be loaded before libmoa; see module docstring)
from cffi import FFI

from moa_cpp.errors import MoaError, error_for

ABI_VERSION = 6
LLAMA_CPP_PYTHON_VERSION = "0.3.36"

_PKG = Path(__file__).resolve().parents[1]      # moa_cpp/ (lib/ and include/ are installed there)
_REPO = _PKG.parent


def _header_path() -> Path:
    for p in chain((_PKG / "include" / "moa.h", _REPO / "native" / "include" / "moa.h"), _installed("include/moa.h")):
        if p.is_file():
            return p
    raise MoaError(f"moa.h not found next to the package ({_PKG / 'include'}) or in the source tree")


def _installed(rel: str) -> Iterator[Path]:
    """``moa_cpp/<rel>`` where the installed distribution puts it. A generator: importlib.metadata
    (~8 ms of imports, paid by every one-shot process) is imported only when a caller gets this
    far, i.e. when the cheap places before it hold nothing."""
    try:
        from importlib.metadata import distribution
        path = Path(distribution("moa_cpp").locate_file(f"moa_cpp/{rel}"))
    except Exception:  # not installed as a distribution
        return
    yield path


def _cdef_source(text: str) -> str:
    """moa.h -> what cffi's cdef accepts: no preprocessor lines, no MOA_API, no extern "C"."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    lines = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#") or s.startswith('extern "C"') or s == "}":
            continue
        lines.append(line.replace("MOA_API", ""))
    return "\n".join(lines)


def _library_candidates() -> Iterator[Path]:
    """Where libmoa may be, in order; the caller stops at the first that exists."""
    env = os.environ.get("MOA_CPP_LIB")
    if env:
        yield Path(env)
    # an editable install keeps the built library in site-packages, not next to the sources:
    # moa_cpp/lib under each import path entry, in import order, before the distribution record
    cheap = [_PKG / "lib"] + [Path(e) / "moa_cpp" / "lib" for e in sys.path if e and Path(e).resolve() != _REPO]
    for d in chain(cheap, _installed("lib")):
        yield from (d / n for n in ("libmoa.so", "libmoa.dylib", "moa.dll"))


def _make_ffi():
    """The FFI of moa.h. Parsing the header (pycparser) cost every process ~50 ms, a tenth of a
    one-shot ``moa-cpp generate``'s overhead over llama-cpp-python; so the parsed declarations are
    kept as cffi's out-of-line ABI module in the cache directory, keyed by the header's text and
    the cffi version, and parsed again only when either changes (or the cache cannot be written)."""
    import hashlib

    import cffi

    from moa_cpp.models.registry import cache_dir

    src = _cdef_source(_header_path().read_text())
    name = "_moa_cffi_" + hashlib.sha256(f"{cffi.__version__}\n{src}".encode()).hexdigest()[:16]
    path = None
    try:
        path = cache_dir() / "cffi" / f"{name}.py"
        if path.is_file():
            namespace: dict = {}
            exec(compile(path.read_text(), str(path), "exec"), namespace)
            return namespace["ffi"]
    except Exception:  # no cache directory, or an unreadable / corrupt entry: parse (and rewrite it)
        pass
    builder = FFI()
    builder.cdef(src)
    if path is not None:
        try:
            from cffi.recompiler import make_py_source   # emit_python_code would print to stdout

            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{name}.{os.getpid()}.tmp")
            make_py_source(builder, name, str(tmp))
            os.replace(tmp, path)            # atomic: concurrent processes never read half a file
        except OSError:                      # read-only cache: parse every time
            pass
    return builder


ffi = _make_ffi()


def _load():
    if llama_cpp.__version__ != LLAMA_CPP_PYTHON_VERSION:
        raise MoaError(f"moa_cpp needs llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}, found {llama_cpp.__version__}")
    tried = []
    for cand in _library_candidates():
        if cand.is_file():
            lib = ffi.dlopen(str(cand))
            if lib.moa_abi_version() != ABI_VERSION:
                raise MoaError(f"{cand}: native ABI {lib.moa_abi_version()} != {ABI_VERSION}; rebuild the native library "
                               "(pip install --force-reinstall --no-deps .)")
            return lib, cand
        tried.append(str(cand))
    raise MoaError("native library libmoa not found; tried: " + ", ".join(tried) +
                   " (set MOA_CPP_LIB or reinstall moa_cpp)")


lib, LIBRARY_PATH = _load()


def last_error() -> str:
    return ffi.string(lib.moa_last_error()).decode("utf-8", "replace")


def check(status: int) -> int:
    """Raise the MoaError subclass for a negative status; return it otherwise."""
    if status < 0:
        raise error_for(status, last_error() or f"native call failed with status {status}")
    return status


def check_ptr(ptr, what: str):
    """Raise for a NULL returned by a native constructor, with its status and message."""
    if ptr == ffi.NULL:
        code = lib.moa_last_status()
        raise error_for(code if code < 0 else -7, f"{what}: {last_error() or 'failed'}")
    return ptr
