"""Continuous batching: several generations on ONE target context, one ``llama_decode`` per
cycle for all of them (llama-server's slots).

:class:`BatchEngine` owns a :class:`~moa_cpp.target.target.Target` whose KV cache has one stream per
slot (``kv_unified=False``). :class:`SlotTarget` is what a slot's speculative loop sees: a
``Target`` whose sequence 0 is its slot's stream. A slot's :meth:`SlotTarget.decode` does not
decode at once: it waits until every slot that is generating has asked for its decode (prompt
chunk, verification rows, plain step), then one thread lays all of them out in one batch and
hands each slot its logits and K/V. So N users share each pass over the weights, and the loop
itself (propose -> score -> verify -> commit) is unchanged.

Exactness per slot (docs/serving.md#continuous-batching): a row's logits depend on how many rows
its ubatch has and on the order of the KV cells its attention visits. Each slot's cells live in
its own stream, in position order as in a context of its own, and the engine packs requests
into calls of at most ``max_rows`` rows, the largest batch the target computes bit-identically to
single-token decodes (:meth:`Target.exact_rows`); a request larger than that runs in a call of
its own, as it would alone. So a slot's rows are the rows it would get alone. Two things cannot
be had on one stream per slot: a tree's extra sequences (the loop verifies a tree's main path:
:attr:`SlotTarget.holds_trees`), and the lone row of a one-token decode past the first KV block,
which takes llama.cpp's split-KV attention alone and the ordinary one in company (both are
batch-invariant otherwise; ``PrefixCache`` already treats lone-row cells as non-reusable).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence

import numpy as np

from moa_cpp.errors import CacheFullError, InvalidArgumentError, MoaError
from moa_cpp.target.context import LONE_ROW_CELLS, TargetContext
from moa_cpp.target.ubatch_order import split_equal_order


class _Request:
    __slots__ = ("slot", "tokens", "positions", "capture", "all_rows", "logits", "lsa", "lone", "error", "done",
                 "run")

    def __init__(self, slot: "SlotTarget", tokens: np.ndarray, positions: np.ndarray, capture: bool,
                 all_rows: bool, run: Optional["PlainRun"] = None) -> None:
        self.slot, self.tokens, self.positions = slot, tokens, positions
        self.capture, self.all_rows = capture, all_rows
        self.run = run                          # a plain run's next row (PlainRun), else None
        self.logits: Optional[np.ndarray] = None
        self.lsa: Optional[np.ndarray] = None
        self.lone = False
        self.error: Optional[BaseException] = None
        self.done = False


# a plain run wakes its slot's thread at most this often (seconds), right before a decode: tokens
# travel in batches of ~10 ms of decoding (a chunk of a stream), and a stop string found later has
# cost that much decoding. Measured on the ~1 ms proxy, 2 cores (tok/s, two interleaved rounds):
# 8 slots 2000-2090 / 1500-1570 against 1300-1370 / 1300-1370 waking per token after the decode;
# 1 slot 1030-1120 / 890-1020 against 860-920 / 700-730 (an ad hoc in-process script, not in bench/)
WAKE_S = 0.01


class PlainRun:
    """A slot's plain decoding, driven by the engine's decode thread (issue 59): after each
    decode the decode thread chooses the slot's next token with ``sample(row)`` -- the loop's own
    rule -- and queues its row for the next decode at once, so a plain cycle waits for no slot
    thread and no thread switch; the slot's thread takes the tokens (:meth:`take`) and streams them
    meanwhile. It stops by itself after an end-of-generation token, ``limit`` tokens, or the slot's
    last cell (the token chosen then is not decoded: the loop's root), or when cancelled.
    Only the decode thread calls ``sample`` while the run lives."""

    def __init__(self, sample: Callable[[np.ndarray], int], eog: frozenset, limit: int,
                 probe: Optional[Callable[[int, int], bool]] = None) -> None:
        self.sample, self.eog, self.limit = sample, eog, int(limit)
        # probe(token, position) -> True ends the run at that token (the loop's lookahead: drafts
        # were found for it, and the slot's thread verifies them); called on the decode thread
        self.probe = probe
        self.count = 0                    # tokens chosen
        self._woken = 0.0
        self._cv = threading.Condition()
        self._tokens: list = []
        self.finished = False
        self.cancelled = False
        self.error: Optional[BaseException] = None

    def push(self, tok: int, last: bool) -> bool:
        """Queue a token (the decode thread); True if the slot's thread is due a wake-up
        (:meth:`wake`): at the end, else at most every WAKE_S -- a woken thread takes the GIL,
        and the decode thread would wait for it at its next call into C, so the engine wakes
        slots right before ``llama_decode``, which runs without the GIL."""
        with self._cv:
            self._tokens.append(tok)
            self.count += 1
            self.finished = self.finished or last
            now = time.perf_counter()
            if last or now - self._woken >= WAKE_S:
                self._woken = now
                return True
            return False

    def wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def finish(self, error: Optional[BaseException] = None) -> None:
        with self._cv:
            self.error = self.error or error
            self.finished = True
            self._cv.notify_all()

    def take(self) -> tuple[list, bool, Optional[BaseException]]:
        """(tokens chosen since the last take, whether the run has ended, its error): waits for
        one token or the end."""
        with self._cv:
            while not self._tokens and not self.finished:
                self._cv.wait()
            toks, self._tokens = self._tokens, []
            return toks, self.finished, self.error

    def wait_finished(self) -> None:
        with self._cv:
            while not self.finished:
                self._cv.wait()


class BatchEngine:
    """The shared context and the rendezvous of its slots' decodes.

    A slot that generates is *active* (:meth:`enter` / :meth:`leave`, around a whole job). A
    decode waits until every active slot has one pending; the thread whose request completes the
    set runs them all (no extra thread, no hand-off on the single-user path). Requests of threads
    that are not active (start-up calibration, a remote-protocol verify) join the next set, or
    run at once when no slot is active."""

    def __init__(self, target: Any, n_slots: int, max_rows: int, pad_rows: int = 1) -> None:
        if target.kv_unified:
            raise InvalidArgumentError("BatchEngine needs a target with one KV stream per slot (kv_unified=False)")
        if n_slots > target.n_seq_max:
            raise InvalidArgumentError(f"{n_slots} slots on a context of {target.n_seq_max} sequences")
        self.target = target
        self.n_slots = n_slots
        self.max_rows = max(1, int(max_rows))
        # every call gets at least this many rows and logits rows (moa_cpp/target/batch_pad.py): 2 on a
        # target whose one-row decodes are computed apart from batches, which all agree; else 1
        self.pad_rows = max(1, int(pad_rows))
        self.n_ctx_slot = target.n_ctx // target.n_seq_max
        self._cv = threading.Condition()
        self._active: set = set()
        self._pending: dict = {}
        self._running = False
        self._ctx_lock = threading.Lock()       # every llama.cpp call on the shared context
        self._decoder: Optional[ThreadPoolExecutor] = None   # the one thread that decodes (_on_decode_thread)
        self._decode_lock = threading.Lock()
        self._to_wake: list = []                # plain runs whose threads wake before the next decode
        self.calls = 0                          # llama_decode calls (statistics)
        self.batches = 0                        # rendezvous sets
        self.rows = 0
        self._slots = [SlotTarget(self, i) for i in range(n_slots)]

    def slot(self, i: int) -> "SlotTarget":
        return self._slots[i]

    # ------------------------------------------------------------------ rendezvous

    def enter(self, seq: int) -> None:
        with self._cv:
            self._active.add(seq)

    def leave(self, seq: int) -> None:
        with self._cv:
            self._active.discard(seq)
            self._cv.notify_all()               # the others may all be waiting now
            reqs = self._take()                 # plain runs wait in no thread: their set starts here
        if reqs is not None:
            self._on_decode_thread(reqs)

    def _take(self) -> Optional[list]:
        if self._running or not self._pending or not self._active.issubset(self._pending):
            return None
        reqs = [self._pending[k] for k in sorted(self._pending)]
        self._pending.clear()
        self._running = True
        return reqs

    def _enqueue(self, req: _Request) -> None:
        """Add a slot's request to the pending set (under ``_cv``)."""
        seq = req.slot.seq
        if seq in self._pending:
            raise MoaError(f"slot {seq}: two decodes at once (one thread per slot)")
        self._pending[seq] = req

    def submit(self, req: _Request) -> None:
        with self._cv:
            self._enqueue(req)
            while not req.done:
                reqs = self._take()
                if reqs is None:
                    self._cv.wait()
                    continue
                self._cv.release()       # never held while taking _decode_lock (close() holds it)
                try:
                    self._on_decode_thread(reqs)
                finally:
                    self._cv.acquire()
        if req.error is not None:
            raise req.error

    def _on_decode_thread(self, reqs: list) -> None:
        """Hand a set to the engine's one decode thread, which wakes its slots when it is done
        (the slot that completed the set waits like the others: one thread switch less per
        cycle than waiting for the decode thread's answer first, ~40 us each here). Why not run
        it on the slot thread that completed the set: libgomp keeps an OpenMP pool per thread
        that ever ran a multi-threaded graph, and once all pools' workers outnumber the cores it
        sleeps on futexes at every barrier, in every pool (moa_cpp/target/omp_pool.py). Four slot
        threads taking turns at leading made four pools: SmolLM2 Q4_1 at 4 clients, 2 cores,
        decoded ~25 % slower than llama-server, which decodes on one thread."""
        with self._decode_lock:
            if self._decoder is None:
                self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="moa-decode")
            try:
                self._decoder.submit(self._execute_and_wake, reqs)
                return
            except RuntimeError:             # shut down (closing): the requests fail here
                pass
        self._execute_and_wake(reqs)

    def _execute_and_wake(self, reqs: Optional[list]) -> None:
        """Run a set, advance its plain runs (their next rows join the pending set at once), wake
        the slots; while the next set is already complete (plain runs only), run it too."""
        while reqs is not None:
            follow: list = []
            try:
                follow = self._execute(reqs)
            finally:
                with self._cv:
                    for r in reqs:                 # even if _execute failed outside a call
                        if not r.done:
                            r.error = r.error or MoaError("the batched decode stopped before this request ran")
                            r.done = True
                            if r.run is not None:
                                r.run.finish(r.error)
                    for f in follow:
                        if f.run.cancelled:
                            f.run.finish()
                        else:
                            self._pending[f.slot.seq] = f
                    self._running = False
                    self._cv.notify_all()
                    reqs = self._take()
                    if reqs is None:
                        self._wake()

    def _advance(self, r: _Request) -> Optional[_Request]:
        """A plain run's next token from its row, and the request that decodes it (None: ended)."""
        run, slot = r.run, r.slot
        if r.error is not None:
            run.finish(r.error)
            return None
        pos = int(r.positions[0])
        if r.lone:
            slot.lone_row_from = pos if slot.lone_row_from is None else min(slot.lone_row_from, pos)
        if run.cancelled:
            run.finish()
            return None
        try:
            tok = int(run.sample(r.logits[0]))
        except BaseException as e:       # the slot's loop hears of it; the other slots go on
            run.finish(e)
            return None
        last = tok in run.eog or run.count + 1 >= run.limit or pos + 1 >= slot.n_ctx
        if not last and run.probe is not None:
            try:
                last = bool(run.probe(tok, pos + 1))
            except BaseException as e:   # as a sampling error: the slot's loop hears of it
                run.finish(e)
                return None
        if run.push(tok, last):
            self._to_wake.append(run)
        if last:
            return None
        return _Request(slot, np.array([tok], np.int32), np.array([pos + 1], np.int32), False, True, run)

    def _wake(self) -> None:
        """Wake the slot threads of the runs that have tokens due (see :meth:`PlainRun.push`)."""
        runs, self._to_wake = self._to_wake, []
        for run in runs:
            run.wake()

    def start_run(self, req: _Request) -> None:
        """Queue a plain run's first row; the decode thread carries it on (no wait here)."""
        with self._cv:
            self._enqueue(req)
            reqs = self._take()
        if reqs is not None:
            self._on_decode_thread(reqs)

    def stop_run(self, run: PlainRun, seq: int) -> None:
        """Cancel a plain run and wait until the decode thread no longer touches the slot."""
        with self._cv:
            run.cancelled = True
            pending = self._pending.get(seq)
            if pending is not None and pending.run is run:    # (a set being decoded has left _pending)
                del self._pending[seq]          # its row waits for the others' rows: drop it
                run.finish()
        run.wait_finished()

    # ------------------------------------------------------------------ one set

    def _calls(self, reqs: list) -> list:
        """Requests packed in order into calls of at most ``max_rows`` rows (and ``n_batch``
        tokens); a larger request alone. Padded engines (``pad_rows`` > 1) put only requests of
        the same row count in a call: llama.cpp cuts a call into ubatches that take the same
        number of rows from each of a run of consecutive sequences, so unequal requests would
        leave a one-row ubatch (one-row kernels) where the request alone has none."""
        cap = min(self.max_rows, self.target.n_batch)
        groups: dict = {}
        for r in reqs:
            groups.setdefault(len(r.tokens) if self.pad_rows > 1 else 0, []).append(r)
        calls: list = []
        for group in groups.values():
            cur: list = []
            rows = 0
            for r in group:
                n = len(r.tokens)
                if cur and rows + n > cap:
                    calls.append(cur)
                    cur, rows = [], 0
                cur.append(r)
                rows += n
            if cur:
                calls.append(cur)
        return calls

    def _execute(self, reqs: list) -> list:
        """Decode a set (one call per :meth:`_calls` group); returns the plain runs' next
        requests (each run advances right after its call, while its rows are llama.cpp's)."""
        self.batches += 1
        follow: list = []
        for call in self._calls(reqs):
            try:
                with self._ctx_lock:
                    self._run_call(call)
            except BaseException as e:
                if len(call) == 1:
                    call[0].error = e
                else:                           # one slot's fault must not fail the others: each alone
                    for r in call:
                        try:
                            with self._ctx_lock:
                                self._run_call([r])
                        except BaseException as e1:
                            r.error = e1
            for r in call:
                if r.run is not None:
                    f = self._advance(r)
                    if f is not None:
                        follow.append(f)
                    r.logits = None             # a view of llama.cpp's buffer: not kept past the call
                r.done = True
        return follow

    def _run_call(self, call: list) -> None:
        tgt = self.target
        lens = [len(r.tokens) for r in call]
        if len(call) == 1:
            tokens, positions = call[0].tokens, call[0].positions
        else:
            tokens = np.concatenate([r.tokens for r in call])
            positions = np.concatenate([r.positions for r in call])
        seqs = np.repeat(np.array([r.slot.seq for r in call], np.int32), lens)
        starts = np.cumsum([0] + lens)
        ends = starts[1:] - 1
        outputs = np.zeros(len(tokens), np.int8)
        outputs[ends] = 1
        for r, a, b in zip(call, starts[:-1], starts[1:]):
            if r.all_rows:
                outputs[a:b] = 1
        real = outputs.copy()
        dummy = self._pad(call, outputs) if self.pad_rows > 1 else None
        if dummy is not None:
            tokens = np.concatenate([tokens, dummy[0]])
            positions = np.concatenate([positions, dummy[1]])
            seqs = np.concatenate([seqs, dummy[2]])
            outputs = np.concatenate([outputs, np.ones(len(dummy[0]), np.int8)])
        capture = any(r.capture for r in call)
        try:
            # a view of llama.cpp's logits: the plain runs read their rows before the next call,
            # the other requests get copies (below)
            logits = tgt.decode_rows(tokens, positions, seqs.tolist(), outputs, capture, copy=False,
                                     before=self._wake)
        finally:
            if dummy is not None:              # the dummy rows' cells go at once (the next token's cell)
                for seq, pos in zip(dummy[2].tolist(), dummy[1].tolist()):
                    tgt.seq_rm(seq, pos, -1)
        self.calls += 1
        self.rows += len(tokens)
        if len(outputs) != len(real) or not np.array_equal(outputs, real):
            asked = np.concatenate([real, np.zeros(len(outputs) - len(real), np.int8)])
            logits = logits[np.flatnonzero(asked[np.flatnonzero(outputs)])]   # the padding's rows dropped
            outputs = real
        inv = None
        if capture and len(call) > 1:
            order, _ = split_equal_order(seqs.tolist(), tgt.n_ubatch)
            inv = np.empty(len(order), np.int32)
            inv[np.asarray(order)] = np.arange(len(order), dtype=np.int32)
        out = np.cumsum([0] + [int(outputs[a:b].sum()) for a, b in zip(starts[:-1], starts[1:])]).tolist()
        lone = len(tokens) == 1 and int(positions[0]) >= LONE_ROW_CELLS
        for k, (r, a, b) in enumerate(zip(call, starts[:-1].tolist(), starts[1:].tolist())):
            rows = logits[out[k]:out[k + 1]]
            r.logits = rows if r.run is not None else rows.copy()
            if r.capture:
                cap_rows = np.arange(a, b, dtype=np.int32) if inv is None else inv[a:b]
                r.lsa = tgt.captured_lsa_in(cap_rows)
            r.lone = lone

    def _pad(self, call: list, outputs: np.ndarray) -> Optional[tuple]:
        """Make every ubatch of a padded call (same-size requests, :meth:`_calls`) compute at
        least two rows and two logits rows, as a request alone would: a request that asks for
        one logits row of several gets its row before too (``outputs``, in place; dropped later);
        a one-row request that no neighbouring sequence joins in a ubatch gets a dummy row at its
        next position (returned: tokens, positions, sequences; its cell removed after the call),
        unless its stream is full (then it decodes unpadded: its last cells)."""
        k = len(call[0].tokens)
        if k > 1:
            a = 0
            for r in call:
                b = a + len(r.tokens)
                if int(outputs[a:b].sum()) < 2:
                    outputs[b - 2:b] = 1
                a = b
            return None
        seqs = [r.slot.seq for r in call]
        alone = [r for i, r in enumerate(call)
                 if (i == 0 or seqs[i - 1] != seqs[i] - 1) and (i + 1 == len(call) or seqs[i + 1] != seqs[i] + 1)]
        alone = [r for r in alone if int(r.positions[-1]) + 1 < self.n_ctx_slot]
        if not alone:
            return None
        return (np.array([int(r.tokens[-1]) for r in alone], np.int32),
                np.array([int(r.positions[-1]) + 1 for r in alone], np.int32),
                np.array([r.slot.seq for r in alone], np.int32))

    # ------------------------------------------------------------------ KV edits

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        with self._ctx_lock:
            self.target.seq_rm(seq, p0, p1)

    def seq_pos_max(self, seq: int) -> int:
        import llama_cpp
        with self._ctx_lock:
            return int(llama_cpp.llama_memory_seq_pos_max(self.target._mem, seq))

    def close(self) -> None:
        with self._decode_lock:
            if self._decoder is not None:
                self._decoder.shutdown(wait=True)
                self._decoder = None
        self.target.close()


