"""Prompt-cache reuse that is exact by construction: a reused KV cell is one a fresh prefill of
the new prompt would compute bit for bit the same, so an answer never depends on what the
caches held before (issue 41).

Why reuse is not free: llama.cpp's kernels switch with a batch's row count, so the K/V of a
position computed inside a 73-row prefill can differ in the last bits from the same position
computed inside a 52-row one; a prompt that reuses such cells can part from a fresh prefill's
answer at a near-tie. Two rules keep every reused cell equal to a fresh prefill's:

- **Canonical** (the prefill chunk ``U`` <= the target's exact batch size ``E``, measured once
  per model: batches of up to E rows compute every row bit for bit as a one-token decode does):
  every cell the loop writes -- prefill chunks, verification batches (at most E rows), plain
  steps -- holds exactly what a fresh prefill computes for it, so everything the caches hold can
  be reused, an earlier answer included. Except one kind: a one-token decode past the KV cache's
  first 256-cell block takes the CPU's split-KV attention (other bits than a batch row;
  ``LONE_ROW_CELLS`` in target_context.py), so reuse stops at the first such cell
  (``Target.lone_row_from``): there a plain-decoded answer is decoded again, as in the aligned
  rule, while drafted answers (verification batches) stay reusable.
- **Aligned** (otherwise: a large ``-ub``, a target exact only for small batches, GPUs): the
  prefill decodes chunks of ``U`` tokens at fixed absolute positions (0..U-1, U..2U-1, ...).
  A fresh prefill of a prompt computes each full chunk from the same tokens in the same batch
  shape, so only whole chunks that an earlier prefill computed from the same tokens are
  reused; the partial last chunk and every cell written while decoding (an earlier answer) are
  computed again, as a fresh prompt's prefill would.

``U`` is the context's ``n_ubatch`` where the user set it (``-ub``); by default it is the
target's exact batch size when that is at least :data:`AUTO_MIN_ROWS` rows (capped at
``n_ubatch``), so that the common case is canonical, else ``n_ubatch``.

Copies in RAM (canonical rule; llama-server's ``--cache-ram``): between generations
(:meth:`PrefixCache.settle`, which the server and the chat run when an answer is out) the loop
keeps a copy of the reusable cells (llama.cpp's sequence state) in RAM, up to ``ram_bytes``
(least recently used dropped first). A later prompt that shares a longer prefix with a copy than
with the KV cache gets that copy put back into the emptied cache and decodes only the rest: one
user asking again, several conversations taking turns on one session. The copy holds the very
bits computed earlier, in the same cells in the same order, so this reuse is as exact as keeping
them (a capturing drafter's generation never restores: the drafter would lack those positions).

Trust: the target's ``kv_version`` is bumped by every write to its KV cache, so a cache someone
else wrote since (calibration, exactness checks, a remote session on the same context) is never
reused. Sliding-window caches (n_swa > 0) may have evicted a prefix's cells: never reused.
"""
from __future__ import annotations

import ctypes
from typing import Any, Iterator, Optional

import llama_cpp
import numpy as np

from moa_cpp.errors import MoaError
from moa_cpp.target.target import MAX_VERIFY_ROWS
from moa_cpp.target.context import LONE_ROW_CELLS, TargetContext

# The smallest exact batch worth prefilling in: below it the default chunk is n_ubatch (aligned
# reuse), above it the prefill runs in exact chunks (canonical reuse). Prefill speed on the CPU
# is flat from about this size on (bench/serve/prompt_cache.py --ubatch).
AUTO_MIN_ROWS = 16

# Copies of earlier generations' KV cells kept in RAM (PrefixCache.save, llama-server's --cache-ram,
# default 8192 MiB there): at most this many bytes per loop; a copy only for at least
# RAM_MIN_TOKENS reusable tokens, restored only where it saves at least RAM_MIN_GAIN token decodes
# over what the KV cache holds (a restore costs ~1 ms; a prompt token ~3 ms on SmolLM2, 2 cores).
RAM_BYTES = 1 << 30
RAM_MIN_TOKENS = 8
RAM_MIN_GAIN = 4


