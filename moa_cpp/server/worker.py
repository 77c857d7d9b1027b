"""One generation run off the event loop (so ``/health`` and other requests are answered during
long generations), reporting to the request's coroutine through an asyncio queue.

Events, in order: ``("ready", n_prompt)`` once the prompt is encoded and fits (or
``("error", exc)``), then ``("piece", token_ids, text, logprobs, spans)`` per verified step (spans: the text split by
token, with who chose each: :mod:`moa_cpp.token_spans`), then
``("done", stats)`` or ``("error", exc)``. Cancelling (client gone, shutdown) takes effect after
the current step; the session is given back the moment the thread stops using it.

Hand-offs to the event loop cost a thread switch each, taken while the other slots of a batched
context wait for this one's next decode (issue 59), so they are few: a streamed job's events
travel in batches (one wake-up of the event loop carries every event queued since the last
one), and a whole (non-streamed) job's pieces are merged into one piece, sent with ``done``.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any, Callable

from moa_cpp.generator import GenerationRequest
from moa_cpp.server.errors import APIError, bad_request
from moa_cpp.server.sessions import Session
from moa_cpp.streaming import Piece

log = logging.getLogger("moa_cpp.server")


@dataclass(frozen=True)
class GenParams:
    """What the server runs for one request: the engine's typed request (sampling and the draft
    setting checked and typed once, in :meth:`moa_cpp.server.app.Server.params`), plus what only
    the server reads: the tool plan (an answer read back as tool calls)."""
    request: GenerationRequest
    tool_plan: Any = None             # moa_cpp.tools.ToolPlan of a chat request with tools


# What a job hands the event loop, in order: Ready, then Piece* (moa_cpp.streaming.Piece), then
# one of Done / Cancelled / Failed.
@dataclass(frozen=True)
class Ready:
    n_prompt: int                     # the prompt's tokens (encoded and checked)


@dataclass(frozen=True)
class Done:
    stats: Any                        # the generation's SpecStats


@dataclass(frozen=True)
class Cancelled:
    pass


@dataclass(frozen=True)
class Failed:
    error: BaseException


class Job:
    """One generation on a session's thread. ``live`` (a streamed response): every piece is sent
    as it is verified; else the pieces are merged and sent once, with ``done``."""

    def __init__(self, session: Session, params: GenParams, release: Callable[[Session], None],
                 live: bool = True) -> None:
        self.session = session
        self.params = params
        self.live = live
        self._release = release
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self._loop = asyncio.get_running_loop()
        self._outbox: deque = deque()      # events not yet handed to the event loop
        self._lock = threading.Lock()
        self._flush_pending = False

    def start(self, executor: Executor) -> None:
        self._loop.run_in_executor(executor, self._run)

    def cancel(self) -> None:
        self.cancelled.set()

    def _put(self, event: Any) -> None:
        with self._lock:
            self._outbox.append(event)
            if self._flush_pending:       # a wake-up is on its way: it takes this event too
                return
            self._flush_pending = True
        try:
            self._loop.call_soon_threadsafe(self._flush)
        except RuntimeError:        # the event loop is gone (shutdown): nobody listens
            pass

    def _flush(self) -> None:
        """On the event loop: queue every event the thread has put since the last flush."""
        with self._lock:
            events = list(self._outbox)
            self._outbox.clear()
            self._flush_pending = False
        for ev in events:
            self.events.put_nowait(ev)

    def _encode(self) -> list:
        gen, p = self.session.gen, self.params.request
        tgt = gen.target
        try:
            ids = gen.encode(p.prompt, p.chat, list(p.tools) if p.tools else None)
        except APIError:
            raise
        except Exception as e:      # e.g. a chat template that rejects the roles' order
            raise bad_request(f"could not build the prompt: {e}", param="messages" if p.chat else "prompt") from None
        bad = [t for t in ids if not 0 <= t < tgt.n_vocab]
        if bad:
            raise bad_request(f"token id {bad[0]} is out of the vocabulary (0..{tgt.n_vocab - 1})", param="prompt")
        if not ids:
            raise bad_request("the prompt is empty (no tokens)", param="prompt")
        if len(ids) >= tgt.n_ctx:
            raise bad_request(f"the prompt has {len(ids)} tokens; this server's context holds {tgt.n_ctx} "
                              f"(prompt + completion)", param="messages" if p.chat else "prompt",
                              code="context_length_exceeded")
        return ids

    def _run(self) -> None:
        gen, req = self.session.gen, self.params.request
        # a batched slot: the other slots' decodes wait for this one's while it generates
        engine = getattr(gen.target, "engine", None)
        if engine is not None:
            engine.enter(gen.target.seq)
        try:
            if self.cancelled.is_set():
                return
            ids = self._encode()
            self._put(Ready(len(ids)))
            it = gen.stream_request(replace(req, prompt=ids, chat=False, tools=None, token_spans=True))
            held: list = []          # a whole job's pieces
            stats = None             # the last piece's: the generation's statistics
            try:
                for piece in it:
                    stats = piece.stats or stats
                    if self.live:
                        self._put(piece)
                    else:
                        held.append(piece)
                    if self.cancelled.is_set():
                        self._put(Cancelled())
                        return
            finally:
                it.close()
            if held:
                self._put(Piece([t for p in held for t in p.tokens], "".join(p.text for p in held),
                                [lp for p in held for lp in p.logprobs], [s for p in held for s in (p.spans or [])]))
            self._put(Done(stats))
            try:
                gen.loop.settle()    # the answer is out: ready the caches for the next turn
            except Exception:        # the answer was sent; the next prompt decodes more instead
                log.exception("settling the session's caches failed")
                gen.target.clear()
        except BaseException as e:   # answered as an error; the server keeps running
            self._put(Failed(e))
        finally:
            if engine is not None:
                engine.leave(gen.target.seq)
            try:
                self._loop.call_soon_threadsafe(self._release, self.session)
            except RuntimeError:
                pass
