"""Generation sessions: ``--parallel N`` of them, allocated at start (memory is bounded then),
and a bounded FIFO of requests waiting for one (503 + Retry-After beyond it).

A session is a :class:`SpeculativeGenerator` with its own drafter state (the drafter weights are
shared). With continuous batching (``--parallel N`` > 1, the default ``--cont-batching``) the
sessions are the slots of one llama.cpp context, and every cycle decodes all generating slots in
one batch (:mod:`moa_cpp.target.slots`); with ``--no-cont-batching`` each session has a context of
its own (the model weights are shared). One generation at a time runs on a session; several
sessions run in parallel threads.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import sys
from dataclasses import dataclass
from typing import Any
from pathlib import Path

from moa_cpp.generator import SpeculativeGenerator, parse_draft
from moa_cpp.speculative.proposers import make_proposer
from moa_cpp.server.errors import APIError
from moa_cpp.server.settings import ServerSettings

# rows checked for the agreement of padded batches (moa_cpp/target/batch_pad.py): the batching engine's
# cap per call there (a cost-aware chain needs 9, prefill chunks take what there is)
PAD_CHECK_ROWS = 32

log = logging.getLogger("moa_cpp.server")


@dataclass
class Session:
    index: int
    gen: SpeculativeGenerator


def resolve_models(s: ServerSettings) -> tuple:
    """(target path, MoA drafter path or None, draft-model path or None, speculative types, draft
    spec); a model no proposer drafts with is None (not loaded)."""
    from moa_cpp.models.defaults import ngram_settings, resolve_models as resolve, resolve_spec_type
    draft = parse_draft(s.draft)
    off = draft.mode == "none"
    target, drafter, draft_model = resolve(s.model, s.drafter, None, off)
    kinds = resolve_spec_type(s.spec_type, drafter, draft_model, off)
    ngram_settings(s.ngram_n_min, s.ngram_n_max)          # checked before anything loads
    if not kinds:
        return target, None, None, (), "none"
    return (target, drafter if "moa" in kinds else None, draft_model if "draft" in kinds else None, kinds,
            str(draft))


def build_sessions(s: ServerSettings) -> list:
    """Load the target once, then ``s.parallel`` sessions on it: the slots of one batched context
    (:func:`batched_slots`), or a context each (the drafter's weights are shared; each session has
    its own drafter state or draft-model context)."""
    from moa_cpp.drafter.drafter import DrafterModel
    from moa_cpp.models.defaults import ngram_settings
    from moa_cpp.target.target import Target

    target_path, drafter_path, draft_model, kinds, draft = resolve_models(s)
    threads = s.session_threads()
    ngram = ngram_settings(s.ngram_n_min, s.ngram_n_max)
    batched = s.batching()
    if batched:
        base, slots = batched_slots(s, target_path)
        if slots is None:
            batched = False
            s.cont_batching = False              # the settings say what runs (threads, /metrics, start-up line)
            threads = s.session_threads()
            print("continuous batching off: this target's rows depend on the batch they are decoded in "
                  "(not even batches of 2+ rows agree), so sharing decodes would change answers; "
                  "a context per session instead (-nocb)", file=sys.stderr, flush=True)
    if not batched:
        base = Target.from_path(target_path, n_ctx=s.n_ctx, n_threads=threads, n_gpu_layers=s.n_gpu_layers,
                                rpc=s.rpc or None, **s.target_options)
    # batched: the drafters and draft models compute on the slots' threads with one thread each. A
    # multi-threaded graph there would give every slot thread a libgomp pool next to the engine's,
    # and with more pool workers than cores libgomp sleeps at every barrier, the target's included
    # (moa_cpp/target/omp_pool.py); the slots draft side by side instead.
    side = 1 if batched else threads
    sessions: list = []
    try:
        drafter = (DrafterModel(drafter_path, target_path, device=s.device, n_threads=side)
                   if drafter_path else None)
        for i in range(s.parallel):
            if batched:
                tgt = slots.slot(i)
            else:
                tgt = base if i == 0 else base.sibling(n_threads=threads)
            proposer = None
            if draft_model is not None:
                proposer = make_proposer(kinds, tgt, parse_draft(draft), drafter=drafter, draft_model=draft_model,
                                         n_ctx=s.n_ctx, n_threads=side, n_gpu_layers=s.n_gpu_layers,
                                         ngram=ngram)
            sessions.append(Session(i, SpeculativeGenerator(tgt, drafter, draft=draft, proposer=proposer,
                                                            spec_type=kinds, draft_min=s.draft_min,
                                                            ngram=ngram)))
            sessions[-1].gen.loop.prefix.ram_bytes = s.cache_ram_bytes()
    except BaseException:
        for ss in sessions:
            ss.gen.close()
        base.close()
        raise
    return sessions


def batched_slots(s: ServerSettings, target_path: Any) -> tuple:
    """(shared target, :class:`~moa_cpp.target.slots.BatchEngine`): one context with one KV
    stream of ``s.n_ctx`` cells per slot, all threads. Its exact batch size is measured here,
    before any slot holds cells (it is cached on disk; measuring uses the KV cache), and bounds
    the engine's calls, so that sharing a call never changes a slot's rows."""
    from moa_cpp.target.target import MAX_VERIFY_ROWS, Target
    from moa_cpp.target.batch_pad import padded_exact_rows
    from moa_cpp.target.omp_pool import run_in_passing_thread
    from moa_cpp.target.slots import BatchEngine

    opts = dict(s.target_options)
    n_batch = max(int(opts.pop("n_batch", 512)), 64 * s.parallel)
    base = Target.from_path(target_path, n_ctx=s.n_ctx * s.parallel, n_threads=s.session_threads(),
                            n_gpu_layers=s.n_gpu_layers, rpc=s.rpc or None, n_seq_max=s.parallel, kv_unified=False,
                            n_batch=n_batch, **opts)
    try:
        # measured (once per model, then cached) on a thread that ends with it: no OpenMP pool of
        # its own outlives it next to the engine's decode thread (moa_cpp/target/omp_pool.py)
        exact = run_in_passing_thread(base.exact_rows, MAX_VERIFY_ROWS)
        pad = 1
        if exact < 2:
            # one-row decodes computed apart (F16 on the CPU): exact if every call has two rows
            # and batches of two rows or more all agree (moa_cpp/target/batch_pad.py)
            agree = run_in_passing_thread(padded_exact_rows, base, 2, PAD_CHECK_ROWS)
            if agree < 2:
                base.close()
                return None, None
            pad, exact = 2, agree
        base.max_exact_rows = exact              # declared: never measured again while slots hold cells
        engine = BatchEngine(base, s.parallel, exact, pad_rows=pad)
    except BaseException:
        base.close()
        raise
    return base, engine


def model_id(s: ServerSettings, sessions: list) -> str:
    return s.model_alias or Path(sessions[0].gen.target.path).name


class SessionPool:
    """Hands sessions to requests in arrival order. Event-loop side only (not thread-safe): a
    worker thread gives its session back through ``loop.call_soon_threadsafe(pool.release, s)``."""

    def __init__(self, sessions: list, max_queue: int, retry_after_s: int = 1) -> None:
        self.sessions = list(sessions)
        self._free: collections.deque = collections.deque(self.sessions)
        self._waiters: collections.deque = collections.deque()
        self.max_queue = max_queue
        self.retry_after_s = retry_after_s
        self.closing = False

    @property
    def busy(self) -> int:
        return len(self.sessions) - len(self._free)

    @property
    def waiting(self) -> int:
        return sum(1 for f in self._waiters if not f.done())

    def _overloaded(self, why: str) -> APIError:
        return APIError(503, why, code="server_busy", headers={"Retry-After": str(self.retry_after_s)})

    async def acquire(self, prefix_key: Any = None) -> Session:
        """A free session (else wait in FIFO order). ``prefix_key(session)``: what giving the
        request this session is worth (the prompt tokens it would not decode, less those of
        another conversation it would evict); the best wins, ties go to the session free the
        longest."""
        if self.closing:
            raise self._overloaded("the server is shutting down")
        if self._free and not self.waiting:
            if prefix_key is not None and len(self._free) > 1:
                best = max(self._free, key=prefix_key)      # the first of equals: free the longest
                self._free.remove(best)
                return best
            return self._free.popleft()
        if self.waiting >= self.max_queue:
            raise self._overloaded(f"all {len(self.sessions)} sessions are busy and {self.max_queue} requests are "
                                   f"queued; retry later")
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())      # handed over just as the waiter left
            raise

    def release(self, session: Session) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(session)
                return
        self._free.append(session)

    def close(self) -> None:
        """Refuse new requests and wake queued ones with 503 (shutdown)."""
        self.closing = True
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(self._overloaded("the server is shutting down"))