class _Copy:
    """One saved sequence: the tokens a prompt may reuse from it and llama.cpp's state bytes."""
    __slots__ = ("tokens", "data", "nbytes", "used")

    def __init__(self, tokens: np.ndarray, data: Any, nbytes: int, used: int) -> None:
        self.tokens, self.data, self.nbytes, self.used = tokens, data, nbytes, used


class PrefixCache:
    """The tokens a :class:`~moa_cpp.speculative.loop.SpeculativeLoop`'s caches hold, and which of
    them a new prompt may reuse."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self._last: Optional[tuple] = None      # (target.kv_version, Generation) after the latest write
        self._exact_end = 0                     # aligned rule: cells < this are whole prefill chunks
        self._shape: Optional[tuple] = None     # (U, canonical), decided once per target
        self.ram_bytes = RAM_BYTES              # copies of earlier generations' caches (save)
        self._ram: list = []                    # _Copy, most recently used first
        self._clock = 0

    # ------------------------------------------------------------------ the prefill's shape

    def shape(self) -> tuple[int, bool]:
        """``(U, canonical)``: the prefill chunk and whether every cell the loop writes equals
        token-by-token decoding's (see the module's doc). Measures the target's exact batch size
        the first time where it is needed (once per model, cached on disk; uses the KV cache)."""
        if self._shape is None:
            t = self.target
            u = int(t.n_ubatch)
            if not getattr(t, "can_rollback", True):
                # a recurrent state cannot drop a suffix at will: no measuring (it rolls back),
                # no reuse (common)
                self._shape = (u, False)
                return self._shape
            if not self._given():
                e = t.exact_rows(min(u, MAX_VERIFY_ROWS))
                if e >= AUTO_MIN_ROWS:
                    u = min(u, e)
            # verification batches are cut to the exact size only where it is 2+ rows
            canonical = u <= MAX_VERIFY_ROWS and t.exact_rows(max(u, 2)) >= max(u, 2)
            self._shape = (u, canonical)
        return self._shape

    def _given(self) -> bool:
        return bool(getattr(self.target, "n_ubatch_given", True))

    def measures_first(self) -> bool:
        """Whether :meth:`shape` will first measure the target's exact batch size (seconds, once
        per model and machine): front ends say so before a user waits for it."""
        if self._shape is not None or not getattr(self.target, "can_rollback", True):
            return False
        u = int(self.target.n_ubatch)
        if self._given():
            return u <= MAX_VERIFY_ROWS and not self.target.knows_exact_rows(max(u, 2))
        return not self.target.knows_exact_rows(min(u, MAX_VERIFY_ROWS))

    def chunks(self, start: int, end: int) -> Iterator[tuple[int, int]]:
        """The prefill's decode calls ``[a, b)`` from ``start`` to ``end``: one chunk of the
        fixed absolute grid of ``U`` positions each (the first may start inside one: ``start`` is
        on the grid under the aligned rule, anywhere under the canonical one)."""
        u = self.shape()[0]
        a = start
        while a < end:
            b = min(end, (a // u + 1) * u)
            yield a, b
            a = b

    # ------------------------------------------------------------------ what the caches hold

    def begin(self, prompt_len: int) -> None:
        """A prefill of ``prompt_len`` tokens starts: under the aligned rule only its whole
        chunks will be reusable."""
        u, canonical = self.shape()
        self._exact_end = prompt_len if canonical else (prompt_len // u) * u

    def record(self, g: Any) -> None:
        """The loop wrote the target's KV cache for generation ``g`` (after every step)."""
        self._last = (self.target.kv_version, g)

    def _held(self) -> Optional[np.ndarray]:
        """The tokens at positions 0.. whose cells a fresh prefill would compute the same."""
        held = self._held_all()
        if held is None:
            return None
        end = held.size
        if not self.shape()[1]:
            end = min(end, self._exact_end)     # cells written while decoding: computed again
        lone = getattr(self.target, "lone_row_from", None)
        if lone is not None:
            end = min(end, lone)                # a one-token decode past the first KV block
        return held[:end]

    def settle(self) -> int:
        """Between generations (a user reads the answer): decode again, in batches of 2..U rows,
        the cells from the first one a one-token decode wrote past the first KV block to the end
        of what the caches hold, so that the next prompt may reuse them (a fresh prefill computes
        them the same). Canonical rule only; the drafter keeps its view (its drafts never change
        an answer). Then keep a copy of those cells in RAM (:meth:`save`). Returns how many
        positions were decoded again."""
        n = self._settle_decode()
        self.save()
        return n

    def _settle_decode(self) -> int:
        held, lone = self._held_all(), getattr(self.target, "lone_row_from", None)
        if held is None or lone is None or lone >= held.size or not self.shape()[1]:
            return 0
        u, end = max(2, self.shape()[0]), int(held.size)
        start = lone - 1 if end - lone == 1 else lone      # never a lone row
        g = self._last[1]
        self.target.rollback(start)
        a = start
        while a < end:
            b = min(end, a + u)
            if end - b == 1:                                 # the last piece would be a lone row
                b -= 1
            self.target.decode(held[a:b], np.arange(a, b, dtype=np.int32))
            a = b
        self.record(g)
        return end - start

    # ------------------------------------------------------------------ copies in RAM

    def save(self) -> bool:
        """Keep a copy of what the target's KV cache holds for the latest generation (sequence 0,
        llama.cpp's ``llama_state_seq_get_data``) with the tokens a prompt may reuse from it, so
        that a later prompt starting as it did is not decoded again even after other prompts
        replaced it in the KV cache (llama-server's ``--cache-ram``). Canonical rule only: there
        every reusable cell is what a fresh prefill computes, and a copy restored into an empty
        cache lands in the same cells in the same order. Copies that a newer one extends are
        dropped; the least recently used go beyond :attr:`ram_bytes`. True if a copy was kept."""
        if self.ram_bytes <= 0 or not self._can_copy() or not self.shape()[1]:
            return False
        held = self._held()
        if held is None or held.size < RAM_MIN_TOKENS:
            return False
        for c in self._ram:
            if c.tokens.size >= held.size and np.array_equal(c.tokens[:held.size], held):
                c.used = self._tick()            # an older copy holds it all already
                return False
        ctx = self.target._ctx
        size = int(llama_cpp.llama_state_seq_get_size(ctx, 0))
        if size <= 0 or size > self.ram_bytes:
            return False
        buf = (ctypes.c_ubyte * size)()
        if int(llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)) != size:
            return False
        self._ram = [c for c in self._ram
                     if not (c.tokens.size <= held.size and np.array_equal(held[:c.tokens.size], c.tokens))]
        self._ram.append(_Copy(held.copy(), buf, size, self._tick()))
        self._ram.sort(key=lambda c: -c.used)
        while sum(c.nbytes for c in self._ram) > self.ram_bytes:
            self._ram.pop()
        return True

    @property
    def ram_copies(self) -> int:
        """Copies held in RAM (:meth:`save`)."""
        return len(self._ram)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _can_copy(self) -> bool:
        """A target of its own context (not a slot of a shared one), without a sliding window."""
        t = self.target
        return isinstance(t, TargetContext) and t._ctx is not None and t.n_swa == 0

    def _restore(self, prompt: np.ndarray, kept: int) -> int:
        """If a copy in RAM holds a longer prefix of ``prompt`` than the KV cache (``kept``,
        by at least RAM_MIN_GAIN tokens), put it in the emptied cache and return how many of its
        positions the prompt reuses (the caller rolls back past them); else 0 (-1: the restore
        failed, the cache is empty)."""
        if not self._ram or not self._can_copy() or not self.shape()[1]:
            return 0
        n_max = prompt.size - 1                 # the last prompt token is decoded: its row gives the first token
        best, best_n = None, kept + RAM_MIN_GAIN - 1
        for c in self._ram:
            n = min(c.tokens.size, n_max)
            diff = np.flatnonzero(c.tokens[:n] != prompt[:n])
            n = self._align(int(diff[0]) if diff.size else n, int(prompt.size))
            if n > best_n:
                best, best_n = c, n
        if best is None:
            return 0
        self.target.clear()
        ok = int(llama_cpp.llama_state_seq_set_data(self.target._ctx, best.data, best.nbytes, 0)) == best.nbytes
        self.target.kv_version += 1             # written behind the target's back
        if not ok:
            self.target.clear()
            self._ram.remove(best)
            return -1
        best.used = self._tick()
        return best_n

    def _held_all(self) -> Optional[np.ndarray]:
        """What the target's KV cache holds from the latest generation (before the lone-row cut)."""
        if self._last is None or self._last[0] != self.target.kv_version:
            return None
        g = self._last[1]
        return np.asarray(g.ids[: g.n - len(g.carry)], dtype=np.int32)

    @property
    def n_cached(self) -> int:
        """Tokens the target's KV cache holds that a prompt may reuse (0: none)."""
        held = self._held()
        return 0 if held is None else int(held.size)

    def common(self, prompt: np.ndarray) -> int:
        """Leading prompt tokens whose cells may be reused: held at their positions, at most all
        but the last (its row gives the first token), whole chunks under the aligned rule."""
        held = self._held()
        # a recurrent state keeps no earlier prefix: reuse would replay it (TargetContext.rollback)
        if held is None or self.target.n_swa > 0 or not getattr(self.target, "can_rollback", True):
            return 0
        n = min(held.size, prompt.size - 1)
        diff = np.flatnonzero(held[:n] != prompt[:n])
        return self._align(int(diff[0]) if diff.size else n, int(prompt.size))

    def _align(self, n: int, end: int) -> int:
        """The prefill of a prompt of ``end`` tokens may start at ``n`` or before: on the chunk
        grid under the aligned rule; under the canonical one anywhere but where its first chunk
        would be one token past the first KV block off the grid (a fresh prefill computes that
        position inside a multi-row chunk, a lone row takes other kernels)."""
        u, canonical = self.shape()
        if not canonical:
            return (n // u) * u
        if n >= LONE_ROW_CELLS and n % u and min(end, (n // u + 1) * u) - n == 1:
            return n - 1
        return n

    def prepare(self, prompt: np.ndarray, proposer: Any, drafting: bool, capture: bool,
                reuse: bool) -> tuple[int, int]:
        """Make the caches ready for ``prompt``: ``(kept, seen)`` = the target keeps positions <
        kept (the prefill decodes the rest), the proposer knows positions < seen (it is fed the
        rest). A capturing drafter needs the target's K/V of every position it does not hold, so
        then kept = seen (on the chunk grid under the aligned rule). A proposer this generation
        does not use is reset (its view would be stale next time)."""
        kept = self.common(prompt) if reuse else 0
        seen = 0
        restored = self._restore(prompt, kept) if reuse and not capture else 0
        if restored:                   # (-1: llama.cpp refused the copy; the cache is empty now)
            kept = max(restored, 0)
            if proposer is not None:
                proposer.reset()       # its view is of the previous generation: fed the whole prompt
        elif proposer is not None:
            if drafting and hasattr(proposer, "rewind"):
                seen = proposer.rewind(kept)
                while capture and self._align(seen, prompt.size) != kept:
                    kept = self._align(seen, prompt.size)
                    seen = proposer.rewind(kept)
            else:
                proposer.reset()
            if capture:
                kept = seen
        if kept:
            try:
                self.target.rollback(kept)
            except MoaError:           # a memory that cannot drop a suffix (recurrent models)
                kept = 0
        if not kept:
            self.target.clear()
            if capture and seen:
                proposer.reset()
                seen = 0
        self._last = None
        self.begin(int(prompt.size))
        return kept, seen
