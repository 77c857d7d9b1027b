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
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from moa_cpp.server.errors import APIError, bad_request
from moa_cpp.server.sessions import Session

log = logging.getLogger("moa_cpp.server")


@dataclass
class GenParams:
    prompt: Any                     # text, token ids, or chat messages (with chat=True)
    chat: bool
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: Optional[int]
    stop: list
    draft: Optional[str]
    ignore_eos: bool = False
    logprobs: Optional[int] = None    # each token's logprob and this many alternatives (None: off)
    sampling: dict = field(default_factory=dict)   # min_p, penalties, logit_bias (stream_steps keywords)
    tools: Optional[list] = None      # OpenAI tools the chat template renders
    tool_plan: Any = None             # moa_cpp.tools.ToolPlan of a chat request with tools


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

    def _put(self, *event: Any) -> None:
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
        gen, p = self.session.gen, self.params
        tgt = gen.target
        try:
            ids = gen.encode(p.prompt, p.chat, p.tools)
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
        gen, p = self.session.gen, self.params
        # a batched slot: the other slots' decodes wait for this one's while it generates
        engine = getattr(gen.target, "engine", None)
        if engine is not None:
            engine.enter(gen.target.seq)
        try:
            if self.cancelled.is_set():
                return
            ids = self._encode()
            self._put("ready", len(ids))
            it = gen.stream_steps(ids, max_tokens=p.max_tokens, temperature=p.temperature, top_k=p.top_k,
                                  top_p=p.top_p, seed=p.seed, stop=p.stop, draft=p.draft,
                                  ignore_eos=p.ignore_eos, logprobs=p.logprobs, token_spans=True, **p.sampling)
            held: list = []          # a whole job's pieces: (tokens, text, logprobs, spans)
            try:
                for piece in it:
                    if self.live:
                        self._put("piece", list(piece.tokens), piece.text, piece.logprobs, piece.spans)
                    else:
                        held.append(piece)
                    if self.cancelled.is_set():
                        self._put("cancelled")
                        return
            finally:
                it.close()
            if held:
                self._put("piece", [t for p in held for t in p.tokens], "".join(p.text for p in held),
                          [lp for p in held for lp in p.logprobs], [s for p in held for s in (p.spans or [])])
            self._put("done", gen.last_stats)
            try:
                gen.loop.settle()    # the answer is out: ready the caches for the next turn
            except Exception:        # the answer was sent; the next prompt decodes more instead
                log.exception("settling the session's caches failed")
                gen.target.clear()
        except BaseException as e:   # answered as an error; the server keeps running
            self._put("error", e)
        finally:
            if engine is not None:
                engine.leave(gen.target.seq)
            try:
                self._loop.call_soon_threadsafe(self._release, self.session)
            except RuntimeError:
                pass
