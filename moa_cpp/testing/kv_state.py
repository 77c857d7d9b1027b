"""Parse llama.cpp's serialized sequence state (``llama_state_seq_get_data``) into K/V arrays.

Test oracle only: it reads what the target really cached. Format at llama.cpp 0c1e570
(src/llama-context.cpp ``state_seq_get_data``, src/llama-kv-cache.cpp ``state_write``,
``state_write_meta``, ``state_write_data``; iSWA caches write base then SWA,
src/llama-kv-cache-iswa.cpp)::

    u32 magic 0xaf143cd8, i32 seq_id
    per KV cache (1, or 2 for iSWA: base = full-attention layers, then SWA layers):
      u32 n_stream
      per stream: u32 cell_count; if cell_count > 0:
        per cell: i32 pos, u32 n_seq_id, [llama_kv_cell_ext if M-RoPE/PLE], i32 seq_id * n_seq_id
        u32 v_trans, u32 n_layer
        per layer: i32 k_type, u64 k_row_size, k rows [cell_count][n_embd_k_gqa]
        v_trans == 0: per layer: i32 v_type, u64 v_row_size, v rows [cell_count][n_embd_v_gqa]
        v_trans == 1: per layer: i32 v_type, u32 el_size, u32 n_embd_v_gqa, v [n_embd_v_gqa][cell_count]

Only F32 and F16 cache types are decoded. Cells appear in cache-slot order; ``CacheBlock``
sorts them by position.
"""
from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass, field
from typing import List

import llama_cpp
import numpy as np

IO_MAGIC = 0xAF143CD8
_DTYPES = {llama_cpp.GGML_TYPE_F32: np.float32, llama_cpp.GGML_TYPE_F16: np.float16}


@dataclass
class CacheBlock:
    """One KV cache's cells of the sequence: ``k[i]``/``v[i]`` are ``[n_cells, n_embd_gqa]``
    for the i-th layer stored in that cache (in increasing layer order), rows sorted by pos."""

    pos: np.ndarray
    v_trans: bool
    k: List[np.ndarray] = field(default_factory=list)
    v: List[np.ndarray] = field(default_factory=list)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.off = data, 0

    def take(self, fmt: str):
        vals = struct.unpack_from("<" + fmt, self.data, self.off)
        self.off += struct.calcsize("<" + fmt)
        return vals if len(vals) > 1 else vals[0]

    def array(self, type_id: int, count: int) -> np.ndarray:
        if type_id not in _DTYPES:
            raise ValueError(f"cache type {type_id} not supported by this parser (use an F32 or F16 cache)")
        dt = np.dtype(_DTYPES[type_id])
        a = np.frombuffer(self.data, dtype=dt, count=count, offset=self.off)
        self.off += count * dt.itemsize
        return a.astype(np.float32)

    @property
    def done(self) -> bool:
        return self.off >= len(self.data)


def read_seq_state(ctx: llama_cpp.llama_context_p, seq_id: int = 0) -> bytes:
    """The raw state bytes of ``seq_id``."""
    size = llama_cpp.llama_state_seq_get_size(ctx, seq_id)
    buf = (ctypes.c_uint8 * size)()
    n = llama_cpp.llama_state_seq_get_data(ctx, buf, size, seq_id)
    assert n == size, f"llama_state_seq_get_data wrote {n} of {size} bytes"
    return bytes(buf)


def parse_seq_state(data: bytes) -> List[CacheBlock]:
    """Every non-empty (cache, stream) block of a sequence state, in serialization order."""
    r = _Reader(data)
    magic, _seq = r.take("Ii")
    if magic != IO_MAGIC:
        raise ValueError(f"bad sequence-state magic {magic:#x}")
    blocks: List[CacheBlock] = []
    while not r.done:
        n_stream = r.take("I")
        for _ in range(n_stream):
            n_cells = r.take("I")
            if n_cells == 0:
                continue
            pos = np.empty(n_cells, dtype=np.int64)
            for c in range(n_cells):
                pos[c], n_seq = r.take("iI")
                r.take(f"{n_seq}i") if n_seq else None
            v_trans, n_layer = r.take("II")
            order = np.argsort(pos, kind="stable")
            blk = CacheBlock(pos=pos[order], v_trans=bool(v_trans))
            for _ in range(n_layer):
                k_type, row_size = r.take("iQ")
                width = row_size // np.dtype(_DTYPES.get(k_type, np.float32)).itemsize
                blk.k.append(r.array(k_type, n_cells * width).reshape(n_cells, width)[order])
            for _ in range(n_layer):
                if v_trans:
                    v_type, _el, width = r.take("iII")
                    blk.v.append(r.array(v_type, width * n_cells).reshape(width, n_cells).T[order])
                else:
                    v_type, row_size = r.take("iQ")
                    width = row_size // np.dtype(_DTYPES.get(v_type, np.float32)).itemsize
                    blk.v.append(r.array(v_type, n_cells * width).reshape(n_cells, width)[order])
            blocks.append(blk)
    return blocks
