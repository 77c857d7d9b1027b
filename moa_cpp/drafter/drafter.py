"""The MoA drafter: a friendly class over the native ``moa_model`` / ``moa_state`` handles.

Example::

    from moa_cpp import Drafter, Target
    target = Target.from_path("model.gguf")
    drafter = Drafter("drafter.gguf", target.path, n_ctx=target.n_ctx)
    logits = target.decode(prompt_ids)                      # captures every layer's K/V
    drafter.commit(target.captured_lsa_in(), pos0=0)        # LSA -> mean -> Ekv2E -> CA cache
    root = int(logits[-1].argmax())
    draft_logits = drafter.draft([root], [len(prompt_ids)], feed=prompt_ids)
    drafter.rollback(len(prompt_ids))                       # forget positions >= n
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from moa_cpp.drafter import native as _native
from moa_cpp.drafter.native import check, check_ptr, ffi, lib
from moa_cpp.errors import InvalidArgumentError

__all__ = ["DrafterModel", "DrafterState", "Drafter", "CommitDebug"]


@dataclass
class CommitDebug:
    """Intermediate arrays of a commit (for parity checks)."""

    lsa_out: np.ndarray   # [T, L, W]
    lsa_mean: np.ndarray  # [T, W]
    ekv: np.ndarray       # [T, d]


def _i32(values: Sequence[int], what: str) -> np.ndarray:
    arr = np.ascontiguousarray(np.asarray(values, dtype=np.int64))
    if arr.ndim != 1:
        raise InvalidArgumentError(f"{what} must be a 1-D sequence of ints")
    if arr.size and (arr.min() < -(2**31) or arr.max() >= 2**31):
        raise InvalidArgumentError(f"{what} out of int32 range")
    return arr.astype(np.int32)


def _ptr(arr: np.ndarray, ctype: str):
    return ffi.cast(ctype, ffi.from_buffer(arr)) if arr.size else ffi.NULL


class DrafterModel:
    """Immutable drafter weights + the target tensors it borrows (token embedding, LM head).

    Args:
        drafter_path: MoA drafter GGUF (``general.architecture = "moa"``).
        target_path: the target's GGUF (its token embedding / LM head are memory-mapped on CPU);
            may be None if the drafter file bundles them.
        device: "auto" (first GPU, else CPU), "cpu", or a ggml device name such as "CUDA0".
        n_threads: CPU threads (default: all cores).
        tli: override the target-layer-inference N stored in the file.

    Raises:
        FormatError, MismatchError, MoaIOError: bad files or a drafter/target mismatch.
    """

    def __init__(self, drafter_path: str | os.PathLike, target_path: str | os.PathLike | None = None, *,
                 device: str = "auto", n_threads: Optional[int] = None, tli: Optional[int] = None,
                 use_mmap: bool = True) -> None:
        params = ffi.new("struct moa_model_params *")
        lib.moa_model_params_init(params)
        device_c = ffi.new("char[]", device.encode())
        params.device = device_c
        params.n_threads = int(n_threads or 0)
        params.tli = -1 if tli is None else int(tli)
        params.use_mmap = bool(use_mmap)
        self.path = Path(drafter_path)
        self.target_path = Path(target_path) if target_path is not None else None
        tp = str(target_path).encode() if target_path is not None else ffi.NULL
        ptr = lib.moa_model_load(str(drafter_path).encode(), tp, params)
        self._ptr = ffi.gc(check_ptr(ptr, f"loading drafter '{drafter_path}'"), lib.moa_model_free)

    # hyper-parameters
    @property
    def n_vocab(self) -> int:
        """Number of logits per draft row (smaller than the target's with a reduced head)."""
        return lib.moa_model_n_vocab(self._ptr)

    @property
    def n_target_vocab(self) -> int:
        return lib.moa_model_n_target_vocab(self._ptr)

    @property
    def n_embd(self) -> int:
        return lib.moa_model_n_embd(self._ptr)

    @property
    def ca_kv_heads(self) -> int:
        """CA K/V heads: a split commit sends ``2 * ca_kv_heads * head_dim`` values per token."""
        return lib.moa_model_ca_kv_heads(self._ptr)

    @property
    def head_dim(self) -> int:
        return lib.moa_model_head_dim(self._ptr)

    @property
    def n_target_layers(self) -> int:
        return lib.moa_model_n_target_layers(self._ptr)

    @property
    def lsa_width(self) -> int:
        return lib.moa_model_lsa_width(self._ptr)

    @property
    def tli(self) -> int:
        return lib.moa_model_tli(self._ptr)

    @property
    def role(self) -> str:
        """``"full"``, or ``"client"`` for a client bundle's drafter (``moa-cpp bundle``): no LSA /
        Ekv2E / CA k,v weights, so it cannot :meth:`DrafterState.commit` or
        :meth:`DrafterState.compute_ca`; CA K/V come from the server through
        :meth:`DrafterState.append_ca`."""
        return "client" if lib.moa_model_role(self._ptr) == lib.MOA_ROLE_CLIENT else "full"

    @property
    def device(self) -> str:
        return ffi.string(lib.moa_model_device(self._ptr)).decode()

    def d2t(self) -> Optional[np.ndarray]:
        """Draft -> target id map of a reduced draft vocabulary, or None."""
        if self.n_vocab == self.n_target_vocab:
            return None
        out = np.empty(self.n_vocab, dtype=np.int32)
        check(lib.moa_model_get_d2t(self._ptr, _ptr(out, "int32_t *")))
        return out

    def acceptance(self) -> Optional[list]:
        """The held-out conditional acceptance per draft depth the trainer recorded
        (``moa.eval.acceptance``: the chance draft d is right given drafts 1..d-1 were), or None."""
        n = check(lib.moa_model_acceptance(self._ptr, ffi.NULL, 0))
        if n == 0:
            return None
        out = ffi.new("float[]", n)
        check(lib.moa_model_acceptance(self._ptr, out, n))
        return [float(v) for v in out]

    def new_state(self, n_ctx: int = 4096, n_draft_max: int = 128, n_batch: int = 512) -> "DrafterState":
        return DrafterState(self, n_ctx=n_ctx, n_draft_max=n_draft_max, n_batch=n_batch)

    def close(self) -> None:
        if self._ptr is not None:
            ffi.release(self._ptr)
            self._ptr = None


class DrafterState:
    """One sequence's drafter caches (SA context + draft rows, CA cache).

    Not thread-safe: use one state from one thread at a time. Different states of one
    ``DrafterModel`` may run on different threads concurrently (native calls release the GIL).
    """

    def __init__(self, model: DrafterModel, *, n_ctx: int = 4096, n_draft_max: int = 128, n_batch: int = 512) -> None:
        p = ffi.new("struct moa_state_params *")
        lib.moa_state_params_init(p)
        p.n_ctx, p.n_draft_max, p.n_batch = int(n_ctx), int(n_draft_max), int(n_batch)
        self.model = model  # keeps the weights alive
        self.n_batch = int(n_batch)
        self._ptr = ffi.gc(check_ptr(lib.moa_state_init(model._ptr, p), "creating drafter state"), lib.moa_state_free)
        self._one: Optional[tuple] = None     # draft_next's buffers (made on first use)

    @property
    def n_ca(self) -> int:
        """Verified positions in the CA cache."""
        return lib.moa_state_n_ca(self._ptr)

    @property
    def n_sa(self) -> int:
        """Context positions in the SA cache."""
        return lib.moa_state_n_sa(self._ptr)

    @property
    def n_drafts(self) -> int:
        """Pending draft rows of the current cycle."""
        return lib.moa_state_n_drafts(self._ptr)

    def commit(self, lsa_in: np.ndarray, pos0: Optional[int] = None, *, debug: bool = False) -> Optional[CommitDebug]:
        """Append verified tokens' CA entries at positions ``pos0..pos0+T-1`` (default: ``n_ca``).

        ``lsa_in`` is ``[T, L, W]`` float32: the target's per-layer K/V, head-interleaved
        ``[K_h | V_h]`` in HF layout (``Target.captured_lsa_in``).
        """
        m = self.model
        x = np.ascontiguousarray(lsa_in, dtype=np.float32)
        if x.ndim != 3 or x.shape[1:] != (m.n_target_layers, m.lsa_width):
            raise InvalidArgumentError(f"lsa_in must have shape [T, {m.n_target_layers}, {m.lsa_width}], got {list(x.shape)}")
        T = x.shape[0]
        pos0 = self.n_ca if pos0 is None else int(pos0)
        if not debug:
            check(lib.moa_state_commit(self._ptr, _ptr(x, "float *"), T, pos0, ffi.NULL, ffi.NULL, ffi.NULL))
            return None
        out = CommitDebug(np.empty((T, m.n_target_layers, m.lsa_width), np.float32),
                          np.empty((T, m.lsa_width), np.float32), np.empty((T, m.n_embd), np.float32))
        check(lib.moa_state_commit(self._ptr, _ptr(x, "float *"), T, pos0, _ptr(out.lsa_out, "float *"),
                                   _ptr(out.lsa_mean, "float *"), _ptr(out.ekv, "float *")))
        return out

    def compute_ca(self, lsa_in: np.ndarray, pos0: int) -> tuple[np.ndarray, np.ndarray]:
        """Server side of a split commit: the CA ``(K, V)``, each ``[T, ca_kv_heads, head_dim]``
        float32, of verified tokens at positions ``pos0..pos0+T-1`` (K after RoPE). This
        state's caches are untouched (it is only scratch). :meth:`append_ca` on a client state
        then leaves the CA cache that :meth:`commit` would (bit for bit in float32)."""
        m = self.model
        x = np.ascontiguousarray(lsa_in, dtype=np.float32)
        if x.ndim != 3 or x.shape[1:] != (m.n_target_layers, m.lsa_width):
            raise InvalidArgumentError(f"lsa_in must have shape [T, {m.n_target_layers}, {m.lsa_width}], got {list(x.shape)}")
        k = np.empty((x.shape[0], m.ca_kv_heads, m.head_dim), np.float32)
        v = np.empty_like(k)
        check(lib.moa_state_compute_ca(self._ptr, _ptr(x, "float *"), x.shape[0], int(pos0), _ptr(k, "float *"),
                                       _ptr(v, "float *")))
        return k, v

    def append_ca(self, k: np.ndarray, v: np.ndarray, pos0: Optional[int] = None) -> None:
        """Client side of a split commit: store CA entries made by :meth:`compute_ca` (float32, or
        f16 / any float array: converted) at positions ``pos0..`` (default: ``n_ca``)."""
        m = self.model
        kk = np.ascontiguousarray(k, dtype=np.float32)
        vv = np.ascontiguousarray(v, dtype=np.float32)
        shape = (m.ca_kv_heads, m.head_dim)
        if kk.ndim != 3 or kk.shape[1:] != shape or vv.shape != kk.shape:
            raise InvalidArgumentError(f"k and v must both have shape [T, {shape[0]}, {shape[1]}], got "
                                       f"{list(kk.shape)} and {list(vv.shape)}")
        pos0 = self.n_ca if pos0 is None else int(pos0)
        check(lib.moa_state_append_ca(self._ptr, _ptr(kk, "float *"), _ptr(vv, "float *"), kk.shape[0], pos0))

    def draft(self, tokens: Sequence[int], positions: Sequence[int], parents: Optional[Sequence[int]] = None, *,
              feed: Sequence[int] = (), hidden: Optional[np.ndarray] = None) -> np.ndarray:
        """One drafting call; returns logits ``[len(tokens), n_vocab]``.

        ``feed`` tokens are first appended to the SA context (K/V only) at positions
        ``n_sa..``; they require that no draft rows are pending. ``parents[i]`` is the parent's
        index among this cycle's draft rows (counted across calls) or -1 (default: each row's
        parent is the previous row, i.e. a chain continuing the pending rows). ``hidden``, if
        given (float32 ``[len(tokens), n_embd]``), receives each row's CA output z.
        """
        tok = _i32(tokens, "tokens")
        pos = _i32(positions, "positions")
        fd = _i32(feed, "feed")
        if fd.size > self.n_batch:          # long prompts: feed the context in n_batch chunks first
            self.feed(fd[: fd.size - self.n_batch])
            fd = fd[fd.size - self.n_batch:]
        n = tok.size
        if pos.size != n:
            raise InvalidArgumentError("tokens and positions must have the same length")
        if parents is None:
            start = self.n_drafts
            par = np.arange(start - 1, start - 1 + n, dtype=np.int32)
        else:
            par = _i32(parents, "parents")
            if par.size != n:
                raise InvalidArgumentError("parents must have one entry per token")
        logits = np.empty((n, self.model.n_vocab), dtype=np.float32)
        hid = ffi.NULL
        if hidden is not None:
            if hidden.dtype != np.float32 or hidden.shape != (n, self.model.n_embd) or not hidden.flags.c_contiguous:
                raise InvalidArgumentError(f"hidden must be a C-contiguous float32 array of shape [{n}, {self.model.n_embd}]")
            hid = _ptr(hidden, "float *")
        args = (n, _ptr(tok, "int32_t *"), _ptr(pos, "int32_t *"), _ptr(par, "int32_t *"), _ptr(logits, "float *"), hid)
        if fd.size:
            # Feed + rows as one native call: one graph, and nothing changes if any argument is bad.
            check(lib.moa_state_draft(self._ptr, fd.size, _ptr(fd, "int32_t *"), *args))
        else:
            check(lib.moa_state_draft_rows(self._ptr, *args))
        return logits

    def draft_next(self, token: int, pos: int, parent: int) -> np.ndarray:
        """:meth:`draft` of one row (a chain's next draft: ``parent`` = the previous row's index)
        through buffers kept from call to call: its logits ``[n_vocab]`` as a view that the next
        call overwrites. The chain's step, with no per-step allocation of a vocabulary-sized row."""
        if self._one is None:
            ints = np.zeros(3, np.int32)
            row = np.empty((1, self.model.n_vocab), np.float32)
            p = ffi.cast("int32_t *", ffi.from_buffer(ints))
            self._one = (ints, row, p, ffi.cast("float *", ffi.from_buffer(row)))
        ints, row, p, out = self._one
        ints[0], ints[1], ints[2] = token, pos, parent
        check(lib.moa_state_draft_rows(self._ptr, 1, p, p + 1, p + 2, out, ffi.NULL))
        return row[0]

    def feed(self, tokens: Sequence[int]) -> None:
        """Append context tokens to the SA cache (K/V only), at positions ``n_sa..``."""
        fd = _i32(tokens, "tokens")
        for off in range(0, fd.size, self.n_batch):
            chunk = np.ascontiguousarray(fd[off: off + self.n_batch])
            check(lib.moa_state_feed(self._ptr, chunk.size, _ptr(chunk, "int32_t *")))

    def clear_drafts(self) -> None:
        """Drop this cycle's draft rows."""
        check(lib.moa_state_clear_drafts(self._ptr))

    def rollback(self, pos: int) -> None:
        """Keep only positions < pos in both caches; drop draft rows."""
        check(lib.moa_state_rollback(self._ptr, int(pos)))

    def ca_cache(self) -> tuple[np.ndarray, np.ndarray]:
        """The CA cache as ``(K, V)``, each ``[ca_kv_heads, n_ca, head_dim]`` (HF layout)."""
        nh, hd = ffi.new("int32_t *"), ffi.new("int32_t *")
        check(lib.moa_state_get_ca_cache(self._ptr, ffi.NULL, ffi.NULL, nh, hd))
        k = np.empty((nh[0], self.n_ca, hd[0]), np.float32)
        v = np.empty_like(k)
        check(lib.moa_state_get_ca_cache(self._ptr, _ptr(k, "float *"), _ptr(v, "float *"), nh, hd))
        return k, v

    def close(self) -> None:
        if self._ptr is not None:
            ffi.release(self._ptr)
            self._ptr = None


class Drafter(DrafterState):
    """A drafter model with one state: the common single-sequence case.

    >>> drafter = Drafter("drafter.gguf", "target.gguf", n_ctx=4096)   # doctest: +SKIP
    """

    def __init__(self, drafter_path: str | os.PathLike, target_path: str | os.PathLike | None = None, *,
                 n_ctx: int = 4096, n_draft_max: int = 128, n_batch: int = 512, device: str = "auto",
                 n_threads: Optional[int] = None, tli: Optional[int] = None) -> None:
        model = DrafterModel(drafter_path, target_path, device=device, n_threads=n_threads, tli=tli)
        super().__init__(model, n_ctx=n_ctx, n_draft_max=n_draft_max, n_batch=n_batch)
