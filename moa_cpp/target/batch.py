"""A reusable ``llama_batch`` with numpy views, for :class:`moa_cpp.target.target.Target`.

Allocated once (``llama_batch_init``) for the context's ``n_batch`` tokens and ``n_seq_max``
sequence ids per token, and refilled for every decode: no per-call allocation.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence, Union

import llama_cpp
import numpy as np

from moa_cpp.errors import InvalidArgumentError

SeqIds = Sequence[Union[int, Iterable[int]]]


class LlamaBatch:
    """Owns one ``llama_batch``; ``fill`` writes tokens, positions, sequence ids, output flags."""

    def __init__(self, n_tokens_max: int, n_seq_max: int) -> None:
        self.n_tokens_max = n_tokens_max
        self.n_seq_max = n_seq_max
        self.batch: Optional[llama_cpp.llama_batch] = llama_cpp.llama_batch_init(n_tokens_max, 0, n_seq_max)
        b = self.batch
        self._token = np.ctypeslib.as_array(b.token, shape=(n_tokens_max,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(n_tokens_max,))
        self._n_seq_id = np.ctypeslib.as_array(b.n_seq_id, shape=(n_tokens_max,))
        self._logits = np.ctypeslib.as_array(b.logits, shape=(n_tokens_max,))
        # seq_id is a pointer per token to n_seq_max ids (llama_batch_init allocates each row).
        self._seq_rows = [np.ctypeslib.as_array(b.seq_id[i], shape=(n_seq_max,)) for i in range(n_tokens_max)]
        self._seq0 = 0    # leading rows whose first sequence id is known to be 0 (saves a loop per decode)

    def fill(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: Optional[SeqIds], last_only: bool = False,
             outputs: Optional[np.ndarray] = None) -> None:
        """Write one decode's inputs; every row requests logits, or only the last one, or the
        rows where ``outputs`` (bool per row) is set."""
        n = len(tokens)
        if not 0 < n <= self.n_tokens_max:
            raise InvalidArgumentError(f"decode: {n} tokens; a decode takes 1..{self.n_tokens_max} (n_batch)")
        self._token[:n] = tokens
        self._pos[:n] = positions
        if outputs is not None:
            self._logits[:n] = outputs
        else:
            self._logits[:n] = 0 if last_only else 1
            self._logits[n - 1] = 1
        if seq_ids is None:
            self._n_seq_id[:n] = 1
            if self._seq0 < n:        # rows up to _seq0 already hold sequence 0 alone
                for i in range(n):
                    self._seq_rows[i][0] = 0
                self._seq0 = n
        else:
            if len(seq_ids) != n:
                raise InvalidArgumentError(f"decode: {len(seq_ids)} seq_ids entries for {n} tokens")
            self._seq0 = 0
            for i, s in enumerate(seq_ids):
                ids = [int(s)] if isinstance(s, (int, np.integer)) else [int(x) for x in s]
                if not ids or len(ids) > self.n_seq_max or min(ids) < 0 or max(ids) >= self.n_seq_max:
                    raise InvalidArgumentError(
                        f"decode: token {i}: sequence ids {ids} must be 1..{self.n_seq_max} ids in [0, {self.n_seq_max})")
                self._n_seq_id[i] = len(ids)
                self._seq_rows[i][: len(ids)] = ids
        self.batch.n_tokens = n

    def fill_one(self, token: int, pos: int) -> None:
        """One token of sequence 0 with its logits (the plain loop's step; no checks)."""
        self._token[0] = token
        self._pos[0] = pos
        self._logits[0] = 1
        self._n_seq_id[0] = 1
        if self._seq0 < 1:
            self._seq_rows[0][0] = 0
            self._seq0 = 1
        self.batch.n_tokens = 1

    def free(self) -> None:
        if self.batch is not None:
            self._seq_rows = []
            llama_cpp.llama_batch_free(self.batch)
            self.batch = None
