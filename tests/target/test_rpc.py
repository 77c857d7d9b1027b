"""Targets split over machines through llama.cpp's RPC backend, on loopback: two real
`moa-cpp rpc-server` processes hold all the target's layers. Logits and captured K/V must equal
the local run bit for bit (same CPU kernels), speculative greedy output must equal local plain
decoding, and the CLI / server take --rpc. Bad endpoints are clear errors, never an abort."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from moa_cpp import SpeculativeGenerator
from moa_cpp.models import defaults
from moa_cpp.errors import InvalidArgumentError, MoaError
from moa_cpp.target.rpc import parse_endpoints, probe, rpc_available
from moa_cpp.target.target import Target

pytestmark = pytest.mark.model

if not rpc_available():
    if os.environ.get("CI"):
        raise RuntimeError("llama-cpp-python was built without GGML_RPC (scripts/setup.sh builds it with it)")
    pytest.skip("llama-cpp-python without the RPC backend: run scripts/setup.sh", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def rpc_servers():
    procs, eps = [], []
    for _ in range(2):
        port = _free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "moa_cpp.cli.main", "rpc-server", "--port", str(port),
                                       "-t", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        eps.append(f"127.0.0.1:{port}")
    try:
        for ep in eps:
            end = time.monotonic() + 30
            while True:
                try:
                    probe(ep, timeout=2)
                    break
                except MoaError:
                    if time.monotonic() > end:
                        raise
                    time.sleep(0.1)
        yield eps
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_logits_and_capture_through_rpc_equal_local(rpc_servers):
    path = defaults.default_target()
    with Target.from_path(path, n_ctx=512, n_threads=1) as loc, \
            Target.from_path(path, n_ctx=512, n_threads=1, n_gpu_layers=-1, rpc=rpc_servers) as rem:
        assert rem.rpc == tuple(rpc_servers)
        ids = loc.tokenize("The quick brown fox jumps over the lazy dog because")
        a = loc.decode(ids, capture=True)
        ka = loc.captured_lsa_in()
        b = rem.decode(ids, capture=True)
        kb = rem.captured_lsa_in()
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ka, kb)


def test_speculative_generation_through_rpc_equals_local_plain(rpc_servers):
    path = defaults.default_target()
    plain = SpeculativeGenerator.from_paths(path, None, draft="none", n_threads=1, n_ctx=1024)
    spec = SpeculativeGenerator.from_paths(path, defaults.default_drafter(), draft="chain:4", n_threads=1,
                                           n_ctx=1024, n_gpu_layers=-1, rpc=rpc_servers)
    try:
        for p in ("def fibonacci(n):", "The three primary colors are"):
            ref = plain.generate(p, max_tokens=24)
            got = spec.generate(p, max_tokens=24)
            assert got.tokens == ref.tokens
            assert got.stats.drafted > 0                         # the drafter really ran on captured K/V
        tree = spec.generate("The three primary colors are", max_tokens=24, draft="tree:4,4,16")
        assert tree.tokens == plain.generate("The three primary colors are", max_tokens=24).tokens
    finally:
        plain.close()
        spec.close()


def test_cli_generate_with_rpc(rpc_servers):
    cmd = [sys.executable, "-m", "moa_cpp.cli.main", "generate", "-p", "def add(a, b):", "-n", "16", "--json", "-t", "1",
           "--chain", "3"]
    local = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
    remote = subprocess.run(cmd + ["--rpc", ",".join(rpc_servers)], capture_output=True, text=True, timeout=300,
                            check=True)
    assert json.loads(remote.stdout.splitlines()[-1])["tokens"] == json.loads(local.stdout.splitlines()[-1])["tokens"]


def test_bad_endpoints_are_clear_errors():
    with pytest.raises(InvalidArgumentError):
        parse_endpoints("localhost")
    with pytest.raises(InvalidArgumentError):
        parse_endpoints("a:99999")
    port = _free_port()                                          # nothing listens there
    with pytest.raises(MoaError, match="not reachable"):
        Target.from_path(defaults.default_target(), n_ctx=256, n_gpu_layers=-1, rpc=[f"127.0.0.1:{port}"])
    # something that is not an rpc-server: a plain TCP server that says nothing useful
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        ep = f"127.0.0.1:{srv.getsockname()[1]}"
        import threading

        def answer():
            c, _ = srv.accept()
            c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            c.close()
        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(MoaError, match="rpc-server"):
            probe(ep, timeout=5)
    out = subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", "generate", "-p", "x", "--rpc", f"127.0.0.1:{port}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "not reachable" in out.stderr


def test_rpc_server_refuses_non_loopback_without_flag():
    out = subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", "rpc-server", "--host", "0.0.0.0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no authentication" in out.stderr


def test_serve_with_rpc(rpc_servers):
    pytest.importorskip("starlette")
    from moa_cpp.testing.server_proc import ServerProc
    plain = SpeculativeGenerator.from_paths(defaults.default_target(), None, draft="none", n_threads=1)
    srv = ServerProc("--rpc", ",".join(rpc_servers), "--draft", "chain:3", "-t", "1")
    try:
        st, _, body = srv.post("/v1/completions", {"prompt": "def add(a, b):", "max_tokens": 24, "temperature": 0})
        assert st == 200 and body["choices"][0]["text"] == plain.generate("def add(a, b):", max_tokens=24).text
        assert body["moa"]["drafted"] > 0
    finally:
        plain.close()
        assert srv.terminate() == 0


def test_serve_exits_cleanly_when_an_rpc_server_dies():
    """Issue 24 item 6: an rpc-server that dies made `serve` abort (llama.cpp's RPC client) on the
    next request, resetting every client's connection without a word. Now the watchdog sees the
    closed connection and `serve` exits 3 with the endpoint named, before any request."""
    pytest.importorskip("starlette")
    from moa_cpp.testing.server_proc import ServerProc
    port = _free_port()
    rpc = subprocess.Popen([sys.executable, "-m", "moa_cpp.cli.main", "rpc-server", "--port", str(port), "-t", "1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 30
        while True:
            try:
                probe(f"127.0.0.1:{port}", timeout=2)
                break
            except MoaError:
                assert time.monotonic() < end
                time.sleep(0.1)
        srv = ServerProc("--rpc", f"127.0.0.1:{port}", "--draft", "none", "-t", "1")
        st, _, body = srv.post("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "temperature": 0})
        assert st == 200
        rpc.kill()
        rpc.wait()
        try:
            srv.proc.wait(20)
        except subprocess.TimeoutExpired:
            srv.kill()
            pytest.fail("serve kept running with its rpc-server gone")
        assert srv.proc.returncode == 3, (srv.proc.returncode, "".join(srv.stderr_lines)[-2000:])
        time.sleep(0.2)
        assert f"rpc-server 127.0.0.1:{port} closed its connection" in "".join(srv.stderr_lines)
    finally:
        rpc.kill()
        rpc.wait()
