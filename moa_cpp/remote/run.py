"""One remote generation (:class:`RemoteRun`): the open, then one cycle per server call --
draft here (the engine's proposer, shaped by the loop's :func:`~moa_cpp.speculative.loop.fit_chain`),
verify there, append the CA K/V of the verified tokens -- and, while the server is away,
drafting alone (unverified tokens, CA frozen) until it answers again and the tail is resynced
or the session reopened by replay.

Bookkeeping: ``out`` holds the verified generated tokens, the last one the root (at position
``n``, not yet decoded by the target); ``unverified`` the tokens drafted past the root while the
server was away. Verified tokens are never withdrawn; each unverified one is confirmed or rolled
back exactly once (the :class:`~moa_cpp.remote.results.Event` stream says which).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np

from moa_cpp.speculative.loop import fit_chain
from moa_cpp.speculative.types import Proposal, SamplingParams
from moa_cpp.remote import protocol as P
from moa_cpp.remote.replies import check_reply
from moa_cpp.remote.results import Event, RemoteResult, RemoteStats
from moa_cpp.remote.transport import UNAVAILABLE, RemoteError

if TYPE_CHECKING:
    from moa_cpp.remote.client_parts import ClientParts


class Unavailable(Exception):
    """The server cannot be reached (refused, reset, timed out, 502-504): go offline."""


def call_record(t0: float, sent: int, received: int, reply: dict) -> dict:
    """The bench's record of one server call (``RemoteGenerator(on_call=...)``): start time t,
    request wall time, bytes each way, the server's timing (decode_ms, lsa_ms, prefill_ms) and,
    when CA travelled, its row count, bytes and zlib level-1 size. The cycle adds kind (open /
    verify / resync), k (proposal nodes), a (accepted), t_draft, t_append, t_cycle (s)."""
    rec = {"t": t0, "t_wall": time.perf_counter() - t0, "req_bytes": sent, "resp_bytes": received,
           **(reply.get("timing") or {})}
    ca = reply.get("ca")
    if isinstance(ca, dict) and ca.get("n"):
        import zlib
        raw = bytes(ca.get("k", b"")) + bytes(ca.get("v", b""))
        rec.update(ca_n=ca["n"], ca_bytes=len(raw), ca_zlib1=len(zlib.compress(raw, 1)))
    return rec


class RemoteRun:
    """The state of one remote generation of ``client`` (see the module docstring)."""

    MAX_CHAIN = 62          # tokens per verify of an unverified tail where the server has no resync

    def __init__(self, client: "ClientParts", prompt: list, max_tokens: int, sampling: dict,
                 on_event: Optional[Callable[[Event], None]], on_call: Optional[Callable[[dict], None]] = None) -> None:
        self.client, self.prompt, self.max_tokens, self.sampling = client, prompt, max_tokens, sampling
        self.on_event, self.on_call = on_event, on_call
        self.st = RemoteStats()
        self.events: list = []
        self.out: list = []
        self.unverified: list = []
        self.feed: list = list(prompt)
        self.sid: Optional[str] = None
        self.max_resync = 0     # the server's max_resync_tokens (0: it verifies no resync chains)
        self.seq = 0
        self.n = 0
        self.done = False
        self.finish = "length"
        self._record: Optional[dict] = None     # the latest call's record, until its cycle completes it

    # -------------------------------------------------------------- events and records

    def _emit(self, ev: Event) -> None:
        self.events.append(ev)
        if self.on_event is not None:
            self.on_event(ev)

    def _traced(self, **extra) -> None:
        """Hand the latest call's record, completed with ``extra``, to ``on_call`` (once)."""
        rec, self._record = self._record, None
        if rec is not None:
            rec.update(extra)
            self.on_call(rec)

    @property
    def root(self) -> int:
        return self.out[-1]

    # -------------------------------------------------------------- server calls

    def _call(self, method: str, path: str, obj: Optional[dict]) -> dict:
        st = self.st
        self._traced()
        b0, b1, t = st.bytes_sent, st.bytes_received, time.perf_counter()
        try:
            r = self.client.http.call(method, path, obj, st)
        except RemoteError as e:
            if e.status in (502, 503, 504):
                raise Unavailable(str(e)) from None
            raise
        except UNAVAILABLE as e:
            raise Unavailable(f"{type(e).__name__}: {e}") from None
        if self.on_call is not None:
            self._record = call_record(t, st.bytes_sent - b0, st.bytes_received - b1, r)
        return r

    def _checked(self, r: dict, n_prop: Optional[int] = None) -> dict:
        c = self.client
        return check_reply(r, n_prop, n_ctx=c.n_ctx, n_vocab=c.n_vocab, ca_heads=c.model.ca_kv_heads,
                           head_dim=c.model.head_dim)

    def _append_ca(self, r: dict) -> float:
        """Append the answer's CA K/V to the drafter state; the time it took (s)."""
        t = time.perf_counter()
        k, v, pos0 = r["_ca"]
        if k.shape[0]:
            self.client.state.append_ca(k, v, pos0)
        return time.perf_counter() - t

    def _open(self, replay: bool) -> dict:
        c = self.client
        msg = {"v": P.VERSION, "seq": self.seq, "prompt": P.pack_i32(self.prompt), "sampling": self.sampling,
               "ca_dtype": c.ca_dtype, "max_tokens": self.max_tokens}
        if c.bundle_id is not None:
            msg["bundle_id"] = c.bundle_id
        if replay:
            msg.update(generated=P.pack_i32(self.out[:-1]), root=self.root)
        try:
            r = self._call("POST", "/moa/v1/sessions", msg)
        except RemoteError as e:
            if e.kind == "bundle_mismatch":
                raise RemoteError(f"the client bundle '{c.bundle.dir}' (bundle_id {c.bundle_id[:16]}…) "
                                  f"was made for another drafter/target than the server's: {e}. Rebuild it with "
                                  "`moa-cpp bundle`, or run the client without --bundle to download the server's",
                                  e.status, e.kind) from None
            raise
        r = self._checked(r)
        self.sid = r["session"]
        m = r.get("max_resync_tokens")
        self.max_resync = m if isinstance(m, int) and not isinstance(m, bool) and 0 < m <= 1 << 16 else 0
        if replay:
            self.st.reopen_calls += 1
        else:
            self.st.open_calls += 1
        return r

    # -------------------------------------------------------------- main loop

    def go(self) -> RemoteResult:
        c = self.client
        c.state.rollback(0)
        try:
            r = self._open(False)
        except Unavailable as e:       # nothing generated yet: nothing to continue offline from
            raise RemoteError(f"cannot reach the server at {c.http.host}:{c.http.port} ({e})", 0,
                              "unavailable") from None
        t_append = self._append_ca(r)
        self._traced(kind="open", k=len(self.prompt), a=0, t_append=t_append)
        first = r["_tokens"]
        self.out += first
        self.n = r["n"]
        self._emit(Event("tokens", 0, tuple(first), True))
        self.done = r["eog"] or not first
        self.finish = r.get("finish_reason") or "stop"
        return self._loop()

    def resume(self, wait: float) -> RemoteResult:
        """Go on after a generation gave up with an unverified tail: wait up to ``wait`` seconds
        for the server, have the tail verified (reopening by replay if the server restarted) and
        finish the generation."""
        c = self.client
        old, c.resync_wait = c.resync_wait, wait
        self.done, self.finish = False, "length"
        try:
            return self._loop()
        finally:
            c.resync_wait = old

    def _loop(self) -> RemoteResult:
        st = self.st
        try:
            while not self.done:
                self._cycle()
        finally:
            if self.sid is not None and not self.done:
                try:
                    self._call("DELETE", f"/moa/v1/sessions/{self.sid}", None)
                except (Unavailable, RemoteError):
                    pass
            self._traced()
        st.n_generated = len(self.out)
        text = self.client.vocab.detokenize(self.out).decode("utf-8", "replace")
        return RemoteResult(text, list(self.out), self.finish, st, list(self.unverified), self.events, self)

    def _proposal(self) -> tuple:
        """(this cycle's proposal, drafter seconds, resync?): the unverified tail as one resync
        (the server verifies it in batch-sized pieces; in 62-token verifies where the server has
        no resync), else a fresh draft from the root."""
        if self.unverified:
            return Proposal.chain(self.unverified[: self.max_resync or self.MAX_CHAIN]), 0.0, True
        c = self.client
        # a chain no longer than the tokens still wanted (longer would only cost drafter work and bytes)
        shape = fit_chain(c.draft, max(1, self.max_tokens - len(self.out)))
        t = time.perf_counter()
        prop = c.proposer.propose(self.feed, self.root, self.n, SamplingParams(), None, shape)
        self.feed = []
        t_draft = time.perf_counter() - t
        self.st.t_drafter += t_draft
        return prop, t_draft, False

    def _cycle(self) -> None:
        t_cycle = time.perf_counter()
        prop, t_draft, resync = self._proposal()
        prop_tokens = [int(x) for x in prop.tokens]
        self.seq += 1
        msg = {"v": P.VERSION, "seq": self.seq, "n": self.n, "root": self.root,
               "tokens": P.pack_i32(prop_tokens), "parents": P.pack_i16([int(x) for x in prop.parents])}
        if resync and self.max_resync:
            msg["resync"] = True
        try:
            r = self._call("POST", f"/moa/v1/sessions/{self.sid}/verify", msg)
        except Unavailable:
            self._offline()
            return
        except RemoteError as e:
            if e.status == 404 or e.kind == "state_mismatch":
                try:
                    self._reopen()
                except Unavailable:          # gone again while reopening: keep drafting alone
                    self._offline()
                return
            raise
        r = self._checked(r, len(prop_tokens))
        t_append = self._verified(r, prop_tokens)
        self._traced(kind="resync" if resync else "verify", k=len(prop_tokens), a=int(r["accepted"]),
                     t_draft=t_draft, t_append=t_append, t_cycle=time.perf_counter() - t_cycle)

    def _verified(self, r: dict, prop_tokens: list) -> float:
        """Apply a verify answer: CA, confirmed / rolled-back unverified tokens, new tokens. The
        CA append's time (s)."""
        st = self.st
        st.verify_calls += 1
        a = int(r["accepted"])
        st.drafted += int(r.get("drafted", len(prop_tokens)))     # what the server verified of it
        st.accepted += a
        t_append = self._append_ca(r)
        new = r["_tokens"]
        self.feed = [self.root] + new[:a]        # the accepted path (a tree's need not be its first nodes)
        pos = len(self.out)
        if self.unverified:
            tail = self.unverified
            k = a
            matched = len(new) > a and a < len(tail) and new[a] == tail[a]
            if matched:
                k += 1                       # the target's own next token is the drafted one
            if k:
                self._emit(Event("confirm", pos, n=k))
                st.unverified_confirmed += k
            rest = tail[k:]
            if rest and not matched:
                self._emit(Event("rollback", pos + k, tuple(rest), False, n=len(rest)))
                st.unverified_rolled_back += len(rest)
                rest = []
            self.unverified = rest
            fresh = new[k:]
        else:
            fresh = new
        self.out += new
        if fresh:
            self._emit(Event("tokens", len(self.out) - len(fresh), tuple(fresh), True))
        self.n = r["n"]
        if r["eog"]:
            self.done = True
            self.finish = r.get("finish_reason") or "stop"
            if self.unverified:                                 # drafted past the end: withdrawn
                self._emit(Event("rollback", len(self.out), tuple(self.unverified), False, n=len(self.unverified)))
                st.unverified_rolled_back += len(self.unverified)
                self.unverified = []
        return t_append

    # -------------------------------------------------------------- disconnection

    def _offline(self) -> None:
        """Keep drafting alone (CA frozen) until the server answers /health again, then return
        (the next cycle resyncs). Gives up after ``resync_wait`` seconds at the limit."""
        c, st = self.client, self.st
        st.disconnections += 1
        self._emit(Event("status", len(self.out), state="disconnected"))
        t0 = time.monotonic()
        self._draft_from_root()
        probe_at, delay = 0.0, 0.1
        while True:
            now = time.monotonic()
            if now >= probe_at:
                if c.http.healthy(c.probe_timeout):
                    break
                delay = min(2.0, delay * 2)
                probe_at = now + delay
            total = len(self.out) + len(self.unverified)
            if len(self.unverified) < c.max_unverified and total < self.max_tokens:
                self._draft_more(1)
            elif now - t0 > c.resync_wait:
                st.offline_s += time.monotonic() - t0
                self._emit(Event("status", len(self.out), state="gave_up"))
                self.done, self.finish = True, "unverified"
                return
            else:
                time.sleep(min(0.05, max(0.0, probe_at - now)))
        st.offline_s += time.monotonic() - t0
        st.resyncs += 1
        self._emit(Event("status", len(self.out), state="reconnected"))

    def _draft_from_root(self) -> None:
        """(Re)build the offline chain's draft rows: the root, then the unverified tokens already
        shown (a failure during a resync keeps them); with none yet, draft the first one."""
        state = self.client.state
        state.clear_drafts()
        chain = [self.root] + self.unverified
        logits = state.draft(chain, list(range(self.n, self.n + len(chain))), list(range(-1, len(chain) - 1)),
                             feed=self.feed)
        self.feed = []
        if not self.unverified:
            self._push(logits[0])

    def _draft_more(self, k: int) -> None:
        state = self.client.state
        for _ in range(k):
            last, pos = self.unverified[-1], self.n + len(self.unverified)
            self._push(state.draft([last], [pos])[0])

    def _push(self, logits: np.ndarray) -> None:
        tok = int(np.argmax(logits))
        tok = int(self.client.proposer.target_ids(np.array([tok]))[0])
        self.unverified.append(tok)
        self.st.unverified_tokens += 1
        self._emit(Event("tokens", len(self.out) + len(self.unverified) - 1, (tok,), False))

    def _reopen(self) -> None:
        """The session is gone (server restarted): reopen by replaying the verified tokens."""
        self._open(True)
        self._emit(Event("status", len(self.out), state="reopened"))
        self.seq += 1
