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
from server_proc import ServerProc

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
    from moa_cpp import SpeculativeGenerator, defaults
    gen = SpeculativeGenerator.from_paths(defaults.default_target(), None, draft="none", n_threads=1, n_ctx=N_CTX)
    yield gen
    gen.close()


def _client(server, **kw):
    from moa_cpp import defaults
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
