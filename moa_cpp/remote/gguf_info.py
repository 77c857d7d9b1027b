"""What the client bundle needs to know of a GGUF file, read with gguf-py's ``GGUFReader``:
its scalar and string metadata, its tensors (shape, type, where their bytes are), where the
metadata ends and where the tensor data begins. Cached per (file, size, mtime) for the process:
the reader walks every token string of a vocabulary (seconds for a 262K one), and one bundle
build or server start asks about the same target several times."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from moa_cpp.errors import FormatError, MoaIOError

_CACHE: dict = {}
_CACHE_MAX = 8


@dataclass(frozen=True)
class GGUFInfo:
    version: int
    n_kv: int
    kv_end: int                      # first byte after the metadata (= first tensor info)
    data_offset: int                 # first byte of the tensor data section
    alignment: int
    kv: dict                         # scalar and string values only (arrays left out)
    tensors: dict                    # name -> (ne tuple, ggml type, offset in the data section)


def file_key(p: Path) -> tuple:
    """(resolved path, size, mtime): the key of this process's per-file caches (a file rewritten
    in place gets a new key); MoaIOError if it cannot be read."""
    try:
        st = p.stat()
    except OSError as e:
        raise MoaIOError(f"'{p}': {e.strerror or e}") from None
    return (str(p.resolve()), st.st_size, st.st_mtime_ns)


def gguf_info(path: Union[str, os.PathLike]) -> GGUFInfo:
    """The :class:`GGUFInfo` of ``path``; FormatError if it is not a readable GGUF file."""
    p = Path(path)
    key = file_key(p)
    if key not in _CACHE:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = _read(p)
    return _CACHE[key]


def _read(p: Path) -> GGUFInfo:
    import gguf
    V = gguf.GGUFValueType
    try:
        with open(p, "rb") as f:
            if f.read(4) != b"GGUF":
                raise FormatError(f"'{p}' is not a GGUF file")
        r = gguf.GGUFReader(p, "r")
        kv, kv_end = {}, 0
        for fld in r.fields.values():
            kv_end = max(kv_end, fld.offset + sum(int(part.nbytes) for part in fld.parts))
            if fld.name.startswith("GGUF.") or not fld.types or fld.types[0] == V.ARRAY:
                continue
            if fld.types[0] == V.STRING:
                kv[fld.name] = bytes(fld.parts[-1]).decode("utf-8", "replace")
            else:
                kv[fld.name] = fld.parts[-1].tolist()[0]
        tensors = {t.name: (tuple(int(x) for x in t.shape), int(t.tensor_type), t.data_offset - r.data_offset)
                   for t in r.tensors}
        head = r.fields
        info = GGUFInfo(int(head["GGUF.version"].parts[0][0]), int(head["GGUF.kv_count"].parts[0][0]), kv_end,
                        int(r.data_offset), int(r.alignment), kv, tensors)
    except FormatError:
        raise
    except (OSError, ValueError, KeyError, IndexError, MemoryError, OverflowError) as e:
        raise FormatError(f"'{p}' is not a readable GGUF file ({type(e).__name__}: {e})") from None
    return info


def tensor_rows(path: Union[str, os.PathLike], info: GGUFInfo, name: str):
    """A tensor's data as a read-only uint8 memmap [rows, row bytes] and its ggml type."""
    import gguf
    import numpy as np
    ne, ttype, off = info.tensors[name]
    qtype = gguf.GGMLQuantizationType(ttype)
    block, tsize = gguf.GGML_QUANT_SIZES[qtype]
    rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
    return np.memmap(path, np.uint8, "r", offset=info.data_offset + off, shape=(rows, ne[0] // block * tsize)), qtype
