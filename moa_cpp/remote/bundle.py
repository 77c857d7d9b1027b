"""The client bundle of client-server MoA (spec/client-server.md §1.3): what a ``moa-cpp client``
needs, and nothing of the server's (no target layers, no LSA / Ekv2E / CA k,v).

``moa-cpp bundle -m T.gguf -d D.gguf -o DIR`` writes::

    DIR/client.gguf    the drafter, moa.role = "client": SA, CA without attn_k/attn_v, the reduced
                       head (draft_output + d2t) if any, and the target tensors it borrows under
                       "target." (token_embd; output.weight only without a reduced head)
    DIR/vocab.gguf     the target's metadata only (tokenizer, chat template, EOG ids), no tensors:
                       loadable by ``llama_cpp.Llama(path, vocab_only=True)``
    DIR/manifest.json  protocol version, bundle_id, dims, and each file's sha256 and size

``bundle_id`` (:func:`bundle_id`) identifies the (full drafter, target) pair by the sha256 of
their tensor data; the server computes it from its own files, checks a served bundle against it,
and answers 409 ``bundle_mismatch`` to a client whose bundle was made for other files.

A client may download the bundle from a ``moa-cpp serve --bundle DIR`` (:func:`download_bundle`):
``GET /moa/v1/bundle`` (the manifest), then ``GET /moa/v1/bundle/FILE``, cached under
``<cache>/bundles/<bundle_id>/`` (``moa_cpp.models.cache_dir``) and checked against the sha256.
"""
from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import logging
import math
import os
import re
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union
from urllib.parse import quote, urlparse

from ..errors import FormatError, InvalidArgumentError, MismatchError, MoaError, MoaIOError

log = logging.getLogger(__name__)

CLIENT_FILE = "client.gguf"
VOCAB_FILE = "vocab.gguf"
MANIFEST_FILE = "manifest.json"
BUNDLE_FILES = (CLIENT_FILE, VOCAB_FILE)
FORMAT = "moa-client-bundle"
FORMAT_VERSION = 1
EMBD_TYPES = ("keep", "q8_0", "f16")
_ID_RE = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 8 << 20

# Tensors the client never runs: the server computes the CA K/V from the target's K/V.
_SERVER_ONLY_PREFIXES = ("lsa.", "ekv2e.")
_SERVER_ONLY = ("ca.attn_k.weight", "ca.attn_v.weight")


class BundleError(FormatError):
    """A bundle directory or download that is missing, incomplete, corrupted or of another format."""


class BundleMismatchError(MismatchError):
    """A bundle made for another drafter / target than the one it is used with."""


# ---------------------------------------------------------------------------- identity

_HASH_CACHE: dict = {}

# GGUF value types (gguf.GGUFValueType): struct codes of the scalar ones; 8 = string, 9 = array.
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


@dataclass
class _GGUFScan:
    """What a fast header walk of a GGUF file gives (gguf.GGUFReader decodes every token string
    of the vocabulary: seconds for a large one): scalar / string metadata, where the metadata
    ends, the tensor infos and the data offset."""

    version: int
    n_kv: int
    kv_end: int                      # first byte after the metadata (= first tensor info)
    data_offset: int
    kv: dict                         # scalar and string values only
    tensors: dict                    # name -> (ne tuple, ggml type, offset in the data section)


def _scan_gguf(path: Path) -> _GGUFScan:
    try:
        with open(path, "rb") as f:
            buf = f.read(24)
            if len(buf) < 24 or buf[:4] != b"GGUF":
                raise FormatError(f"'{path}' is not a GGUF file")
            version, n_tensors, n_kv = struct.unpack("<IQQ", buf[4:])
            rd = f.read

            def u64() -> int:
                return struct.unpack("<Q", rd(8))[0]

            def value(t: int, keep: bool):
                if t in _SCALAR:
                    fmt = "<" + _SCALAR[t]
                    return struct.unpack(fmt, rd(struct.calcsize(fmt)))[0]
                if t == 8:
                    b = rd(u64())
                    return b.decode("utf-8", "replace") if keep else None
                if t == 9:
                    at, n = struct.unpack("<I", rd(4))[0], u64()
                    if at in _SCALAR:
                        f.seek(n * struct.calcsize("<" + _SCALAR[at]), 1)
                    else:
                        for _ in range(n):
                            value(at, False)
                    return None
                raise FormatError(f"'{path}': unknown GGUF value type {t}")

            kv = {}
            for _ in range(n_kv):
                k = rd(u64()).decode("utf-8", "replace")
                v = value(struct.unpack("<I", rd(4))[0], True)
                if v is not None:
                    kv[k] = v
            kv_end = f.tell()
            tensors = {}
            for _ in range(n_tensors):
                name = rd(u64()).decode("utf-8", "replace")
                nd = struct.unpack("<I", rd(4))[0]
                ne = struct.unpack(f"<{nd}Q", rd(8 * nd))
                ttype, off = struct.unpack("<IQ", rd(12))
                tensors[name] = (ne, ttype, off)
            align = int(kv.get("general.alignment", 32))
            end = f.tell()
    except (OSError, struct.error, MemoryError, OverflowError) as e:
        raise FormatError(f"'{path}' is not a readable GGUF file ({type(e).__name__}: {e})") from None
    return _GGUFScan(version, n_kv, kv_end, end + (-end) % align, kv, tensors)


