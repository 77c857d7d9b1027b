"""Prompt-cache reuse: what a loop's caches hold after a generation, and how much of the next
prompt they spare.

After a generation the target's KV cache holds the prompt and the verified tokens at positions
0..n - 1 (less the carry: accepted tokens still to be re-decoded); the proposer holds its own
view of a prefix of them (the MoA drafter's CA + SA, the n-gram index, a draft model's KV). The
next prompt decodes only what follows the prefix it shares with them.

Trust: the target's ``kv_version`` is bumped by every write to its KV cache, so a cache someone
else wrote since (calibration, exactness checks, a remote session on the same context) is never
reused. Sliding-window caches (n_swa > 0) may have evicted a prefix's cells: never reused.

Exactness: the reused prefix's K/V were computed in other batch shapes than a fresh prefill's.
Greedy output is the same as from empty caches wherever the target computes every batch size
used bit for bit alike (SmolLM2 on the CPU: batches up to 63 rows, so ``n_ubatch`` <= 63); with
larger ubatches they differ in the last bits, as with llama.cpp's own prompt cache
(tests/test_prompt_cache.py, bench/prompt_cache.py).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..errors import MoaError


class PrefixCache:
    """The tokens a :class:`~moa_cpp.speculative.loop.SpeculativeLoop`'s caches hold."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self._last: Optional[tuple] = None      # (target.kv_version, Generation) after the latest write

    def record(self, g: Any) -> None:
        """The loop wrote the target's KV cache for generation ``g`` (after every step)."""
        self._last = (self.target.kv_version, g)

    def _held(self) -> Optional[np.ndarray]:
        if self._last is None or self._last[0] != self.target.kv_version:
            return None
        g = self._last[1]
        return np.asarray(g.ids[: g.n - len(g.carry)], dtype=np.int32)

    @property
    def n_cached(self) -> int:
        """Tokens the target's KV cache holds (0: none that can be trusted)."""
        held = self._held()
        return 0 if held is None else int(held.size)

    def common(self, prompt: np.ndarray) -> int:
        """Leading prompt tokens the target's KV cache holds at their positions (at most all but
        the last: its row gives the first token)."""
        held = self._held()
        if held is None or self.target.n_swa > 0:
            return 0
        n = min(held.size, prompt.size - 1)
        diff = np.flatnonzero(held[:n] != prompt[:n])
        return int(diff[0]) if diff.size else n

    def prepare(self, prompt: np.ndarray, proposer: Any, drafting: bool, capture: bool,
                reuse: bool) -> tuple[int, int]:
        """Make the caches ready for ``prompt``: ``(kept, seen)`` = the target keeps positions <
        kept (the prefill decodes the rest), the proposer knows positions < seen (it is fed the
        rest). A capturing drafter needs the target's K/V of every position it does not hold, so
        then kept = seen. A proposer this generation does not use is reset (its view would be
        stale next time)."""
        kept = self.common(prompt) if reuse else 0
        seen = 0
        if proposer is not None:
            if drafting and hasattr(proposer, "rewind"):
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
        return kept, seen
