"""Request bodies and client departures, for every route (OpenAI's, the MoA protocol's, the
text utilities'): bounded in size and time, and a client that leaves stops what it waited for."""
from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import ClientDisconnect, Request

from moa_cpp.server.errors import APIError, bad_request

# A body larger than the limit is read and dropped (not kept) up to this many bytes so that the
# client, still sending, gets the 413 instead of a reset connection.
_DRAIN_MAX = 64 << 20


async def read_json_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """A JSON body (415 otherwise), at most ``limit`` bytes, within ``timeout_s``."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise APIError(415, f"Content-Type must be application/json (got {ctype or 'none'})",
                       code="unsupported_media_type")
    return await read_body(request, limit, timeout_s)


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body, at most ``limit`` bytes, within ``timeout_s`` (a client that trickles or never
    finishes its body holds a connection, never a session)."""
    try:
        return await asyncio.wait_for(_read_body_now(request, limit), timeout_s)
    except asyncio.TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout_s:g} s", code="timeout") from None


async def _read_body_now(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and not declared.strip().isdigit():
        raise bad_request("invalid Content-Length header")
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n <= limit:
            chunks.append(chunk)
        elif n > _DRAIN_MAX:
            break
    if n > limit:
        raise APIError(413, f"the request body is larger than {limit} bytes (--max-body-bytes)",
                       code="request_too_large")
    return b"".join(chunks)


async def _wait_disconnect(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, aw: Any) -> Any:
    """Await ``aw``; if the client leaves first, cancel it and raise ClientDisconnect (answered
    quietly by the app, not logged as an error: a client leaving is not a server failure)."""
    task = asyncio.ensure_future(aw)
    gone = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        try:
            await task
        except BaseException:
            pass
        raise ClientDisconnect()
    finally:
        gone.cancel()
