"""Resolve a converter source argument to a local directory (local path or Hugging Face repo id)."""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from moa_cpp.errors import MoaIOError
from moa_cpp.models.hf import hub_cache_dir, hub_offline

log = logging.getLogger(__name__)

# Only what the converter reads: never the (possibly huge) *.bin / *.pt duplicates.
ALLOW_PATTERNS = ["config.json", "*.safetensors", "*.safetensors.index.json"]

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Source:
    """A resolved checkpoint: its local directory and a human name for ``general.name``."""

    path: Path
    name: str
    repo_id: str | None = None


def resolve_source(src: str | os.PathLike[str], revision: str | None = None) -> Source:
    """Return the local directory of ``src``: an existing path, else a hub repo id to download.

    A hub download fetches only ``config.json`` and safetensors files. ``HF_HUB_OFFLINE=1``
    resolves from the local cache only.
    """
    p = Path(src).expanduser()
    if p.exists():
        if p.is_file():  # e.g. a path to model.safetensors: use its folder
            p = p.parent
        if revision:
            log.warning("--revision %s ignored: %s is a local directory", revision, p)
        p = p.resolve()
        log.info("source: local directory %s", p)
        return Source(path=p, name=p.name)
    s = str(src)
    if not _REPO_ID.match(s):
        raise MoaIOError(f"source {s!r}: no such file or directory, and not a hub repo id (org/name)")
    from huggingface_hub import snapshot_download  # imported lazily: only the hub path needs it

    cache_dir, offline = hub_cache_dir(), hub_offline()
    log.info("source: hub repo %s (revision %s, cache %s%s)", s, revision or "main",
             cache_dir or "default", ", offline" if offline else "")
    try:
        local = snapshot_download(s, revision=revision, cache_dir=cache_dir,
                                  local_files_only=offline, allow_patterns=ALLOW_PATTERNS)
    except Exception as e:  # hub errors have many classes; all mean "could not get it"
        raise MoaIOError(f"cannot get hub repo {s!r} (revision {revision or 'main'}): "
                         f"{type(e).__name__}: {e}") from e
    log.info("source: hub snapshot at %s", local)
    return Source(path=Path(local), name=s.split("/")[-1], repo_id=s)
