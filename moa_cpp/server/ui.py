"""The chat page at ``GET /`` (llama-server's built-in page, plus what speculation did).

Three files shipped as package data (``server/ui/``: HTML, CSS, plain JavaScript; no build
step, nothing from a CDN, so it works offline) and ``GET /props`` (llama-server's name) for the
page's header: model, proposer, draft setting. The page and its two files are public (a browser
cannot send a key with a navigation; they hold no data); ``/props`` and the API ask for the key,
which the page asks the user for and keeps in the tab's sessionStorage. Every answer of the page
carries a Content-Security-Policy that allows scripts from this server's own files only (no
inline script, no eval) and connections to this server only.
"""
from __future__ import annotations

from importlib import resources
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

PUBLIC_PATHS = frozenset({"/", "/ui/chat.js", "/ui/chat.css", "/favicon.ico"})

_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
          "/ui/chat.js": ("chat.js", "text/javascript; charset=utf-8"),
          "/ui/chat.css": ("chat.css", "text/css; charset=utf-8")}

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


def _read(name: str) -> bytes:
    return resources.files("moa_cpp.server").joinpath("ui", name).read_bytes()


class ChatPage:
    """Routes of the chat page over a :class:`moa_cpp.server.app.Server`."""

    def __init__(self, srv: Any) -> None:
        self.srv = srv
        self.files = {path: (_read(name), media) for path, (name, media) in _FILES.items()}

    def routes(self) -> list:
        return [Route(path, self._file, methods=["GET"]) for path in self.files] + \
            [Route("/favicon.ico", self._no_icon, methods=["GET"]), Route("/props", self.props, methods=["GET"])]

    async def _no_icon(self, request: Request) -> Response:
        return Response(status_code=204)     # browsers ask for one; none is shipped

    async def _file(self, request: Request) -> Response:
        body, media = self.files[request.url.path]
        return Response(body, media_type=media, headers={
            "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"})

    async def props(self, request: Request) -> Response:
        srv = self.srv
        gen = srv.pool.sessions[0].gen
        return JSONResponse({
            "model": srv.model, "proposer": srv.spec_type if srv.has_proposer else None,
            "draft": str(gen.draft), "n_ctx": srv.n_ctx, "max_tokens": srv.max_tokens_limit,
            "sessions": len(srv.pool.sessions)})
