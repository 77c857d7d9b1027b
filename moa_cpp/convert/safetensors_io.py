"""Minimal safetensors reader returning float32 numpy arrays (F32, F16 and BF16 inputs).

The header is parsed directly instead of using ``safetensors.numpy``, whose numpy backend
cannot represent BF16. Data are memory-mapped, so large checkpoints are not read twice.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moa_cpp.errors import FormatError

INDEX_NAME = "model.safetensors.index.json"
_NUMPY = {"F32": np.float32, "F16": np.float16, "F64": np.float64}
_SIZES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors file: where it lives and what it is."""

    name: str
    file: Path
    dtype: str              # safetensors dtype string, e.g. "BF16"
    shape: tuple[int, ...]  # PyTorch order ([out, in])
    offset: int             # absolute byte offset in ``file``
    nbytes: int


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Tensor table of one safetensors file."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError) as e:
        raise FormatError(f"{path}: not a readable safetensors file ({e})") from e
    base = 8 + n
    out: dict[str, TensorInfo] = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        out[name] = TensorInfo(name, path, e["dtype"], tuple(int(s) for s in e["shape"]),
                               base + begin, end - begin)
    return out


def list_tensors(folder: Path) -> dict[str, TensorInfo]:
    """All tensors of a checkpoint folder: sharded (index json) or every ``*.safetensors`` file."""
    index = folder / INDEX_NAME
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        files = sorted({folder / f for f in weight_map.values()})
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FormatError(f"{folder}: no *.safetensors file (only safetensors checkpoints are supported)")
    out: dict[str, TensorInfo] = {}
    for f in files:
        for name, info in read_header(f).items():
            if name in out:
                raise FormatError(f"tensor {name!r} appears in both {out[name].file.name} and {f.name}")
            out[name] = info
    return out


def load_f32(info: TensorInfo) -> np.ndarray:
    """The tensor as a float32 array in PyTorch shape (a read-only memmap for F32 input)."""
    if info.dtype not in _SIZES:
        raise FormatError(f"tensor {info.name!r}: dtype {info.dtype} not supported (F32, F16, BF16)")
    count = int(np.prod(info.shape, dtype=np.int64))
    if count * _SIZES[info.dtype] != info.nbytes:
        raise FormatError(f"tensor {info.name!r}: {info.nbytes} bytes do not match {info.dtype}{list(info.shape)}")
    if info.dtype == "BF16":
        raw = np.memmap(info.file, dtype="<u2", mode="r", offset=info.offset, shape=(count,))
        # bfloat16 is the top half of a float32: widen exactly by shifting into the high bits.
        arr = (raw.astype(np.uint32) << 16).view(np.float32)
    else:
        arr = np.memmap(info.file, dtype=np.dtype(_NUMPY[info.dtype]).newbyteorder("<"),
                        mode="r", offset=info.offset, shape=(count,))
        if info.dtype != "F32":
            arr = arr.astype(np.float32)
    return arr.reshape(info.shape)


_INTS = {"I32": np.int32, "I64": np.int64}


def load_ids(info: TensorInfo) -> np.ndarray:
    """An integer tensor (I32 / I64, e.g. a draft -> target id map) as int64."""
    if info.dtype not in _INTS:
        raise FormatError(f"tensor {info.name!r}: dtype {info.dtype}, expected I32 or I64")
    size = np.dtype(_INTS[info.dtype]).itemsize
    count = int(np.prod(info.shape, dtype=np.int64))
    if count * size != info.nbytes:
        raise FormatError(f"tensor {info.name!r}: {info.nbytes} bytes do not match {info.dtype}{list(info.shape)}")
    arr = np.memmap(info.file, dtype=np.dtype(_INTS[info.dtype]).newbyteorder("<"), mode="r",
                    offset=info.offset, shape=(count,))
    return arr.astype(np.int64).reshape(info.shape)
