"""Incremental detokenisation for streaming (:class:`TextStream`): the text of a growing token
sequence, exactly as :meth:`moa_cpp.target.Target.detokenize` renders the whole sequence."""
from __future__ import annotations

import ctypes
from typing import Sequence

import llama_cpp

from .errors import MoaError

__all__ = ["TextStream"]


class TextStream:
    """The text of a growing token sequence, exactly as :meth:`Target.detokenize` renders it
    (leading-space and clean-up rules apply to the whole sequence), without rebuilding ctypes
    arrays per call: tokens and the text buffer are kept and grown by doubling."""

    def __init__(self, vocab) -> None:
        self._vocab = vocab
        self._toks = (llama_cpp.llama_token * 256)()
        self._n = 0
        self._buf = ctypes.create_string_buffer(2048)

    def extend(self, tokens: Sequence[int]) -> str:
        """Append tokens; return the whole text so far."""
        need = self._n + len(tokens)
        if need > len(self._toks):
            grown = (llama_cpp.llama_token * max(need, 2 * len(self._toks)))()
            ctypes.memmove(grown, self._toks, self._n * ctypes.sizeof(llama_cpp.llama_token))
            self._toks = grown
        for i, t in enumerate(tokens):
            self._toks[self._n + i] = int(t)
        self._n = need
        for _ in range(2):
            n = llama_cpp.llama_detokenize(self._vocab, self._toks, self._n, self._buf, len(self._buf), False, False)
            if n >= 0:
                return self._buf.raw[:n].decode("utf-8", "replace")
            self._buf = ctypes.create_string_buffer(max(-n, 2 * len(self._buf)))
        raise MoaError("llama_detokenize failed")
