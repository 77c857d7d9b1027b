"""Which files a client-server MoA client runs (:func:`resolve_files`): a client bundle, a
drafter + target pair, the server's bundle (downloaded with the user's consent only), or the
embedded defaults."""
from __future__ import annotations

import logging
import os
from typing import Optional, Union

from moa_cpp.remote import bundle as B
from moa_cpp.remote.transport import UNAVAILABLE

log = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike, None]


def resolve_files(url: str, key: Optional[str], timeout: float, bundle: PathLike, drafter: PathLike,
                  target: PathLike, trust: bool = False, pin: Optional[str] = None) -> tuple:
    """(drafter GGUF, target GGUF or None (bundled), GGUF to tokenize with, Bundle or None), in
    this order of choice:

    - ``bundle``: a client bundle directory (``moa-cpp bundle``): its ``client.gguf`` and
      ``vocab.gguf``;
    - ``drafter`` and ``target``: the full drafter GGUF and the target GGUF;
    - neither: the server's bundle if it serves one, downloaded into the cache only with the
      user's consent -- ``trust`` (any bundle it offers) or ``pin`` (exactly this bundle_id);
      without consent a BundleError says how to give it. A server without a bundle (or one that
      cannot be asked now): the embedded default drafter and target."""
    from moa_cpp.remote.bundle_download import download_bundle, fetch_manifest
    if bundle is not None:
        if drafter is not None or target is not None:
            raise ValueError("pass either bundle= or drafter= / target=, not both")
        b = B.load_bundle(bundle)
        return b.client, None, b.vocab, b
    if drafter is not None or target is not None:
        if drafter is None or target is None:
            raise ValueError("drafter= and target= go together (or pass bundle=)")
        return drafter, target, target, None
    try:
        m = fetch_manifest(url, key, timeout)
    except UNAVAILABLE as e:             # unreachable now: draft alone with the defaults
        log.warning("cannot ask %s for its bundle (%s: %s): using the embedded default drafter and target",
                    url, type(e).__name__, e)
        m = None
    if m is not None:
        size = sum(e["size"] for e in m["files"].values()) / 2 ** 20
        if pin is not None and pin != m["bundle_id"]:
            raise B.BundleMismatchError(f"the server at {url} offers bundle_id {m['bundle_id']}, not the pinned "
                                        f"{pin}: its drafter or target changed")
        if pin is None and not trust:
            raise B.BundleError(
                f"the server at {url} offers its client bundle (bundle_id {m['bundle_id']}, {size:.0f} MiB: a "
                "drafter and the target's tokenizer and embedding, to be parsed and run here). Running files a "
                "server sends is your call: pass --trust-server-bundle (trust_server_bundle=True) to download "
                f"and run it, or --bundle-id {m['bundle_id']} (bundle_id=...) to accept exactly this one; or "
                "use your own files: --bundle DIR, or -m TARGET -d DRAFTER")
        b = download_bundle(url, key, timeout=timeout, manifest=m, progress=True)
        return b.client, None, b.vocab, b
    from moa_cpp.models import defaults
    default_target = defaults.default_target()
    return defaults.default_drafter(), default_target, default_target, None

