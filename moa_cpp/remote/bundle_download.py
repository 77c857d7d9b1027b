"""Downloading the bundle a ``moa-cpp serve --bundle DIR`` offers (:func:`download_bundle`):
``GET /moa/v1/bundle`` (the manifest), then ``GET /moa/v1/bundle/FILE`` for each file, through
the one HTTP client (:class:`~.transport.Transport`), into ``<cache>/bundles/<bundle_id>/``
(``moa_cpp.models.registry.cache_dir``), every file checked against the manifest's size and sha256."""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Optional
from urllib.parse import quote

from moa_cpp.errors import MoaError
from moa_cpp.remote.bundle import (ID_RE, MANIFEST_FILE, Bundle, BundleError, check_manifest, file_sha256, fmt_size, load_bundle,
                     write_atomic)
from moa_cpp.remote.transport import Transport

MAX_MANIFEST = 1 << 20


def bundle_cache_dir(bid: str) -> Path:
    from moa_cpp.models.registry import cache_dir
    if not ID_RE.match(bid):
        raise BundleError(f"bad bundle_id {bid!r}")
    return cache_dir() / "bundles" / bid


def _http_error(r, data: bytes, what: str) -> MoaError:
    try:
        msg = json.loads(data)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        msg = data[:200].decode("utf-8", "replace")
    return MoaError(f"{what}: the server answered {r.status}: {msg}")


def fetch_manifest(url: str, api_key: Optional[str] = None, timeout: float = 30.0) -> Optional[dict]:
    """The server's bundle manifest, or None if it serves no bundle (404)."""
    with Transport(url, api_key, timeout).stream("/moa/v1/bundle") as r:
        data = r.read(MAX_MANIFEST)
        if len(data) == MAX_MANIFEST and r.read(1):
            raise BundleError(f"{url}: the bundle manifest is larger than 1 MiB")
    if r.status == 404:
        return None
    if r.status != 200:
        raise _http_error(r, data, "GET /moa/v1/bundle")
    try:
        m = json.loads(data)
    except ValueError:
        raise BundleError(f"{url}: the bundle manifest is not JSON") from None
    return check_manifest(m, f"{url}/moa/v1/bundle")


def _download_file(http: Transport, name: str, entry: dict, tmp: Path) -> int:
    """Stream ``name`` into ``tmp`` (no more than the manifest's size); BundleError unless its
    size and sha256 are the manifest's. Its size."""
    with http.stream(f"/moa/v1/bundle/{quote(name)}") as r:
        if r.status != 200:
            raise _http_error(r, r.read(1 << 16), f"GET /moa/v1/bundle/{name}")
        h, n = hashlib.sha256(), 0
        with open(tmp, "wb") as f:
            while chunk := r.read(1 << 20):
                n += len(chunk)
                if n > entry["size"]:
                    break
                h.update(chunk)
                f.write(chunk)
    if n != entry["size"] or h.hexdigest() != entry["sha256"]:
        raise BundleError(f"downloaded {name} from {http.url} does not match the manifest "
                          f"({n} bytes, sha256 {h.hexdigest()[:16]}…; expected {entry['size']} bytes, "
                          f"{entry['sha256'][:16]}…): corrupted in transit or changed on the server")
    return n


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
    http = Transport(url, api_key, timeout)
    for name, e in m["files"].items():
        dst = d / name
        if dst.is_file() and dst.stat().st_size == e["size"] and file_sha256(dst) == e["sha256"]:
            continue
        tmp = d / f".{name}.{os.getpid()}.tmp"
        try:
            n = _download_file(http, name, e, tmp)
            os.replace(tmp, dst)
            if progress:
                print(f"[bundle: downloaded {name} ({fmt_size(n)})]", file=sys.stderr, flush=True)
        finally:
            tmp.unlink(missing_ok=True)
    write_atomic(d / MANIFEST_FILE, lambda p: p.write_text(json.dumps(m, indent=2) + "\n"))
    return load_bundle(d, verify=False)      # every file was just checked
