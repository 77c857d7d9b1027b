"""`moa-cpp serve --parallel N` with continuous batching (the default): concurrent clients get
the answers they get alone, while their rows really share decodes; a client that leaves
mid-answer frees its slot; a bounded burst of mixed clients leaves the server healthy.
A real server on 127.0.0.1, SmolLM2 Q4_1, raw HTTP."""
from __future__ import annotations

import json
import random
import re
import socket
import threading
import time

import pytest

from moa_cpp.testing.server_proc import ServerProc, streamed_chat_text, wait_until

N = 40
PROMPTS = ["What is a good name for a grey cat?", "Give me three tips for sleeping better.",
           "Explain what a compiler does in two sentences.", "Write a haiku about autumn rain."]


@pytest.fixture(scope="module")
def server():
    srv = ServerProc("--parallel", "3", "--queue", "4", "-c", "1024", "--metrics")
    yield srv
    assert srv.terminate() == 0
    assert "Traceback" not in "".join(srv.stderr_lines)


def _body(prompt: str, draft: str = None, max_tokens: int = N, **extra) -> dict:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0, **extra}
    if draft:
        body["moa"] = {"draft": draft}
    return body


def _chat(srv, body: dict) -> str:
    st, _, r = srv.post("/v1/chat/completions", body, timeout=300)
    assert st == 200, r
    return r["choices"][0]["message"]["content"]


def _stream(srv, body: dict) -> str:
    return streamed_chat_text(srv, body)


def _metric(srv, name: str) -> float:
    st, _, text = srv.request("GET", "/metrics")
    assert st == 200
    m = re.search(rf"^{re.escape(name)}(?:_total)? ([0-9.e+]+)$", text.decode(), re.M)
    assert m, name
    return float(m.group(1))


def _together(fns: list) -> list:
    out: list = [None] * len(fns)
    errs: list = []

    def run(i):
        try:
            out[i] = fns[i]()
        except BaseException as e:    # reported below
            errs.append(e)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    assert not errs, errs
    return out


@pytest.mark.parametrize("draft", ["none", "auto", "chain:3"])
def test_concurrent_clients_get_their_alone_answers_from_shared_decodes(server, draft):
    """Each prompt alone, then all three at once (streamed and not): the same texts, and the
    slots' decodes were shared (more slot decodes than engine cycles)."""
    d = None if draft == "auto" else draft
    alone = [_chat(server, _body(p, d)) for p in PROMPTS[:3]]
    decodes0, sets0 = _metric(server, "llamacpp:n_decode"), _metric(server, "moa:batch_sets")
    got = _together([lambda p=p, i=i: (_stream if i == 1 else _chat)(server, _body(p, d))
                     for i, p in enumerate(PROMPTS[:3])])
    assert got == alone
    decodes = _metric(server, "llamacpp:n_decode") - decodes0
    sets = _metric(server, "moa:batch_sets") - sets0
    if draft == "none":      # three plain generations of 40 tokens in step: ~3 slot decodes per cycle
        assert decodes / sets >= 1.8, (decodes, sets)
    else:
        assert decodes / sets > 1.2, (decodes, sets)


def test_trees_verify_their_main_path_and_answer_the_same(server):
    """A batched slot holds one sequence: a tree request is verified along its main path; the
    answer is the target's own all the same."""
    alone = _chat(server, _body(PROMPTS[3], "none"))
    got = _together([lambda: _chat(server, _body(PROMPTS[3], "tree:4,4,16")),
                     lambda: _chat(server, _body(PROMPTS[0], "chain:4"))])
    assert got[0] == alone


def _leave_mid_answer(srv, prompt: str) -> int:
    """Open a streamed answer, read its first chunk, and drop the connection. Returns the status:
    200, or 503 when the queue is full (abandoned answers hold their slots until the server sees
    the client gone, so a burst can fill the queue; the 503 connection stays open, keep-alive)."""
    s = socket.create_connection((srv.host, srv.port), timeout=60)
    body = json.dumps(_body(prompt, "none", max_tokens=600, stream=True)).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    buf = b""
    while b"data: " not in buf:
        if b"\r\n\r\n" in buf and not buf.startswith(b"HTTP/1.1 200"):
            status = int(buf.split(b" ", 2)[1])
            assert status == 503, buf
            s.close()
            return status
        chunk = s.recv(4096)
        assert chunk, "the server closed the stream"
        buf += chunk
    s.close()
    return 200


def test_client_that_leaves_mid_answer_frees_its_slot(server):
    """All three slots start long answers whose clients go away after the first chunk: the
    slots come free within seconds (not after 600 tokens), and three new requests are served
    at once with their alone answers."""
    alone = [_chat(server, _body(p, "none", max_tokens=12)) for p in PROMPTS[:3]]
    assert _together([lambda p=p: _leave_mid_answer(server, p) for p in PROMPTS[:3]]) == [200] * 3
    assert wait_until(lambda: _metric(server, "llamacpp:requests_processing") == 0, timeout=60)
    t = time.monotonic()
    got = _together([lambda p=p: _chat(server, _body(p, "none", max_tokens=12)) for p in PROMPTS[:3]])
    assert got == alone
    assert time.monotonic() - t < 120


def test_bounded_burst_of_mixed_clients_leaves_the_server_healthy(server):
    """Six clients for ~15 s: random prompts, lengths, drafts, streaming, early leaving, bad
    bodies. Every well-formed answer is 200 or a 503 (queue full); afterwards the server is
    healthy and answers as it did alone."""
    ref = _chat(server, _body(PROMPTS[1], None, max_tokens=24))
    stop = time.monotonic() + 15
    statuses: list = []

    def client(seed: int) -> None:
        rnd = random.Random(seed)
        while time.monotonic() < stop:
            kind = rnd.random()
            if kind < 0.15:
                _leave_mid_answer(server, rnd.choice(PROMPTS))        # 200, or 503: queue full
                continue
            if kind < 0.25:
                st, _, _ = server.post("/v1/chat/completions", b'{"messages": [', timeout=60)
                assert st == 400
                continue
            body = _body(rnd.choice(PROMPTS), rnd.choice([None, "none", "chain:2", "tree:3,2,6"]),
                         max_tokens=rnd.randint(1, 32))
            st, _, r = server.post("/v1/chat/completions", body, timeout=300)
            statuses.append(st)
            assert st in (200, 503), r
    _together([lambda s=s: client(s) for s in range(6)])
    assert statuses.count(200) >= 6
    assert server.health() == 200
    assert server.proc.poll() is None
    assert _chat(server, _body(PROMPTS[1], None, max_tokens=24)) == ref
