"""A fault-injecting TCP proxy on 127.0.0.1 for client-server tests (spec §5.1): forwards bytes
between a client and a server, and on command refuses connections, resets every open one, or
forwards a request and then resets the connection before the answer arrives. Threads only;
every socket has a timeout, so nothing hangs a test."""
from __future__ import annotations

import socket
import struct
import threading


def _rst(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # close = RST
        sock.close()
    except OSError:
        pass


class FaultProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode = "pass"            # pass | refuse | reset_after_request
        self.lock = threading.Lock()
        self.conns: list = []
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.listener.listen(16)
        self.listener.settimeout(0.2)
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
                _rst(c)                       # as good as ECONNREFUSED for the client: nothing gets through
                continue
            try:
                s = socket.create_connection(self.target, timeout=5)
            except OSError:
                _rst(c)
                continue
            with self.lock:
                self.conns += [c, s]
            threading.Thread(target=self._pipe, args=(c, s, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(s, c, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        src.settimeout(120)
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
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for x in (src, dst):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def kill_all(self) -> None:
        """Reset every open connection."""
        with self.lock:
            conns, self.conns = self.conns, []
        for c in conns:
            _rst(c)

    def refuse(self) -> None:
        self.mode = "refuse"
        self.kill_all()

    def restore(self) -> None:
        self.mode = "pass"

    def close(self) -> None:
        self.running = False
        self.kill_all()
        self.listener.close()
