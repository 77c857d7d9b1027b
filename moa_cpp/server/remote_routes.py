"""The MoA protocol's routes on the ``moa-cpp serve`` process (same keys, limits and session pool
as the OpenAI routes): ``GET /moa/v1/info``, ``POST /moa/v1/sessions`` (open),
``POST /moa/v1/sessions/{id}/verify``, ``DELETE /moa/v1/sessions/{id}``.

A remote session holds a pool session from open until it is closed, its generation ends, or it
makes no progress for ``--idle-timeout`` seconds (a sweeper closes it; the client reopens by
replay on its next call's 404; empty verifies and rewinds are not progress). A key holds at most
``--max-sessions-per-key`` sessions, queued opens included; an open whose client leaves while it
waits for a pool session is dropped; an unexpected failure inside a cycle closes the session.
Another key's session is a 404.
"""
from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from moa_cpp.remote import protocol as P
from moa_cpp.speculative.types import SamplingParams
from moa_cpp.server.auth import offered_key
from moa_cpp.server.body import read_body, until_disconnect
from moa_cpp.server.bundle_routes import BundleAPI
from moa_cpp.server.errors import APIError
from moa_cpp.server.remote_sessions import (RemoteSession, check_state, new_session, open_generation, resync_chain, rewind,
                              verify_cycle)

MAX_PROMPT = 1 << 16
DECODE_INLINE = 64 << 10       # bytes decoded on the event loop; larger bodies in a thread


