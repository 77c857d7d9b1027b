"""Client-server limits and sampling (spec A10, A11) against a real ``moa-cpp serve`` on
127.0.0.1: a full session pool answers 503 + Retry-After; an idle session is closed by the
sweeper and the client reopens it transparently; prompts beyond the context are 422
``context_full`` and a generation that reaches the context ends cleanly; a seeded sampled
generation repeats itself. Waits are bounded polls of the server's own state, never sleeps
that order events."""
from __future__ import annotations

import time

import pytest

from moa_cpp.remote import protocol as P
from moa_cpp.testing.server_proc import ServerProc

pytestmark = pytest.mark.model
msgpack = pytest.importorskip("msgpack")

PROMPT = "The three primary colors are"
N_CTX = 256


@pytest.fixture(scope="module")
def server():
    srv = ServerProc("--parallel", "2", "--queue", "0", "--idle-timeout", "1", "-c", str(N_CTX),
                     "--draft", "chain:3")
    # warm up: the first open measures the target's exact batch size (seconds on a machine whose
    # cache is cold), longer than the 1 s idle timeout the pool test relies on
    st, _, body = _open(srv)
    assert st == 200, body
    srv.request("DELETE", f"/moa/v1/sessions/{msgpack.unpackb(body)['session']}")
    yield srv
    assert srv.terminate() == 0


@pytest.fixture(scope="module")
def plain():
    from moa_cpp import SpeculativeGenerator
    from moa_cpp.models import defaults
    gen = SpeculativeGenerator.from_paths(defaults.default_target(), None, draft="none", n_threads=1, n_ctx=N_CTX)
    yield gen
    gen.close()


def _client(server, **kw):
    from moa_cpp.models import defaults
    from moa_cpp.remote.client import RemoteGenerator
    return RemoteGenerator(server.url, drafter=defaults.default_drafter(), target=defaults.default_target(),
                           draft="chain:3", timeout=10, **kw)


def _open(server, prompt=(1, 2, 3)):
    body = {"v": 1, "seq": 0, "prompt": P.pack_i32(prompt), "max_tokens": 8}
    return server.request("POST", "/moa/v1/sessions", P.encode_body(body, P.MSGPACK),
                          headers={"Content-Type": P.MSGPACK})


def _busy(server) -> int:
    st, _, body = server.request("GET", "/v1/models")
    assert st == 200
    return body["data"][0]["meta"]["sessions_busy"]


def _wait_idle(server, bound: float = 15.0) -> float:
    """Poll until the server holds no session; the seconds it took."""
    t0 = time.monotonic()
    while _busy(server):
        assert time.monotonic() - t0 < bound, "idle sessions were not closed"
        time.sleep(0.1)
    return time.monotonic() - t0


def test_full_pool_is_503_until_idle_sessions_expire(server):
    _wait_idle(server)
    held = [_open(server) for _ in range(2)]
    assert [h[0] for h in held] == [200, 200]
    st, headers, body = _open(server)
    assert st == 503 and int(headers["retry-after"]) >= 1
    assert body["error"]["message"]
    # nobody uses the two sessions: the sweeper closes them (idle timeout 1 s) and opens work again
    waited = _wait_idle(server)
    assert waited < 1 + 3, waited
    assert _open(server)[0] == 200
    for h in held:                                                # closed by the sweeper: 404
        sid = msgpack.unpackb(h[2])["session"]
        assert server.request("DELETE", f"/moa/v1/sessions/{sid}")[0] == 404


def test_idle_expiry_is_a_transparent_reopen(server, plain):
    """The client pauses mid-generation until the server has closed its session; its next verify
    gets 404 and it reopens by replay: the output is still plain greedy."""
    ref = plain.generate(PROMPT, max_tokens=40, ignore_eos=True).tokens
    _wait_idle(server)
    fired = {"paused": False}

    def hook(ev):
        if ev.kind == "tokens" and ev.verified and ev.pos >= 8 and not fired["paused"]:
            fired["paused"] = True
            _wait_idle(server)                # blocks the client until its session expired
    g = _client(server)
    try:
        r = g.generate(PROMPT, max_tokens=40, ignore_eos=True, on_event=hook)
    finally:
        g.close()
    assert fired["paused"] and r.stats.reopen_calls == 1 and r.stats.disconnections == 0
    assert r.tokens == ref and not r.unverified


