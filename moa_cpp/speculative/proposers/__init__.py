"""Proposers: who drafts, and :func:`make_proposer`, the one place that builds them (the
generator, the server's sessions and the remote client all go through it).

- :mod:`.moa` — the MoA drafter (reads the target's K/V): chain or EAGLE-2 dynamic tree;
- :mod:`.draft_model` — a small LLM with the target's tokenizer (llama.cpp's ``-md``);
- :mod:`.ngram` — prompt lookup over the verified text: free drafts, no model;
- :mod:`.hybrid` — several of them merged into one verification tree (``moa,ngram``).

``--spec-type`` names them as llama.cpp does its speculative types: ``moa``, ``draft``,
``ngram``, or a comma list for a hybrid.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

from moa_cpp.errors import InvalidArgumentError
from moa_cpp.speculative.types import DraftConfig
from moa_cpp.speculative.proposers.draft_model import DraftModelProposer
from moa_cpp.speculative.proposers.hybrid import HybridProposer, merge
from moa_cpp.speculative.proposers.moa import MoAProposer
from moa_cpp.speculative.proposers.ngram import DEFAULT_N_MAX, DEFAULT_N_MIN, NgramProposer

__all__ = ["DraftModelProposer", "HybridProposer", "MoAProposer", "NgramProposer", "NgramSettings", "SPEC_TYPES",
           "make_proposer", "merge", "parse_spec_type", "resolve_spec_type"]

SPEC_TYPES = ("moa", "draft", "ngram")
# drafter rows per cycle a proposer's state is sized for: the widest tree a request may ask
N_DRAFT_MAX = 1 + 8 * 64


@dataclass(frozen=True)
class NgramSettings:
    """Prompt-lookup key sizes: keys of ``n_max`` tokens down to ``n_min`` are tried."""

    n_min: int = DEFAULT_N_MIN
    n_max: int = DEFAULT_N_MAX


def parse_spec_type(spec: Union[str, Sequence[str], None]) -> tuple:
    """``"moa"``, ``"ngram"``, ``"moa,ngram"``, ... -> ``("moa", "ngram")``; ``"none"``/empty -> ()."""
    if spec is None:
        return ()
    parts = [p.strip().lower() for p in (spec.split(",") if isinstance(spec, str) else spec)]
    parts = [p for p in parts if p and p != "none"]
    bad = [p for p in parts if p not in SPEC_TYPES]
    if bad:
        raise ValueError(f"unknown speculative type {bad[0]!r}: expected {', '.join(SPEC_TYPES)}, a comma list of "
                         "them (e.g. moa,ngram) or none")
    if len(set(parts)) != len(parts):
        raise ValueError(f"speculative type {spec!r} names a proposer twice")
    if "moa" in parts and "draft" in parts:
        raise ValueError("moa and draft cannot be combined: a generation has one drafter model")
    return tuple(parts)


def resolve_spec_type(requested: Union[str, Sequence[str], None], *, drafter: bool, draft_model: bool,
                      fallback: tuple = ()) -> tuple:
    """Who drafts, decided in this one place for the Python API, the CLI and the server:
    ``requested`` (a spec type, see :func:`parse_spec_type`) if given, else ``moa`` with an MoA
    drafter, ``draft`` with a draft model, else ``fallback`` (the Python API: () = plain
    decoding; the CLI and the server: ``("ngram",)``, prompt lookup, free). A requested kind
    without its model is a ValueError."""
    if requested is None:
        return ("moa",) if drafter else ("draft",) if draft_model else tuple(fallback)
    kinds = parse_spec_type(requested)
    if "moa" in kinds and not drafter:
        raise InvalidArgumentError("spec type moa needs an MoA drafter (-d/--drafter; the embedded one without -m)")
    if "draft" in kinds and not draft_model:
        raise InvalidArgumentError("spec type draft needs a draft model (-md/--draft-model: a small LLM GGUF with the "
                         "target's tokenizer)")
    return kinds


def _followable(kinds: tuple, target) -> tuple:
    """``kinds`` less what ``target``'s architecture cannot take, each refusal said in one line
    (moa_cpp.format.arch: a recurrent state that cannot roll back decodes plainly; the drafter needs
    attention K/V)."""
    import logging

    from moa_cpp.format.arch import drafter_refusal, speculation_refusal

    arch = getattr(target, "arch", "?")
    why = speculation_refusal(arch, getattr(target, "recurrent", False), getattr(target, "hybrid", False),
                              getattr(target, "rollback_limit", None))
    if why:
        logging.getLogger("moa_cpp").warning("speculation off: %s; decoding plainly", why)
        return ()
    why = drafter_refusal(arch) if "moa" in kinds else None
    if why:
        logging.getLogger("moa_cpp").warning("MoA drafting off: %s", why)
        return tuple(k for k in kinds if k != "moa")
    return kinds


def make_proposer(kinds: Union[str, Sequence[str], None], target, config: DraftConfig, *, drafter=None,
                  draft_model: Union[str, Path, None] = None, n_ctx: Optional[int] = None,
                  n_threads: Optional[int] = None, n_gpu_layers: int = 0,
                  ngram: NgramSettings = NgramSettings(), n_draft_max: int = N_DRAFT_MAX):
    """The proposer of ``kinds`` (see :func:`parse_spec_type`) for ``target``, or None (plain).

    ``drafter``: a :class:`~moa_cpp.drafter.drafter.DrafterModel` (``moa``; its state holds ``n_ctx``
    positions, default the target's, and ``n_draft_max`` draft rows); ``draft_model``: the path
    of a small LLM GGUF (``draft``, loaded in its own context like the target's). ``target`` may
    be None where no target runs here (the remote client: ``moa`` needs ``n_ctx`` then)."""
    from moa_cpp.drafter.drafter import DrafterState

    kinds = parse_spec_type(kinds)
    if target is not None and kinds:
        kinds = _followable(kinds, target)
        if not kinds:
            return None
    n_ctx = n_ctx or target.n_ctx
    n_batch = target.n_batch if target is not None else 512
    parts: list = []
    try:
        for kind in kinds:
            if kind == "moa":
                if drafter is None:
                    raise InvalidArgumentError("speculative type moa needs an MoA drafter (-d/--drafter)")
                state = DrafterState(drafter, n_ctx=n_ctx, n_draft_max=n_draft_max, n_batch=n_batch)
                parts.append(MoAProposer(state, config))
            elif kind == "draft":
                if draft_model is None:
                    raise InvalidArgumentError("speculative type draft needs a draft model (-md/--draft-model)")
                parts.append(DraftModelProposer.from_path(draft_model, config if config.mode != "tree" else
                                                          DraftConfig("chain", chain=4), target=target, n_ctx=n_ctx,
                                                          n_threads=n_threads, n_gpu_layers=n_gpu_layers))
            else:
                parts.append(NgramProposer(config, n_min=ngram.n_min, n_max=ngram.n_max))
    except BaseException:
        for p in parts:
            getattr(p, "close", lambda: None)()
        raise
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else HybridProposer(parts, list(kinds), config)


def moa_state(proposer):
    """The MoA drafter state inside ``proposer`` (itself or a hybrid's part), or None."""
    for p in getattr(proposer, "proposers", [proposer]):
        if isinstance(p, MoAProposer):
            return p.state
    return None
