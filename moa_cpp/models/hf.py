"""GGUF models named the way llama.cpp users name them: ``-hf user/repo[:quant]`` (``-hfd`` for a
drafter or draft model), through huggingface_hub's cache, as ``llama-cli -hf`` and
``Llama.from_pretrained`` do.

Which file of the repo (llama.cpp's rule): the ``.gguf`` whose name holds the quant tag (case
insensitive; default ``Q4_K_M``), else, without a tag, the first ``.gguf`` by name; multimodal
projectors (``mmproj``) never; a split model (``-00001-of-00003.gguf``) brings all its parts and
its first part is the path. ``HF_HUB_OFFLINE=1`` (or no network) resolves from the local cache
only; a model that is not there is a clear error, never a hang or a traceback.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Optional

from moa_cpp.errors import InvalidArgumentError, MoaIOError

DEFAULT_QUANT = "Q4_K_M"
_SPEC = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<quant>[\w.-]+))?$")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def parse_spec(spec: str) -> tuple:
    """``user/repo[:quant]`` -> (repo, quant or None); anything else is an InvalidArgumentError."""
    m = _SPEC.match(spec.strip())
    if not m:
        raise InvalidArgumentError(f"-hf {spec!r}: expected user/repo[:quant], e.g. "
                                   f"bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M")
    return m.group("repo"), m.group("quant")


def pick_file(files: list, quant: Optional[str], repo: str) -> list:
    """The repo files to fetch for ``quant`` (llama.cpp's rule, module doc): the model first, then
    the other parts of a split model."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower())
    if not ggufs:
        raise MoaIOError(f"-hf {repo}: the repo has no .gguf file")
    want = (quant or DEFAULT_QUANT).lower()
    hits = [f for f in ggufs if want in Path(f).name.lower()]
    if not hits:
        if quant:
            raise MoaIOError(f"-hf {repo}:{quant}: no .gguf file with {quant!r} in its name; the repo has: "
                             + ", ".join(Path(f).name for f in ggufs))
        hits = ggufs
    first = hits[0]
    m = _SPLIT.search(first)
    if not m:
        return [first]
    stem = first[:m.start()]
    return [first] + [f for f in hits if f != first and f.startswith(stem) and _SPLIT.search(f)]


def hub_cache_dir() -> Optional[str]:
    """huggingface_hub's cache folder as the environment says now (None: its default). It reads
    HF_HUB_CACHE / HF_HOME once at import; reading them here honours later changes (tests, wrappers)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def hub_offline() -> bool:
    """HF_HUB_OFFLINE set: the local cache only."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _cached_files(repo: str, cache_dir: Optional[str]) -> Optional[tuple]:
    """(snapshot folder, its .gguf files) of ``repo`` in the local cache, or None."""
    from huggingface_hub import snapshot_download
    try:
        snap = Path(snapshot_download(repo, cache_dir=cache_dir, local_files_only=True, allow_patterns=["*.gguf"]))
    except Exception:          # not cached (huggingface_hub raises several classes for it)
        return None
    files = [str(p.relative_to(snap)) for p in snap.rglob("*.gguf")]
    return (snap, files) if files else None


def resolve_hf(spec: str) -> str:
    """The local path of the GGUF that ``-hf spec`` names, downloaded into huggingface_hub's cache
    if needed (see the module doc)."""
    repo, quant = parse_spec(spec)
    cache_dir = hub_cache_dir()
    cached = _cached_files(repo, cache_dir)
    if cached is not None:
        snap, files = cached
        try:
            chosen = pick_file(files, quant, repo)
        except MoaIOError:
            chosen = None            # cached, but not this quant: ask the hub (unless offline)
        if chosen and all((snap / f).is_file() for f in chosen):
            return str(snap / chosen[0])
    if hub_offline():
        raise MoaIOError(f"-hf {spec}: not in the Hugging Face cache ({cache_dir or 'the default cache'}) and "
                         f"HF_HUB_OFFLINE is set: run once online, or pass the file with -m")
    from huggingface_hub import HfApi, hf_hub_download
    print(f"-hf {spec}: asking the Hugging Face hub (HF_HUB_OFFLINE=1: the local cache only)", file=sys.stderr,
          flush=True)
    try:
        chosen = pick_file(HfApi().list_repo_files(repo), quant, repo)
        paths = [hf_hub_download(repo, f, cache_dir=cache_dir) for f in chosen]
    except MoaIOError:
        raise
    except Exception as e:       # no network, no such repo, gated: all mean "could not get it"
        raise MoaIOError(f"-hf {spec}: cannot get it from the Hugging Face hub ({type(e).__name__}: {e}); "
                         f"not in the local cache either ({cache_dir or 'the default cache'})") from None
    return paths[0]


def apply_hf_args(args) -> None:
    """``-hf`` / ``-hfd`` on a parsed command line: set ``args.model`` / ``args.drafter`` to the
    files they name (an error if ``-m`` / ``-d`` names one too)."""
    # `train` names its target --target (-m); the other commands -m/--model
    target = "target" if hasattr(args, "target") and not hasattr(args, "model") else "model"
    for flag, src, dest, other in (("-hf", "hf_repo", target, "-m"), ("-hfd", "hf_repo_draft", "drafter", "-d/-md")):
        spec = getattr(args, src, None)
        if not spec:
            continue
        if getattr(args, dest, None):
            raise InvalidArgumentError(f"pass either {other} or {flag}, not both")
        setattr(args, dest, resolve_hf(spec))
