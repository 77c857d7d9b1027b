"""Client-server MoA through real faults (spec A3-A7): a fault proxy that refuses and resets
connections, a response lost after the server processed its request, and a `kill -9` of the
server followed by a restart. Faults fire from the client's event hook at chosen positions (no
sleeps for ordering). Invariants checked every time: verified tokens are never withdrawn, each
unverified token is confirmed or rolled back exactly once, the events replay to the result, and
the greedy output equals single-device plain decoding. Every generation (and the plain reference)
ignores end-of-generation tokens, so it runs the full MAX tokens whatever text greedy decoding
makes on this CPU: the faults fire at positions 5-28, always inside the generation."""
from __future__ import annotations

import select
import signal
import socket

import pytest

from moa_cpp.testing.fault_proxy import FaultProxy
from moa_cpp.testing.server_proc import ServerProc

pytestmark = pytest.mark.model
pytest.importorskip("msgpack")

PROMPT = "The three primary colors are"
MAX = 64


@pytest.fixture(scope="module")
def plain_tokens():
    from moa_cpp import SpeculativeGenerator
    from moa_cpp.models import defaults
    gen = SpeculativeGenerator.from_paths(defaults.default_target(), None, draft="none", n_threads=1)
    toks = gen.generate(PROMPT, max_tokens=MAX, ignore_eos=True).tokens
    gen.close()
    assert len(toks) == MAX
    return toks


def _client(url, **kw):
    from moa_cpp.models import defaults
    from moa_cpp.remote.client import RemoteGenerator
    kw.setdefault("timeout", 10)
    return RemoteGenerator(url, drafter=defaults.default_drafter(), target=defaults.default_target(),
                           draft="chain:3", **kw)


def check_invariants(result) -> None:
    """I1, I3, I5: replay the events over an empty list."""
    seq: list = []            # (token, verified)
    for ev in result.events:
        if ev.kind == "tokens":
            assert ev.pos == len(seq), (ev, len(seq))                         # contiguous, no gaps or repeats
            seq += [(t, ev.verified) for t in ev.ids]
        elif ev.kind == "confirm":
            part = seq[ev.pos: ev.pos + ev.n]
            assert len(part) == ev.n and not any(v for _, v in part)        # only unverified ones, once
            seq[ev.pos: ev.pos + ev.n] = [(t, True) for t, _ in part]
        elif ev.kind == "rollback":
            assert ev.pos + ev.n == len(seq)                                 # the tail
            assert not any(v for _, v in seq[ev.pos:])                       # I1: never a verified token
            seq = seq[: ev.pos]
    assert [t for t, v in seq if v] == result.tokens
    assert [t for t, v in seq if not v] == result.unverified
    st = result.stats
    assert st.unverified_confirmed + st.unverified_rolled_back + len(result.unverified) == st.unverified_tokens


@pytest.fixture(scope="module")
def server():
    srv = ServerProc("--draft", "chain:3", "--parallel", "2")
    yield srv
    srv.terminate()


def test_refused_then_restored_connection(server, plain_tokens):
    """A3: at token 8 every connection is reset and new ones refused; the client keeps drafting
    alone; after 20 unverified tokens the network comes back, the client resyncs."""
    proxy = FaultProxy(server.host, server.port)
    fired = {"cut": False, "back": False}

    def hook(ev):
        if ev.kind == "tokens" and ev.verified and ev.pos >= 8 and not fired["cut"]:
            fired["cut"] = True
            proxy.refuse()
        if ev.kind == "tokens" and not ev.verified and ev.pos >= 8 + 20 and not fired["back"]:
            fired["back"] = True
            proxy.restore()
    try:
        g = _client(proxy.url)
        r = g.generate(PROMPT, max_tokens=MAX, ignore_eos=True, on_event=hook)
    finally:
        proxy.close()
    assert fired["cut"] and fired["back"]
    assert r.tokens == plain_tokens and r.finish_reason == "length" and not r.unverified
    st = r.stats
    assert st.disconnections == 1 and st.resyncs == 1 and st.unverified_tokens >= 20
    check_invariants(r)


def test_response_lost_after_the_server_advanced(server, plain_tokens):
    """A4: the server processes a verify but its answer never arrives; the client's retry is
    behind the server, which rolls back: no token lost or duplicated."""
    proxy = FaultProxy(server.host, server.port)
    fired = {"n": 0}

    def hook(ev):
        if ev.kind == "tokens" and ev.verified and ev.pos >= 8 and fired["n"] == 0:
            fired["n"] = 1
            proxy.mode = "reset_after_request"
    try:
        r = _client(proxy.url).generate(PROMPT, max_tokens=MAX, ignore_eos=True, on_event=hook)
    finally:
        proxy.close()
    assert fired["n"] == 1 and r.stats.disconnections == 1
    assert r.tokens == plain_tokens
    check_invariants(r)


def test_blackhole_is_detected_by_the_read_timeout(server, plain_tokens):
    """A5: at token 8 the network swallows everything (connections stay open, nothing arrives):
    the client notices within its read timeout + 1 s, drafts alone, and resyncs once the network
    delivers again (after 10 unverified tokens)."""
    import time
    proxy = FaultProxy(server.host, server.port)
    box: dict = {}

    def hook(ev):
        if ev.kind == "tokens" and ev.verified and ev.pos >= 8 and "cut" not in box:
            box["cut"] = time.monotonic()
            proxy.blackhole()
        if ev.kind == "status" and ev.state == "disconnected" and "seen" not in box:
            box["seen"] = time.monotonic()
        if ev.kind == "tokens" and not ev.verified and ev.pos >= 8 + 10 and "back" not in box:
            box["back"] = True
            proxy.restore()
    try:
        r = _client(proxy.url, timeout=2.0).generate(PROMPT, max_tokens=MAX, ignore_eos=True, on_event=hook)
    finally:
        proxy.close()
    assert "back" in box and box["seen"] - box["cut"] < 2.0 + 1.0, box
    assert r.tokens == plain_tokens and not r.unverified
    assert r.stats.disconnections >= 1 and r.stats.resyncs >= 1
    check_invariants(r)


