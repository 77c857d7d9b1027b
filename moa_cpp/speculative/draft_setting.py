"""The draft options of a generator: the draft shape (``"chain:N"``, ``"tree:DEPTH,TOPK,TOTAL"``,
``"auto[:KMAX]"``, ``"none"``: :func:`parse_draft`, default :data:`DEFAULT_DRAFT`) and which kind
of drafter a GGUF is (:func:`is_moa_drafter`: an MoA drafter, or a small LLM for draft-model
speculation). Shared by the Python API, the CLI, the server and the remote client."""
from __future__ import annotations

from pathlib import Path
from typing import Union

from moa_cpp.errors import FormatError
from moa_cpp.speculative.types import DraftConfig

__all__ = ["DEFAULT_DRAFT", "is_moa_drafter", "parse_draft"]

# The draft setting of the library, the CLI and the server when none is given: cost-aware chains
# of up to 8 drafts, chosen every cycle from the measured verify cost (never slower than plain).
DEFAULT_DRAFT = "auto:8"


def parse_draft(spec: Union[str, DraftConfig, None]) -> DraftConfig:
    """"chain:N", "tree:DEPTH,TOPK,TOTAL", "auto[:KMAX]", "none" (or a DraftConfig) -> DraftConfig;
    None -> :data:`DEFAULT_DRAFT`."""
    if spec is None:
        spec = DEFAULT_DRAFT
    if isinstance(spec, DraftConfig):
        return spec
    s = spec.strip().lower()
    if s in ("none", "off", "no-draft"):
        return DraftConfig("none")
    if s.startswith("auto"):
        _, _, arg = s.partition(":")
        return DraftConfig("auto", chain=int(arg or 8))
    kind, _, arg = s.partition(":")
    try:
        if kind == "chain":
            return DraftConfig("chain", chain=int(arg or 3))
        if kind == "tree":
            d, k, t = (int(x) for x in (arg or "6,8,62").split(","))
            return DraftConfig("tree", depth=d, topk=k, total=t)
    except ValueError as e:
        raise ValueError(f"bad draft spec {spec!r}: {e}") from None
    raise ValueError(f"bad draft spec {spec!r}: expected chain:N, tree:DEPTH,TOPK,TOTAL or none")


def is_moa_drafter(path: Union[str, Path]) -> bool:
    """True if ``path`` is an MoA drafter GGUF (general.architecture "moa"), False for any other
    GGUF (e.g. a small LLM for draft-model speculation). FileNotFoundError if there is no such
    file, FormatError (what is wrong with it) if it is not a whole GGUF."""
    import gguf
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"drafter not found: {p}")
    try:
        field_ = gguf.GGUFReader(str(p)).fields.get("general.architecture")
    except Exception as e:  # gguf-py's words are numpy's ("index 0 is out of bounds"): say what is wrong
        from moa_cpp.format.check import gguf_problem
        problem = gguf_problem(p) or f"not a readable GGUF file (gguf-py: {type(e).__name__})"
        raise FormatError(f"drafter {p}: {problem}") from None
    return field_ is not None and bytes(field_.parts[-1]).decode("utf-8", "replace") == "moa"
