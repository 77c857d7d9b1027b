"""The target model in its own llama.cpp context, whose every decode also captures per-layer K/V
(:class:`TargetContext`; :class:`moa_cpp.target.target.Target` is this plus what is measured on it).

It creates its **own** ``llama_context`` on the model through the low-level API, because
``cb_eval`` can only be set at context creation and ``Llama(...)`` does not expose it
(docs/llama-cpp.md#own-context); the eval callback is the native ``moa_capture_eval_cb``, so no
Python runs per graph node. Loading and the context's parameters are :mod:`moa_cpp.target.setup`'s,
the vocabulary side (tokens, text, chat template) :class:`~moa_cpp.target.text.TargetText`'s;
this class holds the handles (model, context, batch, capture) and decodes, captures, edits the
KV cache and frees them.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any, Optional, Sequence, TypeVar, Union

import llama_cpp
import numpy as np

from moa_cpp.target.batch import LlamaBatch, SeqIds
from moa_cpp.format.arch import embedding_scale
from moa_cpp.drafter.native import check, check_ptr, ffi, lib
from moa_cpp.errors import CacheFullError, InvalidArgumentError, MoaError
from moa_cpp.target.setup import (ROPE_TYPES, capture_callback, check_context_args, context_params, default_threads,
                           load_model)
from moa_cpp.target.text import TargetText

_T = TypeVar("_T", bound="TargetContext")


# llama.cpp's KV cache is attended in blocks of 256 cells; a one-token decode over more than one
# block takes the CPU's split-KV attention, whose sums differ in the last bits from what a row of
# a multi-row batch computes (measured on SmolLM2 Q4_1, 2 threads: equal at position 255,
# differing by up to 0.7 logit from position 256 on; tests/speculative/test_same_answer.py checks it).
LONE_ROW_CELLS = 256

# Recurrent states (hybrid models' recurrent layers) cannot drop a suffix like KV cells can. Where
# llama.cpp keeps per-token snapshots of them (llama_context_params.n_rs_seq, on the architectures
# of its llm_arch_supports_rs_rollback: lfm2, qwen35, nemotron_h, ...), one rollback of up to this
# many positions after each decode is exact: a verification batch drafts at most this many tokens.
# llama-server sizes it by --draft-max (16); 8 keeps the snapshots' memory (1 + 8 states per
# sequence) modest on large hybrids, and chains longer than 8 rarely pay.
RS_ROLLBACK = 8

class TargetContext(TargetText):
    """A GGUF target model with its own context and a native K/V capture.

    Use :meth:`from_path` or :meth:`from_llama`; the constructor is internal. The context is
    created with a unified KV cache and ``n_seq_max`` sequences (tree verification), flash
    attention on (llama.cpp's CPU default: with it, a row's logits computed in a batch are
    bit-identical to the single-token decode for SmolLM2 Q4_1/Q8_0; without it they differ at
    some positions by up to ~1 logit), ``n_ubatch == n_batch`` by default, and logits for every
    batch row.
    Not thread-safe: one thread at a time.
    """

    def __init__(self, model: Any, path: Path, *, owns_model: bool, keep_alive: Any = None,
                 n_ctx: int = 4096, n_batch: int = 512, n_ubatch: Optional[int] = None,
                 n_threads: Optional[int] = None, n_seq_max: int = 64, cache_type: str = "f16",
                 install_callback: bool = True, flash_attn: bool = True, kv_unified: bool = True) -> None:
        self._model = model
        self._owns_model = owns_model
        self._keep_alive = keep_alive  # e.g. the llama_cpp.Llama that owns the model
        self._ctx = None
        self._batch: Optional[LlamaBatch] = None
        self._cap = None
        self._eog_tokens: Optional[np.ndarray] = None  # read on first use (eog_tokens)
        self._logits_types: dict = {}
        self.path = path
        self.flash_attn = bool(flash_attn)
        self.kv_unified = bool(kv_unified)
        self.chat_template: Optional[str] = None   # overrides the GGUF's (Jinja text or a llama.cpp name)
        self.repack = True  # llama.cpp weight repacking (use_extra_bufts); from_path(repack=False) clears it
        self.rpc: tuple = ()   # rpc-server endpoints holding offloaded layers (from_path(rpc=...))
        self.n_gpu_layers = 0  # layers offloaded (from_path sets it; from_llama keeps the Llama's own choice unknown)
        try:
            self._init_context(n_ctx, n_batch, n_ubatch, n_threads, n_seq_max, cache_type, install_callback)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_path(cls: type[_T], path: Union[str, os.PathLike], n_ctx: int = 4096, n_threads: Optional[int] = None,
                  n_gpu_layers: int = 0, *, n_batch: int = 512, n_ubatch: Optional[int] = None,
                  n_seq_max: int = 64, cache_type: str = "f16", use_mmap: bool = True,
                  install_callback: bool = True, verbose: Optional[bool] = None, flash_attn: bool = True,
                  kv_unified: bool = True, repack: bool = True,
                  rpc: Optional[Sequence[str]] = None, use_mlock: bool = False,
                  chat_template: Optional[str] = None) -> _T:
        """Load a GGUF target.

        Args:
            path: the target GGUF.
            n_ctx: KV cache cells, shared by all sequences (unified cache); llama.cpp pads it
                (to a multiple of 256): read :attr:`n_ctx` for the real size.
            n_threads: CPU threads (default: all usable cores).
            n_gpu_layers: layers to offload (-1: all).
            n_batch: max tokens per :meth:`decode`.
            n_ubatch: tokens per graph evaluation (default ``n_batch``).
            n_seq_max: sequence ids available for tree verification (<= n_batch: llama.cpp
                aborts otherwise, so this is checked first).
            cache_type: KV cache type, ``"f16"`` (llama.cpp default), ``"f32"`` or ``"q8_0"``.
                Capture is unaffected: it reads the F32 K/V before they are cast into the cache.
            use_mmap: map the model file.
            use_mlock: lock the weights in RAM (llama.cpp's ``--mlock``).
            chat_template: a chat template instead of the GGUF's: Jinja text, or the name of one of
                llama.cpp's built-in templates (``chatml``, ``llama3``, ...; ``--chat-template``).
            install_callback: set ``cb_eval`` (False gives a plain context, for benchmarks;
                capture is then impossible).
            flash_attn: flash attention (default on: batch rows then match single-token decodes
                bit for bit on SmolLM2; needed for lossless-by-construction greedy speculation).
            verbose: let llama.cpp log to stderr (process-wide, as in ``llama_cpp.Llama``); None
                keeps what :func:`set_llama_log` chose (quiet if nobody chose).
            kv_unified: one KV cache shared by all sequences (default; tree verification needs
                it). False: one stream of ``n_ctx / n_seq_max`` cells per sequence, faster for
                independent sequences decoded together (batched data generation).
            repack: let llama.cpp repack weights for its faster CPU kernels (default, as llama.cpp;
                ``llama_model_params.use_extra_bufts``). False keeps the file's layout.
            rpc: ``["host:port", ...]`` of llama.cpp ``rpc-server`` processes (``moa-cpp
                rpc-server``): the offloaded layers (``n_gpu_layers``; -1 = all) are split over
                them (llama.cpp's RPC backend; needs a build with ``GGML_RPC=ON``). K/V capture
                works through it (the eval callback reads the tensors back).

        Raises:
            MoaIOError: the file does not exist.
            FormatError: the file is not a whole GGUF (the message says what is wrong).
            MoaError: llama.cpp could not load the model or create the context.
        """
        p = Path(path)
        model = load_model(p, n_gpu_layers=n_gpu_layers, use_mmap=use_mmap, use_mlock=use_mlock, repack=repack,
                           rpc=rpc, verbose=verbose)
        tgt = cls(model, p, owns_model=True, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch,
                  n_threads=n_threads, n_seq_max=n_seq_max, cache_type=cache_type,
                  install_callback=install_callback, flash_attn=flash_attn, kv_unified=kv_unified)
        tgt.repack = bool(repack)
        tgt.chat_template = chat_template
        tgt.n_gpu_layers = int(n_gpu_layers)
        tgt.rpc = tuple(rpc or ())
        return tgt

    @classmethod
    def from_llama(cls: type[_T], llm: "llama_cpp.Llama", *, n_ctx: Optional[int] = None,
                   n_threads: Optional[int] = None, n_batch: int = 512, n_ubatch: Optional[int] = None,
                   n_seq_max: int = 64, cache_type: str = "f16", install_callback: bool = True,
                   flash_attn: bool = True) -> _T:
        """Wrap the model of an existing ``llama_cpp.Llama`` (weights shared, new context).

        ``llm`` is kept alive by the Target; its own context is not used.
        """
        return cls(llm.model, Path(llm.model_path), owns_model=False, keep_alive=llm,
                   n_ctx=n_ctx if n_ctx is not None else llm.n_ctx(), n_batch=n_batch, n_ubatch=n_ubatch,
                   n_threads=n_threads, n_seq_max=n_seq_max, cache_type=cache_type,
                   install_callback=install_callback, flash_attn=flash_attn)

    def _init_context(self, n_ctx: int, n_batch: int, n_ubatch: Optional[int], n_threads: Optional[int],
                      n_seq_max: int, cache_type: str, install_callback: bool) -> None:
        check_context_args(n_ctx, n_batch, n_seq_max, cache_type)
        # the user's -ub is the prefill's chunk; unset, the prompt cache picks one (PrefixCache.shape)
        self.n_ubatch_given: bool = n_ubatch is not None
        n_ubatch = n_batch if n_ubatch is None else n_ubatch
        threads = n_threads or default_threads()
        self.n_threads: int = threads
        # bumped by every call that writes the KV cache: a loop that reuses a prompt prefix
        # knows that nobody else wrote it since (calibration, exactness checks, a remote session)
        self.kv_version: int = 0
        # the lowest position a one-token decode wrote past LONE_ROW_CELLS cells (None: none):
        # such a cell holds other bits than a batch row computes (the prompt cache stops there)
        self.lone_row_from: Optional[int] = None
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        # n_layer_model: the model's layers; n_layer: those with a KV cache, which the capture
        # reads (fewer in hybrid models, whose recurrent layers have none: found by a probe decode
        # once the context exists)
        self.n_layer_model: int = llama_cpp.llama_model_n_layer(self._model)
        self.n_layer: int = self.n_layer_model
        self._kv_layers_checked = False
        self.recurrent: bool = bool(llama_cpp.llama_model_is_recurrent(self._model))
        self.hybrid: bool = bool(llama_cpp.llama_model_is_hybrid(self._model))
        has_state = self.recurrent or self.hybrid
        # a KV suffix can be dropped at will (rejected drafts, prompt reuse): not past a recurrent
        # state, which rolls back only through llama.cpp's snapshots (rollback_limit)
        self.can_rollback: bool = not has_state
        # trees need a sequence per leaf; a recurrent state follows one sequence of tokens
        self.holds_trees: bool = not has_state
        if has_state and self.kv_unified:
            n_seq_max = 1        # every sequence costs a recurrent state (times 1 + RS_ROLLBACK snapshots)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.n_embd: int = llama_cpp.llama_model_n_embd(self._model)
        self.n_head: int = llama_cpp.llama_model_n_head(self._model)
        self.n_head_kv: int = llama_cpp.llama_model_n_head_kv(self._model)
        self.n_swa: int = llama_cpp.llama_model_n_swa(self._model)
        self.arch: str = self.meta("general.architecture") or "?"
        key_length = self.meta(f"{self.arch}.attention.key_length")
        # recurrent models (mamba, rwkv) have no attention heads: head_dim 0, nothing to capture
        self.head_dim: int = int(key_length) if key_length else (self.n_embd // self.n_head if self.n_head else 0)
        rope = llama_cpp.llama_model_rope_type(self._model)
        self.rope_type: str = ROPE_TYPES.get(rope, f"other({rope})")

        # NORM rope: llama.cpp's converter permuted the K rows per head (docs/drafter.md#k-permutation).
        self._cap = check_ptr(lib.moa_capture_init(self.n_layer_model, self.rope_type == "norm"), "moa_capture_init")
        self._cap_dirty = True        # the capture may hold rows (reset before the next decode)
        self._cap_enabled: Optional[bool] = None   # what moa_capture_set_enabled was last told
        params = context_params(n_ctx, n_batch, n_ubatch, n_seq_max, threads, flash_attn=self.flash_attn,
                                kv_unified=self.kv_unified, cache_type=cache_type)
        if has_state:
            params.n_rs_seq = RS_ROLLBACK      # llama.cpp clamps it to 0 where it cannot snapshot
        if install_callback:        # both ctypes objects kept on self: they must outlive the context
            self._cb, self._cb_ud = capture_callback(self._cap)
            params.cb_eval = self._cb
            params.cb_eval_user_data = self._cb_ud
        self._has_callback = install_callback
        # (a quantized cache: llama.cpp rotates K/V before writing them; the capture undoes it)
        self._ctx = llama_cpp.llama_init_from_model(self._model, params)
        if not self._ctx:
            raise MoaError(f"llama.cpp could not create a context for {self.path} (n_ctx {n_ctx}, n_batch {n_batch})")
        self.n_ctx: int = llama_cpp.llama_n_ctx(self._ctx)
        self.n_batch: int = n_batch
        self.n_ubatch: int = n_ubatch
        self.n_seq_max: int = n_seq_max
        self.cache_type: str = cache_type
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self._batch = LlamaBatch(n_batch, n_seq_max)
        # how many trailing positions one rollback after a decode may drop exactly (None: any);
        # a longer one (calibration, exactness checks) replays the kept tokens (rollback)
        self.rollback_limit: Optional[int] = int(llama_cpp.llama_n_rs_seq(self._ctx)) if has_state else None
        self._history: Optional[np.ndarray] = np.zeros(self.n_ctx, np.int32) if has_state else None
        self.n_replays = 0      # rollbacks done by replaying (never in a speculative loop's cycle)
        if self.hybrid and install_callback:
            self.n_layer = self._probe_kv_layers()

    def _probe_kv_layers(self) -> int:
        """How many layers write a KV cache (a hybrid model's attention layers): one captured
        decode of one token, then the cache emptied."""
        bos = llama_cpp.llama_vocab_bos(self._vocab)
        self._kv_layers_checked = True      # this decode is what decides the count
        self.decode([bos if 0 <= bos < self.n_vocab else 0], positions=[0], logits="last")
        self.clear()
        # the heads of the attention layers (llama_model_n_head_kv tells layer 0's, a recurrent one)
        self.n_head_kv = int(lib.moa_capture_n_head_kv(self._cap))
        self.head_dim = int(lib.moa_capture_head_dim(self._cap))
        return int(lib.moa_capture_n_layer(self._cap))

    # ------------------------------------------------------------------ properties

    @property
    def lsa_width(self) -> int:
        """W = 2 * n_head_kv * head_dim: width of one layer row of :meth:`captured_lsa_in`."""
        return 2 * self.n_head_kv * self.head_dim

    @property
    def embd_scale(self) -> float:
        """Factor llama.cpp applies to token_embd rows before layer 0 (Gemma: sqrt(n_embd), else 1)."""
        return embedding_scale(self.arch, self.n_embd)

    @property
    def n_past(self) -> int:
        """Next position of sequence 0 (max cached position + 1; 0 when empty)."""
        return int(llama_cpp.llama_memory_seq_pos_max(self._mem, 0)) + 1

    @property
    def context(self) -> Any:
        """The raw ``llama_context_p`` (for tests and diagnostics)."""
        return self._ctx

    # ------------------------------------------------------------------ decoding

    def decode(self, tokens: Sequence[int], positions: Optional[Sequence[int]] = None,
               seq_ids: Optional[SeqIds] = None, capture: bool = True, logits: Optional[str] = "all") -> np.ndarray:
        """One ``llama_decode`` of up to ``n_batch`` tokens; returns logits ``[n, n_vocab]`` (F32),
        or ``[1, n_vocab]`` of the last row with ``logits="last"`` (or None: not needed). The LM
        head runs only for the rows asked: a prompt's other rows would cost a vocabulary-sized
        matmul each (151,936 rows on Qwen2.5).

        Args:
            tokens: token ids.
            positions: per-token positions (default: ``n_past, n_past + 1, ...``).
            seq_ids: per-token sequence id or list of ids (default: all in sequence 0). A token
                in several sequences is visible to all of them (tree verification,
                docs/llama-cpp.md#batch-verification).
            capture: capture K/V of every row for :meth:`captured_lsa_in`. Rows captured by an
                earlier decode are discarded either way.

        Raises:
            CacheFullError: no KV slot (llama_decode returned 1); the cache is unchanged.
            MoaError: any other llama_decode failure (its code is in the message), or an
                inconsistent capture.
        """
        if self._ctx is None:
            raise MoaError("Target is closed")
        toks = np.asarray(tokens, dtype=np.int32).reshape(-1)
        n = len(toks)
        pos = (np.arange(n, dtype=np.int32) + self.n_past if positions is None
               else np.asarray(positions, dtype=np.int32).reshape(-1))
        if len(pos) != n:
            raise InvalidArgumentError(f"decode: {len(pos)} positions for {n} tokens")
        if n and (toks.min() < 0 or toks.max() >= self.n_vocab):
            raise InvalidArgumentError(f"decode: token ids must be in [0, {self.n_vocab})")
        if capture and not self._has_callback:
            raise InvalidArgumentError("decode(capture=True) on a Target built with install_callback=False")
        last_only = logits != "all"
        self.kv_version += 1
        if self._history is not None and n:
            if seq_ids is not None and any(np.ravel(x).tolist() != [0] for x in seq_ids):
                raise InvalidArgumentError(f"decode: a {self.arch} target follows one sequence (a recurrent state)")
            if pos.min() >= 0 and pos.max() < self.n_ctx:
                self._history[pos] = toks
        if n == 1 and int(pos[0]) >= LONE_ROW_CELLS:
            p = int(pos[0])
            self.lone_row_from = p if self.lone_row_from is None else min(self.lone_row_from, p)
        self._batch.fill(toks, pos, seq_ids, last_only)
        return self._run_batch(n, 1 if last_only else n, capture)

    def decode_one(self, token: int, pos: int) -> np.ndarray:
        """:meth:`decode` of one token of sequence 0 at ``pos``, without capture, for the plain
        loop's step (its ids come from sampling: not checked again): its logits ``[1, n_vocab]``
        as a view of llama.cpp's buffer, valid until the next decode."""
        if self._ctx is None:
            raise MoaError("Target is closed")
        self.kv_version += 1
        if self._history is not None and 0 <= pos < self.n_ctx:
            self._history[pos] = token
        if pos >= LONE_ROW_CELLS:
            self.lone_row_from = pos if self.lone_row_from is None else min(self.lone_row_from, pos)
        self._batch.fill_one(token, pos)
        return self._run_batch(1, 1, False, copy=False)

    def decode_rows(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: SeqIds, outputs: np.ndarray,
                    capture: bool, *, copy: bool = True, before: Optional[Any] = None) -> np.ndarray:
        """One ``llama_decode`` of already checked inputs, with logits for the rows where
        ``outputs`` is set (``[outputs.sum(), n_vocab]``, batch order). For callers that lay out
        batches of several sequences themselves (:mod:`moa_cpp.target.slots`); they keep
        :attr:`kv_version` and :attr:`lone_row_from` of their own sequences. ``copy=False``:
        a view of llama.cpp's logits buffer, valid until the next decode. ``before()``: called
        right before ``llama_decode``, which runs without the GIL."""
        if self._ctx is None:
            raise MoaError("Target is closed")
        if self._history is not None and all(np.ravel(x).tolist() == [0] for x in seq_ids):
            self._history[np.asarray(positions)] = tokens      # sequence 0: what a rollback replays
        self._batch.fill(tokens, positions, seq_ids, outputs=outputs)
        return self._run_batch(len(tokens), int(np.count_nonzero(outputs)), capture, copy, before)

    def _run_batch(self, n: int, rows: int, capture: bool, copy: bool = True, before: Optional[Any] = None) -> np.ndarray:
        # the capture is told only what changed: every call into C lets another thread take the
        # GIL, and a batched engine's decode thread then waits for it (issue 59)
        if capture or self._cap_dirty:         # a captured decode's rows must not outlive the next decode
            lib.moa_capture_reset(self._cap)
            self._cap_dirty = capture
        if capture != self._cap_enabled:
            lib.moa_capture_set_enabled(self._cap, capture)
            self._cap_enabled = capture
        if before is not None:
            before()
        rc = llama_cpp.llama_decode(self._ctx, self._batch.batch)
        if rc == 1:
            raise CacheFullError(f"llama_decode returned 1: no KV cache slot for {n} tokens (n_ctx {self.n_ctx})")
        if rc != 0:
            raise MoaError(f"llama_decode failed with return code {rc}", code=rc if rc < 0 else 0)
        if capture:
            n_rows = check(lib.moa_capture_n_rows(self._cap))
            if n_rows != n:
                raise MoaError(f"capture inconsistent: {n_rows} rows captured for a {n}-token decode"
                               + (f" ({self.arch} keeps no KV cache: nothing to capture)" if n_rows == 0 else ""))
            if not self._kv_layers_checked:  # the capture holds later graphs to the first one's layers
                got = int(lib.moa_capture_n_layer(self._cap))
                if got != self.n_layer:
                    raise MoaError(f"capture: {self.arch} wrote the KV cache of {got} of its {self.n_layer_model} "
                                   f"layers, {self.n_layer} expected (layers sharing another layer's cache?)")
                self._kv_layers_checked = True
        ptr = llama_cpp.llama_get_logits(self._ctx)
        # one ctypes array type per row count, made once (np.ctypeslib.as_array builds one per call)
        arr_t = self._logits_types.get(rows)
        if arr_t is None:
            arr_t = self._logits_types[rows] = ctypes.c_float * (rows * self.n_vocab)
        buf = arr_t.from_address(ctypes.cast(ptr, ctypes.c_void_p).value)
        view = np.frombuffer(buf, dtype=np.float32).reshape(rows, self.n_vocab)
        return view.copy() if copy else view

    @property
    def n_captured(self) -> int:
        """Rows captured by the latest decode (0 if it ran with ``capture=False``)."""
        return check(lib.moa_capture_n_rows(self._cap))

    def captured_lsa_in(self, rows: Optional[Sequence[int]] = None) -> np.ndarray:
        """LSA input ``[n_rows, n_layer, W]`` (F32) of the latest decode's batch rows ``rows``
        (default: all), head-interleaved ``[K_h | V_h]`` in HF layout (K un-permuted for NORM
        rope), W = 2 * n_head_kv * head_dim (docs/drafter.md#target-kv)."""
        n_avail = self.n_captured
        idx = np.arange(n_avail, dtype=np.int32) if rows is None else np.ascontiguousarray(rows, dtype=np.int32)
        out = np.empty((len(idx), self.n_layer, self.lsa_width), dtype=np.float32)
        if len(idx):
            check(lib.moa_capture_get(self._cap, ffi.cast("int32_t *", idx.ctypes.data), len(idx),
                                      ffi.cast("float *", out.ctypes.data)))
        return out

    def captured_layer_ids(self) -> list[int]:
        """The model layers the capture reads (those with a KV cache), in order; empty before the
        first captured decode."""
        n = int(lib.moa_capture_n_layer(self._cap))
        out = ffi.new("int32_t[]", max(n, 1))
        check(lib.moa_capture_layer_ids(self._cap, out, n))
        return [int(out[i]) for i in range(n)]

    def captured_kv(self, rows: Optional[Sequence[int]] = None) -> tuple[np.ndarray, np.ndarray]:
        """K and V ``[n_layer, n_head_kv, n_rows, head_dim]`` (HF layout) of the latest decode."""
        x = self.captured_lsa_in(rows)  # [n, L, H*2D]
        x = x.reshape(x.shape[0], self.n_layer, self.n_head_kv, 2, self.head_dim).transpose(3, 1, 2, 0, 4)
        return np.ascontiguousarray(x[0]), np.ascontiguousarray(x[1])

    def rollback(self, pos: int) -> None:
        """Drop every cached position >= ``pos`` in every sequence.

        A target with a recurrent state (:attr:`rollback_limit` not None) drops up to
        ``rollback_limit`` positions after a decode through llama.cpp's per-token snapshots (exact,
        cheap: a rejected draft); a longer rollback, or a second one before the next decode, clears
        the caches and decodes the kept tokens again (exact, as costly as their prefill)."""
        self.kv_version += 1
        pos = int(pos)
        if self.lone_row_from is not None and self.lone_row_from >= pos:
            self.lone_row_from = None
        if self._history is None:
            if not llama_cpp.llama_memory_seq_rm(self._mem, -1, pos, -1):
                raise MoaError(f"llama_memory_seq_rm(pos >= {pos}) failed: this target's memory cannot roll back")
            return
        n = self.n_past
        if pos >= n:
            return
        # the recurrent memory is asked first and refuses without changing anything (more than
        # rollback_limit positions, or a rollback already pending): then replay
        if llama_cpp.llama_memory_seq_rm(self._mem, 0, max(pos, 0), -1):
            return
        self._replay(max(pos, 0))

    def _replay(self, pos: int) -> None:
        """Clear the caches and decode the first ``pos`` tokens of sequence 0 again."""
        kept = self._history[:pos].copy()
        self.clear()
        self.n_replays += 1
        for off in range(0, pos, self.n_batch):
            chunk = kept[off: off + self.n_batch]
            self.decode(chunk, np.arange(off, off + len(chunk), dtype=np.int32), capture=False, logits="last")

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Add sequence ``dst`` to the cells of ``src`` with positions in [p0, p1) (-1: open end).
        In the unified cache this shares cells, it copies nothing."""
        self.kv_version += 1
        llama_cpp.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None:
        """Remove ``seq_id`` (-1: all) from cells with positions in [p0, p1) (-1: open end)."""
        self.kv_version += 1
        if not llama_cpp.llama_memory_seq_rm(self._mem, seq_id, p0, p1):
            raise MoaError(f"llama_memory_seq_rm({seq_id}, {p0}, {p1}) failed")

    def clear(self) -> None:
        """Empty the KV cache (all sequences)."""
        self.kv_version += 1
        self.lone_row_from = None
        llama_cpp.llama_memory_clear(self._mem, True)

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Free the context, the batch, the capture and (if owned) the model. Idempotent."""
        if self._batch is not None:
            self._batch.free()
            self._batch = None
        if self._ctx is not None:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._cap is not None:  # after the context: its callback points at the capture
            lib.moa_capture_free(self._cap)
            self._cap = None
        if self._model is not None and self._owns_model:
            llama_cpp.llama_model_free(self._model)
        self._model = None
        self._keep_alive = None

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may be gone
            pass

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.path.name!r}, arch={self.arch}, n_layer={self.n_layer}, "
                f"n_head_kv={self.n_head_kv}, head_dim={self.head_dim}, rope={self.rope_type}, "
                f"n_ctx={getattr(self, 'n_ctx', '?')})")
