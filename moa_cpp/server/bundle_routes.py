"""The client bundle on ``moa-cpp serve`` (docs/client-server.md#bundle, docs/client-server.md#messages):

- ``GET /moa/v1/bundle``: the manifest of ``--bundle DIR`` (404 ``no_bundle`` without one);
- ``GET /moa/v1/bundle/{file}``: one of the files the manifest names (nothing else is served);
- this server's ``bundle_id`` (``moa_cpp.remote.bundle.bundle_id`` of its drafter and target),
  reported by ``/moa/v1/info`` and checked against the ``bundle_id`` an open may carry (409
  ``bundle_mismatch``).

Auth is the app's middleware (every route but /health). The files hold target weights: the
target's licence applies to whoever downloads them.
"""
from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, AsyncIterator, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from moa_cpp.remote import bundle as B
from moa_cpp.server.errors import APIError


def server_files(srv: Any) -> tuple:
    """(MoA drafter path or None, target path) of a running server."""
    gen = srv.pool.sessions[0].gen
    model = gen.state.model if getattr(gen, "state", None) is not None else None
    return (str(model.path) if model is not None else None), str(gen.target.path)


class BundleAPI:
    def __init__(self, srv: Any) -> None:
        self.srv = srv
        self._id: Optional[str] = None
        self._id_known = False
        self._lock = threading.Lock()
        self.bundle: Optional[B.Bundle] = None
        self.fds: dict = {}               # file name -> descriptor opened at start (what is served)
        path = getattr(srv.settings, "bundle", None)
        if path:
            # `moa-cpp serve` has verified the files' sha256 before loading the models
            # (B.check_server_bundle); here only the manifest and the identity are checked again.
            # The files are opened now and served from these descriptors: a file replaced on disk
            # later (a new inode) cannot change what clients get; one written over in place is
            # caught by their sha256 check, one cut short by the size check below.
            self.bundle = B.load_bundle(path, verify=False)
            self.fds = {name: os.open(self.bundle.dir / name, os.O_RDONLY) for name in self.bundle.manifest["files"]}
            mine = self.bundle_id()
            if mine != self.bundle.bundle_id:
                raise B.BundleMismatchError(f"bundle '{path}' was made for another drafter/target than this server's "
                                            f"(bundle_id {self.bundle.bundle_id[:16]}… vs {str(mine)[:16]}…)")

    def bundle_id(self) -> Optional[str]:
        """This server's bundle_id (None without an MoA drafter); computed once (hashes the
        drafter's and target's tensor data)."""
        with self._lock:
            if not self._id_known:
                drafter, target = server_files(self.srv)
                self._id = B.bundle_id(drafter, target).bundle_id if drafter else None
                self._id_known = True
            return self._id

    async def bundle_id_async(self) -> Optional[str]:
        if self._id_known:
            return self._id
        return await asyncio.get_running_loop().run_in_executor(None, self.bundle_id)

    async def check_open(self, msg: dict) -> None:
        """409 ``bundle_mismatch`` if the open names a bundle_id other than this server's."""
        want = msg.get("bundle_id")
        if want is None:
            return
        if not isinstance(want, str) or len(want) > 128:
            raise APIError(422, "bundle_id must be a string (the client bundle's manifest bundle_id)",
                           code="invalid_field")
        mine = await self.bundle_id_async()
        if want != mine:
            raise APIError(409, f"the client's bundle (bundle_id {want[:16]}…) was made for another drafter/target "
                                f"than this server's (bundle_id {str(mine)[:16]}…)", code="bundle_mismatch")

    # ------------------------------------------------------------------ routes

    def _need_bundle(self) -> B.Bundle:
        if self.bundle is None:
            raise APIError(404, "this server serves no client bundle (start it with --bundle DIR)", code="no_bundle")
        return self.bundle

    async def manifest(self, request: Request) -> Response:
        return JSONResponse(self._need_bundle().manifest)

    async def file(self, request: Request) -> Response:
        b = self._need_bundle()
        name = request.path_params["name"]
        entry = b.file_entry(name)
        if entry is None:
            raise APIError(404, f"no bundle file {name!r}", code="not_found")
        fd = self.fds[name]
        if os.fstat(fd).st_size != entry["size"]:
            raise APIError(500, f"bundle file {name} changed on the server since it started", code="internal_error")
        return StreamingResponse(self._chunks(fd, entry["size"]), media_type="application/octet-stream",
                                 headers={"X-Moa-Sha256": entry["sha256"], "Content-Length": str(entry["size"]),
                                          "Content-Disposition": f'attachment; filename="{name}"'})

    @staticmethod
    async def _chunks(fd: int, size: int, chunk: int = 1 << 20) -> AsyncIterator[bytes]:
        """The file behind ``fd`` (pread: no shared offset between concurrent downloads), read
        in a thread chunk by chunk so the event loop keeps serving."""
        loop = asyncio.get_running_loop()
        off = 0
        while off < size:
            data = await loop.run_in_executor(None, os.pread, fd, min(chunk, size - off), off)
            if not data:
                return
            off += len(data)
            yield data

    def routes(self) -> list:
        return [Route("/moa/v1/bundle", self.manifest, methods=["GET"]),
                Route("/moa/v1/bundle/{name}", self.file, methods=["GET"])]

