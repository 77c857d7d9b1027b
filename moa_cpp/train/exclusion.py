"""Which prompts training never uses (issue 12): those repeating an eval prompt (:class:`EvalIndex`,
:func:`filter_eval_overlap`) and those of a held-out set (:func:`prompt_key`, :func:`read_prompt_keys`,
:func:`drop_prompts`, recorded in a manifest as :func:`exclusion_sha256`). For ShareGPT
conversations (:mod:`moa_cpp.train.sharegpt`, which re-exports these as part of its pipeline) and
prompt files alike.

Eval overlap: a conversation is dropped when any of its human turns, normalised (lowercase,
whitespace collapsed), equals a normalised eval prompt (any turn of any set in
``../shared/data/eval``), or contains one of at least ``min_contain_chars`` characters. The
known instruction prefixes of the eval sets (``Complete the code I provided.``, ``Summarize:``)
are also stripped for the containment check, so the bare code or article counts too.

This module imports no torch and no llama.cpp.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence, Union

from moa_cpp.train.conversation import Conversation, ReadStats

__all__ = ["EvalIndex", "default_eval_dir", "drop_prompts", "exclusion_sha256", "filter_eval_overlap", "normalize",
           "prompt_key", "read_prompt_keys"]

# instruction prefixes of the eval sets, stripped for the containment check (normalised form)
_EVAL_PREFIXES = ("complete the code i provided.", "summarize:")


def default_eval_dir() -> Path:
    """``$MOA_EVAL_DIR``, else ``../shared/data/eval`` next to the repository (as bench/eval/run.py)."""
    env = os.environ.get("MOA_EVAL_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data" / "eval"


def normalize(text: str) -> str:
    """Lowercase, whitespace runs collapsed to one space, stripped."""
    return " ".join(text.lower().split())


def prompt_key(item: Union[str, Sequence[dict], dict]) -> str:
    """What identifies a training or held-out sample: its first user message, normalised. ``item``:
    the text, a message list, or a ``prompts.jsonl`` record (``{"prompt": ...}`` or ``{"messages": [...]}``)."""
    if isinstance(item, dict):
        item = item["prompt"] if "prompt" in item else item["messages"]
    if not isinstance(item, str):
        item = next(m["content"] for m in item if m.get("role") == "user")
    return normalize(str(item))


def read_prompt_keys(paths: Iterable[Union[str, os.PathLike]]) -> set[str]:
    """The :func:`prompt_key` of every sample in ``prompts.jsonl`` files, or in the ``prompts.jsonl``
    of run/data directories (``DIR``, ``DIR/data``, ``DIR/data-fixed``; a GGUF: its directory's)."""
    keys: set[str] = set()
    for path in paths:
        p = Path(path)
        if p.suffix == ".gguf":
            p = p.parent
        files = [p] if p.is_file() else [f for f in (p / "prompts.jsonl", p / "data" / "prompts.jsonl",
                                                     p / "data-fixed" / "prompts.jsonl") if f.is_file()]
        if not files and not p.is_dir():
            raise FileNotFoundError(f"{p}: no such prompts file or run directory")
        for f in files:
            keys |= {prompt_key(json.loads(line)) for line in f.read_text().splitlines() if line.strip()}
    return keys


def exclusion_sha256(keys: Iterable[str]) -> str:
    """What a dataset's manifest records of an exclusion (a changed set regenerates the data)."""
    import hashlib

    return hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()


def drop_prompts(items: list, keys: set[str], *, key=lambda x: x, stats: Optional[ReadStats] = None) -> list:
    """``items`` without those whose prompt's :func:`prompt_key` is in ``keys`` (order kept: applied after
    the seeded sample, so a run with an exclusion draws what it would have drawn, minus those)."""
    if not keys:
        return items
    kept = [it for it in items if prompt_key(key(it)) not in keys]
    if stats is not None:
        stats.excluded += len(items) - len(kept)
    return kept


class EvalIndex:
    """Normalised eval prompts, for :meth:`matches` (exact match or containment of a long prompt).

    Containment is found through a key of ``k`` inner words of each long eval prompt (the words
    after its first one, which are whole words wherever the prompt is embedded): a turn is
    searched for the full prompt only when it holds such a word sequence.
    """

    def __init__(self, prompts: Iterable[str], *, min_contain_chars: int = 48, k: int = 6):
        self.k = k
        self.exact: set[str] = set()
        self.long: dict[tuple, list[str]] = {}
        self.n_prompts = 0
        for p in prompts:
            n = normalize(p)
            if not n:
                continue
            self.n_prompts += 1
            self.exact.add(n)
            cores = {n}
            for pre in _EVAL_PREFIXES:
                if n.startswith(pre):
                    cores.add(n[len(pre):].strip())
            for c in cores:
                w = c.split(" ")
                if len(c) >= min_contain_chars and len(w) >= k + 2:
                    self.long.setdefault(tuple(w[1:1 + k]), []).append(c)

    @classmethod
    def from_dir(cls, eval_dir: Union[str, os.PathLike, None] = None, **kw) -> "EvalIndex":
        """Every turn of every ``*.jsonl`` in ``eval_dir`` (default :func:`default_eval_dir`)."""
        d = Path(eval_dir) if eval_dir is not None else default_eval_dir()
        files = sorted(d.glob("*.jsonl"))
        if not files:
            raise FileNotFoundError(f"no eval prompts (*.jsonl) in {d}: cannot filter conversations that repeat "
                                    "them (pass the eval directory, or none to disable the filter)")
        prompts: list[str] = []
        for f in files:
            for line in f.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    turns = json.loads(line).get("turns") or []
                    prompts += [t for t in turns if isinstance(t, str)]
        return cls(prompts, **kw)

    def matches(self, text: str) -> bool:
        """``text`` (a human turn) repeats an eval prompt."""
        n = normalize(text)
        if n in self.exact:
            return True
        if not self.long:
            return False
        w = n.split(" ")
        k = self.k
        if len(w) < k:
            return False
        grams = zip(*(w[i:] for i in range(k)))
        if self.long.keys().isdisjoint(grams):
            return False
        for g in zip(*(w[i:] for i in range(k))):
            for c in self.long.get(g, ()):
                if c in n:
                    return True
        return False

    def overlaps(self, conv: Conversation) -> bool:
        """Any human turn of ``conv`` repeats an eval prompt."""
        return any(m["role"] == "user" and self.matches(m["content"]) for m in conv.messages)


def filter_eval_overlap(convs: Iterable[Conversation], index: Optional[EvalIndex], *,
                        stats: Optional[ReadStats] = None) -> Iterator[Conversation]:
    """``convs`` without those repeating an eval prompt (counted in ``stats.eval_overlap``).
    ``index`` None: no filtering."""
    for c in convs:
        if index is not None and index.overlaps(c):
            if stats is not None:
                stats.eval_overlap += 1
            continue
        yield c