def test_context_limits(server, plain):
    _wait_idle(server)
    st, _, body = _open(server, prompt=[1] * N_CTX)
    assert st == 422 and body["error"]["code"] == "context_full"
    # issue 24 item 9: a prompt may not take the whole context (it was accepted up to n_ctx - 1)
    margin = N_CTX // 8
    st, _, body = _open(server, prompt=[1] * (N_CTX - margin + 1))
    assert st == 422 and body["error"]["code"] == "context_full" and f"{margin} of them kept" in body["error"]["message"]
    st, _, body = _open(server, prompt=[1] * (N_CTX - margin))
    assert st == 200
    assert server.request("DELETE", f"/moa/v1/sessions/{msgpack.unpackb(body)['session']}")[0] == 204
    # a generation that runs into the context ends there, with plain decoding's tokens (EOG
    # ignored on both sides: greedy text, and so where it would stop, differs between CPUs)
    ref = plain.generate(PROMPT, max_tokens=N_CTX, ignore_eos=True)
    g = _client(server)
    try:
        r = g.generate(PROMPT, max_tokens=N_CTX, ignore_eos=True)
    finally:
        g.close()
    assert r.tokens == ref.tokens and r.finish_reason == ref.finish_reason == "length"
    assert len(r.tokens) < N_CTX


def test_seeded_sampling_repeats_itself(server):
    """A11: same seed, no fault: the same sampled tokens twice (the server owns the RNG; drafts are
    point masses). Another seed gives another text (64 tokens at temperature 1)."""
    g = _client(server)
    try:
        runs = [g.generate(PROMPT, max_tokens=48, temperature=1.0, top_p=0.95, seed=s, ignore_eos=True).tokens
                for s in (7, 7, 8)]
    finally:
        g.close()
    assert runs[0] == runs[1] and len(runs[0]) == 48
    assert runs[0] != runs[2]


def test_a_session_that_only_rewinds_expires(server):
    """Issue 24 item 3: every verify refreshed the idle clock, so a client rewinding to the start
    again and again held its pool session for ever. Only progress refreshes it now: the session
    expires (1 s idle timeout) while the rewinds go on."""
    _wait_idle(server)
    st, _, body = _open(server)
    assert st == 200
    r = msgpack.unpackb(body)
    n0, root0, sid = r["n"], r["root"], r["session"]
    t0, seq, codes = time.monotonic(), 0, []
    while time.monotonic() - t0 < 6:
        seq += 1
        msg = {"v": 1, "seq": seq, "n": n0, "root": root0, "tokens": b"", "parents": b""}
        st, _, _ = server.request("POST", f"/moa/v1/sessions/{sid}/verify", P.encode_body(msg, P.MSGPACK),
                                  headers={"Content-Type": P.MSGPACK})
        codes.append(st)
        if st == 404:
            break
        time.sleep(0.2)
    assert codes[0] == 200 and codes[-1] == 404, codes
    assert time.monotonic() - t0 < 4


KEY_A, KEY_B = "limits-key-a", "limits-key-b"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    keys = tmp_path_factory.mktemp("k") / "keys"
    keys.write_text(f"{KEY_A}\n{KEY_B}\n")
    keys.chmod(0o600)
    srv = ServerProc("--parallel", "1", "--queue", "4", "--idle-timeout", "120", "-c", str(N_CTX), "--draft", "chain:3",
                     "--api-key-file", str(keys), "--max-sessions-per-key", "1")
    yield srv
    assert srv.terminate() == 0


def _kopen(server, key):
    body = {"v": 1, "seq": 0, "prompt": P.pack_i32((1, 2, 3)), "max_tokens": 8}
    return server.request("POST", "/moa/v1/sessions", P.encode_body(body, P.MSGPACK),
                          headers={"Content-Type": P.MSGPACK, "Authorization": f"Bearer {key}"})


def _kmeta(server) -> dict:
    return server.request("GET", "/v1/models", headers={"Authorization": f"Bearer {KEY_A}"})[2]["data"][0]["meta"]


def _kclose(server, key, sid) -> int:
    return server.request("DELETE", f"/moa/v1/sessions/{sid}", headers={"Authorization": f"Bearer {key}"})[0]


