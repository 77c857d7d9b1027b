"""The MoA client-server protocol, v1 (docs/client-server.md#protocol): message bodies, the CA payload
codec and the validation every request passes before anything touches llama.cpp.

Bodies are msgpack (``application/vnd.msgpack``) or JSON (``application/json``; binary fields as
base64); the answer uses the request's type. Integer arrays travel as little-endian int32
``bin`` (parents: int16). The CA K/V of verified tokens travel as f16 (default), q8_0 (ggml's
block layout: per 32 values an f16 scale + 32 int8) or f32 (parity tests). Errors are JSON:
``{"error": {"code", "type", "message"}}``.
"""
from __future__ import annotations

import base64
import json
from typing import Any, Optional

import numpy as np

VERSION = 1
MSGPACK = "application/vnd.msgpack"
JSON = "application/json"
CA_DTYPES = ("f16", "q8_0", "f32")
QK8_0 = 32


class ProtocolError(ValueError):
    """A message that breaks the protocol: answered with ``status`` and ``kind``."""

    def __init__(self, message: str, kind: str = "invalid_request", status: int = 400) -> None:
        super().__init__(message)
        self.kind, self.status = kind, status


# ---------------------------------------------------------------------------- bodies

def has_msgpack() -> bool:
    """Is the optional msgpack package installed (else bodies are JSON)?"""
    try:
        import msgpack  # noqa: F401
        return True
    except ImportError:
        return False


def encode_body(obj: dict, content_type: str) -> bytes:
    if content_type == MSGPACK:
        import msgpack
        return msgpack.packb(obj, use_bin_type=True)
    return json.dumps(_to_json(obj), separators=(",", ":")).encode()


# Containers a protocol message may hold: a message is a map of a few fields (numbers, strings,
# packed binaries, the small sampling / ca / timing maps); nothing in it is a long list. Bounding
# them bounds what a body costs to decode (a 1 MiB msgpack body of one-byte empty maps decoded
# into ~73 MiB of Python objects before being refused, on the event loop).
MAX_MAP_LEN = 64
MAX_ARRAY_LEN = 256
MAX_CONTAINERS = 1024


def decode_body(body: bytes, content_type: str, max_len: int = 1 << 20) -> dict:
    """Parse a body (bounded by ``max_len``, and by the container limits above); any failure is
    a ProtocolError."""
    if len(body) > max_len:
        raise ProtocolError(f"body larger than {max_len} bytes", "too_large", 413)
    try:
        if content_type == MSGPACK:
            import msgpack
            obj = msgpack.unpackb(body, raw=False, strict_map_key=True, max_bin_len=max_len, max_str_len=max_len,
                                  max_array_len=MAX_ARRAY_LEN, max_map_len=MAX_MAP_LEN)
        elif content_type == JSON:
            # json has no container limits: count the brackets first (cheap, in C)
            if body.count(b"{") + body.count(b"[") > MAX_CONTAINERS:
                raise ProtocolError(f"more than {MAX_CONTAINERS} objects / arrays in the body", "malformed_body")
            obj = _from_json(json.loads(body))
        else:
            raise ProtocolError(f"Content-Type must be {MSGPACK} or {JSON}", "unsupported_media_type", 415)
    except ProtocolError:
        raise
    except Exception as e:     # malformed msgpack / JSON, too deep, too many items, bad UTF-8, bad base64
        raise ProtocolError(f"malformed body: {type(e).__name__}", "malformed_body") from None
    if not isinstance(obj, dict):
        raise ProtocolError("the body must be a map / object", "malformed_body")
    if type(obj.get("v")) is not int or obj["v"] != VERSION:      # True == 1 in Python: not a version
        raise ProtocolError(f"unsupported protocol version {obj.get('v')!r} (this server speaks {VERSION})",
                            "unsupported_version")
    return obj


