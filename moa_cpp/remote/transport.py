"""The one HTTP client of client-server MoA: every request the client side makes to a
``moa-cpp serve`` goes through :class:`Transport` -- the protocol calls of a generation (one
kept-alive connection), the bundle download (a streamed GET) and the health probe while offline.

http and https alike; the API key as ``Authorization: Bearer``; every read bounded and every
connection under a timeout (a server must not make the client buffer gigabytes or hang).
"""
from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
import time
from typing import Any, Iterator, Optional
from urllib.parse import urlparse

from moa_cpp.remote import protocol as P


class RemoteError(RuntimeError):
    """The server answered an error (``status``, ``kind``) or broke the protocol."""

    def __init__(self, message: str, status: int = 0, kind: str = "") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


# What "the server cannot be reached" looks like: refused, reset, timed out, a torn HTTP exchange.
UNAVAILABLE = (OSError, http.client.HTTPException)


class Transport:
    """HTTP to one server at ``url`` (``http(s)://HOST:PORT``).

    :meth:`call`: a protocol request on one keep-alive connection, its bytes counted as sent /
    read (headers estimated by the request line and header block we write and the status line +
    headers we read). :meth:`stream`: a GET on a connection of its own, its body read by the
    caller (downloads). :meth:`healthy`: ``GET /health`` on a fresh connection."""

    # A kept-alive connection idle this long may have been closed by the server (uvicorn's default
    # keep-alive is 5 s; moa-cpp serve keeps 75 s): start a fresh one rather than find out by a
    # failed request, which would be ambiguous (was the request processed?).
    REUSE_IDLE_S = 4.0
    MAX_REPLY = 64 << 20      # a verify answer is KBs (CA of the accepted tokens); an open's, MBs at most

    def __init__(self, url: str, api_key: Optional[str] = None, timeout: float = 30.0,
                 content_type: str = P.JSON) -> None:
        u = urlparse(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"server URL must be http(s)://HOST:PORT, got {url!r}")
        self.url = url
        self.https = u.scheme == "https"
        self.host, self.port = u.hostname, u.port or (443 if self.https else 80)
        self.auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.headers = {"Content-Type": content_type, **self.auth}    # the server answers in the request's type
        self.ctype, self.timeout = content_type, timeout
        self.conn: Optional[http.client.HTTPConnection] = None
        self.last_used = 0.0

    def _new_connection(self, timeout: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout)

    # ------------------------------------------------------------------ the kept-alive connection

    def _dropped(self) -> bool:
        """The kept-alive connection was closed by the other side (urllib3's check: an idle
        connection with something to read has an EOF or a reset waiting)."""
        sock = self.conn.sock if self.conn is not None else None
        if sock is None:
            return True
        try:
            return bool(select.select([sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def _connect(self) -> tuple:
        """(connection, reused): the kept-alive one if it is still good, else a fresh one."""
        if self.conn is not None and (time.monotonic() - self.last_used > self.REUSE_IDLE_S or self._dropped()):
            self.close()
        if self.conn is not None:
            return self.conn, True
        self.conn = self._new_connection(self.timeout)
        # http.client writes the header block and the body in two send()s: with Nagle on, the
        # body waits for the ACK of the headers (a delayed ACK: ~40 ms per request)
        self.conn.connect()
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.conn, False

    def _read_bounded(self, r: http.client.HTTPResponse) -> bytes:
        """The body, refused before it is read if it declares more than MAX_REPLY and cut off
        past it if it does not say (a server must not make the client buffer gigabytes)."""
        declared = r.getheader("Content-Length")
        if declared is not None and (not declared.strip().isdigit() or int(declared) > self.MAX_REPLY):
            self.close()
            raise RemoteError(f"the server's answer declares {declared[:20]} bytes (at most {self.MAX_REPLY})", 0,
                              "bad_reply")
        data = r.read(self.MAX_REPLY + 1)
        if len(data) > self.MAX_REPLY:
            self.close()
            raise RemoteError(f"the server's answer is larger than {self.MAX_REPLY} bytes", 0, "bad_reply")
        return data

    def _exchange(self, method: str, path: str, body: Optional[bytes]) -> tuple:
        """(response, body bytes). A request that could not even be sent on a reused connection
        (the server had closed it) is sent once more on a fresh one: the server cannot have
        processed a request it did not receive. A failure after sending is the caller's."""
        for attempt in (0, 1):
            reused = False
            try:
                c, reused = self._connect()
                c.request(method, path, body=body, headers=self.headers)
            except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                self.close()
                if attempt or not reused:
                    raise
                continue
            except UNAVAILABLE:
                self.close()
                raise
            try:
                r = c.getresponse()
                data = self._read_bounded(r)
            except UNAVAILABLE:
                self.close()
                raise
            self.last_used = time.monotonic()
            if r.will_close:
                self.close()
            return r, data
        raise AssertionError("unreachable")

    def call(self, method: str, path: str, obj: Optional[dict], meter: Any) -> dict:
        """One protocol request: ``obj`` encoded in the transport's content type, the answer
        decoded (``{}`` for 204). ``meter`` (a :class:`~moa_cpp.remote.results.RemoteStats`)
        counts the call: ``server_calls``, ``bytes_sent``, ``bytes_received``, ``t_network``.
        An error status raises :class:`RemoteError` with the server's code; network failures
        raise as :data:`UNAVAILABLE`."""
        body = P.encode_body(obj, self.ctype) if obj is not None else None
        t = time.perf_counter()
        r, data = self._exchange(method, path, body)
        meter.t_network += time.perf_counter() - t
        meter.server_calls += 1
        meter.bytes_sent += len(body or b"") + len(method) + len(path) + 12 + sum(len(k) + len(v) + 4 for k, v in
                                                                                  self.headers.items())
        meter.bytes_received += len(data) + 17 + sum(len(k) + len(v) + 4 for k, v in r.getheaders())
        if r.status == 204:
            return {}
        rtype = (r.getheader("Content-Type") or "").split(";")[0].strip()
        if r.status != 200:
            try:
                err = json.loads(data)["error"]
                raise RemoteError(err.get("message", ""), r.status, err.get("code") or err.get("type", ""))
            except (ValueError, KeyError, TypeError):
                raise RemoteError(f"HTTP {r.status}: {data[:200]!r}", r.status) from None
        try:
            return P.decode_body(data, rtype, self.MAX_REPLY)
        except P.ProtocolError as e:
            raise RemoteError(f"the server's answer is malformed: {e}", 0, "bad_reply") from None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    # ------------------------------------------------------------------ connections of their own

    @contextlib.contextmanager
    def stream(self, path: str, accept: str = "application/json, application/octet-stream"
               ) -> Iterator[http.client.HTTPResponse]:
        """``GET path`` on a connection of its own (a download must not hold the protocol's
        kept-alive one), closed when the block ends; the caller reads the body, bounded."""
        c = self._new_connection(self.timeout)
        try:
            c.request("GET", path, headers={"Accept": accept, **self.auth})
            yield c.getresponse()
        finally:
            c.close()

    def healthy(self, timeout: float) -> bool:
        """Does the server answer ``GET /health`` with 200 within ``timeout`` seconds (a fresh
        connection: the probe of a client drafting alone while the server is away)?"""
        try:
            c = self._new_connection(timeout)
            try:
                c.request("GET", "/health")
                return c.getresponse().status == 200
            finally:
                c.close()
        except UNAVAILABLE:
            return False
