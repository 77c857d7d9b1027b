"""llama.cpp's RPC backend: targets whose layers live on other machines.

llama.cpp's distributed engine is ``rpc-server``: a process that exposes its local ggml
backend (CPU or GPU) over TCP; a client's model loader splits the offloaded layers over the
servers it is given. llama-cpp-python==0.3.36 builds it when compiled with ``GGML_RPC=ON``
(``scripts/setup.sh`` does) but installs no ``rpc-server`` binary, so ``moa-cpp rpc-server``
starts the same server loop (``ggml_backend_rpc_start_server``) from ``libggml-rpc``.

**rpc-server has no authentication and no encryption**: anyone who reaches its port can run
graphs on it and read or write its memory. Use it on loopback or a private network only.
"""
from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import struct
from pathlib import Path
from typing import Optional, Sequence

from moa_cpp.errors import InvalidArgumentError, MoaError


def _lib_dir() -> Path:
    import llama_cpp
    return Path(llama_cpp.__file__).resolve().parent / "lib"


_libs: dict = {}


def _load(name: str) -> ctypes.CDLL:
    if name not in _libs:
        path = _lib_dir() / name
        if not path.is_file():
            raise MoaError("this llama-cpp-python build has no RPC backend (libggml-rpc); rebuild it with "
                           "GGML_RPC=ON: bash scripts/setup.sh does")
        import llama_cpp  # noqa: F401  (loads libggml first, with its backends)
        _libs[name] = ctypes.CDLL(str(path))
    return _libs[name]


def rpc_available() -> bool:
    """True if llama-cpp-python was built with the RPC backend."""
    return (_lib_dir() / "libggml-rpc.so").is_file() or (_lib_dir() / "libggml-rpc.dylib").is_file()


def _rpc_lib() -> ctypes.CDLL:
    name = "libggml-rpc.dylib" if (_lib_dir() / "libggml-rpc.dylib").is_file() else "libggml-rpc.so"
    lib = _load(name)
    lib.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    lib.ggml_backend_rpc_start_server.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                                  ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
    lib.ggml_backend_rpc_start_server.restype = None
    return lib


def _base_lib() -> ctypes.CDLL:
    name = "libggml-base.dylib" if (_lib_dir() / "libggml-base.dylib").is_file() else "libggml-base.so"
    lib = _load(name)
    lib.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    return lib


def parse_endpoints(spec: "str | Sequence[str]") -> list:
    """``"host:port,host:port"`` (or a list) -> ``["host:port", ...]``, each checked."""
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s and s.strip()]
    if not items:
        raise InvalidArgumentError("--rpc: expected HOST:PORT[,HOST:PORT...]")
    for it in items:
        host, sep, port = it.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgumentError(f"--rpc: {it!r} is not HOST:PORT")
    return items


_HELLO = 14               # RPC_CMD_HELLO (fixed by the protocol)
_CAPS = 24                # RPC_CONN_CAPS_SIZE of protocol 7
_PROTO_MAJOR = 7          # RPC_PROTO_MAJOR_VERSION of llama-cpp-python 0.3.36's ggml


def probe(endpoint: str, timeout: float = 5.0) -> None:
    """Check that ``endpoint`` is a compatible rpc-server (TCP connect + the protocol's HELLO).
    llama.cpp aborts the process when it cannot connect or the handshake fails: this turns both
    into a clear error first."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
            sock.sendall(bytes([_HELLO]) + struct.pack("<Q", _CAPS) + bytes(_CAPS))
            head = _recv(sock, 8)
            size = struct.unpack("<Q", head)[0]
            body = _recv(sock, size) if 4 <= size <= 4096 else b""
    except OSError as e:
        raise MoaError(f"rpc-server {endpoint} is not reachable ({e.strerror or e}); start it there with "
                       f"`moa-cpp rpc-server --port {port}`") from None
    if len(body) < 3:
        raise MoaError(f"{endpoint} does not answer as a llama.cpp rpc-server")
    if body[0] != _PROTO_MAJOR:
        raise MoaError(f"rpc-server {endpoint} speaks RPC protocol {body[0]}.{body[1]}.{body[2]}; this build "
                       f"needs {_PROTO_MAJOR}.x (same llama.cpp version on both sides)")


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def rpc_device_list(endpoints: Sequence[str]) -> "ctypes.Array":
    """A NULL-terminated array of the devices of these rpc-servers, for
    ``llama_model_params.devices``. Connects to each server (a clear error if one is down).
    The devices are not registered globally: the drafter's ``device="auto"`` stays local."""
    rpc, base = _rpc_lib(), _base_lib()
    devs: list = []
    for ep in parse_endpoints(list(endpoints)):
        probe(ep)
        reg = rpc.ggml_backend_rpc_add_server(ep.encode())
        n = base.ggml_backend_reg_dev_count(reg) if reg else 0
        if n == 0:
            raise MoaError(f"rpc-server {ep} is not reachable (is `moa-cpp rpc-server --port "
                           f"{ep.rpartition(':')[2]}` running there?)")
        devs += [base.ggml_backend_reg_dev_get(reg, i) for i in range(n)]
    arr = (ctypes.c_void_p * (len(devs) + 1))(*devs, None)
    return arr


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def start_server(host: str = "127.0.0.1", port: int = 50052, n_threads: Optional[int] = None,
                 cache_dir: Optional[str] = None) -> None:
    """Serve this machine's CPU backend to llama.cpp RPC clients; blocks until the process is
    killed (as llama.cpp's ``rpc-server``)."""
    rpc = _rpc_lib()
    ggml = _load("libggml.dylib" if (_lib_dir() / "libggml.dylib").is_file() else "libggml.so")
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    cpu = ggml.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    if not cpu:
        raise MoaError("no CPU backend device")
    devices = (ctypes.c_void_p * 1)(cpu)
    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
    threads = n_threads or max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    rpc.ggml_backend_rpc_start_server(f"{host}:{port}".encode(), cache_dir.encode() if cache_dir else None,
                                      threads, 1, devices)