class SlotTarget:
    """One slot's view of the shared target: its sequence is the loop's sequence 0; everything
    that is not about the KV cache (vocabulary, chat template, measurements) is the shared
    target's. Thread-safe against the other slots; one thread at a time per slot."""

    holds_trees = False                       # one stream per slot: no room for a tree's sequences
    n_seq_max = 1
    decode_one = None                         # not the shared context's: a slot's decodes go through the engine

    def __init__(self, engine: BatchEngine, seq: int) -> None:
        self.__dict__["_engine"] = engine
        self.__dict__["seq"] = seq
        self.kv_version = 0
        self.lone_row_from: Optional[int] = None
        self.n_ctx = engine.n_ctx_slot
        self._lsa: Optional[np.ndarray] = None
        # a recurrent state (hybrid targets) rolls back once per decode, through llama.cpp's
        # snapshots; the engine's pad rows and shared decodes are not planned around that: slots of
        # such a target decode plainly (speculation_refusal)
        self.rollback_limit: Optional[int] = None if engine.target.rollback_limit is None else 0

    def __getattr__(self, name: str) -> Any:     # the shared target's (only for what is not set here)
        return getattr(self.__dict__["_engine"].target, name)

    @property
    def engine(self) -> BatchEngine:
        return self._engine

    # ------------------------------------------------------------------ decoding

    @property
    def n_past(self) -> int:
        return self._engine.seq_pos_max(self.seq) + 1

    def decode(self, tokens: Sequence[int], positions: Optional[Sequence[int]] = None, seq_ids: Any = None,
               capture: bool = True, logits: Optional[str] = "all") -> np.ndarray:
        """:meth:`Target.decode` on this slot's sequence, batched with the other slots' decodes."""
        toks = np.asarray(tokens, dtype=np.int32).reshape(-1)
        n = len(toks)
        if not 0 < n <= self._engine.target.n_batch:
            raise InvalidArgumentError(f"decode: {n} tokens; a decode takes 1..{self._engine.target.n_batch} (n_batch)")
        pos = (np.arange(n, dtype=np.int32) + self.n_past if positions is None
               else np.asarray(positions, dtype=np.int32).reshape(-1))
        if len(pos) != n:
            raise InvalidArgumentError(f"decode: {len(pos)} positions for {n} tokens")
        if toks.min() < 0 or toks.max() >= self.n_vocab:
            raise InvalidArgumentError(f"decode: token ids must be in [0, {self.n_vocab})")
        if int(pos.max()) >= self.n_ctx:      # the slot's stream is full: only this slot hears of it
            raise CacheFullError(f"no KV cache slot for {n} tokens at position {int(pos.max())} "
                                 f"(n_ctx {self.n_ctx} per slot)")
        if seq_ids is not None and any(np.ravel(s).tolist() != [0] for s in seq_ids):
            raise InvalidArgumentError("decode: a batched slot holds one sequence (trees need --no-cont-batching)")
        if capture and not self._engine.target._has_callback:
            raise InvalidArgumentError("decode(capture=True) on a Target built with install_callback=False")
        self.kv_version += 1
        self._lsa = None
        req = _Request(self, toks, pos, capture, logits == "all")
        self._engine.submit(req)
        if req.lone:
            p = int(pos[0])
            self.lone_row_from = p if self.lone_row_from is None else min(self.lone_row_from, p)
        self._lsa = req.lsa
        return req.logits

    def plain_run(self, root: int, pos: int, sample: Callable[[np.ndarray], int], limit: int,
                  probe: Optional[Callable[[int, int], bool]] = None) -> PlainRun:
        """Plain decoding from ``root`` at ``pos`` on, driven by the engine's decode thread
        (:class:`PlainRun`): ``sample(logits_row) -> token`` chooses each next token there, up to
        ``limit`` tokens; ``probe(token, position)`` returning True ends the run at that token (not
        decoded). :meth:`stop_run` ends it early (call it before any other use of the slot)."""
        if not 0 <= int(root) < self.n_vocab:
            raise InvalidArgumentError(f"decode: token ids must be in [0, {self.n_vocab})")
        if not 0 <= int(pos) < self.n_ctx:
            raise CacheFullError(f"no KV cache slot at position {int(pos)} (n_ctx {self.n_ctx} per slot)")
        if limit < 1:
            raise InvalidArgumentError("plain_run: limit must be >= 1")
        self.kv_version += 1
        self._lsa = None
        run = PlainRun(sample, frozenset(self.eog_tokens.tolist()), limit, probe)
        self._engine.start_run(_Request(self, np.array([int(root)], np.int32), np.array([int(pos)], np.int32),
                                        False, True, run))
        return run

    def stop_run(self, run: PlainRun) -> None:
        """End a :meth:`plain_run` early and wait until the decode thread has let go of the slot
        (its cells past what was taken are the caller's to drop)."""
        self._engine.stop_run(run, self.seq)
        self.kv_version += 1

    @property
    def n_captured(self) -> int:
        return 0 if self._lsa is None else len(self._lsa)

    def captured_lsa_in(self, rows: Optional[Sequence[int]] = None) -> np.ndarray:
        if self._lsa is None:
            return np.empty((0, self.n_layer, self.lsa_width), np.float32)
        return self._lsa.copy() if rows is None else self._lsa[np.asarray(rows, dtype=np.int64)]

    def captured_kv(self, rows: Optional[Sequence[int]] = None) -> tuple:
        return TargetContext.captured_kv(self, rows)

    # ------------------------------------------------------------------ the KV cache

    def rollback(self, pos: int) -> None:
        self.kv_version += 1
        if self.lone_row_from is not None and self.lone_row_from >= pos:
            self.lone_row_from = None
        self._engine.seq_rm(self.seq, int(pos), -1)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None:
        if seq_id not in (0, -1):
            raise InvalidArgumentError(f"seq_rm({seq_id}): a batched slot holds sequence 0 only")
        self.kv_version += 1
        self._engine.seq_rm(self.seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        raise InvalidArgumentError("a batched slot holds one sequence: trees need --no-cont-batching")

    def clear(self) -> None:
        self.kv_version += 1
        self.lone_row_from = None
        self._engine.seq_rm(self.seq, -1, -1)

    def sibling(self, **_: Any) -> Any:
        raise InvalidArgumentError("a batched slot has no siblings: its engine holds one slot per sequence")

    def close(self) -> None:
        """The engine owns the context (BatchEngine.close)."""

    def __repr__(self) -> str:
        return f"SlotTarget(seq={self.seq}, n_ctx={self.n_ctx}, {self._engine.target!r})"
