"""llama-server's text utilities: ``POST /tokenize``, ``/detokenize``, ``/apply-template``.

Same request and response shapes as llama.cpp's server (``tools/server/README.md``):

- ``/tokenize`` ``{"content": str, "add_special": false, "parse_special": true, "with_pieces": false}``
  -> ``{"tokens": [id, ...]}``, or with pieces ``{"tokens": [{"id": id, "piece": str | [byte, ...]}]}``
  (a piece that is not valid UTF-8 on its own is its bytes, as llama-server writes it);
- ``/detokenize`` ``{"tokens": [id, ...]}`` -> ``{"content": str}``;
- ``/apply-template`` ``{"messages": [...]}`` -> ``{"prompt": str}`` (the GGUF's chat template,
  as ``/v1/chat/completions`` renders it).

Bodies are validated as strictly as the completion routes (unknown fields, wrong types, ids
outside the vocabulary: 400). The work runs off the event loop: tokenizing a 1 MiB body takes
a while.
"""
from __future__ import annotations

import asyncio
from typing import Annotated, Any

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from moa_cpp.server.body import read_json_body
from moa_cpp.server.errors import bad_request
from moa_cpp.server.schemas import _STRICT, MAX_MESSAGES, Message, parse_body

MAX_TOKENS_IN = 1 << 18          # ids one /detokenize may send (a 1 MiB body holds fewer anyway)


class TokenizeRequest(BaseModel):
    model_config = _STRICT
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    model_config = _STRICT
    tokens: Annotated[list[Annotated[int, Field(ge=0, le=2 ** 31 - 1)]], Field(max_length=MAX_TOKENS_IN)]


class ApplyTemplateRequest(BaseModel):
    model_config = _STRICT
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]


def _piece(target: Any, tok: int) -> Any:
    """llama-server's piece: the token's text, or its bytes where they are not UTF-8 alone."""
    raw = target.token_bytes(tok, special=True)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


class TextUtilities:
    """The three routes over the server's target (its vocabulary is shared by every session)."""

    def __init__(self, srv: Any) -> None:
        self.srv = srv
        self.target = srv.pool.sessions[0].gen.target

    async def _body(self, request: Request, model: type) -> Any:
        s = self.srv.settings
        return parse_body(await read_json_body(request, s.max_body_bytes, s.body_timeout_s), model)

    async def tokenize(self, request: Request) -> Response:
        req = await self._body(request, TokenizeRequest)
        t = self.target

        def work() -> dict:
            ids = t.tokenize(req.content, add_bos=req.add_special, special=req.parse_special).tolist()
            if req.with_pieces:
                return {"tokens": [{"id": i, "piece": _piece(t, i)} for i in ids]}
            return {"tokens": ids}
        return JSONResponse(await asyncio.to_thread(work))

    async def detokenize(self, request: Request) -> Response:
        req = await self._body(request, DetokenizeRequest)
        n_vocab = self.target.n_vocab
        bad = next((i for i in req.tokens if i >= n_vocab), None)
        if bad is not None:      # llama.cpp would abort the process on an id outside the vocabulary
            raise bad_request(f"token id {bad} is outside the vocabulary [0, {n_vocab})", param="tokens")
        text = await asyncio.to_thread(self.target.detokenize, req.tokens, True)
        return JSONResponse({"content": text})

    async def apply_template(self, request: Request) -> Response:
        req = await self._body(request, ApplyTemplateRequest)
        msgs = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in req.messages]
        prompt = await asyncio.to_thread(self.target.apply_chat_template, msgs)
        return JSONResponse({"prompt": prompt})

    def routes(self) -> list:
        return [Route("/tokenize", self.tokenize, methods=["POST"]),
                Route("/detokenize", self.detokenize, methods=["POST"]),
                Route("/apply-template", self.apply_template, methods=["POST"])]