def _to_json(o: Any) -> Any:
    if isinstance(o, (bytes, bytearray)):
        return {"$b64": base64.b64encode(bytes(o)).decode()}
    if isinstance(o, dict):
        return {k: _to_json(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_to_json(v) for v in o]
    return o


def _from_json(o: Any) -> Any:
    if isinstance(o, dict):
        if set(o) == {"$b64"} and isinstance(o["$b64"], str):
            return base64.b64decode(o["$b64"], validate=True)
        return {k: _from_json(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_from_json(v) for v in o]
    return o


# ---------------------------------------------------------------------------- arrays

def pack_i32(a: Any) -> bytes:
    return np.asarray(a, dtype="<i4").tobytes()


def pack_i16(a: Any) -> bytes:
    return np.asarray(a, dtype="<i2").tobytes()


def unpack_ints(b: Any, dtype: str, name: str, max_n: int) -> np.ndarray:
    if not isinstance(b, (bytes, bytearray)):
        raise ProtocolError(f"{name} must be binary ({dtype} little-endian)", "invalid_field")
    size = np.dtype(dtype).itemsize
    if len(b) % size or len(b) // size > max_n:
        raise ProtocolError(f"{name}: {len(b)} bytes is not a list of at most {max_n} {dtype}", "invalid_field")
    return np.frombuffer(bytes(b), dtype=dtype).astype(np.int64)


# ---------------------------------------------------------------------------- CA payload

def q8_0_encode(x: np.ndarray) -> bytes:
    """ggml's Q8_0: per block of 32 values, an f16 scale d = max|x| / 127 and round(x / d) int8."""
    flat = np.asarray(x, np.float32).reshape(-1)
    pad = (-flat.size) % QK8_0
    blocks = np.concatenate([flat, np.zeros(pad, np.float32)]).reshape(-1, QK8_0)
    d = np.abs(blocks).max(axis=1) / 127.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    q = np.clip(np.rint(blocks * inv[:, None]), -127, 127).astype(np.int8)
    out = np.empty(len(blocks), dtype=[("d", "<f2"), ("q", "i1", QK8_0)])
    out["d"], out["q"] = d.astype(np.float16), q
    return out.tobytes()


def q8_0_decode(b: bytes, n_values: int) -> np.ndarray:
    n_blocks = -(-n_values // QK8_0)
    rec = np.frombuffer(b, dtype=[("d", "<f2"), ("q", "i1", QK8_0)], count=n_blocks)
    return (rec["q"].astype(np.float32) * rec["d"].astype(np.float32)[:, None]).reshape(-1)[:n_values]


def ca_nbytes(dtype: str, n_values: int) -> int:
    if dtype == "f32":
        return 4 * n_values
    if dtype == "f16":
        return 2 * n_values
    return (-(-n_values // QK8_0)) * (2 + QK8_0)


def encode_ca(k: np.ndarray, v: np.ndarray, pos0: int, dtype: str) -> dict:
    """CA entries ``[n, heads, dim]`` (float32) -> the wire dict."""
    if dtype not in CA_DTYPES:
        raise ProtocolError(f"ca_dtype must be one of {', '.join(CA_DTYPES)}", "invalid_field")
    n, heads, dim = k.shape

    def enc(x: np.ndarray) -> bytes:
        if dtype == "f32":
            return np.ascontiguousarray(x, "<f4").tobytes()
        if dtype == "f16":
            return np.ascontiguousarray(x, "<f2").tobytes()
        return q8_0_encode(x)
    return {"dtype": dtype, "pos0": int(pos0), "n": int(n), "heads": int(heads), "dim": int(dim),
            "k": enc(k), "v": enc(v)}


def decode_ca(ca: Any, heads: int, dim: int, max_n: int) -> tuple:
    """The wire dict -> (k, v, pos0), each ``[n, heads, dim]`` float32; sizes checked (the
    client distrusts the server too)."""
    if not isinstance(ca, dict):
        raise ProtocolError("ca must be a map", "invalid_field")
    dtype, n, pos0 = ca.get("dtype"), ca.get("n"), ca.get("pos0")
    if dtype not in CA_DTYPES or not isinstance(n, int) or not isinstance(pos0, int) or not 0 <= n <= max_n \
            or pos0 < 0 or ca.get("heads") != heads or ca.get("dim") != dim:
        raise ProtocolError("ca: bad dtype / n / pos0 / shape", "invalid_field")
    nv = n * heads * dim
    out = []
    for key in ("k", "v"):
        b = ca.get(key)
        if not isinstance(b, (bytes, bytearray)) or len(b) != ca_nbytes(dtype, nv):
            raise ProtocolError(f"ca.{key}: expected {ca_nbytes(dtype, nv)} bytes", "invalid_field")
        if dtype == "q8_0":
            x = q8_0_decode(bytes(b), nv)
        else:
            x = np.frombuffer(bytes(b), "<f4" if dtype == "f32" else "<f2").astype(np.float32)
        out.append(x.reshape(n, heads, dim))
    return out[0], out[1], pos0


# ---------------------------------------------------------------------------- field checks

def get_int(msg: dict, key: str, lo: int, hi: int, default: Optional[int] = None) -> int:
    v = msg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ProtocolError(f"{key} must be an integer in [{lo}, {hi}]", "invalid_field")
    return v


def get_float(msg: dict, key: str, lo: float, hi: float, default: float) -> float:
    v = msg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= float(v) <= hi:
        raise ProtocolError(f"{key} must be a number in [{lo}, {hi}]", "invalid_field")
    return float(v)


def get_bool(msg: dict, key: str, default: bool = False) -> bool:
    v = msg.get(key, default)
    if not isinstance(v, bool):
        raise ProtocolError(f"{key} must be true or false", "invalid_field")
    return v


def is_chain(parents: np.ndarray) -> bool:
    """True if ``parents`` is a chain's: -1, 0, 1, ... (each node the child of the one before)."""
    return bool(np.array_equal(parents, np.arange(-1, parents.size - 1)))


def check_tree(tokens: np.ndarray, parents: np.ndarray, n_vocab: int, max_nodes: int, max_depth: int = 16) -> None:
    """Token ids in the vocabulary; parents precede children (so no cycles); depth bounded."""
    if tokens.size != parents.size:
        raise ProtocolError("tokens and parents differ in length", "invalid_tree", 422)
    if tokens.size > max_nodes:
        raise ProtocolError(f"at most {max_nodes} draft nodes", "invalid_tree", 422)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= n_vocab):
        raise ProtocolError(f"token ids must be in [0, {n_vocab})", "invalid_tree", 422)
    depth = np.zeros(tokens.size, np.int64)
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ProtocolError("parents[i] must be in [-1, i): parents precede children", "invalid_tree", 422)
        depth[i] = 1 if p < 0 else depth[p] + 1
    if tokens.size and depth.max() > max_depth:
        raise ProtocolError(f"tree depth is at most {max_depth}", "invalid_tree", 422)
