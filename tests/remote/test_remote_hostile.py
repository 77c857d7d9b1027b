"""A client that a malicious server cannot kill (issue 24 item 2). A fake `moa-cpp serve` on
127.0.0.1 answers the open or the verify with one bad field at a time: token ids outside the
vocabulary (llama.cpp's detokenize aborted the client process, exit 134, on 49152, -1 and 10**9
with SmolLM2), missing fields (KeyError tracebacks), wrong types, NaN/Inf or misshapen CA, more
tokens than the proposal allows, a session id that is not one. Each is a clear RemoteError
(kind bad_reply) before anything is applied; the CLI exits 2 with the message."""
from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading

import numpy as np
import pytest

from moa_cpp.remote import protocol as P

pytestmark = pytest.mark.model

PROMPT = "The three primary colors are"


class FakeServer:
    """Answers /health, the open and every verify with the replies it is given (JSON bodies)."""

    def __init__(self) -> None:
        self.open_reply: dict = {}
        self.verify_reply: dict = {}
        self.raw_open: bytes = b""                 # sent as is instead of open_reply
        self.manifest: dict = {}                   # GET /moa/v1/bundle (404 if empty)
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a) -> None:
                pass

            def _send(self, status: int, obj: dict) -> None:
                body = P.encode_body(obj, P.JSON) if status == 200 else json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", P.JSON)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._send(200, {"v": P.VERSION, "status": "ok"})
                elif self.path == "/moa/v1/bundle" and fake.manifest:
                    body = json.dumps(fake.manifest).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self._send(404, {"error": {"message": "no", "code": "not_found"}})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if fake.raw_open and self.path == "/moa/v1/sessions":
                    self.wfile.write(fake.raw_open)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                reply = fake.open_reply if self.path == "/moa/v1/sessions" else fake.verify_reply
                self._send(200, reply)

            def do_DELETE(self) -> None:
                self._send(200, {"v": P.VERSION})

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def fake():
    f = FakeServer()
    yield f
    f.close()


@pytest.fixture(scope="module")
def client(fake):
    pytest.importorskip("msgpack")
    from moa_cpp.models import defaults
    from moa_cpp.remote.client import RemoteGenerator
    g = RemoteGenerator(fake.url, drafter=defaults.default_drafter(), target=defaults.default_target(),
                        draft="chain:3", timeout=10, use_msgpack=False, resync_wait=1.0)
    yield g
    g.close()


def _ca(g, n: int, pos0: int = 0, fill: float = 0.0, dtype: str = "f32") -> dict:
    k = np.full((n, g.model.ca_kv_heads, g.model.head_dim), fill, np.float32)
    return P.encode_ca(k, k.copy(), pos0, dtype)


def _good_open(g) -> dict:
    n = len(g.encode(PROMPT))
    return {"v": P.VERSION, "session": "s-1_ok", "n": n, "root": 100, "eog": False, "finish_reason": None,
            "tokens": P.pack_i32([100]), "ca": _ca(g, n)}


def _good_verify(g) -> dict:
    n = len(g.encode(PROMPT))
    return {"v": P.VERSION, "session": "s-1_ok", "n": n + 1, "root": 101, "eog": True, "finish_reason": "length",
            "tokens": P.pack_i32([101]), "ca": _ca(g, 1, n), "accepted": 0, "drafted": 3}


def _case(g, name: str) -> tuple:
    """(which reply, the bad reply, what the error says)."""
    o, v = _good_open(g), _good_verify(g)
    n_vocab = g.n_vocab
    cases = {
        "open token = n_vocab": ("open", {**o, "tokens": P.pack_i32([n_vocab])}, f"token id {n_vocab}"),
        "open token -1": ("open", {**o, "tokens": P.pack_i32([-1])}, "token id -1"),
        "open token 10**9": ("open", {**o, "tokens": P.pack_i32([10 ** 9])}, "outside the vocabulary"),
        "open without ca": ("open", {k: x for k, x in o.items() if k != "ca"}, "'ca' is missing"),
        "open without n": ("open", {k: x for k, x in o.items() if k != "n"}, "'n' is missing"),
        "open without session": ("open", {k: x for k, x in o.items() if k != "session"}, "'session' is missing"),
        "open session path": ("open", {**o, "session": "../../v1/models"}, "not a session id"),
        "open n as string": ("open", {**o, "n": "7"}, "'n' is not int"),
        "open eog as int": ("open", {**o, "eog": 1}, "'eog' is not bool"),
        "open n beyond the context": ("open", {**o, "n": 10 ** 7}, "outside the context"),
        "open two tokens": ("open", {**o, "tokens": P.pack_i32([100, 101])}, "tokens"),
        "open tokens odd bytes": ("open", {**o, "tokens": b"\x01\x02\x03"}, "tokens"),
        "open ca NaN": ("open", {**o, "ca": _ca(g, 3, fill=float("nan"))}, "NaN or Inf"),
        "open ca Inf f16": ("open", {**o, "ca": _ca(g, 3, fill=float("inf"), dtype="f16")}, "NaN or Inf"),
        "open ca wrong heads": ("open", {**o, "ca": {**_ca(g, 2), "heads": 99}}, "ca"),
        "open ca short bytes": ("open", {**o, "ca": {**_ca(g, 2), "k": b"\x00" * 8}}, "ca.k"),
        "open ca beyond the context": ("open", {**o, "ca": _ca(g, 2, pos0=g.n_ctx - 1)}, "outside the context"),
        "verify token = n_vocab": ("verify", {**v, "tokens": P.pack_i32([n_vocab])}, f"token id {n_vocab}"),
        "verify without accepted": ("verify", {k: x for k, x in v.items() if k != "accepted"}, "'accepted' is missing"),
        "verify accepted > drafted": ("verify", {**v, "accepted": 4, "tokens": P.pack_i32([1] * 5)}, "accepted 4 of 3"),
        "verify too many tokens": ("verify", {**v, "tokens": P.pack_i32([1, 2, 3])}, "tokens"),
        "verify drafted as string": ("verify", {**v, "drafted": "3"}, "'drafted'"),
        "verify finish_reason junk": ("verify", {**v, "finish_reason": "<script>" * 10}, "finish_reason"),
    }
    return cases[name]


