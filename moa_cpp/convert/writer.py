"""GGUF output: typed ``moa.*`` metadata helpers and per-tensor type selection / quantization."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from moa_cpp.errors import FormatError, InvalidArgumentError
from moa_cpp.format.names import ARCH, Keys

log = logging.getLogger(__name__)

Q = gguf.GGMLQuantizationType
OUTTYPES: dict[str, tuple[Q, gguf.LlamaFileType]] = {
    "f32": (Q.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (Q.F16, gguf.LlamaFileType.MOSTLY_F16),
    "q8_0": (Q.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (Q.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
}
F16_MAX = float(np.finfo(np.float16).max)

# Value types of the moa.* keys; every key not listed is u32.
_F32_KEYS = {Keys.RMS_EPS, Keys.ROPE_FREQ_BASE, Keys.EMBEDDING_SCALE}
_STR_KEYS = {Keys.ROPE_QK_LAYOUT, Keys.TARGET_ARCH, Keys.LSA_INPUT_LAYOUT, Keys.SA_ROPE_SCALING,
             Keys.SOURCE_FORMAT}
_BOOL_KEYS = {Keys.TARGET_BUNDLED}
_U64_KEYS = {Keys.TRAIN_TOKEN_PASSES}   # paper-scale runs see ~10^10 token-passes: more than a u32


def add_moa_kv(w: gguf.GGUFWriter, key: str, value: int | float | str | bool | list) -> None:
    """Add one ``moa.*`` key with the type the format fixes for it (docs/gguf-format.md)."""
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, str) for v in value) and value:   # moa.train.runs: string array
            w.add_array(key, list(value))
        else:                                                  # moa.eval.acceptance: float32 array
            w.add_array(key, [float(v) for v in value])
    elif key in _STR_KEYS:
        w.add_string(key, str(value))
    elif key in _F32_KEYS:
        w.add_float32(key, float(value))
    elif key in _BOOL_KEYS:
        w.add_bool(key, bool(value))
    elif key in _U64_KEYS:
        v = int(value)
        if not 0 <= v < 2**64:
            raise InvalidArgumentError(f"{key} = {value}: not a u64")
        w.add_uint64(key, v)
    else:
        v = int(value)
        if not 0 <= v < 2**32:
            raise InvalidArgumentError(f"{key} = {value}: not a u32")
        w.add_uint32(key, v)


def pick_type(name: str, shape: tuple[int, ...], outtype: str) -> Q:
    """Storage type of one tensor: 1-D (norms, bias) always F32; matrices ``outtype``, with F16
    for block quants when the row length is not a multiple of the block size."""
    qtype = OUTTYPES[outtype][0]
    if len(shape) == 1:
        return Q.F32
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if shape[-1] % block:
        log.info("%s: row length %d is not a multiple of %d: stored as F16 instead of %s",
                 name, shape[-1], block, qtype.name)
        return Q.F16
    return qtype


@dataclass(frozen=True)
class Encoded:
    """A tensor ready for the writer: numpy payload plus its ggml type."""

    name: str
    data: np.ndarray
    qtype: Q


def encode(name: str, x: np.ndarray, outtype: str) -> Encoded:
    """Convert one float32 tensor (PyTorch shape) to its storage type."""
    if not np.isfinite(x).all():
        raise FormatError(f"{name}: contains NaN or Inf")
    qtype = pick_type(name, x.shape, outtype)
    if qtype != Q.F32 and x.size and float(np.abs(x).max()) > F16_MAX:
        # F16 (and the F16 block scales of Q8_0/Q4_0) would overflow: keep the exact values.
        log.warning("%s: |max| %.4g exceeds the F16 range: stored as F32", name, float(np.abs(x).max()))
        qtype = Q.F32
    if qtype == Q.F32:
        return Encoded(name, np.ascontiguousarray(x, dtype=np.float32), qtype)
    if qtype == Q.F16:
        return Encoded(name, x.astype(np.float16), qtype)
    return Encoded(name, gguf.quants.quantize(np.ascontiguousarray(x, dtype=np.float32), qtype), qtype)


def encode_ids(name: str, ids: np.ndarray) -> Encoded:
    """An id map (``d2t``) as an I32 tensor."""
    if ids.size and (ids.min() < 0 or ids.max() >= 2**31):
        raise FormatError(f"{name}: ids do not fit I32")
    return Encoded(name, np.ascontiguousarray(ids, dtype=np.int32), Q.I32)


def write_gguf(path: Path, name: str, outtype: str, metadata: dict[str, int | float | str | bool],
               tensors: list[Encoded]) -> None:
    """Write ``general.*`` + ``moa.*`` metadata and the tensors (ggml ne = reversed numpy shape)."""
    w = gguf.GGUFWriter(path, ARCH)  # also writes general.architecture = "moa"
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_file_type(OUTTYPES[outtype][1])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value in metadata.items():
        add_moa_kv(w, key, value)
    for t in tensors:
        # Quantized payloads are uint8 [rows, bytes]; raw_dtype lets the writer derive the shape.
        w.add_tensor(t.name, t.data, raw_dtype=None if t.qtype in (Q.F32, Q.F16, Q.I32) else t.qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