def _tensor_bytes(path: Path, scan: _GGUFScan, name: str):
    """A tensor's data as a read-only uint8 memmap [rows, row bytes] and its ggml type."""
    import gguf
    import numpy as np
    ne, ttype, off = scan.tensors[name]
    qtype = gguf.GGMLQuantizationType(ttype)
    block, tsize = gguf.GGML_QUANT_SIZES[qtype]
    rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
    return np.memmap(path, np.uint8, "r", offset=scan.data_offset + off, shape=(rows, ne[0] // block * tsize)), qtype


def tensor_data_sha256(path: Union[str, os.PathLike]) -> str:
    """sha256 (hex) of a GGUF file's tensor data section (from the data offset to the end): the
    weights, whatever the metadata says. Cached per (file, size, mtime) for this process."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        raise MoaIOError(f"'{p}': {e.strerror or e}") from None
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASH_CACHE:
        off = _scan_gguf(p).data_offset
        h = hashlib.sha256()
        with open(p, "rb") as f:
            f.seek(off)
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        _HASH_CACHE[key] = h.hexdigest()
    return _HASH_CACHE[key]


@dataclass(frozen=True)
class BundleIdentity:
    bundle_id: str
    drafter_sha256: str   # tensor data of the full drafter GGUF
    target_sha256: str    # tensor data of the target GGUF


def bundle_id(drafter_path: Union[str, os.PathLike], target_path: Union[str, os.PathLike]) -> BundleIdentity:
    """The identity of a (full drafter, target) pair: ``sha256("moa-bundle/1\\0" + drafter data
    sha256 + "\\0" + target data sha256)``. The one definition, used by ``moa-cpp bundle`` and by
    the server."""
    d, t = tensor_data_sha256(drafter_path), tensor_data_sha256(target_path)
    return BundleIdentity(hashlib.sha256(f"moa-bundle/1\0{d}\0{t}".encode()).hexdigest(), d, t)


def file_sha256(path: Union[str, os.PathLike]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------- writing

def _copy_fields(w, reader, skip: set) -> None:
    """Copy a GGUF file's metadata (but ``skip`` and the header fields) to a GGUFWriter."""
    import gguf
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name in skip:
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        if vtype == gguf.GGUFValueType.ARRAY and sub == gguf.GGUFValueType.ARRAY:
            raise FormatError(f"metadata key '{f.name}': nested arrays are not supported")
        w.add_key_value(f.name, f.contents(), vtype, sub)


def _embedding(data, qtype, n_embd: int, embd_type: str):
    """(data, raw_dtype) of the target's token embedding (uint8 rows of type ``qtype``) in the
    asked type."""
    import gguf
    import numpy as np
    Q = gguf.GGMLQuantizationType
    if embd_type == "keep" or qtype.name.lower() == embd_type:
        return data, qtype
    n_rows = data.shape[0]
    want = {"q8_0": Q.Q8_0, "f16": Q.F16}[embd_type]
    block = gguf.GGML_QUANT_SIZES[want][0]
    if n_embd % block:
        raise InvalidArgumentError(f"--embd-type {embd_type}: the embedding width {n_embd} is not a multiple "
                                   f"of {block}")
    parts = []
    step = max(1, (64 << 20) // (4 * n_embd))           # ~64 MiB of float32 at a time
    for r0 in range(0, n_rows, step):
        x = gguf.quants.dequantize(np.asarray(data[r0: r0 + step]), qtype).reshape(-1, n_embd)
        x = np.ascontiguousarray(x, dtype=np.float32)
        parts.append(x.astype(np.float16) if want == Q.F16 else gguf.quants.quantize(x, want))
    return np.concatenate(parts), want


def _write_client(path: Path, drafter, target_path: Path, target: _GGUFScan, *, meta: dict, embd_type: str,
                  own_head: bool, progress: bool) -> None:
    import gguf
    w = gguf.GGUFWriter(path, "moa")
    _copy_fields(w, drafter, {"general.architecture", *meta})
    for k, (v, vtype) in meta.items():
        w.add_key_value(k, v, vtype)
    for t in drafter.tensors:
        if t.name.startswith(_SERVER_ONLY_PREFIXES) or t.name in _SERVER_ONLY or t.name.startswith("target."):
            continue
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    data, qtype = _tensor_bytes(target_path, target, "token_embd.weight")
    data, qtype = _embedding(data, qtype, int(target.tensors["token_embd.weight"][0][0]), embd_type)
    w.add_tensor("target.token_embd.weight", data, raw_dtype=qtype)
    if not own_head and "output.weight" in target.tensors:     # untied target LM head
        data, qtype = _tensor_bytes(target_path, target, "output.weight")
        w.add_tensor("target.output.weight", data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=progress)
    w.close()


def _write_vocab(path: Path, target_path: Path, scan: _GGUFScan) -> None:
    """The target's header + metadata bytes, copied verbatim, with zero tensors (like llama.cpp's
    models/ggml-vocab-*.gguf). Verbatim: token strings stay byte-exact."""
    kv_end, n_kv, version = scan.kv_end, scan.n_kv, scan.version
    align = int(scan.kv.get("general.alignment", 32))
    with open(target_path, "rb") as src, open(path, "wb") as out:
        head = src.read(24)
        if head[:4] != b"GGUF":
            raise FormatError(f"'{target_path}' is not a GGUF file")
        out.write(b"GGUF" + struct.pack("<IQQ", version, 0, n_kv))
        src.seek(24)
        left = kv_end - 24
        while left > 0:
            chunk = src.read(min(left, _CHUNK))
            if not chunk:
                raise FormatError(f"'{target_path}' is truncated")
            out.write(chunk)
            left -= len(chunk)
        pad = (-out.tell()) % align
        out.write(b"\0" * pad)


def _atomic(dst: Path, write) -> None:
    tmp = dst.with_name("." + dst.name + ".tmp")
    try:
        write(tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def _fmt_size(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def make_bundle(target_path: Union[str, os.PathLike], drafter_path: Union[str, os.PathLike],
                out_dir: Union[str, os.PathLike], *, embd_type: str = "keep", progress: bool = True) -> dict:
    """Write the client bundle of (``drafter_path``, ``target_path``) to ``out_dir``; return the
    manifest. The pair is first loaded as a full drafter (so a mismatch is reported as the loader
    reports it). Each file is written to a temporary name and renamed; the manifest comes last."""
    import gguf

    from .. import __version__
    from ..drafter import DrafterModel
    from ..gguf_names import Keys
    from . import protocol as P

    if embd_type not in EMBD_TYPES:
        raise InvalidArgumentError(f"embd_type must be one of {', '.join(EMBD_TYPES)}")
    target_path, drafter_path, out = Path(target_path), Path(drafter_path), Path(out_dir)
    for what, p in (("target", target_path), ("drafter", drafter_path)):
        if not p.is_file():
            raise MoaIOError(f"{what} '{p}': file not found")
    model = DrafterModel(drafter_path, target_path, device="cpu", n_threads=1)
    try:
        if model.role != "full":
            raise InvalidArgumentError(f"'{drafter_path}' is already a client-role drafter; bundle the full drafter")
        if model.tli != 0:
            raise InvalidArgumentError(f"'{drafter_path}' uses target layer inference N={model.tli}: "
                                       "client-server mode (and so a client bundle) needs N == 0")
        dims = {"n_vocab": model.n_target_vocab, "n_draft_vocab": model.n_vocab, "n_embd": model.n_embd,
                "ca_heads": model.ca_kv_heads, "ca_dim": model.head_dim, "n_target_layers": model.n_target_layers,
                "lsa_width": model.lsa_width, "tli": 0}
    finally:
        model.close()
    ident = bundle_id(drafter_path, target_path)
    dr, ts = gguf.GGUFReader(drafter_path, "r"), _scan_gguf(target_path)
    tarch = str(ts.kv.get("general.architecture", ""))
    own_head = "draft_output.weight" in {t.name for t in dr.tensors}
    if Keys.EMBEDDING_SCALE in dr.fields:               # as the loader reads it (moa-model.cpp)
        scale = float(dr.fields[Keys.EMBEDDING_SCALE].contents())
    else:
        scale = math.sqrt(dims["n_embd"]) if tarch.startswith("gemma") else 1.0
    V = gguf.GGUFValueType
    meta = {Keys.ROLE: ("client", V.STRING), Keys.TARGET_BUNDLED: (True, V.BOOL),
            Keys.EMBEDDING_SCALE: (scale, V.FLOAT32), Keys.TARGET_BLOCK_COUNT: (dims["n_target_layers"], V.UINT32),
            Keys.TARGET_ARCH: (tarch, V.STRING), Keys.TLI: (0, V.UINT32),
            "moa.bundle.id": (ident.bundle_id, V.STRING),
            "moa.bundle.drafter_sha256": (ident.drafter_sha256, V.STRING),
            "moa.bundle.target_sha256": (ident.target_sha256, V.STRING),
            "moa.bundle.embd_type": (embd_type, V.STRING)}

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    _atomic(out / CLIENT_FILE, lambda p: _write_client(p, dr, target_path, ts, meta=meta, embd_type=embd_type,
                                                       own_head=own_head, progress=progress))
    _atomic(out / VOCAB_FILE, lambda p: _write_vocab(p, target_path, ts))
    files = {}
    for name in BUNDLE_FILES:
        files[name] = {"sha256": file_sha256(out / name), "size": (out / name).stat().st_size}
    tname = ts.kv.get("general.name", target_path.stem)
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "protocol": P.VERSION,
                "bundle_id": ident.bundle_id, "drafter_sha256": ident.drafter_sha256,
                "target_sha256": ident.target_sha256, "target_name": str(tname), "target_arch": tarch,
                "drafter_file": drafter_path.name, "target_file": target_path.name, "embd_type": embd_type,
                **dims, "files": files, "created_by": f"moa_cpp {__version__}"}
    _atomic(out / MANIFEST_FILE, lambda p: p.write_text(json.dumps(manifest, indent=2) + "\n"))
    log.info("wrote bundle %s in %.1f s", out, time.perf_counter() - t0)
    return manifest


# ---------------------------------------------------------------------------- reading

@dataclass(frozen=True)
class Bundle:
    dir: Path
    manifest: dict

    @property
    def bundle_id(self) -> str:
        return self.manifest["bundle_id"]

    @property
    def client(self) -> Path:
        return self.dir / CLIENT_FILE

    @property
    def vocab(self) -> Path:
        return self.dir / VOCAB_FILE

    def file_entry(self, name: str) -> Optional[dict]:
        return self.manifest["files"].get(name) if name in BUNDLE_FILES else None


# The largest bundle file a client downloads: the token embedding of a 262K-vocabulary target at
# F16 is ~0.35 GB per 640 dimensions; 8 GiB covers 4096-dimension F16 embeddings with room.
MAX_FILE_BYTES = 8 << 30


def check_manifest(m: object, where: str) -> dict:
    """Structure of a manifest (from a file or a server): every field the client relies on."""
    from . import protocol as P
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise BundleError(f"{where}: not a moa_cpp client bundle manifest")
    if m.get("format_version") != FORMAT_VERSION:
        raise BundleError(f"{where}: bundle format version {m.get('format_version')!r} is not supported "
                          f"(expected {FORMAT_VERSION}); rebuild it with `moa-cpp bundle`")
    if m.get("protocol") != P.VERSION:
        raise BundleError(f"{where}: bundle for protocol {m.get('protocol')!r}, this client speaks {P.VERSION}")
    if not isinstance(m.get("bundle_id"), str) or not _ID_RE.match(m["bundle_id"]):
        raise BundleError(f"{where}: bad bundle_id")
    files = m.get("files")
    if not isinstance(files, dict) or set(files) != set(BUNDLE_FILES):
        raise BundleError(f"{where}: the manifest must list exactly {', '.join(BUNDLE_FILES)}")
    for name, e in files.items():
        if (not isinstance(e, dict) or not isinstance(e.get("sha256"), str) or not _ID_RE.match(e["sha256"])
                or type(e.get("size")) is not int or e["size"] < 0):
            raise BundleError(f"{where}: bad manifest entry for {name}")
        if e["size"] > MAX_FILE_BYTES:
            raise BundleError(f"{where}: {name} declares {e['size']} bytes, more than a client bundle file may have "
                              f"({MAX_FILE_BYTES >> 30} GiB)")
    return m


def load_bundle(path: Union[str, os.PathLike], *, verify: bool = True) -> Bundle:
    """Read and check a bundle directory: the manifest, each file's presence and size, and (with
    ``verify``) its sha256. Raises :class:`BundleError` with what is wrong."""
    d = Path(path)
    if not d.is_dir():
        raise BundleError(f"bundle '{d}': not a directory (make one with `moa-cpp bundle -m T.gguf -d D.gguf -o DIR`)")
    mf = d / MANIFEST_FILE
    try:
        m = json.loads(mf.read_text())
    except FileNotFoundError:
        raise BundleError(f"bundle '{d}': {MANIFEST_FILE} is missing") from None
    except (OSError, ValueError) as e:
        raise BundleError(f"bundle '{d}': cannot read {MANIFEST_FILE}: {e}") from None
    check_manifest(m, f"bundle '{d}'")
    for name, e in m["files"].items():
        p = d / name
        if not p.is_file():
            raise BundleError(f"bundle '{d}': {name} is missing")
        size = p.stat().st_size
        if size != e["size"]:
            raise BundleError(f"bundle '{d}': {name} has {size} bytes, the manifest says {e['size']} "
                              "(truncated or replaced)")
        if verify and file_sha256(p) != e["sha256"]:
            raise BundleError(f"bundle '{d}': {name} does not match its sha256 in the manifest (corrupted or modified)")
    return Bundle(d, m)


def check_server_bundle(bundle_dir: Union[str, os.PathLike], drafter_path: Union[str, os.PathLike, None],
                        target_path: Union[str, os.PathLike]) -> Bundle:
    """What ``moa-cpp serve --bundle DIR`` checks at start: a valid bundle made for exactly this
    server's drafter and target. Raises BundleError / BundleMismatchError."""
    b = load_bundle(bundle_dir)
    if drafter_path is None:
        raise BundleMismatchError("--bundle needs an MoA drafter on the server (-d); this server has none")
    ident = bundle_id(drafter_path, target_path)
    if ident.bundle_id != b.bundle_id:
        which = [w for w, a, c in (("drafter", b.manifest.get("drafter_sha256"), ident.drafter_sha256),
                                   ("target", b.manifest.get("target_sha256"), ident.target_sha256)) if a != c]
        raise BundleMismatchError(
            f"bundle '{b.dir}' (bundle_id {b.bundle_id[:16]}…) was made for another "
            f"{' and '.join(which) or 'drafter/target'} than this server's (drafter '{drafter_path}', target "
            f"'{target_path}': bundle_id {ident.bundle_id[:16]}…); rebuild it with "
            f"`moa-cpp bundle -m {target_path} -d {drafter_path} -o {b.dir}`")
    return b


# ---------------------------------------------------------------------------- download

def bundle_cache_dir(bid: str) -> Path:
    from ..models import cache_dir
    if not _ID_RE.match(bid):
        raise BundleError(f"bad bundle_id {bid!r}")
    return cache_dir() / "bundles" / bid


def _get(url: str, path: str, api_key: Optional[str], timeout: float):
    u = urlparse(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"server URL must be http(s)://HOST:PORT, got {url!r}")
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    c = cls(u.hostname, u.port or (443 if u.scheme == "https" else 80), timeout=timeout)
    headers = {"Accept": "application/json, application/octet-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    c.request("GET", path, headers=headers)
    return c, c.getresponse()


def _http_error(r, data: bytes, what: str) -> MoaError:
    try:
        msg = json.loads(data)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        msg = data[:200].decode("utf-8", "replace")
    return MoaError(f"{what}: the server answered {r.status}: {msg}")


def fetch_manifest(url: str, api_key: Optional[str] = None, timeout: float = 30.0) -> Optional[dict]:
    """The server's bundle manifest, or None if it serves no bundle (404)."""
    c, r = _get(url, "/moa/v1/bundle", api_key, timeout)
    try:
        data = r.read(1 << 20)
        if len(data) == 1 << 20 and r.read(1):
            raise BundleError(f"{url}: the bundle manifest is larger than 1 MiB")
    finally:
        c.close()
    if r.status == 404:
        return None
    if r.status != 200:
        raise _http_error(r, data, "GET /moa/v1/bundle")
    try:
        m = json.loads(data)
    except ValueError:
        raise BundleError(f"{url}: the bundle manifest is not JSON") from None
    return check_manifest(m, f"{url}/moa/v1/bundle")


def download_bundle(url: str, api_key: Optional[str] = None, *, timeout: float = 30.0,
                    manifest: Optional[dict] = None, progress: bool = False) -> Optional[Bundle]:
    """Download the server's bundle into ``<cache>/bundles/<bundle_id>/`` (reused when already
    there and intact); None if the server serves none. Each file is streamed to a temporary name,
    checked against the manifest's size and sha256, then renamed; the manifest is written last."""
    m = manifest if manifest is not None else fetch_manifest(url, api_key, timeout)
    if m is None:
        return None
    d = bundle_cache_dir(m["bundle_id"])
    try:
        b = load_bundle(d)
        if b.manifest.get("files") == m["files"]:
            return b
    except BundleError:
        pass
    d.mkdir(parents=True, exist_ok=True)
    for name, e in m["files"].items():
        dst = d / name
        if dst.is_file() and dst.stat().st_size == e["size"] and file_sha256(dst) == e["sha256"]:
            continue
        tmp = d / f".{name}.{os.getpid()}.tmp"
        try:
            c, r = _get(url, f"/moa/v1/bundle/{quote(name)}", api_key, timeout)
            try:
                if r.status != 200:
                    raise _http_error(r, r.read(1 << 16), f"GET /moa/v1/bundle/{name}")
                h, n = hashlib.sha256(), 0
                with open(tmp, "wb") as f:
                    while chunk := r.read(1 << 20):
                        n += len(chunk)
                        if n > e["size"]:
                            break
                        h.update(chunk)
                        f.write(chunk)
            finally:
                c.close()
            if n != e["size"] or h.hexdigest() != e["sha256"]:
                raise BundleError(f"downloaded {name} from {url} does not match the manifest "
                                  f"({n} bytes, sha256 {h.hexdigest()[:16]}…; expected {e['size']} bytes, "
                                  f"{e['sha256'][:16]}…): corrupted in transit or changed on the server")
            os.replace(tmp, dst)
            if progress:
                print(f"[bundle: downloaded {name} ({_fmt_size(n)})]", file=sys.stderr, flush=True)
        finally:
            tmp.unlink(missing_ok=True)
    _atomic(d / MANIFEST_FILE, lambda p: p.write_text(json.dumps(m, indent=2) + "\n"))
    return load_bundle(d, verify=False)      # every file was just checked


# ---------------------------------------------------------------------------- CLI

def add_bundle_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", help="the target GGUF (default: the embedded default target)")
    p.add_argument("-d", "--drafter", help="the full MoA drafter GGUF (default: the embedded default drafter)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="bundle directory to write")
    p.add_argument("--embd-type", choices=EMBD_TYPES, default="keep",
                   help="type of the bundled token embedding: keep the target's (default), or requantize")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_bundle(args: argparse.Namespace) -> int:
    from .. import defaults
    if args.model is not None and args.drafter is None:
        raise InvalidArgumentError("-m/--model needs -d/--drafter (the MoA drafter trained for it)")
    target = args.model or defaults.default_target()
    drafter = args.drafter or defaults.default_drafter()
    m = make_bundle(target, drafter, args.output, embd_type=args.embd_type, progress=not args.no_progress)
    out = Path(args.output)
    total = 0
    for name in BUNDLE_FILES:
        total += m["files"][name]["size"]
        print(f"{out / name}: {_fmt_size(m['files'][name]['size'])}")
    print(f"bundle {out}: {_fmt_size(total)} in all (drafter '{Path(drafter).name}' "
          f"{_fmt_size(os.path.getsize(drafter))}, target '{Path(target).name}' {_fmt_size(os.path.getsize(target))}); "
          f"bundle_id {m['bundle_id']}")
    return 0
