"""The client bundle of client-server MoA (docs/client-server.md#bundle): what a ``moa-cpp client``
needs, and nothing of the server's (no target layers, no LSA / Ekv2E / CA k,v). This module is
the bundle's identity and its reading and checking; writing one is :mod:`.bundle_write`
(``moa-cpp bundle``, :mod:`moa_cpp.cli.bundle`), downloading one :mod:`.bundle_download`.

A bundle directory holds::

    DIR/client.gguf    the drafter, moa.role = "client": SA, CA without attn_k/attn_v, the reduced
                       head (draft_output + d2t) if any, and the target tensors it borrows under
                       "target." (token_embd; output.weight only without a reduced head)
    DIR/vocab.gguf     the target's metadata only (tokenizer, chat template, EOG ids), no tensors:
                       loadable by ``llama_cpp.Llama(path, vocab_only=True)``
    DIR/manifest.json  protocol version, bundle_id, dims, and each file's sha256 and size

``bundle_id`` (:func:`bundle_id`) identifies the (full drafter, target) pair by the sha256 of
their tensor data; the server computes it from its own files, checks a served bundle against it,
and answers 409 ``bundle_mismatch`` to a client whose bundle was made for other files.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from moa_cpp.atomic import write_atomic  # noqa: F401  (bundle_write / bundle_download use it from here)
from moa_cpp.errors import FormatError, MismatchError
from moa_cpp.remote.gguf_info import file_key, gguf_info

CLIENT_FILE = "client.gguf"
VOCAB_FILE = "vocab.gguf"
MANIFEST_FILE = "manifest.json"
BUNDLE_FILES = (CLIENT_FILE, VOCAB_FILE)
FORMAT = "moa-client-bundle"
FORMAT_VERSION = 1
ID_RE = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 8 << 20

# The largest bundle file a client downloads: the token embedding of a 262K-vocabulary target at
# F16 is ~0.35 GB per 640 dimensions; 8 GiB covers 4096-dimension F16 embeddings with room.
MAX_FILE_BYTES = 8 << 30


class BundleError(FormatError):
    """A bundle directory or download that is missing, incomplete, corrupted or of another format."""


class BundleMismatchError(MismatchError):
    """A bundle made for another drafter / target than the one it is used with."""


# ---------------------------------------------------------------------------- identity

_HASH_CACHE: dict = {}


def tensor_data_sha256(path: Union[str, os.PathLike]) -> str:
    """sha256 (hex) of a GGUF file's tensor data section (from the data offset to the end): the
    weights, whatever the metadata says. Cached per (file, size, mtime) for this process."""
    p = Path(path)
    key = file_key(p)
    if key not in _HASH_CACHE:
        off = gguf_info(p).data_offset
        h = hashlib.sha256()
        with open(p, "rb") as f:
            f.seek(off)
            while chunk := f.read(CHUNK):
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
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------- files

# write_atomic (imported above, from moa_cpp.atomic): the bundle's files appear whole or not at all


def fmt_size(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


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


def check_manifest(m: object, where: str) -> dict:
    """Structure of a manifest (from a file or a server): every field the client relies on."""
    from moa_cpp.remote import protocol as P
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise BundleError(f"{where}: not a moa_cpp client bundle manifest")
    if m.get("format_version") != FORMAT_VERSION:
        raise BundleError(f"{where}: bundle format version {m.get('format_version')!r} is not supported "
                          f"(expected {FORMAT_VERSION}); rebuild it with `moa-cpp bundle`")
    if m.get("protocol") != P.VERSION:
        raise BundleError(f"{where}: bundle for protocol {m.get('protocol')!r}, this client speaks {P.VERSION}")
    if not isinstance(m.get("bundle_id"), str) or not ID_RE.match(m["bundle_id"]):
        raise BundleError(f"{where}: bad bundle_id")
    files = m.get("files")
    if not isinstance(files, dict) or set(files) != set(BUNDLE_FILES):
        raise BundleError(f"{where}: the manifest must list exactly {', '.join(BUNDLE_FILES)}")
    for name, e in files.items():
        if (not isinstance(e, dict) or not isinstance(e.get("sha256"), str) or not ID_RE.match(e["sha256"])
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
