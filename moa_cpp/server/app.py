"""The Starlette app: OpenAI-compatible routes over the session pool.

``GET /health`` (no key), ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (non-streaming and SSE streaming, ``data: [DONE]``), llama-server's
``/tokenize``, ``/detokenize``, ``/apply-template`` (extras.py) and ``/metrics`` (metrics.py), the
MoA client-server protocol (remote_routes.py). Every failure is OpenAI's JSON error shape;
nothing a client sends can stop the server. Middleware, outermost first: Host check, CORS (with
``--cors-origins``), API key.
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Optional

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from moa_cpp.errors import MoaError
from moa_cpp.generator import GenerationRequest, parse_draft
from moa_cpp.server.auth import KeyChecker, offered_key
from moa_cpp.server.body import read_json_body, until_disconnect
from moa_cpp.server.errors import APIError, bad_request
from moa_cpp.server.extras import TextUtilities
from moa_cpp.server.hosts import HostMiddleware, allowed_hosts
from moa_cpp.logprobs import LogprobWriter
from moa_cpp.speculative.grammar import Grammar
from moa_cpp.speculative.types import DraftConfig
from moa_cpp.streaming import Piece
from moa_cpp.tools import ToolPlan, assistant_message, may_be_call, stream_delta
from moa_cpp.server.metrics import ServerMetrics
from moa_cpp.server.remote_routes import RemoteAPI
from moa_cpp.server.schemas import ChatRequest, CompletionRequest, parse_body
from moa_cpp.server.sessions import SessionPool, model_id
from moa_cpp.server.settings import ServerSettings
from moa_cpp.server.ui import PUBLIC_PATHS, ChatPage
from moa_cpp.server.worker import Cancelled, Done, Failed, GenParams, Job

log = logging.getLogger("moa_cpp.server")

class AuthMiddleware:
    """API key on every route but /health and the chat page's files (pure ASGI: streaming responses pass untouched)."""

    def __init__(self, app: Any, checker: KeyChecker) -> None:
        self.app, self.checker = app, checker

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.checker.enabled and not _public(scope):
            if not self.checker.check(offered_key(scope.get("headers", ()))):
                err = APIError(401, "invalid or missing API key (Authorization: Bearer KEY or X-Api-Key: KEY)",
                               code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                await err.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _public(scope: dict) -> bool:
    """Answered without a key: /health, and the chat page's own files on GET (they hold no data;
    a browser cannot send a key when it opens a page)."""
    path = scope.get("path")
    return path == "/health" or (scope.get("method") in ("GET", "HEAD") and path in PUBLIC_PATHS)


class Server:
    """State of one serving process: settings, sessions, threads, active jobs."""

    def __init__(self, settings: ServerSettings, sessions: list) -> None:
        self.settings = settings
        self.pool = SessionPool(sessions, settings.queue, settings.retry_after_s)
        self.executor = ThreadPoolExecutor(max_workers=len(sessions), thread_name_prefix="moa-session")
        self.model = model_id(settings, sessions)
        self.created = int(time.time())
        self.jobs: set = set()
        gen = sessions[0].gen
        self.has_proposer = gen.proposer is not None
        self.chains_only = bool(getattr(gen.proposer, "chains_only", False))   # a draft model alone
        self.spec_type = gen.spec_type
        self.n_ctx = gen.target.n_ctx
        self.n_vocab = gen.target.n_vocab
        self.max_tokens_limit = settings.max_tokens_limit or self.n_ctx
        self.metrics = ServerMetrics(self, settings.metrics)

    def shutdown(self) -> None:
        """End open generations (streams send their last chunk and [DONE]) and refuse new ones."""
        self.pool.close()
        for job in list(self.jobs):
            job.cancel()

    # ------------------------------------------------------------------ request -> params

    def _draft_override(self, req: Any) -> Optional[DraftConfig]:
        if req.moa is None or req.moa.draft is None:
            return None
        cfg = parse_draft(req.moa.draft)
        s = self.settings
        if cfg.mode != "none" and not self.has_proposer:
            raise bad_request("this server runs without a drafter (--draft none): moa.draft must be 'none'",
                              param="moa.draft")
        if cfg.mode in ("chain", "auto") and cfg.chain > s.max_chain:
            raise bad_request(f"moa.draft: at most {s.max_chain} drafted tokens per cycle", param="moa.draft")
        if cfg.mode == "tree" and self.chains_only:
            raise bad_request("this server drafts with a draft model, which drafts chains: moa.draft must be "
                              "auto[:K], chain:N or none", param="moa.draft")
        if cfg.mode == "tree" and (cfg.total > s.max_tree_nodes or cfg.depth > 16 or cfg.topk > 16):
            raise bad_request(f"moa.draft: trees up to {s.max_tree_nodes} nodes, depth 16, top-k 16",
                              param="moa.draft")
        return cfg

    def params(self, req: Any, chat: bool) -> GenParams:
        limit = req.token_limit if chat else req.max_tokens
        if limit is None:
            limit = self.max_tokens_limit
        elif limit > self.max_tokens_limit:
            raise bad_request(f"max_tokens is {limit}; this server allows at most {self.max_tokens_limit}",
                              param="max_tokens")
        prompt = req.message_dicts() if chat else req.prompt_value()
        extras = req.sampling_extras(self.n_vocab)
        gen = self.pool.sessions[0].gen
        tools = req.tool_plan(gen.target.chat_template_text) if chat else ToolPlan()
        grammar = extras["grammar"]
        if tools.grammar is not None:
            if grammar is not None:
                raise bad_request("a forced tool call (tool_choice) and grammar / json_schema / response_format each "
                                  "constrain the output: give one of them", param="tool_choice")
            grammar = tools.grammar
        if grammar is not None:
            try:     # parsed here, so that a bad grammar is a 400 before any stream starts
                Grammar.compile(gen.target, grammar).close()
            except ValueError as e:
                raise bad_request(str(e), param="grammar") from None
        try:         # typed and checked once: the engine runs exactly this
            sampling = gen.sampling_params(req.temperature, req.top_k, req.top_p, req.seed_or_none, req.ignore_eos,
                                           extras["min_p"], extras["repeat_penalty"], extras["frequency_penalty"],
                                           extras["presence_penalty"], extras["repeat_last_n"], extras["logit_bias"],
                                           grammar)
        except ValueError as e:
            raise bad_request(str(e)) from None
        request = GenerationRequest(prompt, limit, sampling, self._draft_override(req), tuple(req.stops), chat,
                                    req.n_logprobs, bool(extras["cache_prompt"]), True,
                                    tuple(tools.tools) if tools.tools else None)
        return GenParams(request, tools)


def _error_of(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, (ValueError, MoaError)) and not isinstance(exc, MemoryError):
        return bad_request(str(exc))
    log.exception("generation failed", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}", code="internal_error")


def _moa(stats: Any, draft: str) -> dict:
    return {"tau": round(stats.tau, 4), "target_calls": stats.target_calls, "draft": draft,
            "decision": stats.decision, "drafted": stats.drafted, "accepted": stats.accepted,
            "by_source": stats.by_source, "emitted_from": stats.emitted_from,
            "tokens_per_s": round(stats.tokens_per_s, 2)}


class _Completion:
    """Builds the response objects of one request (text or chat, whole or chunked)."""

    def __init__(self, srv: Server, chat: bool, params: GenParams) -> None:
        self.chat = chat
        self.route = "chat" if chat else "completions"
        self.id = (f"chatcmpl-{uuid.uuid4().hex}" if chat else f"cmpl-{uuid.uuid4().hex}")
        self.created = int(time.time())
        self.model = srv.model
        self.draft = str(params.request.draft or srv.pool.sessions[0].gen.draft)
        self.n_prompt = 0
        self.n_cached = 0          # prompt tokens the session's KV cache already held
        self.logprobs = LogprobWriter(srv.pool.sessions[0].gen.target, chat) if params.request.logprobs is not None else None
        self.tools = params.tool_plan           # answers read as tool calls (chat with tools)

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def usage(self, n_completion: int) -> dict:
        return {"prompt_tokens": self.n_prompt, "completion_tokens": n_completion,
                "total_tokens": self.n_prompt + n_completion,
                "prompt_tokens_details": {"cached_tokens": self.n_cached}}

    def whole(self, text: str, n_tokens: int, finish: str, stats: Any, lps: Optional[list] = None) -> dict:
        choice: dict = {"index": 0, "logprobs": self.logprobs.part(lps or []) if self.logprobs else None,
                        "finish_reason": finish}
        if self.chat:
            choice["message"] = self._message(text, choice)
        else:
            choice["text"] = text
        return {**self._head(False), "choices": [choice], "usage": self.usage(n_tokens), "moa": _moa(stats, self.draft)}

    def _message(self, text: str, choice: dict) -> dict:
        if self.tools is None or not self.tools.active:
            return {"role": "assistant", "content": text}
        msg, called = assistant_message(self.tools, text, self.id)
        if called:
            choice["finish_reason"] = "tool_calls"
        return msg

    def tool_deltas(self, text: str, finish: str) -> list:
        """The held-back answer of a streamed tool request: its calls (or its content) as chunks,
        then the last chunk."""
        delta, called = stream_delta(self.tools, text, self.id)
        return ([self._delta_chunk(delta)] if delta is not None else []) + \
            [self.chunk(None, finish="tool_calls" if called else finish)]

    def _delta_chunk(self, delta: dict) -> dict:
        return {**self._head(True), "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}

    def chunk(self, piece: Optional[str], finish: Optional[str] = None, first: bool = False,
              lps: Optional[list] = None, spans: Optional[list] = None) -> dict:
        """One SSE chunk. ``spans``: the piece split by token with who chose each token, sent as
        the extension field ``moa_pieces`` ([[text, origin, index], ...]; OpenAI clients ignore
        unknown fields; the chat page highlights drafted tokens with it)."""
        lp = self.logprobs.part(lps) if self.logprobs and lps else None
        if self.chat:
            delta: dict = {"role": "assistant", "content": ""} if first else ({} if piece is None else {"content": piece})
            choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": piece or "", "logprobs": lp, "finish_reason": finish}
        out = {**self._head(True), "choices": [choice]}
        if spans:
            out["moa_pieces"] = spans
        return out


def _prefix_key(srv: Server, params: GenParams) -> Any:
    """What a session is worth to this request: the prompt prefix its caches hold (not decoded
    again) less the cached tokens past it (another conversation, evicted). A conversation's next
    turn goes back to its session; a new one that shares only a system prompt with a held
    conversation goes to a free session rather than evicting it. None where it cannot matter."""
    r = params.request
    if len(srv.pool.sessions) < 2 or not r.cache_prompt:
        return None

    ids: list = []       # the prompt, encoded once (by the first session asked)

    def key(session: Any) -> int:
        if not ids:
            try:
                ids.append(session.gen.encode(r.prompt, r.chat, list(r.tools) if r.tools else None))
            except Exception:        # the worker reports it
                ids.append(None)
        if not ids[0]:
            return 0
        loop = session.gen.loop
        common = loop.cached_prefix(ids[0])
        return common - (loop.n_cached - common)
    return key


def _sse(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj, ensure_ascii=False).encode()) + b"\n\n"


async def _generate(srv: Server, request: Request, model: type, chat: bool) -> Response:
    body = await read_json_body(request, srv.settings.max_body_bytes, srv.settings.body_timeout_s)
    req = parse_body(body, model)
    params = srv.params(req, chat)
    out = _Completion(srv, chat, params)
    session = await until_disconnect(request, srv.pool.acquire(_prefix_key(srv, params)))
    job = Job(session, params, srv.pool.release, live=bool(req.stream))
    srv.jobs.add(job)
    try:
        job.start(srv.executor)
        ev = await until_disconnect(request, job.events.get())
        if isinstance(ev, Failed):
            raise _error_of(ev.error)
        out.n_prompt = ev.n_prompt          # Ready
    except BaseException:
        job.cancel()
        srv.jobs.discard(job)
        raise
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return _JobStream(srv, job, _stream(srv, job, out, include_usage), media_type="text/event-stream",
                          headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        return JSONResponse(await until_disconnect(request, _collect(srv, job, out)))
    finally:
        job.cancel()
        srv.jobs.discard(job)


class _JobStream(StreamingResponse):
    """A streaming response that stops its generation however the response ends, even if the
    client left before the first chunk (then the body generator never starts, and its own
    ``finally`` never runs)."""

    def __init__(self, srv: Server, job: Job, content: Any, **kw: Any) -> None:
        super().__init__(content, **kw)
        self._srv, self._job = srv, job

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._job.cancel()
            self._srv.jobs.discard(self._job)


async def _collect(srv: Server, job: Job, out: _Completion) -> dict:
    pieces, n, lps = [], 0, []
    while True:
        ev = await job.events.get()
        if isinstance(ev, Piece):
            n += len(ev.tokens)
            pieces.append(ev.text)
            lps += ev.logprobs
        elif isinstance(ev, Done):
            st = ev.stats
            out.n_cached = st.n_cached
            srv.metrics.observe(out.route, st)
            return out.whole("".join(pieces), n, st.finish_reason or "length", st, lps)
        elif isinstance(ev, Cancelled):
            raise APIError(503, "the server is shutting down; the generation was stopped", code="server_shutdown")
        elif isinstance(ev, Failed):
            raise _error_of(ev.error)


async def _stream(srv: Server, job: Job, out: _Completion, include_usage: bool) -> AsyncIterator[bytes]:
    """SSE chunks; the client leaving cancels this generator, which stops the generation."""
    n = 0
    # a tool request's answer is held back while it may still be a tool call (then sent whole)
    held: Optional[list] = [] if out.tools is not None and out.tools.active else None
    try:
        if out.chat:
            yield _sse(out.chunk(None, first=True))
        while True:
            ev = await job.events.get()
            if isinstance(ev, Piece):
                n += len(ev.tokens)
                if held is not None:
                    held.append(ev.text)
                    if may_be_call(out.tools, "".join(held)):
                        continue
                    ev = Piece(ev.tokens, "".join(held), ev.logprobs, [])
                    held = None
                if ev.text or (ev.logprobs and out.logprobs):
                    # a piece's tokens travel with it (text held back for a stop string or a
                    # multi-byte character may come a chunk later than its tokens' logprobs)
                    yield _sse(out.chunk(ev.text, lps=ev.logprobs, spans=ev.spans if ev.text else None))
                continue
            if isinstance(ev, Failed):
                yield _sse(_error_of(ev.error).body())
                break
            stats = ev.stats if isinstance(ev, Done) else None
            finish = (stats.finish_reason or "length") if stats else "abort"
            chunks = out.tool_deltas("".join(held), finish) if held is not None else [out.chunk(None, finish=finish)]
            last = chunks[-1]
            if stats is not None:
                out.n_cached = stats.n_cached
                last["moa"] = _moa(stats, out.draft)
                srv.metrics.observe(out.route, stats)
            for c in chunks:
                yield _sse(c)
            if include_usage:
                yield _sse({**out._head(True), "choices": [], "usage": out.usage(n)})
            break
        yield _sse(b"[DONE]")
    finally:
        job.cancel()
        srv.jobs.discard(job)


def create_app(settings: ServerSettings, sessions: list) -> Starlette:
    srv = Server(settings, sessions)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": srv.model, "object": "model", "created": srv.created, "owned_by": "moa_cpp",
             "meta": {"n_ctx": srv.n_ctx, "parallel": len(srv.pool.sessions), "draft": str(sessions[0].gen.draft),
                      "sessions_busy": srv.pool.busy, "queued": srv.pool.waiting}}]})

    async def completions(request: Request) -> Response:
        return await _generate(srv, request, CompletionRequest, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await _generate(srv, request, ChatRequest, chat=True)

    async def api_error(request: Request, exc: APIError) -> Response:
        return exc.response()

    async def http_error(request: Request, exc: HTTPException) -> Response:
        msg = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
        return APIError(exc.status_code, msg.get(exc.status_code, str(exc.detail)),
                        headers=dict(exc.headers or {})).response()

    async def client_gone(request: Request, exc: ClientDisconnect) -> Response:
        # the client closed the connection (mid-body or mid-generation): nobody reads an answer
        return Response(status_code=499)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        return APIError(500, f"internal error: {type(exc).__name__}", code="internal_error").response()

    app = Starlette(routes=[
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        *TextUtilities(srv).routes(),
        *srv.metrics.routes(),
        *RemoteAPI(srv).routes(),
        *ChatPage(srv).routes(),
    ], exception_handlers={APIError: api_error, HTTPException: http_error,
                           ClientDisconnect: client_gone, Exception: server_error})
    app.state.server = srv
    app.add_middleware(AuthMiddleware, checker=KeyChecker(settings.api_keys))
    if settings.cors_origins:
        # outside the key check: a browser's preflight carries no key; keys travel only in headers
        # (no cookies), so credentials stay off
        from starlette.middleware.cors import CORSMiddleware
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_credentials=False,
                           allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["Authorization", "Content-Type", "X-Api-Key"], max_age=600)
    # outermost (added last): a rebinding page learns nothing, not even whether a key is needed
    app.add_middleware(HostMiddleware, allowed=allowed_hosts(settings.host, settings.allowed_hosts))
    return app
