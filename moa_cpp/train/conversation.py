"""The two records the training-prompt pipeline passes around: a :class:`Conversation` (one
validated ShareGPT record as chat messages) and :class:`ReadStats` (what a pass over the data
found). :mod:`moa_cpp.train.sharegpt` makes and counts them, :mod:`moa_cpp.train.exclusion`
filters them; both import them from here (and sharegpt re-exports them).

This module imports no torch and no llama.cpp.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

__all__ = ["Conversation", "Messages", "ReadStats"]

Messages = list  # list[dict[str, str]]: chat messages {"role", "content"}


@dataclass
class ReadStats:
    """What a pass over the file found (filled in while iterating)."""

    records: int = 0            # complete top-level values parsed
    conversations: int = 0      # records that passed validation (yielded by iter_conversations)
    bad_records: int = 0        # records skipped: not a dict / no conversation list / non-string fields
    truncated: bool = False     # the array ended mid-record (or without its closing ']')
    tail_chars: int = 0         # characters of the unfinished tail that were dropped
    chars: int = 0              # characters read
    seconds: float = 0.0
    eval_overlap: int = 0       # conversations dropped by filter_eval_overlap
    human_turns: int = 0        # human turns in the conversations that passed (counted by human_prompts)
    skipped_turns: int = 0      # human turns or answers dropped: empty / over a length limit
    prompts: int = 0            # prompts (or pairs) yielded
    excluded: int = 0           # prompts (or pairs) dropped by drop_prompts (e.g. a held-out set's)
    code_prompts: Optional[int] = None  # with a code share: prompts taken whose dataset answer holds code

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Conversation:
    """One validated record: ``messages`` are chat messages (roles user / assistant / system)."""

    id: str
    messages: Messages = field(default_factory=list)
