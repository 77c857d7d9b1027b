"""Grammar-constrained rows: llama.cpp's own grammar sampler on every verification row.

llama-cpp-python constrains generation with ``llama_sampler_init_grammar`` in its sampler chain
(after the penalties, before top-k / temperature / greedy): the sampler sets every token the
grammar cannot take next to -inf, and accepting a sampled token advances its state. Under
speculation every verification row is constrained by the state reached along its own path:
the root's row by the generation's state, the row of draft node i by that state advanced by
the path's tokens (tree branches carry their own state: ``llama_sampler_clone``). A draft the
grammar refuses gets -inf at its parent's row, so verification rejects it: it is never emitted,
and its subtree's rows are never used.

Greedy rows are masked lazily, as llama.cpp's common sampler does ("grammar first" is the
expensive path): masking only removes tokens, so where the row's argmax is allowed it is also
the constrained argmax and the row is left as it is. Sampling needs the whole masked row.

The grammar text comes from the user: llama.cpp's parser returns NULL for a grammar it cannot
parse (or one with left recursion), which here is a ValueError, never an abort. Accepting a
token the grammar refuses would abort inside llama.cpp, so a token is accepted only after
:meth:`Grammar.allows` said yes.
"""
from __future__ import annotations

import ctypes
from typing import Optional

import llama_cpp
import numpy as np

from moa_cpp.speculative.types import Proposal

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)
assert _TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)


class Grammar:
    """One state of a llama.cpp grammar sampler over a target's vocabulary."""

    def __init__(self, ptr, n_vocab: int, eog: frozenset) -> None:
        self._ptr = ptr
        self._n_vocab = n_vocab
        self._eog = eog
        self._one = np.zeros(1, _TOKEN_DATA)

    @classmethod
    def compile(cls, target, text: str, root: str = "root") -> "Grammar":
        """Parse GBNF ``text`` for ``target``'s vocabulary; ValueError if llama.cpp refuses it."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError("grammar: expected a non-empty GBNF string")
        ptr = llama_cpp.llama_sampler_init_grammar(target._vocab, text.encode("utf-8"), root.encode("utf-8"))
        if not ptr:
            raise ValueError("grammar: llama.cpp could not parse it (undefined rule, syntax error, left "
                             f"recursion or no rule named {root!r}; llama.cpp's log says where)")
        return cls(ptr, target.n_vocab, frozenset(int(t) for t in target.eog_tokens))

    def clone(self) -> "Grammar":
        return Grammar(llama_cpp.llama_sampler_clone(self._ptr), self._n_vocab, self._eog)

    def _apply(self, data: np.ndarray) -> None:
        arr = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), size=data.size,
            selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self._ptr, ctypes.byref(arr))

    def allows(self, token: int) -> bool:
        """True if the grammar can take ``token`` next (an EOG token: if the grammar is complete)."""
        one = self._one
        one["id"], one["logit"], one["p"] = int(token), 0.0, 0.0
        self._apply(one)
        return bool(np.isfinite(one["logit"][0]))

    def mask(self, row: np.ndarray) -> None:
        """Set ``row[t] = -inf`` (in place) for every token the grammar cannot take next."""
        data = np.empty(row.shape[-1], _TOKEN_DATA)
        data["id"] = np.arange(row.shape[-1], dtype=np.int32)
        data["logit"] = row
        data["p"] = 0.0
        self._apply(data)
        row[:] = data["logit"]

    def accept(self, token: int) -> None:
        """Advance by ``token`` (which :meth:`allows` must have allowed)."""
        llama_cpp.llama_sampler_accept(self._ptr, int(token))

    def advanced(self, token: int) -> Optional["Grammar"]:
        """A new state: this one after ``token``; None if the grammar refuses it or it ends the
        generation (nothing follows an EOG token)."""
        if int(token) in self._eog or not self.allows(token):
            return None
        g = self.clone()
        g.accept(token)
        return g

    def close(self) -> None:
        if self._ptr:
            llama_cpp.llama_sampler_free(self._ptr)
            self._ptr = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:      # interpreter shutdown: llama_cpp may be gone already
            pass


def constrain_rows(logits: np.ndarray, state: Grammar, greedy: bool,
                   proposal: Optional[Proposal] = None) -> np.ndarray:
    """``logits`` [rows, V] with each row constrained by its path's grammar state (a copy when
    anything changes). Row 0 follows ``state``; with a ``proposal``, row i + 1 follows ``state``
    advanced along the path to draft node i (rows under a refused draft are left alone: they
    cannot be reached)."""
    states: list = [state]
    if proposal is not None:
        for i in range(proposal.n):
            par = int(proposal.parents[i])
            parent = states[par + 1] if par >= 0 else state
            states.append(parent.advanced(int(proposal.tokens[i])) if parent is not None else None)
    out = logits
    for r in range(logits.shape[0]):
        s = states[r] if r < len(states) else None
        if s is None:
            continue
        if greedy and s.allows(int(np.argmax(out[r]))):
            continue
        if out is logits:
            out = np.array(logits, dtype=np.float32, copy=True)
        s.mask(out[r])
    for s in states[1:]:
        if s is not None:
            s.close()
    return out
