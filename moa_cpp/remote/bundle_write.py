"""Writing a client bundle (:func:`make_bundle`, ``moa-cpp bundle``): ``client.gguf`` (the
drafter without the server-only tensors, with the target's token embedding), ``vocab.gguf``
(the target's metadata, no tensors) and ``manifest.json`` -- the layout in :mod:`.bundle`."""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Union

from moa_cpp.errors import FormatError, InvalidArgumentError, MoaIOError
from moa_cpp.remote.bundle import (BUNDLE_FILES, CHUNK, CLIENT_FILE, FORMAT, FORMAT_VERSION, MANIFEST_FILE, VOCAB_FILE, bundle_id,
                     file_sha256, write_atomic)
from moa_cpp.remote.gguf_info import GGUFInfo, gguf_info, tensor_rows

log = logging.getLogger(__name__)

EMBD_TYPES = ("keep", "q8_0", "f16")

# Tensors the client never runs: the server computes the CA K/V from the target's K/V.
_SERVER_ONLY_PREFIXES = ("lsa.", "ekv2e.")
_SERVER_ONLY = ("ca.attn_k.weight", "ca.attn_v.weight")


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


def _write_client(path: Path, drafter, target_path: Path, target: GGUFInfo, *, meta: dict, embd_type: str,
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
    data, qtype = tensor_rows(target_path, target, "token_embd.weight")
    data, qtype = _embedding(data, qtype, int(target.tensors["token_embd.weight"][0][0]), embd_type)
    w.add_tensor("target.token_embd.weight", data, raw_dtype=qtype)
    if not own_head and "output.weight" in target.tensors:     # untied target LM head
        data, qtype = tensor_rows(target_path, target, "output.weight")
        w.add_tensor("target.output.weight", data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=progress)
    w.close()


def _write_vocab(path: Path, target_path: Path, info: GGUFInfo) -> None:
    """The target's header + metadata bytes, copied verbatim, with zero tensors (like llama.cpp's
    models/ggml-vocab-*.gguf). Verbatim: token strings stay byte-exact."""
    import struct
    with open(target_path, "rb") as src, open(path, "wb") as out:
        head = src.read(24)
        if head[:4] != b"GGUF":
            raise FormatError(f"'{target_path}' is not a GGUF file")
        out.write(b"GGUF" + struct.pack("<IQQ", info.version, 0, info.n_kv))
        src.seek(24)
        left = info.kv_end - 24
        while left > 0:
            chunk = src.read(min(left, CHUNK))
            if not chunk:
                raise FormatError(f"'{target_path}' is truncated")
            out.write(chunk)
            left -= len(chunk)
        pad = (-out.tell()) % info.alignment
        out.write(b"\0" * pad)


def _dims(drafter_path: Path, target_path: Path) -> dict:
    """The pair's dimensions, loaded as a full drafter (so a mismatch is reported as the loader
    reports it); refuses a client-role drafter and target layer inference (N > 0)."""
    from moa_cpp.drafter.drafter import DrafterModel
    model = DrafterModel(drafter_path, target_path, device="cpu", n_threads=1)
    try:
        if model.role != "full":
            raise InvalidArgumentError(f"'{drafter_path}' is already a client-role drafter; bundle the full drafter")
        if model.tli != 0:
            raise InvalidArgumentError(f"'{drafter_path}' uses target layer inference N={model.tli}: "
                                       "client-server mode (and so a client bundle) needs N == 0")
        return {"n_vocab": model.n_target_vocab, "n_draft_vocab": model.n_vocab, "n_embd": model.n_embd,
                "ca_heads": model.ca_kv_heads, "ca_dim": model.head_dim, "n_target_layers": model.n_target_layers,
                "lsa_width": model.lsa_width, "tli": 0}
    finally:
        model.close()


def make_bundle(target_path: Union[str, os.PathLike], drafter_path: Union[str, os.PathLike],
                out_dir: Union[str, os.PathLike], *, embd_type: str = "keep", progress: bool = True) -> dict:
    """Write the client bundle of (``drafter_path``, ``target_path``) to ``out_dir``; return the
    manifest. The pair is first loaded as a full drafter (so a mismatch is reported as the loader
    reports it). Each file is written to a temporary name and renamed; the manifest comes last."""
    import gguf

    from moa_cpp import __version__
    from moa_cpp.format.arch import embedding_scale
    from moa_cpp.format.names import Keys
    from moa_cpp.remote import protocol as P

    if embd_type not in EMBD_TYPES:
        raise InvalidArgumentError(f"embd_type must be one of {', '.join(EMBD_TYPES)}")
    target_path, drafter_path, out = Path(target_path), Path(drafter_path), Path(out_dir)
    for what, p in (("target", target_path), ("drafter", drafter_path)):
        if not p.is_file():
            raise MoaIOError(f"{what} '{p}': file not found")
    dims = _dims(drafter_path, target_path)
    ident = bundle_id(drafter_path, target_path)
    dr, ts = gguf.GGUFReader(drafter_path, "r"), gguf_info(target_path)
    tarch = str(ts.kv.get("general.architecture", ""))
    own_head = "draft_output.weight" in {t.name for t in dr.tensors}
    if Keys.EMBEDDING_SCALE in dr.fields:               # as the loader reads it (moa-model.cpp)
        scale = float(dr.fields[Keys.EMBEDDING_SCALE].contents())
    else:
        scale = embedding_scale(tarch, dims["n_embd"])
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
    write_atomic(out / CLIENT_FILE, lambda p: _write_client(p, dr, target_path, ts, meta=meta, embd_type=embd_type,
                                                            own_head=own_head, progress=progress))
    write_atomic(out / VOCAB_FILE, lambda p: _write_vocab(p, target_path, ts))
    files = {}
    for name in BUNDLE_FILES:
        files[name] = {"sha256": file_sha256(out / name), "size": (out / name).stat().st_size}
    tname = ts.kv.get("general.name", target_path.stem)
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "protocol": P.VERSION,
                "bundle_id": ident.bundle_id, "drafter_sha256": ident.drafter_sha256,
                "target_sha256": ident.target_sha256, "target_name": str(tname), "target_arch": tarch,
                "drafter_file": drafter_path.name, "target_file": target_path.name, "embd_type": embd_type,
                **dims, "files": files, "created_by": f"moa_cpp {__version__}"}
    write_atomic(out / MANIFEST_FILE, lambda p: p.write_text(json.dumps(manifest, indent=2) + "\n"))
    log.info("wrote bundle %s in %.1f s", out, time.perf_counter() - t0)
    return manifest
