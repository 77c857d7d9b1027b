"""Connections that cost nothing to hold must not lock working clients out.

uvicorn (h11) waits for a request head without a deadline, restarts no timer when a client
trickles a header byte at a time, and with ``limit_concurrency`` counts idle sockets against
everyone (1,000 silent TCP connections made ``/health`` answer 503). :func:`guarded_h11` is its
protocol with two guards:

- **head deadline**: a request head (request line + headers) must be complete within
  ``head_timeout`` seconds of the connection opening or of its first byte after a keep-alive
  pause; otherwise the connection is closed (the keep-alive pause itself keeps uvicorn's
  ``timeout_keep_alive``);
- **idle eviction**: beyond ``max_connections`` open connections, the longest-idle ones (no
  request in progress) are closed to make room; if every connection is working, the newcomer
  gets ``503`` and is closed.

The server is then limited by what it serves (the session pool's queue), not by sockets.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Optional

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("moa_cpp.server")

_BUSY_BODY = b'{"error": {"message": "too many open connections", "type": "server_overloaded", "code": null}}'
_BUSY_503 = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
             b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))


def guarded_h11(head_timeout: float, max_connections: int) -> type:
    """An ``H11Protocol`` subclass with the guards above (pass it as uvicorn's ``http``)."""

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head_timer: Optional[asyncio.TimerHandle] = None
            self._idle_since = time.monotonic()
            self._arm_head_deadline()
            if len(self.connections) > max_connections:
                self._make_room()

        # --------------------------------------------------------------- head deadline

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm_head_deadline(self) -> None:
            self._head_cycle = self.cycle
            self._head_timer = self.loop.call_later(head_timeout, self._head_timed_out)

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.cycle is self._head_cycle and not self.transport.is_closing():
                log.debug("closing a connection that sent no complete request head in %.0f s", head_timeout)
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._head_timer is None and self._between_requests():
                self._arm_head_deadline()              # the first byte after a keep-alive pause
            super().data_received(data)
            if self._head_timer is not None and self.cycle is not self._head_cycle:
                self._head_timer.cancel()              # a request head arrived
                self._head_timer = None

        def on_response_complete(self) -> None:
            self._idle_since = time.monotonic()
            super().on_response_complete()

        def connection_lost(self, exc: Optional[Exception]) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

        # --------------------------------------------------------------- idle eviction

        def _make_room(self) -> None:
            idle = sorted((c for c in self.connections
                           if c is not self and isinstance(c, GuardedH11Protocol) and c._between_requests()
                           and not c.transport.is_closing()), key=lambda c: c._idle_since)
            excess = len(self.connections) - max_connections
            for c in idle[:excess]:
                c.transport.close()
                c.connections.discard(c)               # counted out now, not when the loop gets to it
            if len(self.connections) > max_connections:
                self.transport.write(_BUSY_503)        # every other connection is serving a request
                self.transport.close()
                self.connections.discard(self)

    return GuardedH11Protocol
