"""A fault-injecting TCP proxy on 127.0.0.1 for client-server tests and the live check of
``bench/remote/sim.py`` (docs/client-server.md#simulation). It forwards bytes between a client and a server and can, on
command:

- add a one-way ``latency_ms`` per direction and cap each direction at ``bandwidth_bps`` (a
  serial link: a chunk leaves when the link is free, takes ``8 * len / bps`` seconds to send,
  and arrives ``latency_ms`` later; order is kept),
- ``refuse`` new connections (reset at once: nothing gets through, as with ECONNREFUSED),
- ``blackhole``: accept and read, deliver nothing (the client sees a read timeout),
- ``reset_after_request``: forward a request, then reset the connection when the answer comes,
- ``kill_all`` open connections (RST) and ``restore``.

Threads only; every socket has a timeout, so nothing hangs a test.
"""
from __future__ import annotations

import collections
import socket
import struct
import threading
import time
from typing import Optional


def _rst(sock: socket.socket) -> None:
    """Reset the connection now. Linux defers the close of a socket another thread is blocked in
    recv() on until that recv returns (here: a pipe thread, for up to its timeout), so the reader
    is woken first (SHUT_RD sends nothing), then the close with a zero linger sends the RST."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # close = RST
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Link:
    """One direction of a connection: delivers chunks in order after the link's delay."""

    def __init__(self, proxy: "FaultProxy", dst: socket.socket) -> None:
        self.proxy, self.dst = proxy, dst
        self.queue: collections.deque = collections.deque()
        self.cv = threading.Condition()
        self.link_free = 0.0
        self.closed = False
        self.thread = threading.Thread(target=self._deliver, daemon=True)
        self.thread.start()

    def put(self, data: bytes) -> None:
        p = self.proxy
        now = time.monotonic()
        start = max(now, self.link_free)
        self.link_free = start + (8.0 * len(data) / p.bandwidth_bps if p.bandwidth_bps else 0.0)
        with self.cv:
            self.queue.append((self.link_free + p.latency_ms / 1000.0, data))
            self.cv.notify()

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify()

    def _deliver(self) -> None:
        while True:
            with self.cv:
                while not self.queue and not self.closed:
                    self.cv.wait(1.0)
                if not self.queue:
                    break
                due, data = self.queue.popleft()
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if self.proxy.mode == "blackhole":
                continue
            try:
                self.dst.sendall(data)
            except OSError:
                break
        try:
            self.dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class FaultProxy:
    """``FaultProxy(host, port)`` listens on ``127.0.0.1:<self.port>`` and forwards to
    ``host:port``. Knobs may change at any time; ``latency_ms`` and ``bandwidth_bps`` apply to
    both directions (0 = none)."""

    def __init__(self, target_host: str, target_port: int, *, latency_ms: float = 0.0,
                 bandwidth_bps: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.mode = "pass"            # pass | refuse | blackhole | reset_after_request
        self.latency_ms, self.bandwidth_bps = float(latency_ms), float(bandwidth_bps)
        self.lock = threading.Lock()
        self.conns: list = []
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self.trigger: Optional[tuple] = None    # (answers left, mode): see after()
        self.running = True
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while self.running:
            try:
                c, _ = self.listener.accept()
            except OSError:
                continue
            if self.mode == "refuse":
                _rst(c)
                continue
            try:
                s = socket.create_connection(self.target, timeout=5)
            except OSError:
                _rst(c)
                continue
            for x in (c, s):
                x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                self.conns += [c, s]
            threading.Thread(target=self._pipe, args=(c, s, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(s, c, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        src.settimeout(120)
        link = _Link(self, dst)
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not upstream and self.mode == "reset_after_request":
                    # the server answered: the client never sees it
                    self.mode = "pass"
                    _rst(dst)
                    _rst(src)
                    return
                if self.mode == "blackhole":
                    continue                  # swallowed
                if not upstream and data.startswith(b"HTTP/") and self._answers_done():
                    return                    # the answer after the last allowed one: never delivered
                link.put(data)
        except OSError:
            pass
        finally:
            link.close()

    def after(self, answers: int, mode: str) -> None:
        """Let ``answers`` more HTTP answers through, then switch to ``mode`` ("refuse" /
        "blackhole") as the next one starts (it is not delivered): a fault at a point of a run
        driven from outside, e.g. a CLI process."""
        with self.lock:
            self.trigger = (answers, mode)

    def _answers_done(self) -> bool:
        with self.lock:
            if self.trigger is None:
                return False
            left, mode = self.trigger
            self.trigger = (left - 1, mode) if left > 0 else None
        if left > 0:
            return False
        self.refuse() if mode == "refuse" else self.blackhole()
        return True

    def kill_all(self) -> None:
        """Reset every open connection."""
        with self.lock:
            conns, self.conns = self.conns, []
        for c in conns:
            _rst(c)

    def refuse(self) -> None:
        self.mode = "refuse"
        self.kill_all()

    def blackhole(self) -> None:
        """Connections stay open (new ones are accepted) but nothing is delivered either way."""
        self.mode = "blackhole"

    def restore(self) -> None:
        self.mode = "pass"

    def close(self) -> None:
        self.running = False
        self.kill_all()
        self.listener.close()
