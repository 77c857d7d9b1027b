"""Client-server MoA (issue 11), connected mode: the protocol's codec and validation without a
model (spec A12), and a real `moa-cpp serve` on 127.0.0.1 driven by `RemoteGenerator`: greedy
output equal to single-device plain decoding for chains and trees and every CA dtype (A1),
sessions that belong to their key (A9), and malformed protocol messages answered with 4xx
while the server stays up and correct (A8)."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from moa_cpp.remote import protocol as P

msgpack = pytest.importorskip("msgpack")


# ---------------------------------------------------------------------------- A12: no model

def test_ca_codec_round_trips():
    rng = np.random.default_rng(0)
    k = rng.normal(size=(5, 3, 64)).astype(np.float32) * 3
    v = rng.normal(size=(5, 3, 64)).astype(np.float32)
    for dtype in P.CA_DTYPES:
        wire = P.encode_ca(k, v, 7, dtype)
        assert len(wire["k"]) == P.ca_nbytes(dtype, k.size)
        k2, v2, pos0 = P.decode_ca(wire, 3, 64, 100)
        assert pos0 == 7 and k2.shape == k.shape
        if dtype == "f32":
            np.testing.assert_array_equal(k2, k)
        elif dtype == "f16":
            np.testing.assert_allclose(k2, k, rtol=2 ** -11, atol=0)
        else:                                  # q8_0: half a quantisation step of each 32-block + f16 scale
            blocks = np.abs(k.reshape(-1, 32)).max(1)
            err = np.abs(k2 - k).reshape(-1, 32).max(1)
            assert (err <= blocks / 127 * 0.5 + blocks * 2 ** -10).all()
    assert P.ca_nbytes("f16", 2 * 3 * 64) == 768        # SmolLM2: bytes per verified token at f16


def test_bodies_json_equals_msgpack():
    obj = {"v": 1, "seq": 3, "n": 10, "root": 5, "tokens": P.pack_i32([1, 2, 3]), "parents": P.pack_i16([-1, 0, 1]),
           "ca": P.encode_ca(np.ones((1, 3, 64), np.float32), np.zeros((1, 3, 64), np.float32), 0, "f16")}
    a = P.decode_body(P.encode_body(obj, P.MSGPACK), P.MSGPACK)
    b = P.decode_body(P.encode_body(obj, P.JSON), P.JSON)
    assert a == b == obj


@pytest.mark.parametrize("body,ctype,kind", [
    (b"\xc1\xc1", P.MSGPACK, "malformed_body"), (b"{", P.JSON, "malformed_body"), (b"[1]", P.JSON, "malformed_body"),
    (json.dumps({"v": 2}).encode(), P.JSON, "unsupported_version"), (b"{}", "text/plain", "unsupported_media_type"),
    (json.dumps({"v": 1, "x": {"$b64": "!!"}}).encode(), P.JSON, "malformed_body"),
    (b"\x91" * 100000, P.MSGPACK, "malformed_body"),
])
def test_bad_bodies(body, ctype, kind):
    with pytest.raises(P.ProtocolError) as e:
        P.decode_body(body, ctype)
    assert e.value.kind == kind


def _hostile_bodies() -> list:
    n = 1 << 20
    arr32 = b"\xdd" + (n - 5).to_bytes(4, "big")                 # msgpack array32 header
    map32 = b"\xdf" + ((n - 5) // 2).to_bytes(4, "big")          # msgpack map32 header
    return [("msgpack array of 1M empty maps", arr32 + b"\x80" * (n - 5), P.MSGPACK),
            ("msgpack array of 1M empty arrays", arr32 + b"\x90" * (n - 5), P.MSGPACK),
            ("msgpack map of 500k int keys", map32 + b"\x01\x80" * ((n - 5) // 2), P.MSGPACK),
            ("msgpack map of 100k str keys", b"\xdf" + (100000).to_bytes(4, "big")
             + b"".join(b"\xa5" + f"{i:05d}".encode() + b"\xc0" for i in range(100000)), P.MSGPACK),
            ("json array of 350k objects", b"[" + b"{}," * ((n - 3) // 3) + b"{}]", P.JSON),
            ("json nested arrays", b"[" * (n // 2) + b"]" * (n // 2), P.JSON)]


@pytest.mark.parametrize("name,body,ctype", _hostile_bodies(), ids=lambda x: x if isinstance(x, str) and " " in x else "")
def test_hostile_bodies_cost_little_to_refuse(name, body, ctype):
    """Issue 24 item 7: a 1 MiB body of empty maps decoded into ~73 MiB of Python objects (on the
    server's event loop) before it was refused. The decoder's container limits refuse it early:
    the peak of Python allocations while refusing stays under 4 MiB."""
    import tracemalloc
    assert len(body) <= 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(P.ProtocolError) as e:
            P.decode_body(body, ctype, 1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.kind == "malformed_body"
    assert peak < 4 << 20, f"{name}: {peak / 2 ** 20:.1f} MiB to refuse"


@pytest.mark.parametrize("tokens,parents,ok", [
    ([1, 2, 3], [-1, 0, 1], True), ([1, 2], [-1, -1], True), ([], [], True),
    ([1, 2], [-1, 1], False), ([1, 2], [-1, 5], False), ([1, 2], [-2, 0], False), ([-1], [-1], False),
    ([100], [-1], False), ([1, 2], [-1], False), (list(range(20)), list(range(-1, 19)), False),
])
def test_tree_validation(tokens, parents, ok):
    t, p = np.array(tokens, np.int64), np.array(parents, np.int64)
    if ok:
        P.check_tree(t, p, n_vocab=100, max_nodes=62)
    else:
        with pytest.raises(P.ProtocolError):
            P.check_tree(t, p, n_vocab=100, max_nodes=62)


# ---------------------------------------------------------------------------- real server

KEY, OTHER = "remote-key-1", "remote-key-2"
PROMPTS = ["def fibonacci(n):", "The three primary colors are", "Once upon a time, in a small village,"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from moa_cpp.testing.server_proc import ServerProc
    keys = tmp_path_factory.mktemp("k") / "keys"
    keys.write_text(f"{KEY}\n{OTHER}\n")
    srv = ServerProc("--parallel", "2", "--draft", "chain:4", "--api-key-file", str(keys))
    yield srv
    assert srv.terminate() == 0


@pytest.fixture(scope="module")
def server_nocb(tmp_path_factory):
    """Sessions with contexts of their own: a client's tree is verified whole (a batched slot
    verifies its main path, which is lossless but another cycle)."""
    from moa_cpp.testing.server_proc import ServerProc
    keys = tmp_path_factory.mktemp("k") / "keys"
    keys.write_text(f"{KEY}\n")
    srv = ServerProc("--parallel", "2", "--no-cont-batching", "--draft", "chain:4", "--api-key-file", str(keys))
    yield srv
    assert srv.terminate() == 0


@pytest.fixture(scope="module")
def plain():
    from moa_cpp import SpeculativeGenerator
    from moa_cpp.models import defaults
    gen = SpeculativeGenerator.from_paths(defaults.default_target(), None, draft="none", n_threads=1)
    yield gen
    gen.close()


def _remote(server, **kw):
    from moa_cpp.models import defaults
    from moa_cpp.remote.client import RemoteGenerator
    return RemoteGenerator(server.url, drafter=defaults.default_drafter(), target=defaults.default_target(),
                           api_key=kw.pop("api_key", KEY), **kw)


@pytest.mark.model
@pytest.mark.parametrize("draft,ca_dtype", [("chain:1", "f16"), ("chain:4", "f16"), ("tree:3,3,10", "f16"),
                                            ("chain:4", "f32"), ("tree:4,4,16", "q8_0")])
def test_remote_greedy_equals_plain(server, plain, draft, ca_dtype):
    g = _remote(server, draft=draft, ca_dtype=ca_dtype)
    try:
        for p in PROMPTS:
            ref = plain.generate(p, max_tokens=32)
            r = g.generate(p, max_tokens=32)
            assert r.tokens == ref.tokens, (draft, ca_dtype, p)
            assert r.text == ref.text
            st = r.stats
            assert st.server_calls == st.verify_calls + 1          # one open, one call per cycle (no close)
            assert st.accepted <= st.drafted and st.verify_calls < len(r.tokens)
    finally:
        g.close()


@pytest.mark.model
@pytest.mark.parametrize("draft", ["chain:4", "tree:6,8,62"])
def test_remote_f32_cycles_equal_the_local_run(request, draft):
    """A1: with f32 CA the client's drafter sees exactly what a single-device drafter sees, so
    every cycle is the same: same proposals (drafted), same verdicts (accepted), same calls.
    Chains on the batched server, trees on one whose sessions verify them whole."""
    from moa_cpp import SpeculativeGenerator
    from moa_cpp.models import defaults
    server = request.getfixturevalue("server" if draft.startswith("chain") else "server_nocb")
    local = SpeculativeGenerator.from_paths(defaults.default_target(), defaults.default_drafter(), draft=draft,
                                            n_threads=1)
    g = _remote(server, draft=draft, ca_dtype="f32")
    n = 32 if draft.startswith("chain") else 12      # the 62-node tree: ~5x the rows per cycle
    try:
        for p in PROMPTS:
            a = local.generate(p, max_tokens=n)
            r = g.generate(p, max_tokens=n)
            assert r.tokens == a.tokens
            assert (r.stats.verify_calls, r.stats.drafted, r.stats.accepted) == \
                (a.stats.target_calls, a.stats.drafted, a.stats.accepted), (draft, p)
    finally:
        g.close()
        local.close()


@pytest.mark.model
def test_remote_json_bodies_too(server, plain):
    g = _remote(server, use_msgpack=False)
    try:
        assert g.generate(PROMPTS[0], max_tokens=16).tokens == plain.generate(PROMPTS[0], max_tokens=16).tokens
    finally:
        g.close()


def _open(server, key=KEY, prompt=(1, 2, 3), **kw):
    body = {"v": 1, "seq": 0, "prompt": P.pack_i32(prompt), "max_tokens": 64, **kw}
    return server.request("POST", "/moa/v1/sessions", P.encode_body(body, P.MSGPACK),
                          headers={"Content-Type": P.MSGPACK, "Authorization": f"Bearer {key}"})


def _verify(server, sid, body: bytes, key=KEY, ctype=P.MSGPACK):
    return server.request("POST", f"/moa/v1/sessions/{sid}/verify", body,
                          headers={"Content-Type": ctype, "Authorization": f"Bearer {key}"})


@pytest.mark.model
def test_sessions_belong_to_their_key_and_auth(server):
    st, _, raw = _open(server)
    assert st == 200
    r = msgpack.unpackb(raw)
    good = P.encode_body({"v": 1, "seq": 1, "n": r["n"], "root": r["root"], "tokens": b"", "parents": b""}, P.MSGPACK)
    assert _verify(server, r["session"], good, key=OTHER)[0] == 404           # another key: no such session
    assert _verify(server, r["session"], good, key="wrong")[0] == 401
    assert _verify(server, r["session"], good)[0] == 200
    assert _verify(server, r["session"], good)[0] == 409                      # the same seq again: stale
    st, _, _ = server.request("DELETE", f"/moa/v1/sessions/{r['session']}", headers={"Authorization": f"Bearer {KEY}"})
    assert st == 204
    assert _verify(server, r["session"], good)[0] == 404


def _malformed(rng: random.Random, n_vocab: int, state: dict) -> list:
    """(path kind, content type, body) of malformed protocol requests."""
    def pack(o):
        return msgpack.packb(o, use_bin_type=True)
    ok = {"v": 1, "seq": state["seq"], "n": state["n"], "root": state["root"], "tokens": P.pack_i32([5]),
          "parents": P.pack_i16([-1])}
    cases = []
    for _ in range(150):
        cases.append(("verify", P.MSGPACK, bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 200)))))
    full = pack(ok)
    for i in range(1, len(full), max(1, len(full) // 20)):
        cases.append(("verify", P.MSGPACK, full[:i]))                       # truncated msgpack
    wrong = [None, "x", 1.5, True, [1], {"a": 1}, -1, 2 ** 64 - 1, b"\x00"]
    for key in ("seq", "n", "root", "tokens", "parents", "v"):
        for w in wrong:
            cases.append(("verify", P.MSGPACK, pack({**ok, key: w})))
    bad_trees = [([-1], [-1]), ([n_vocab], [-1]), ([1, 2], [-1, 1]), ([1, 2], [0, -1]), ([1] * 63, [-1] * 63),
                 ([1, 2, 3], [-1, 0]), ([1], [5])]
    for toks, pars in bad_trees:
        cases.append(("verify", P.MSGPACK, pack({**ok, "tokens": P.pack_i32(toks), "parents": P.pack_i16(pars)})))
    resync = {**ok, "resync": True}
    cases.append(("verify", P.MSGPACK, pack({**resync, "tokens": P.pack_i32([5] * 513),      # over max_resync_tokens
                                             "parents": P.pack_i16(range(-1, 512))})))
    cases.append(("verify", P.MSGPACK, pack({**resync, "tokens": P.pack_i32([5, 6]),         # a resync is a chain
                                             "parents": P.pack_i16([-1, -1])})))
    cases.append(("verify", P.MSGPACK, pack({**ok, "resync": "yes"})))
    cases.append(("verify", P.MSGPACK, pack({**ok, "tokens": b"\x01\x02\x03"})))       # not whole int32s
    cases.append(("verify", P.MSGPACK, pack({**ok, "n": state["n"] + 3})))              # state mismatch
    cases.append(("verify", P.MSGPACK, pack({**ok, "seq": 0})))                         # replayed seq
    cases.append(("verify", P.MSGPACK, b"\x91" * 20000))                               # deep nesting
    cases.append(("verify", P.MSGPACK, b"\xdd\x00\x0f\x42\x40"))                       # declares 10^6 elements
    cases.append(("verify", "text/plain", full))
    cases.append(("verify", P.JSON, b"{not json"))
    cases.append(("verify", P.MSGPACK, b"\x00" * (2 << 20)))                           # 2 MiB
    cases.append(("unknown", P.MSGPACK, full))
    for _ in range(100):
        o = {"v": 1, "seq": 0, "prompt": P.pack_i32([rng.randint(-5, n_vocab + 5) for _ in range(3)]),
             "max_tokens": rng.choice([0, -1, 2 ** 40, "x", 5]), "ca_dtype": rng.choice(["f16", "bf16", 5]),
             "sampling": rng.choice([{}, [], {"temperature": -1}, {"top_p": 0}, {"seed": -3}, "x"])}
        if o["max_tokens"] == 5 and o["ca_dtype"] == "f16" and isinstance(o["sampling"], dict) and not o["sampling"] \
                and all(0 <= t < n_vocab for t in np.frombuffer(o["prompt"], "<i4")):
            o["prompt"] = b""
        cases.append(("open", P.MSGPACK, pack(o)))
    cases.append(("open", P.MSGPACK, pack({"v": 1, "seq": 0, "prompt": P.pack_i32([1] * 5000), "max_tokens": 4})))
    return cases


@pytest.mark.model
def test_malformed_protocol_messages(server, plain):
    st, _, raw = _open(server, prompt=plain.encode(PROMPTS[0]))
    assert st == 200
    r = msgpack.unpackb(raw)
    state = {"seq": 1, "n": r["n"], "root": r["root"]}
    n_vocab = 49152
    cases = _malformed(random.Random(11), n_vocab, state)
    assert len(cases) >= 300
    bad = []
    for kind, ctype, body in cases:
        path = {"verify": f"/moa/v1/sessions/{r['session']}/verify", "open": "/moa/v1/sessions",
                "unknown": "/moa/v1/sessions/nope/verify"}[kind]
        status, hdr, resp = server.request("POST", path, body,
                                           headers={"Content-Type": ctype, "Authorization": f"Bearer {KEY}"})
        if not (400 <= status < 500 and isinstance(resp, dict) and isinstance(resp.get("error"), dict)):
            bad.append((kind, body[:40], status, resp if isinstance(resp, dict) else resp[:100]))
    assert not bad, bad[:5]
    assert server.health() == 200
    # the session survived every bad request: a valid verify still works, and a new remote
    # generation still equals plain decoding
    good = P.encode_body({"v": 1, "seq": 2, "n": state["n"], "root": state["root"], "tokens": b"", "parents": b""},
                         P.MSGPACK)
    assert _verify(server, r["session"], good)[0] == 200
    server.request("DELETE", f"/moa/v1/sessions/{r['session']}", headers={"Authorization": f"Bearer {KEY}"})
    g = _remote(server)
    try:
        assert g.generate(PROMPTS[1], max_tokens=24).tokens == plain.generate(PROMPTS[1], max_tokens=24).tokens
    finally:
        g.close()


def _msg(server, sid, body: dict) -> dict:
    st, _, raw = _verify(server, sid, P.encode_body({"v": 1, **body}, P.MSGPACK))
    assert st == 200, raw
    return msgpack.unpackb(raw)


@pytest.mark.model
def test_resync_verifies_a_long_chain_in_pieces(server, plain):
    """A resync (docs/client-server.md#resync) of 140 tokens, more than one 63-row batch, in ONE request: the server
    verifies it in pieces up to the first rejection. Its answer equals what three ordinary verifies
    of the same tokens answer: the same accepted count, tokens and CA rows (bit-identical: the same
    batches); a chain wrong at token 100 stops there, the target's own token after it."""
    prompt = plain.encode(PROMPTS[2])
    ref = plain.generate(PROMPTS[2], max_tokens=150, ignore_eos=True).tokens
    m = 140

    def session():
        st, _, raw = _open(server, prompt=prompt, max_tokens=160, sampling={"ignore_eos": True})
        assert st == 200
        r = msgpack.unpackb(raw)
        assert r["root"] == ref[0] and r["max_resync_tokens"] == 512
        return r

    r = session()
    one = _msg(server, r["session"], {"seq": 1, "n": r["n"], "root": r["root"], "resync": True,
                                      "tokens": P.pack_i32(ref[1:1 + m]), "parents": P.pack_i16(range(-1, m - 1))})
    server.request("DELETE", f"/moa/v1/sessions/{r['session']}", headers={"Authorization": f"Bearer {KEY}"})
    assert one["accepted"] == m and np.frombuffer(one["tokens"], "<i4").tolist() == ref[1:m + 2]
    assert one["n"] == r["n"] + m + 1 and one["root"] == ref[m + 1]
    k1, v1, pos1 = P.decode_ca(one["ca"], one["ca"]["heads"], one["ca"]["dim"], 1 << 12)
    assert pos1 == r["n"] and len(k1) == m + 1

    r = session()                                   # the same tokens as ordinary verifies of 62
    n, root, seq, ks, vs, toks = r["n"], r["root"], 1, [], [], []
    i = 1
    while i < 1 + m:
        part = ref[i: min(i + 62, 1 + m)]
        a = _msg(server, r["session"], {"seq": seq, "n": n, "root": root, "tokens": P.pack_i32(part),
                                        "parents": P.pack_i16(range(-1, len(part) - 1))})
        assert a["accepted"] == len(part)
        k, v, _ = P.decode_ca(a["ca"], a["ca"]["heads"], a["ca"]["dim"], 1 << 12)
        ks.append(k), vs.append(v)
        toks += np.frombuffer(a["tokens"], "<i4").tolist()
        n, root, seq, i = a["n"], a["root"], seq + 1, i + len(part) + 1
    assert toks[:m + 1] == ref[1:m + 2]
    k3, v3 = np.concatenate(ks)[:m + 1], np.concatenate(vs)[:m + 1]
    assert np.array_equal(k1, k3) and np.array_equal(v1, v3)
    server.request("DELETE", f"/moa/v1/sessions/{r['session']}", headers={"Authorization": f"Bearer {KEY}"})

    r = session()                                   # wrong at token 100: stops there
    bad = list(ref[1:1 + m])
    bad[99] = (bad[99] + 1) % 49152
    a = _msg(server, r["session"], {"seq": 1, "n": r["n"], "root": r["root"], "resync": True,
                                    "tokens": P.pack_i32(bad), "parents": P.pack_i16(range(-1, m - 1))})
    assert a["accepted"] == 99 and np.frombuffer(a["tokens"], "<i4").tolist() == ref[1:101]
    assert a["drafted"] <= 2 * 62
    server.request("DELETE", f"/moa/v1/sessions/{r['session']}", headers={"Authorization": f"Bearer {KEY}"})


@pytest.mark.model
def test_cli_client_json_and_pipe(server, plain, tmp_path):
    import subprocess
    import sys
    keyfile = tmp_path / "k"
    keyfile.write_text(f"# mine\n{KEY}\n")
    base = [sys.executable, "-m", "moa_cpp.cli.main", "client", "--server", server.url, "--api-key-file", str(keyfile),
            "-n", "24"]
    out = subprocess.run(base + ["-p", PROMPTS[0], "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    ref = plain.generate(PROMPTS[0], max_tokens=24)
    assert res["tokens"] == ref.tokens and res["text"] == ref.text and res["unverified"] == []
    for key in ("server_calls", "tau", "bytes_sent", "bytes_received", "disconnections", "resyncs",
                "unverified_tokens", "unverified_confirmed", "unverified_rolled_back"):
        assert key in res["stats"]
    chat = subprocess.run(base + ["-p", "Name three colors.", "--chat"], capture_output=True, text=True, timeout=300)
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout == plain.generate("Name three colors.", chat=True, max_tokens=24).text + "\n"   # a pipe
    bad = subprocess.run(base[:-2] + ["-p", "x"] + ["--api-key-file", str(tmp_path / "missing")], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2
