"""The client bundle of client-server mode (issue 11, docs/client-server.md#bundle): `moa-cpp bundle`
writes a client-role drafter (no LSA / Ekv2E / CA k,v; the token embedding bundled), a tensorless
vocab GGUF and a manifest. The client-role model drafts bit for bit like the full drafter given
the same CA K/V; the vocab GGUF tokenizes like the target; a damaged bundle is refused; a client
with a bundle (given, or downloaded from `serve --bundle`) decodes exactly like plain decoding;
a bundle of other files is refused by the server (start) and by open (409 bundle_mismatch)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from moa_cpp.remote import bundle as B
from moa_cpp.remote import protocol as P
from moa_cpp.remote.bundle_download import download_bundle
from moa_cpp.remote.bundle_write import make_bundle
from moa_cpp.remote.gguf_info import gguf_info, tensor_rows

pytestmark = pytest.mark.model

KEY = "bundle-key-1"
PROMPTS = ["def fibonacci(n):"]


@pytest.fixture(scope="module")
def files():
    from moa_cpp.models import defaults
    return defaults.default_target(), defaults.default_drafter()


@pytest.fixture(scope="module")
def bundle_dir(files, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "smollm2"
    make_bundle(*files, out, progress=False)
    return out


@pytest.fixture(scope="module")
def models(files, bundle_dir):
    from moa_cpp.drafter.drafter import DrafterModel
    target, drafter = files
    full = DrafterModel(drafter, target, device="cpu", n_threads=2)
    client = DrafterModel(bundle_dir / B.CLIENT_FILE, None, device="cpu", n_threads=2)
    yield full, client
    client.close()
    full.close()


def _tensors(path):
    return {name: (ne, t) for name, (ne, t, _) in gguf_info(path).tensors.items()}


# ---------------------------------------------------------------------------- files

def test_bundle_layout_and_sizes(files, bundle_dir):
    target, drafter = files
    m = B.load_bundle(bundle_dir).manifest          # sha256 of every file checked
    assert m["bundle_id"] == B.bundle_id(drafter, target).bundle_id and m["protocol"] == P.VERSION
    assert (m["n_vocab"], m["n_draft_vocab"], m["ca_heads"], m["ca_dim"], m["tli"]) == (49152, 8192, 3, 64, 0)
    client = bundle_dir / B.CLIENT_FILE
    ct, dt, tt = _tensors(client), _tensors(drafter), _tensors(target)
    server_only = {n for n in dt if n.startswith(("lsa.", "ekv2e.")) or n in ("ca.attn_k.weight", "ca.attn_v.weight")}
    assert len(server_only) == 13
    assert set(ct) == (set(dt) - server_only) | {"target.token_embd.weight"}   # reduced head: no target.output
    assert ct["target.token_embd.weight"] == tt["token_embd.weight"]           # type kept
    kv = gguf_info(client).kv
    assert kv["moa.role"] == "client" and kv["moa.target.bundled"] is True
    assert kv["moa.target.block_count"] == 30 and kv["moa.embedding_scale"] == 1.0
    assert kv["moa.bundle.id"] == m["bundle_id"]

    # sizes: client = drafter - server-only part + embedding (+ metadata); the bundle is much
    # smaller than the target, the vocab a few MB with no tensor
    sd = gguf_info(drafter)
    size = {n: (tensor_rows(drafter, sd, n)[0].nbytes) for n in dt}
    server_bytes = sum(size[n] for n in server_only)
    embd = tensor_rows(target, gguf_info(target), "token_embd.weight")[0].nbytes
    csize, vsize = client.stat().st_size, (bundle_dir / B.VOCAB_FILE).stat().st_size
    dsize, tsize = sum(size.values()), os.path.getsize(target)
    # LSA + Ekv2E + CA k/v (docs/client-server.md#bundle) from the drafter's own sizes: 2-D weights Q8_0 (34 bytes per
    # 32), norms and bias F32 (1.18 MB for the shipped LSA FFN 192; 1.42 MB at FFN 384)
    k = gguf_info(drafter).kv
    W, d, F = k["moa.lsa.embedding_length"], k["moa.embedding_length"], k["moa.lsa.feed_forward_length"]
    q_dim = k["moa.lsa.head_count"] * k["moa.lsa.key_length"]
    kv_dim = k["moa.lsa.head_count_kv"] * k["moa.lsa.key_length"]
    ca_kv_dim = k["moa.ca.head_count_kv"] * k["moa.attention.key_length"]
    weights = 2 * W * q_dim + 2 * W * kv_dim + 3 * W * F + W * d + 2 * d * ca_kv_dim
    assert server_bytes == pytest.approx(weights * 34 / 32 + 4 * (2 * W + d), rel=0.01), server_bytes
    assert abs(csize - (dsize - server_bytes + embd)) < 64 * 1024
    assert csize < 0.5 * tsize and csize + vsize < 45e6          # spec: ≈42.5 MB for SmolLM2
    assert gguf_info(bundle_dir / B.VOCAB_FILE).tensors == {} and vsize < 3e6
    assert m["files"][B.CLIENT_FILE]["size"] == csize and m["files"][B.VOCAB_FILE]["size"] == vsize


def test_client_role_model_drafts_like_the_full_drafter(models, files):
    """Same CA K/V (compute_ca of the full model) -> bit-identical draft logits and hidden states,
    over cycles with feed, a truncating re-append and a rollback."""
    from moa_cpp.drafter.drafter import DrafterState
    from moa_cpp.target.target import Target
    full, client = models
    assert (full.role, client.role) == ("full", "client")
    for attr in ("n_vocab", "n_target_vocab", "n_embd", "ca_kv_heads", "head_dim", "n_target_layers", "tli"):
        assert getattr(full, attr) == getattr(client, attr), attr
    np.testing.assert_array_equal(full.d2t(), client.d2t())
    with Target.from_path(files[0], n_ctx=256, n_threads=2) as tgt:
        ids = tgt.tokenize("The quick brown fox jumps over the lazy dog. It was a sunny day in the park.")
        tgt.decode(ids, capture=True)
        lsa = tgt.captured_lsa_in()
    ids = [int(i) for i in ids]
    scratch = DrafterState(full, n_ctx=256)
    a, b = DrafterState(full, n_ctx=256), DrafterState(client, n_ctx=256)

    def commit(lo, hi):
        a.commit(lsa[lo:hi], lo)
        k, v = scratch.compute_ca(lsa[lo:hi], lo)
        b.append_ca(k, v, lo)

    def draft(tokens, pos, parents, feed=()):
        ha, hb = (np.empty((len(tokens), full.n_embd), np.float32) for _ in range(2))
        la = a.draft(tokens, pos, parents, feed=feed, hidden=ha)
        lb = b.draft(tokens, pos, parents, feed=feed, hidden=hb)
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(ha, hb)
        return la

    n0 = 10
    commit(0, n0)                                            # prompt
    draft([ids[n0]], [n0], [-1], feed=ids[:n0])               # root
    draft(ids[n0 + 1: n0 + 4], [n0 + 1, n0 + 2, n0 + 3], [0, 1, 2])   # a chain below it
    commit(n0, n0 + 3)                                        # 3 verified: feed them, draft again
    draft([ids[n0 + 3]], [n0 + 3], [-1], feed=ids[n0: n0 + 3])
    commit(n0 + 1, n0 + 5)                                    # pos0 < n_ca: truncates first
    for s in (a, b):
        s.rollback(n0 + 1)
    commit(n0 + 1, n0 + 5)
    draft([ids[n0 + 5]], [n0 + 5], [-1], feed=ids[n0 + 1: n0 + 5])
    for x, y in zip(a.ca_cache(), b.ca_cache()):
        np.testing.assert_array_equal(x, y)


def test_client_role_model_cannot_commit(models):
    from moa_cpp.errors import InvalidArgumentError
    full, client = models
    s = client.new_state(n_ctx=16)
    lsa = np.zeros((1, client.n_target_layers, client.lsa_width), np.float32)
    for call in (lambda: s.commit(lsa, 0), lambda: s.compute_ca(lsa, 0)):
        with pytest.raises(InvalidArgumentError, match="client-role"):
            call()
    assert s.n_ca == 0
    k = np.zeros((1, client.ca_kv_heads, client.head_dim), np.float32)
    s.append_ca(k, k, 0)                                     # the client's way works
    assert s.n_ca == 1


def test_vocab_gguf_tokenizes_like_the_target(files, bundle_dir):
    import llama_cpp
    t = llama_cpp.Llama(files[0], vocab_only=True, verbose=False)
    v = llama_cpp.Llama(str(bundle_dir / B.VOCAB_FILE), vocab_only=True, verbose=False)
    assert v.metadata == t.metadata and v.metadata["tokenizer.chat_template"]
    assert (v.n_vocab(), v.token_bos(), v.token_eos()) == (t.n_vocab(), t.token_bos(), t.token_eos())
    for text in ["Hello, world!", "<|im_start|>user\nhi<|im_end|>\n", "  ünïcödé 日本語 🙂\n\tx = 1"]:
        for special in (False, True):
            a = t.tokenize(text.encode(), add_bos=False, special=special)
            assert v.tokenize(text.encode(), add_bos=False, special=special) == a
            assert v.detokenize(a, special=special) == t.detokenize(a, special=special)


def test_damaged_bundles_are_refused(bundle_dir, tmp_path):
    from moa_cpp.remote.client import RemoteGenerator

    def copy(name):
        d = tmp_path / name
        shutil.copytree(bundle_dir, d)
        return d

    d = copy("flipped")
    with open(d / B.CLIENT_FILE, "r+b") as f:            # same size, one byte changed
        f.seek(-100, 2)
        byte = f.read(1)
        f.seek(-100, 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(B.BundleError, match="client.gguf does not match its sha256"):
        B.load_bundle(d)
    with pytest.raises(B.BundleError, match="sha256"):       # before any network or model load
        RemoteGenerator("http://127.0.0.1:9", bundle=d)
    d = copy("truncated")
    with open(d / B.VOCAB_FILE, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(B.BundleError, match="vocab.gguf has 1000 bytes"):
        B.load_bundle(d)
    d = copy("missing")
    (d / B.VOCAB_FILE).unlink()
    with pytest.raises(B.BundleError, match="vocab.gguf is missing"):
        B.load_bundle(d)
    d = copy("nomanifest")
    (d / B.MANIFEST_FILE).unlink()
    with pytest.raises(B.BundleError, match="manifest.json is missing"):
        B.load_bundle(d)
    d = copy("badmanifest")
    (d / B.MANIFEST_FILE).write_text("{not json")
    with pytest.raises(B.BundleError, match="cannot read manifest.json"):
        B.load_bundle(d)
    with pytest.raises(B.BundleError, match="not a directory"):
        B.load_bundle(tmp_path / "nowhere")


def test_server_bundle_check(files, bundle_dir, tmp_path):
    target, drafter = files
    assert B.check_server_bundle(bundle_dir, drafter, target).bundle_id == B.load_bundle(bundle_dir).bundle_id
    other = tmp_path / "other.gguf"                         # any other weights: another drafter
    shutil.copy(bundle_dir / B.CLIENT_FILE, other)
    with pytest.raises(B.BundleMismatchError, match="another drafter than this server's"):
        B.check_server_bundle(bundle_dir, other, target)
    with pytest.raises(B.BundleMismatchError, match="needs an MoA drafter"):
        B.check_server_bundle(bundle_dir, None, target)


def test_cli_bundle_bad_arguments(tmp_path, capsys):
    from moa_cpp.cli.main import main
    with pytest.raises(SystemExit) as e:
        main(["bundle"])                                   # no -o
    assert e.value.code == 2 and "-o/--output" in capsys.readouterr().err
    assert main(["bundle", "-o", str(tmp_path / "b"), "-m", str(tmp_path / "none.gguf"), "-d",
                 str(tmp_path / "none2.gguf")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["bundle", "-o", str(tmp_path / "b"), "-m", str(tmp_path / "none.gguf")]) == 2
    assert "needs -d/--drafter" in capsys.readouterr().err
    assert not (tmp_path / "b" / B.MANIFEST_FILE).exists()


# ---------------------------------------------------------------------------- a real server

@pytest.fixture(scope="module")
def server(bundle_dir, tmp_path_factory):
    from moa_cpp.testing.server_proc import ServerProc
    keys = tmp_path_factory.mktemp("k") / "keys"
    keys.write_text(f"{KEY}\n")
    srv = ServerProc("--draft", "chain:4", "-t", "1", "--api-key-file", str(keys), "--bundle", str(bundle_dir))
    yield srv
    assert srv.terminate() == 0


@pytest.fixture(scope="module")
def plain(files):
    from moa_cpp import SpeculativeGenerator
    gen = SpeculativeGenerator.from_paths(files[0], None, draft="none", n_threads=1)
    yield gen
    gen.close()


def _get(server, path, key=KEY):
    return server.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})


def test_remote_with_bundle_equals_plain(server, plain, bundle_dir):
    from moa_cpp.remote.client import RemoteGenerator
    g = RemoteGenerator(server.url, bundle=bundle_dir, api_key=KEY, draft="chain:4")
    try:
        assert g.model.role == "client" and g.bundle_id == B.load_bundle(bundle_dir).bundle_id
        for p in PROMPTS:
            assert g.generate(p, max_tokens=32).tokens == plain.generate(p, max_tokens=32).tokens, p
        import types

        import llama_cpp
        msgs = [{"role": "user", "content": "Hi"}]
        full = types.SimpleNamespace(vocab=llama_cpp.Llama(str(plain.target.path), vocab_only=True, verbose=False))
        assert g.chat_prompt(msgs) == RemoteGenerator.chat_prompt(full, msgs)      # the chat template travels
    finally:
        g.close()


def test_bundle_routes(server, bundle_dir):
    m = B.load_bundle(bundle_dir).manifest
    st, _, info = _get(server, "/moa/v1/info")
    assert st == 200 and info["bundle_id"] == m["bundle_id"]
    assert _get(server, "/moa/v1/bundle", key=None)[0] == 401               # auth like every route
    assert _get(server, "/moa/v1/bundle/vocab.gguf", key=None)[0] == 401
    st, _, got = _get(server, "/moa/v1/bundle")
    assert st == 200 and got == m
    st, h, data = _get(server, "/moa/v1/bundle/vocab.gguf")
    assert st == 200 and data == (bundle_dir / B.VOCAB_FILE).read_bytes() and h["x-moa-sha256"] == \
        m["files"]["vocab.gguf"]["sha256"]
    for name in ("manifest.json", "..%2Fmanifest.json", "other.gguf"):
        assert _get(server, f"/moa/v1/bundle/{name}")[0] == 404, name


def test_served_files_are_the_ones_checked_at_start(bundle_dir, tmp_path):
    """Issue 24 item 9: bundle files were re-checked by size only when served, so a file replaced
    on disk after start (same size) was served under the manifest's sha256. The server serves the
    descriptors it opened at start: what clients get is what was checked. (Its own server and
    copy of the bundle: the module's server keeps serving the original files.)"""
    import hashlib
    import shutil
    from moa_cpp.testing.server_proc import ServerProc
    d = tmp_path / "bundle"
    shutil.copytree(bundle_dir, d)
    m = B.load_bundle(d).manifest
    srv = ServerProc("--draft", "chain:4", "-t", "1", "--bundle", str(d))
    try:
        served = d / B.VOCAB_FILE
        other = d / ".other.tmp"
        other.write_bytes(bytes(b ^ 0x5A for b in served.read_bytes()))     # same size, other bytes
        os.replace(other, served)                                           # a new file under the name
        st, h, data = srv.request("GET", "/moa/v1/bundle/vocab.gguf")
        assert st == 200 and hashlib.sha256(data).hexdigest() == m["files"]["vocab.gguf"]["sha256"] == h["x-moa-sha256"]
    finally:
        assert srv.terminate() == 0


def test_download_bundle_into_the_cache(server, plain, bundle_dir, tmp_path, monkeypatch):
    from moa_cpp.remote.client import RemoteGenerator
    monkeypatch.setenv("MOA_CPP_CACHE", str(tmp_path / "cache"))
    m = B.load_bundle(bundle_dir).manifest
    # no files given: the server's bundle, downloaded and run only with consent (issue 24 item 5)
    with pytest.raises(B.BundleError, match="--trust-server-bundle") as e:
        RemoteGenerator(server.url, api_key=KEY, draft="chain:4")
    assert m["bundle_id"] in str(e.value) and not (tmp_path / "cache" / "bundles").exists()   # nothing downloaded
    with pytest.raises(B.BundleMismatchError, match="not the pinned"):
        RemoteGenerator(server.url, api_key=KEY, draft="chain:4", bundle_id="0" * 64)
    g = RemoteGenerator(server.url, api_key=KEY, draft="chain:4", bundle_id=m["bundle_id"])   # pinned consent
    g.close()
    g = RemoteGenerator(server.url, api_key=KEY, draft="chain:4", trust_server_bundle=True)
    try:
        d = tmp_path / "cache" / "bundles" / m["bundle_id"]
        assert g.bundle is not None and g.bundle.dir == d and g.model.role == "client"
        assert B.load_bundle(d).manifest == m
        assert g.generate(PROMPTS[0], max_tokens=16).tokens == plain.generate(PROMPTS[0], max_tokens=16).tokens
    finally:
        g.close()
    mtime = (d / B.CLIENT_FILE).stat().st_mtime_ns
    assert download_bundle(server.url, KEY).dir == d and (d / B.CLIENT_FILE).stat().st_mtime_ns == mtime  # reused
    with open(d / B.VOCAB_FILE, "r+b") as f:                 # a damaged cached copy is fetched again
        f.write(b"XXXX")
    assert download_bundle(server.url, KEY).dir == d
    B.load_bundle(d)
    # a file that does not match the manifest on the way is rejected and not kept
    served = bundle_dir / B.VOCAB_FILE
    orig = served.read_bytes()
    try:
        served.write_bytes(orig[:-1] + bytes([orig[-1] ^ 1]))
        monkeypatch.setenv("MOA_CPP_CACHE", str(tmp_path / "cache2"))
        with pytest.raises(B.BundleError, match="does not match the manifest"):
            download_bundle(server.url, KEY)
        d2 = tmp_path / "cache2" / "bundles" / m["bundle_id"]
        assert not (d2 / B.VOCAB_FILE).exists() and not (d2 / B.MANIFEST_FILE).exists()
    finally:
        served.write_bytes(orig)


def test_bundle_mismatch(server, bundle_dir, tmp_path):
    from moa_cpp.remote.client import RemoteError, RemoteGenerator
    body = {"v": 1, "seq": 0, "prompt": P.pack_i32([1, 2, 3]), "max_tokens": 4, "bundle_id": "0" * 64}
    st, _, err = server.request("POST", "/moa/v1/sessions", P.encode_body(body, P.MSGPACK),
                                headers={"Content-Type": P.MSGPACK, "Authorization": f"Bearer {KEY}"})
    assert st == 409 and err["error"]["code"] == "bundle_mismatch", err
    body["bundle_id"] = 5
    st, _, err = server.request("POST", "/moa/v1/sessions", P.encode_body(body, P.MSGPACK),
                                headers={"Content-Type": P.MSGPACK, "Authorization": f"Bearer {KEY}"})
    assert st == 422, err
    # a bundle of other files (its manifest's bundle_id differs): the client says so clearly
    d = tmp_path / "other"
    shutil.copytree(bundle_dir, d)
    m = json.loads((d / B.MANIFEST_FILE).read_text())
    m["bundle_id"] = "f" * 64
    (d / B.MANIFEST_FILE).write_text(json.dumps(m))
    g = RemoteGenerator(server.url, bundle=d, api_key=KEY)
    try:
        with pytest.raises(RemoteError, match="made for another drafter/target") as e:
            g.generate(PROMPTS[0], max_tokens=8)
        assert e.value.status == 409 and e.value.kind == "bundle_mismatch"
    finally:
        g.close()
    # and a server refuses to start with it (before loading the models)
    r = subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", "serve", "--port", "0", "--bundle", str(d)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "was made for another" in r.stderr and r.stdout == ""


def test_cli_client_with_bundle(server, plain, bundle_dir, capsys):
    from moa_cpp.cli.main import main
    assert main(["client", "--server", server.url, "--bundle", str(bundle_dir), "-m", "t.gguf", "-p", "x"]) == 2
    assert "--bundle replaces" in capsys.readouterr().err
    r = subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", "client", "--server", server.url, "--bundle",
                        str(bundle_dir), "-p", PROMPTS[0], "-n", "8", "--json"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "MOA_API_KEY": KEY})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["tokens"] == plain.generate(PROMPTS[0], max_tokens=8).tokens