CASES = ["open token = n_vocab", "open token -1", "open token 10**9", "open without ca", "open without n",
         "open without session", "open session path", "open n as string", "open eog as int",
         "open n beyond the context", "open two tokens", "open tokens odd bytes", "open ca NaN", "open ca Inf f16",
         "open ca wrong heads", "open ca short bytes", "open ca beyond the context", "verify token = n_vocab",
         "verify without accepted", "verify accepted > drafted", "verify too many tokens", "verify drafted as string",
         "verify finish_reason junk"]


def test_the_fake_server_is_a_good_one(fake, client):
    """The fake's good replies work: what the bad ones change is what the client refuses."""
    fake.open_reply, fake.verify_reply = _good_open(client), _good_verify(client)
    r = client.generate(PROMPT, max_tokens=8)
    assert r.tokens == [100, 101] and r.finish_reason == "length"


@pytest.mark.parametrize("name", CASES)
def test_bad_reply_is_a_clear_error(fake, client, name):
    from moa_cpp.remote.client import RemoteError
    which, bad, says = _case(client, name)
    fake.open_reply = bad if which == "open" else _good_open(client)
    fake.verify_reply = bad if which == "verify" else _good_verify(client)
    with pytest.raises(RemoteError) as e:
        client.generate(PROMPT, max_tokens=8)
    assert e.value.kind == "bad_reply" and says in str(e.value), (name, str(e.value))
    assert "malformed" in str(e.value)
    # nothing was applied: the client still generates against a good server afterwards
    fake.open_reply, fake.verify_reply = _good_open(client), _good_verify(client)
    assert client.generate(PROMPT, max_tokens=8).tokens == [100, 101]


def test_cli_client_exits_2_not_134(fake, client):
    """The process-level failure the audit found: llama.cpp aborted the client (exit 134)."""
    from moa_cpp.models import defaults
    fake.open_reply, fake.verify_reply = _good_open(client), {**_good_verify(client),
                                                               "tokens": P.pack_i32([client.n_vocab])}
    out = subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", "client", "--server", fake.url, "-p", PROMPT, "-n", "8",
                          "-m", str(defaults.default_target()), "-d", str(defaults.default_drafter()),
                          "--draft", "chain:3"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "malformed" in out.stderr and f"token id {client.n_vocab}" in out.stderr


def test_a_reply_declaring_gigabytes_is_refused_unread(fake, client):
    """Issue 24 item 5: replies were read whole before the 64 MiB check."""
    from moa_cpp.remote.client import RemoteError
    fake.raw_open = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 99999999999\r\n\r\n{")
    try:
        with pytest.raises(RemoteError) as e:
            client.generate(PROMPT, max_tokens=8)
    finally:
        fake.raw_open = b""
    assert e.value.kind == "bad_reply" and "declares 99999999999 bytes" in str(e.value)


def test_a_manifest_declaring_a_huge_file_is_refused(fake):
    """Issue 24 item 5: a manifest could declare any size (the client would stream it to disk)."""
    from moa_cpp.remote import bundle as B
    from moa_cpp.remote.client import RemoteGenerator
    files = {name: {"size": 1 << 40, "sha256": "0" * 64} for name in B.BUNDLE_FILES}
    fake.manifest = {"format": B.FORMAT, "format_version": B.FORMAT_VERSION, "protocol": P.VERSION,
                     "bundle_id": "1" * 64, "files": files}
    try:
        with pytest.raises(B.BundleError, match="declares 1099511627776 bytes"):
            RemoteGenerator(fake.url, trust_server_bundle=True)
    finally:
        fake.manifest = {}
