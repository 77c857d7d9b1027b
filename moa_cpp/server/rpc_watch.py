"""``serve --rpc``: notice an rpc-server that went away before llama.cpp does.

llama.cpp's RPC client aborts the whole process (``GGML_ABORT``) when a call to an rpc-server
fails, on the next decode that needs it: every client of ``moa-cpp serve`` then sees its
connection reset, with no message. The watchdog reads this process's own TCP sockets to the
endpoints from ``/proc`` every second (no extra connection: rpc-server serves one client at a
time); once the kernel says the peer closed one (``CLOSE_WAIT``, i.e. the rpc-server process
died or was stopped), it prints which endpoint is gone and exits with status 3 at once. A
machine that vanishes without closing its sockets is not seen (no FIN): then llama.cpp aborts on
the next decode, as before. Linux only (elsewhere: no watchdog).
"""
from __future__ import annotations

import ipaddress
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

_CLOSE_WAIT = "08"
EXIT_RPC_GONE = 3


def _own_socket_inodes() -> set:
    out = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def _hex_addr(hexaddr: str) -> tuple:
    ip, port = hexaddr.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        addr = ipaddress.IPv4Address(raw[::-1])
    else:                                          # /proc/net/tcp6: four little-endian 32-bit words
        addr = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
        if addr.ipv4_mapped:
            addr = addr.ipv4_mapped
    return str(addr), int(port, 16)


def peer_states(endpoints: dict) -> dict:
    """{endpoint: set of TCP states of this process's sockets to it} (``endpoints``: endpoint ->
    (ip, port))."""
    mine = _own_socket_inodes()
    states: dict = {ep: set() for ep in endpoints}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[9] not in mine:
                continue
            remote = _hex_addr(f[2])
            for ep, addr in endpoints.items():
                if remote == addr:
                    states[ep].add(f[3])
    return states


def _resolve(endpoint: str) -> tuple:
    host, _, port = endpoint.rpartition(":")
    info = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)[0]
    addr = ipaddress.ip_address(info[4][0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        addr = addr.ipv4_mapped
    return str(addr), int(port)


def start_watchdog(endpoints: Sequence[str], period: float = 1.0,
                   on_gone: Optional[Callable[[str], None]] = None) -> Optional[threading.Thread]:
    """Watch ``endpoints`` in a daemon thread; ``on_gone(endpoint)`` (default: message + exit 3)
    once one of this process's connections to it is closed by the peer. None where /proc is
    missing (not Linux)."""
    if not Path("/proc/self/net/tcp").exists():
        return None
    addrs = {ep: _resolve(ep) for ep in endpoints}

    def gone(ep: str) -> None:
        print(f"moa-cpp serve: error: rpc-server {ep} closed its connection (stopped or crashed): the target's "
              "layers it held are lost. Exiting (status 3) before llama.cpp's RPC client aborts the process; "
              "restart the rpc-server, then moa-cpp serve", file=sys.stderr, flush=True)
        os._exit(EXIT_RPC_GONE)        # no teardown: freeing RPC buffers would call the dead server

    def watch() -> None:
        while True:
            time.sleep(period)
            for ep, st in peer_states(addrs).items():
                if _CLOSE_WAIT in st:
                    (on_gone or gone)(ep)
                    return

    t = threading.Thread(target=watch, name="moa-rpc-watchdog", daemon=True)
    t.start()
    return t