def context_margin(n_ctx: int) -> int:
    """Positions an open must leave free: one full verification (63 rows) on a large context, an
    eighth of a small one. A prompt that fills the context would leave a session that can only
    end, holding a pool session for nothing."""
    return min(64, n_ctx // 8)


def _err(e: P.ProtocolError) -> APIError:
    return APIError(e.status, str(e), code=e.kind)


class RemoteAPI:
    def __init__(self, srv: Any) -> None:
        self.srv = srv
        self.sessions: dict = {}
        self.locks: dict = {}
        self.sweeper: Any = None          # started with the first session (uvicorn runs without lifespan)
        self.opening: dict = {}           # owner -> opens waiting for a pool session
        self.bundle = BundleAPI(srv)      # --bundle files, this server's bundle_id

    # ------------------------------------------------------------------ helpers

    async def _body(self, request: Request) -> tuple:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        body = await read_body(request, self.srv.settings.max_body_bytes, self.srv.settings.body_timeout_s)
        try:
            if len(body) <= DECODE_INLINE:        # a cycle's body: microseconds, no thread hop
                return P.decode_body(body, ctype, self.srv.settings.max_body_bytes), ctype
            # a large body (a long prompt, a replay) is decoded off the event loop: /health and
            # the other clients' cycles do not wait for it
            return await asyncio.get_running_loop().run_in_executor(
                None, P.decode_body, body, ctype, self.srv.settings.max_body_bytes), ctype
        except P.ProtocolError as e:
            raise _err(e) from None

    def _reply(self, obj: dict, ctype: str) -> Response:
        return Response(P.encode_body(obj, ctype), media_type=ctype)

    def _owner(self, request: Request) -> bytes:
        return hashlib.sha256((offered_key(request.scope.get("headers", ())) or "").encode()).digest()

    def _session(self, request: Request) -> RemoteSession:
        rs = self.sessions.get(request.path_params["sid"])
        if rs is None or rs.closed or rs.owner != self._owner(request):
            raise APIError(404, "no such session (closed, expired, or the server restarted)", code="session_not_found")
        return rs

    def _close(self, rs: RemoteSession) -> None:
        if not rs.closed:
            rs.closed = True
            self.sessions.pop(rs.id, None)
            self.locks.pop(rs.id, None)
            self.srv.pool.release(rs.pool_session)

    def _make_room_for(self, owner: bytes, limit: int) -> int:
        """Sessions + queued opens ``owner`` holds after closing its own longest-unused sessions
        that no cycle is using, down to ``limit - 1`` (a client that lost track of a session - a
        generation given up offline, a crash - opens again without waiting for the idle timeout)."""
        own = sorted((rs for rs in self.sessions.values() if rs.owner == owner), key=lambda rs: rs.last_used)
        held = len(own) + self.opening.get(owner, 0)
        for rs in own:
            if held < limit:
                break
            if not self.locks[rs.id].locked():
                self._close(rs)
                held -= 1
        return held

    def _reap(self) -> None:
        now, idle = time.monotonic(), self.srv.settings.idle_timeout_s
        for rs in list(self.sessions.values()):
            if now - rs.last_used > idle and not self.locks[rs.id].locked():
                self._close(rs)

    async def sweep(self) -> None:
        """Close idle sessions every few seconds, so an abandoned one frees its pool session
        (and a queued request gets it) without waiting for the next open."""
        period = min(10.0, max(0.1, self.srv.settings.idle_timeout_s / 4))
        while True:
            await asyncio.sleep(period)
            self._reap()

    async def _run(self, fn: Any, *args: Any) -> dict:
        try:
            return await asyncio.get_running_loop().run_in_executor(self.srv.executor, fn, *args)
        except P.ProtocolError as e:
            raise _err(e) from None
        except ValueError as e:
            raise APIError(422, str(e), code="invalid_request") from None

    # ------------------------------------------------------------------ routes

    async def info(self, request: Request) -> Response:
        gen = self.srv.pool.sessions[0].gen
        m = gen.state.model if gen.state is not None else None
        return JSONResponse({"model": self.srv.model, "protocol": P.VERSION, "n_vocab": gen.target.n_vocab,
                             "n_ctx": self.srv.n_ctx, "ca_dtypes": list(P.CA_DTYPES),
                             "ca_heads": m.ca_kv_heads if m else None, "ca_dim": m.head_dim if m else None,
                             "tli": m.tli if m else None,
                             "bundle_id": await self.bundle.bundle_id_async(),
                             "limits": {"max_tree_nodes": self.srv.settings.max_tree_nodes,
                                        "max_resync_tokens": self.srv.settings.max_resync_tokens,
                                        "max_body_bytes": self.srv.settings.max_body_bytes}})

    async def open(self, request: Request) -> Response:
        msg, ctype = await self._body(request)
        try:
            prompt = P.unpack_ints(msg.get("prompt"), "<i4", "prompt", MAX_PROMPT)
            sp = _sampling(msg.get("sampling", {}))
            ca_dtype = msg.get("ca_dtype", "f16")
            if ca_dtype not in P.CA_DTYPES:
                raise P.ProtocolError(f"ca_dtype must be one of {', '.join(P.CA_DTYPES)}", "invalid_field")
            max_tokens = P.get_int(msg, "max_tokens", 1, self.srv.max_tokens_limit, 256)
            seq = P.get_int(msg, "seq", 0, 2 ** 62)
            generated = P.unpack_ints(msg.get("generated", b""), "<i4", "generated", MAX_PROMPT)
            root = P.get_int(msg, "root", -1, 2 ** 31, -1)
        except P.ProtocolError as e:
            raise _err(e) from None
        await self.bundle.check_open(msg)
        n_vocab = self.srv.pool.sessions[0].gen.target.n_vocab
        if prompt.size == 0 or prompt.min() < 0 or prompt.max() >= n_vocab:
            raise APIError(422, f"prompt: 1.. token ids in [0, {n_vocab})", code="invalid_field")
        if root >= n_vocab or (generated.size and (generated.min() < 0 or generated.max() >= n_vocab)):
            raise APIError(422, f"generated / root: token ids in [0, {n_vocab})", code="invalid_field")
        if generated.size and root < 0:
            raise APIError(422, "a replay (generated) needs its root", code="invalid_field")
        margin = context_margin(self.srv.n_ctx)
        if prompt.size + generated.size + margin > self.srv.n_ctx:
            raise APIError(422, f"the prompt ({prompt.size + generated.size} tokens) does not fit the context "
                                f"({self.srv.n_ctx} positions, {margin} of them kept for what it generates)",
                           code="context_full")
        self._reap()
        if self.sweeper is None:
            self.sweeper = asyncio.get_running_loop().create_task(self.sweep())
        owner = self._owner(request)
        limit = self.srv.settings.sessions_per_key()
        held = self._make_room_for(owner, limit) if limit else 0
        if limit and held >= limit:
            raise APIError(429, f"this key already holds {held} session(s) (--max-sessions-per-key {limit}): close one "
                                "(DELETE /moa/v1/sessions/ID) or let it finish", code="too_many_sessions",
                           headers={"Retry-After": str(self.srv.settings.retry_after_s)})
        self.opening[owner] = self.opening.get(owner, 0) + 1
        try:
            # a client that leaves while queued must not be served (and hold a session) later
            pool_session = await until_disconnect(request, self.srv.pool.acquire())
        finally:
            self.opening[owner] -= 1
            if not self.opening[owner]:
                del self.opening[owner]
        try:
            rs = new_session(pool_session, offered_key(request.scope.get("headers", ())), ca_dtype)
        except P.ProtocolError as e:
            self.srv.pool.release(pool_session)
            raise _err(e) from None
        rs.last_seq = seq
        self.sessions[rs.id] = rs
        self.locks[rs.id] = asyncio.Lock()
        async with self.locks[rs.id]:
            try:
                out = await self._run(open_generation, rs, prompt, sp, max_tokens, generated, root)
            except BaseException:
                self._close(rs)
                raise
            rs.progressed()
            if rs.g.finished:
                self._close(rs)
        out["max_resync_tokens"] = self.srv.settings.max_resync_tokens
        return self._reply(out, ctype)

    async def verify(self, request: Request) -> Response:
        rs = self._session(request)
        msg, ctype = await self._body(request)
        async with self.locks.get(rs.id) or asyncio.Lock():
            if rs.closed:
                raise APIError(404, "no such session", code="session_not_found")
            try:
                seq = P.get_int(msg, "seq", 0, 2 ** 62)
                n = P.get_int(msg, "n", 0, 2 ** 31)
                root = P.get_int(msg, "root", 0, 2 ** 31)
                resync = P.get_bool(msg, "resync", False)
                st = self.srv.settings
                nodes = st.max_resync_tokens if resync else st.max_tree_nodes
                tokens = P.unpack_ints(msg.get("tokens", b""), "<i4", "tokens", nodes)
                parents = P.unpack_ints(msg.get("parents", b""), "<i2", "parents", nodes)
                P.check_tree(tokens, parents, rs.loop.target.n_vocab, nodes, max_depth=nodes)
                if resync and not P.is_chain(parents):
                    raise P.ProtocolError("a resync verifies a chain: parents must be -1, 0, 1, ...", "invalid_tree", 422)
                behind = check_state(rs, seq, n, root)
            except P.ProtocolError as e:
                raise _err(e) from None
            rs.last_seq = seq
            try:
                if behind:                      # its last answer was lost: redo from n
                    await self._run(rewind, rs, n)
                out = await self._run(resync_chain if resync else verify_cycle, rs, tokens, parents)
            except APIError:
                raise
            except Exception:
                # its state is unknown now (docs/client-server.md#security): close it; the client reopens by replay
                self._close(rs)
                raise
            out["seq"] = seq
            rs.progressed()
            if rs.g.finished:
                self._close(rs)
        return self._reply(out, ctype)

    async def close(self, request: Request) -> Response:
        rs = self._session(request)
        async with self.locks.get(rs.id) or asyncio.Lock():
            self._close(rs)
        return Response(status_code=204)

    def routes(self) -> list:
        return [Route("/moa/v1/info", self.info, methods=["GET"]),
                Route("/moa/v1/sessions", self.open, methods=["POST"]),
                Route("/moa/v1/sessions/{sid}/verify", self.verify, methods=["POST"]),
                Route("/moa/v1/sessions/{sid}", self.close, methods=["DELETE"]),
                *self.bundle.routes()]


def _sampling(s: Any) -> SamplingParams:
    if not isinstance(s, dict):
        raise P.ProtocolError("sampling must be a map", "invalid_field")
    seed = s.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63):
        raise P.ProtocolError("sampling.seed must be an integer >= 0", "invalid_field")
    return SamplingParams(P.get_float(s, "temperature", 0.0, 100.0, 0.0), P.get_int(s, "top_k", 0, 2 ** 31, 0),
                          P.get_float(s, "top_p", 1e-9, 1.0, 1.0), seed,
                          ignore_eos=P.get_bool(s, "ignore_eos", False))