def test_an_open_abandoned_while_queued_is_dropped(keyed):
    """Issue 24 item 3: a queued open whose client had left still prefilled and then held its
    session until the idle timeout (here 120 s). Now it is dropped when its client leaves."""
    import socket
    st, _, body = _kopen(keyed, KEY_A)                  # A holds the only pool session
    assert st == 200
    sid = msgpack.unpackb(body)["session"]
    raw = P.encode_body({"v": 1, "seq": 0, "prompt": P.pack_i32((1, 2, 3)), "max_tokens": 8}, P.MSGPACK)
    s = socket.create_connection((keyed.host, keyed.port), timeout=10)
    s.sendall(b"POST /moa/v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: " + P.MSGPACK.encode() + b"\r\n"
              b"Authorization: Bearer " + KEY_B.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(raw) + raw)
    t0 = time.monotonic()
    while _kmeta(keyed)["queued"] != 1:
        assert time.monotonic() - t0 < 10, "B's open was not queued"
        time.sleep(0.05)
    s.close()                                           # B leaves while queued
    time.sleep(0.3)
    assert _kclose(keyed, KEY_A, sid) == 204
    t1 = time.monotonic()
    while time.monotonic() - t1 < 2:                    # nobody takes the freed session
        assert _kmeta(keyed)["sessions_busy"] == 0
        time.sleep(0.1)


def test_sessions_per_key(keyed):
    """--max-sessions-per-key 1: a key's second open replaces its own unused session (a client
    that lost track of one is not locked out); while its open is queued, another open is 429."""
    import threading
    st, _, body = _kopen(keyed, KEY_A)
    first = msgpack.unpackb(body)["session"]
    st, _, body = _kopen(keyed, KEY_A)                  # replaces A's first session
    assert st == 200
    second = msgpack.unpackb(body)["session"]
    assert _kclose(keyed, KEY_A, first) == 404 and _kmeta(keyed)["sessions_busy"] == 1
    # B holds the pool; A's open waits in the queue; A's next open is refused
    assert _kclose(keyed, KEY_A, second) == 204
    st, _, body = _kopen(keyed, KEY_B)
    b_sid = msgpack.unpackb(body)["session"]
    queued: dict = {}
    t = threading.Thread(target=lambda: queued.update(r=_kopen(keyed, KEY_A)))
    t.start()
    t0 = time.monotonic()
    while _kmeta(keyed)["queued"] != 1:
        assert time.monotonic() - t0 < 10
        time.sleep(0.05)
    st, headers, err = _kopen(keyed, KEY_A)
    assert st == 429 and err["error"]["code"] == "too_many_sessions" and "retry-after" in headers
    assert _kclose(keyed, KEY_B, b_sid) == 204          # B leaves: A's queued open gets the session
    t.join(30)
    assert queued["r"][0] == 200
    assert _kclose(keyed, KEY_A, msgpack.unpackb(queued["r"][2])["session"]) == 204


def test_a_failure_inside_a_cycle_closes_the_session(monkeypatch):
    """Issue 24 item 3 / docs/client-server.md#security: an unexpected exception inside verify answered 500 and kept the
    session (its state unknown). Now the session is closed and its pool session freed; the
    client's next call gets 404 and reopens by replay. (In-process app: the failure is injected.)"""
    from starlette.testclient import TestClient
    from moa_cpp.server import remote_routes
    from moa_cpp.server.app import create_app
    from moa_cpp.server.sessions import build_sessions
    from moa_cpp.server.settings import ServerSettings
    settings = ServerSettings(parallel=1, draft="chain:3", n_ctx=N_CTX, threads=1)
    sessions = build_sessions(settings)
    try:
        with TestClient(create_app(settings, sessions), base_url="http://localhost",
                        raise_server_exceptions=False) as c:
            body = P.encode_body({"v": 1, "seq": 0, "prompt": P.pack_i32((1, 2, 3)), "max_tokens": 8}, P.MSGPACK)
            r = c.post("/moa/v1/sessions", content=body, headers={"Content-Type": P.MSGPACK})
            assert r.status_code == 200
            o = msgpack.unpackb(r.content)

            def broken(*a, **k):
                raise RuntimeError("injected")
            monkeypatch.setattr(remote_routes, "verify_cycle", broken)
            msg = {"v": 1, "seq": 1, "n": o["n"], "root": o["root"], "tokens": b"", "parents": b""}
            r = c.post(f"/moa/v1/sessions/{o['session']}/verify", content=P.encode_body(msg, P.MSGPACK),
                       headers={"Content-Type": P.MSGPACK})
            assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
            monkeypatch.undo()
            msg["seq"] = 2
            r = c.post(f"/moa/v1/sessions/{o['session']}/verify", content=P.encode_body(msg, P.MSGPACK),
                       headers={"Content-Type": P.MSGPACK})
            assert r.status_code == 404
            assert c.get("/v1/models").json()["data"][0]["meta"]["sessions_busy"] == 0
    finally:
        for s in sessions:
            s.gen.close()