def test_a_dead_kept_alive_connection_is_replaced(server, plain_tokens, monkeypatch):
    """Between two generations the kept-alive connection dies (reset; a server's keep-alive
    timeout does the same): the next request could not be sent on it, so it goes once more on a
    fresh connection: no disconnection, no error."""
    from moa_cpp.remote.transport import Transport
    monkeypatch.setattr(Transport, "REUSE_IDLE_S", 1e9)        # reuse it however long it idled
    proxy = FaultProxy(server.host, server.port)
    try:
        g = _client(proxy.url)
        first = g.generate(PROMPT, max_tokens=8, ignore_eos=True)
        sock = g.http.conn.sock
        proxy.kill_all()
        select.select([sock], [], [], 5.0)        # the reset has reached the client's socket
        r = g.generate(PROMPT, max_tokens=MAX, ignore_eos=True)
    finally:
        proxy.close()
    assert first.tokens == plain_tokens[:8]
    assert r.tokens == plain_tokens and r.stats.disconnections == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_killed_and_restarted(plain_tokens):
    """A6: kill -9 of the server at token 10; a new server process on the same port after 10
    unverified tokens: the session is gone (404), the client reopens by replay and resyncs."""
    port = _free_port()
    box = {"srv": ServerProc("--draft", "chain:3", "--port", str(port)), "killed": False, "restarted": False}

    def hook(ev):
        if ev.kind == "tokens" and ev.verified and ev.pos >= 10 and not box["killed"]:
            box["killed"] = True
            box["srv"].proc.send_signal(signal.SIGKILL)
            box["srv"].proc.wait(10)
        if ev.kind == "tokens" and not ev.verified and ev.pos >= 10 + 10 and not box["restarted"]:
            box["restarted"] = True
            box["srv"] = ServerProc("--draft", "chain:3", "--port", str(port))
    try:
        r = _client(f"http://127.0.0.1:{port}").generate(PROMPT, max_tokens=MAX, ignore_eos=True, on_event=hook)
    finally:
        box["srv"].kill()
    assert box["killed"] and box["restarted"]
    assert r.stats.reopen_calls == 1 and r.stats.disconnections == 1
    assert r.tokens == plain_tokens
    check_invariants(r)


def test_server_never_returns_then_verify_pending(plain_tokens):
    """A7: the server dies for good: the generation ends with finish_reason "unverified", its
    unverified tail kept, nothing verified lost. A server started later on the same address lets
    verify_pending resolve the tail (reopen by replay) and finish: plain greedy, events replay."""
    port = _free_port()
    srv = ServerProc("--draft", "chain:3", "--port", str(port))
    fired = {"k": False}

    def hook(ev):
        if ev.kind == "tokens" and ev.verified and ev.pos >= 5 and not fired["k"]:
            fired["k"] = True
            srv.proc.send_signal(signal.SIGKILL)
            srv.proc.wait(10)
    g = _client(f"http://127.0.0.1:{port}", resync_wait=1.0, max_unverified=16)
    try:
        r = g.generate(PROMPT, max_tokens=MAX, ignore_eos=True, on_event=hook)
    finally:
        srv.kill()                               # a failure before the hook fired must not leak it
    assert r.finish_reason == "unverified" and len(r.unverified) == 16 and len(r.tokens) >= 6
    check_invariants(r)
    again = ServerProc("--draft", "chain:3", "--port", str(port))
    try:
        done = g.verify_pending(r, wait=10.0)
    finally:
        again.kill()
        g.close()
    assert done.finish_reason == "length" and not done.unverified
    assert done.tokens == plain_tokens and done.stats.reopen_calls == 1
    check_invariants(done)
    with pytest.raises(ValueError):
        g.verify_pending(_stale(r), wait=0.1)


def test_cli_exit_3_when_the_server_does_not_return(server, plain_tokens):
    """A7, CLI: the network dies after a few answers: exit 3, the JSON holds the verified tokens
    (a prefix of plain greedy) and the unverified tail; a pipe got verified text only."""
    import json
    import subprocess
    import sys
    from moa_cpp.models import defaults
    proxy = FaultProxy(server.host, server.port)
    proxy.after(4, "refuse")                     # the open + 3 verify answers, then nothing
    try:
        out = subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", "client", "--server", proxy.url,
                              "-m", defaults.default_target(), "-d", defaults.default_drafter(), "-p", PROMPT,
                              "-n", str(MAX), "--ignore-eos", "--draft", "chain:3", "--max-unverified", "8", "--resync-wait", "1",
                              "--json"], capture_output=True, text=True, timeout=300)
    finally:
        proxy.close()
    assert out.returncode == 3, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["finish_reason"] == "unverified" and len(res["unverified"]) == 8
    assert res["tokens"] == plain_tokens[: len(res["tokens"])] and len(res["tokens"]) >= 4
    assert res["stats"]["disconnections"] == 1


def _stale(r):
    """A result whose generation is not the generator's latest."""
    import dataclasses
    return dataclasses.replace(r, finish_reason="unverified", _run=object())
