"""The target model: a llama.cpp context whose every decode also captures per-layer K/V.

:class:`Target` is what the engine, the front ends and the trainer use. It is split by role over
three modules that hold the only calls into llama-cpp-python (docs/llama-cpp.md#own-context):

- :mod:`moa_cpp.target.setup` -- loading the GGUF and the parameters of the target's **own**
  ``llama_context`` (``cb_eval`` can only be set at context creation and ``Llama(...)`` does not
  expose it), with the native ``moa_capture_eval_cb`` as the eval callback (no Python runs per
  graph node);
- :mod:`moa_cpp.target.text` -- tokens and text, special tokens, the chat template;
- :mod:`moa_cpp.target.context` -- :class:`~moa_cpp.target.context.TargetContext`: the handles
  (model, context, batch, capture), decoding with capture, the KV cache, lifetime.

This module adds what is measured on a target: :meth:`Target.exact_rows`, the largest batch
whose rows are bit-identical to single-token decodes (:mod:`moa_cpp.target.exactness`, which works on a
``TargetContext``). Helpers elsewhere: :mod:`moa_cpp.chat_template` (prompts from chat messages),
:mod:`moa_cpp.target.text_stream` (streamed text), :mod:`moa_cpp.target.llama_log` (llama.cpp's process-wide log).

Example::

    from moa_cpp.target.target import Target
    with Target.from_path("model.gguf", n_ctx=2048) as tgt:
        ids = tgt.tokenize("The quick brown fox")
        logits = tgt.decode(ids)            # [len(ids), n_vocab]
        lsa_in = tgt.captured_lsa_in()      # [len(ids), n_layer, 2*n_head_kv*head_dim]
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from moa_cpp.errors import MoaError
from moa_cpp.target.exactness import cached_exact_rows as _cached_exact_rows, exact_rows as _measured_exact_rows
from moa_cpp.target.context import TargetContext

__all__ = ["MAX_VERIFY_ROWS", "Target"]

# The most rows a verification batch may hold: on the CPU, llama.cpp switches to another
# kernel path at 64 rows (measured on SmolLM2 Q4_1 / Q8_0 with flash attention).
MAX_VERIFY_ROWS = 63


class Target(TargetContext):
    """A GGUF target model with its own context and a native K/V capture
    (:class:`~moa_cpp.target.context.TargetContext`), and the largest decode batch that stays
    bit-identical to plain decoding on it (:meth:`exact_rows`).

    Use :meth:`from_path` or :meth:`from_llama`; the constructor is internal.
    Not thread-safe: one thread at a time.
    """

    def __init__(self, model: Any, path: Path, **kwargs: Any) -> None:
        self._max_exact_rows: Optional[int] = None   # declared by a caller (overrides measuring)
        self._exact_known: dict = {}                   # upto -> measured exact rows
        super().__init__(model, path, **kwargs)

    def sibling(self, *, n_ctx: Optional[int] = None, n_threads: Optional[int] = None) -> "Target":
        """Another context on this target's model (weights shared, not copied): one per
        concurrent generation, e.g. a server's sessions. Keeps this Target's model alive."""
        if self._model is None:
            raise MoaError("the target is closed")
        t = Target(self._model, self.path, owns_model=False, keep_alive=self,
                   n_ctx=n_ctx or self.n_ctx, n_batch=self.n_batch,
                   n_ubatch=self.n_ubatch if self.n_ubatch_given else None,
                   n_threads=n_threads if n_threads is not None else self.n_threads,
                   n_seq_max=self.n_seq_max, cache_type=self.cache_type,
                   install_callback=self._has_callback, flash_attn=self.flash_attn, kv_unified=self.kv_unified)
        t.repack, t.n_gpu_layers, t.rpc = self.repack, self.n_gpu_layers, self.rpc
        t.chat_template = self.chat_template
        t._exact_known = self._exact_known          # same model, same build: same exactness
        t._eog_tokens = self._eog_tokens            # same vocabulary (None: read on first use)
        t._max_exact_rows = self._max_exact_rows
        return t

    def exact_rows(self, upto: int = MAX_VERIFY_ROWS) -> int:
        """Largest decode batch (at most ``upto`` rows) whose every row's logits equal a
        single-token decode's bit for bit: lossless greedy verification stays within it.
        Measured once per model file, build, threads and settings and cached on disk
        (:mod:`moa_cpp.target.exactness`); asking only as far as needed keeps the measurement short
        (the cost-aware default needs 9 rows, a 62-node tree 63). Uses the KV cache: call it
        between generations."""
        upto = max(1, min(MAX_VERIFY_ROWS, int(upto)))
        if self._max_exact_rows is not None:
            return min(self._max_exact_rows, upto)
        known = self._exact_known.get(upto)
        if known is None:
            known = self._exact_known[upto] = min(upto, int(_measured_exact_rows(self, upto)))
        return known

    def knows_exact_rows(self, upto: int = MAX_VERIFY_ROWS) -> bool:
        """Whether :meth:`exact_rows` ``(upto)`` answers without measuring (declared, asked
        before, or cached on disk)."""
        upto = max(1, min(MAX_VERIFY_ROWS, int(upto)))
        return (self._max_exact_rows is not None or upto in self._exact_known
                or _cached_exact_rows(self, upto) is not None)

    @property
    def max_exact_rows(self) -> int:
        """:meth:`exact_rows` up to :data:`MAX_VERIFY_ROWS` (63)."""
        return self.exact_rows(MAX_VERIFY_ROWS)

    @max_exact_rows.setter
    def max_exact_rows(self, rows: int) -> None:
        """Declare it (tests, or a value measured elsewhere)."""
        self._max_exact_rows = int(rows)
