"""Why a file is not a whole GGUF model, in words: :func:`gguf_problem`.

gguf-py and llama.cpp refuse a bad file with what broke inside them (numpy's "index 0 is out of
bounds", "cannot mmap an empty file", or llama.cpp's "could not load"), not with what is wrong
with the file. This module walks the file's layout with :mod:`struct` alone -- header, metadata,
tensor index, then the tensor data's extent against the file's size -- and says where it breaks.
The loaders call it only after a load failed, so a good file costs nothing extra.

Example::

    from moa_cpp.format.check import gguf_problem
    gguf_problem("notes.txt")    # "not a GGUF file: it starts with b'hell' (a GGUF file with b'GGUF')"
"""
from __future__ import annotations

import mmap
import os
import struct
from typing import Optional, Union

__all__ = ["gguf_problem"]

MAGIC = b"GGUF"
VERSIONS = (2, 3)                 # what gguf-py and llama.cpp read
HEADER = 24                       # magic, version (u32), tensor count (u64), metadata key count (u64)
ALIGNMENT = 32                    # of the tensor data, unless general.alignment says otherwise
MAX_DIMS = 4                      # GGML_MAX_DIMS
# GGUF metadata value types -> struct format of one value (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class _Short(Exception):
    """The file ends inside the part being read."""


class _Corrupt(Exception):
    """A value no GGUF writer produces (unknown type, too many dimensions)."""


class _Walk:
    """A bounded reader over the file's bytes (``end``: the byte order's struct prefix)."""

    def __init__(self, buf, end: str) -> None:
        self.buf, self.end, self.pos = buf, end, HEADER

    def take(self, fmt: str):
        size = struct.calcsize(self.end + fmt)
        if self.pos + size > len(self.buf):
            raise _Short
        (v,) = struct.unpack_from(self.end + fmt, self.buf, self.pos)
        self.pos += size
        return v

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise _Short
        self.pos += n

    def string(self) -> bytes:
        n = self.take("Q")
        start = self.pos
        self.skip(n)
        return bytes(self.buf[start:self.pos])

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise _Corrupt(f"unknown value type {vtype}")
        etype, count = self.take("I"), self.take("Q")
        if etype in _SCALARS:                     # fixed size: skipped whole
            self.skip(count * struct.calcsize(_SCALARS[etype]))
        else:
            for _ in range(count):
                self.value(etype)
        return None


def gguf_problem(path: Union[str, os.PathLike]) -> Optional[str]:
    """What keeps ``path`` from being a whole GGUF file (a few words, no file name), or None when
    its header, metadata and tensor index parse and its tensor data fits in the file (then a
    loader's complaint is about something else: the architecture, a missing key, ...)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return "empty file (0 bytes), not a GGUF model"
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _problem(buf, size)
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"


def _problem(buf, size: int) -> Optional[str]:
    head = bytes(buf[:4])
    if head != MAGIC[:len(head)]:
        return f"not a GGUF file: it starts with {head!r} (a GGUF file with {MAGIC!r})"
    if size < HEADER:
        return f"truncated GGUF file: {size} bytes, shorter than the {HEADER}-byte GGUF header"
    end = "<"
    version = struct.unpack_from("<I", buf, 4)[0]
    if version not in VERSIONS and struct.unpack_from(">I", buf, 4)[0] in VERSIONS:
        end, version = ">", struct.unpack_from(">I", buf, 4)[0]      # a big-endian GGUF
    if version not in VERSIONS:
        return f"GGUF version {version} is not supported (this build reads versions 2 and 3)"
    n_tensors, n_kv = struct.unpack_from(end + "QQ", buf, 8)
    w = _Walk(buf, end)
    alignment = ALIGNMENT
    part = "metadata"
    i = n = 0
    try:
        n = n_kv
        for i in range(n_kv):
            key = w.string()
            v = w.value(w.take("I"))
            if key == b"general.alignment" and isinstance(v, int) and v > 0:
                alignment = v
        part, n = "tensor index", n_tensors
        tensors = []
        for i in range(n_tensors):
            w.string()
            n_dims = w.take("I")
            if n_dims > MAX_DIMS:
                raise _Corrupt(f"{n_dims} dimensions")
            dims = [w.take("Q") for _ in range(n_dims)]
            tensors.append((dims, w.take("I"), w.take("Q")))
    except _Short:
        return (f"truncated or corrupt GGUF file: its {part} ({'key' if part == 'metadata' else 'tensor'} "
                f"{i + 1} of {n}) runs past the end of the file ({size} bytes)")
    except _Corrupt as e:
        return f"corrupt GGUF file: {part} entry {i + 1} of {n} has {e}"
    data = -(-w.pos // alignment) * alignment
    need = _data_end(tensors, data)
    if isinstance(need, str):
        return need
    if need > size:
        return f"truncated GGUF file: {size} bytes, its tensor data needs {need}"
    return None


def _data_end(tensors: list, data: int):
    """The byte after the last tensor's data, or a problem (an unknown tensor type)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    end = data
    for i, (dims, ttype, offset) in enumerate(tensors):
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (ValueError, KeyError):
            return f"corrupt GGUF file: tensor {i + 1} of {len(tensors)} has unknown type {ttype}"
        n = 1
        for d in dims:
            n *= d
        end = max(end, data + offset + n // block * type_size)
    return end
