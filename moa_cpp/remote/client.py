"""The client of client-server MoA: the drafter runs here, the target on a ``moa-cpp serve``.

Each cycle drafts locally (chain or tree, the same proposer as single-device generation), sends
the proposal, and appends the CA K/V of the verified tokens that the server returns; one server
call per cycle, so calls per generated token = 1/tau. Connected mode in this version (the
offline mode, resync and reopen of the spec come next).

Example::

    from moa_cpp.remote.client import RemoteGenerator
    gen = RemoteGenerator("http://127.0.0.1:8765", drafter="drafter.gguf", target="target.gguf")
    r = gen.generate("def fib(n):", max_tokens=64)
    print(r.text, r.stats)
"""
from __future__ import annotations

import http.client
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union
from urllib.parse import urlparse


from ..drafter import DrafterModel, DrafterState
from ..generator import parse_draft
from ..speculative.proposer import MoAProposer
from ..speculative.types import SamplingParams
from . import protocol as P


class RemoteError(RuntimeError):
    """The server answered an error (``status``, ``kind``) or broke the protocol."""

    def __init__(self, message: str, status: int = 0, kind: str = "") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


@dataclass
class RemoteStats:
    server_calls: int = 0
    verify_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    t_network: float = 0.0        # s: request wall time (server time included)
    t_drafter: float = 0.0
    n_generated: int = 0

    @property
    def tau(self) -> float:
        return self.n_generated / self.verify_calls if self.verify_calls else 0.0

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["tau"] = self.tau
        return d


@dataclass
class RemoteResult:
    text: str
    tokens: list
    finish_reason: str
    stats: RemoteStats = field(default_factory=RemoteStats)


class _Transport:
    """One keep-alive HTTP connection; bytes counted as sent / read (headers estimated by the
    request line and header block we write and the status line + headers we read)."""

    def __init__(self, url: str, api_key: Optional[str], timeout: float, content_type: str) -> None:
        u = urlparse(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"server URL must be http(s)://HOST:PORT, got {url!r}")
        self.host, self.port, self.https = u.hostname, u.port or (443 if u.scheme == "https" else 80), u.scheme == "https"
        self.headers = {"Content-Type": content_type, "Accept": content_type}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.ctype, self.timeout = content_type, timeout
        self.conn: Optional[http.client.HTTPConnection] = None

    def _connect(self) -> http.client.HTTPConnection:
        if self.conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self.conn = cls(self.host, self.port, timeout=self.timeout)
        return self.conn

    def call(self, method: str, path: str, obj: Optional[dict], stats: RemoteStats) -> dict:
        body = P.encode_body(obj, self.ctype) if obj is not None else None
        t = time.perf_counter()
        c = self._connect()
        try:
            c.request(method, path, body=body, headers=self.headers)
            r = c.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        stats.t_network += time.perf_counter() - t
        stats.server_calls += 1
        stats.bytes_sent += len(body or b"") + len(method) + len(path) + 12 + sum(len(k) + len(v) + 4 for k, v in
                                                                                  self.headers.items())
        stats.bytes_received += len(data) + 17 + sum(len(k) + len(v) + 4 for k, v in r.getheaders())
        if r.status == 204:
            return {}
        rtype = (r.getheader("Content-Type") or "").split(";")[0].strip()
        if r.status != 200:
            try:
                err = json.loads(data)["error"]
                raise RemoteError(err.get("message", ""), r.status, err.get("code") or err.get("type", ""))
            except (ValueError, KeyError, TypeError):
                raise RemoteError(f"HTTP {r.status}: {data[:200]!r}", r.status) from None
        return P.decode_body(data, rtype, 64 << 20)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class RemoteGenerator:
    """Generate with the drafter here and the target on a ``moa-cpp serve`` at ``url``.

    ``drafter`` and ``target``: the drafter GGUF and the target GGUF (only its vocabulary and
    metadata are read here: tokenizer, drafter/target match). Greedy output equals the target's
    plain greedy decoding; with temperature > 0 every token is the target's own sample (drafts
    are deterministic and verified as point masses)."""

    def __init__(self, url: str, *, drafter: Union[str, Path], target: Union[str, Path],
                 api_key: Optional[str] = None, draft: str = "chain:4", ca_dtype: str = "f16", timeout: float = 30.0,
                 n_ctx: int = 4096, n_threads: Optional[int] = None, use_msgpack: bool = True) -> None:
        import llama_cpp
        if ca_dtype not in P.CA_DTYPES:
            raise ValueError(f"ca_dtype must be one of {', '.join(P.CA_DTYPES)}")
        self.draft = parse_draft(draft)
        if self.draft.mode not in ("chain", "tree"):
            raise ValueError("draft must be chain:N or tree:D,K,T in client-server mode")
        self.ca_dtype = ca_dtype
        self.model = DrafterModel(drafter, target, n_threads=n_threads)
        self.state = DrafterState(self.model, n_ctx=n_ctx, n_draft_max=1 + 16 * 16)
        self.proposer = MoAProposer(self.state, self.draft)
        self.vocab = llama_cpp.Llama(str(target), vocab_only=True, verbose=False)
        ctype = P.MSGPACK if use_msgpack and P._has_msgpack() else P.JSON
        key = api_key if api_key is not None else os.environ.get("MOA_API_KEY") or None
        self.http = _Transport(url, key, timeout, ctype)

    def encode(self, prompt: Union[str, Sequence[int]]) -> list:
        if isinstance(prompt, str):
            return self.vocab.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)
        return [int(t) for t in prompt]

    def generate(self, prompt: Union[str, Sequence[int]], *, max_tokens: int = 256, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: Optional[int] = None) -> RemoteResult:
        ids = self.encode(prompt)
        st = RemoteStats()
        sampling = {"temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p)}
        if seed is not None:
            sampling["seed"] = int(seed)
        seq = 0
        r = self.http.call("POST", "/moa/v1/sessions", {"v": P.VERSION, "seq": seq, "prompt": P.pack_i32(ids),
                                                         "sampling": sampling, "ca_dtype": self.ca_dtype,
                                                         "max_tokens": int(max_tokens)}, st)
        sid = r["session"]
        self.state.rollback(0)
        self._append(r)
        out = self._tokens(r)
        feed, n, root, done = list(ids), r["n"], r["root"], r["eog"]
        greedy = SamplingParams()
        try:
            while not done:
                t = time.perf_counter()
                prop = self.proposer.propose(feed, root, n, greedy, None, self.draft)
                st.t_drafter += time.perf_counter() - t
                seq += 1
                r = self.http.call("POST", f"/moa/v1/sessions/{sid}/verify",
                                   {"v": P.VERSION, "seq": seq, "n": n, "root": root,
                                    "tokens": P.pack_i32(prop.tokens), "parents": P.pack_i16(prop.parents)}, st)
                st.verify_calls += 1
                st.drafted += prop.n
                st.accepted += int(r["accepted"])
                self._append(r)
                new = self._tokens(r)
                out += new
                feed = [root] + new[: int(r["accepted"])]
                n, root, done = r["n"], r["root"], r["eog"]
        finally:
            if not done:
                try:
                    self.http.call("DELETE", f"/moa/v1/sessions/{sid}", None, st)
                except (OSError, RemoteError, http.client.HTTPException):
                    pass
        st.n_generated = len(out)
        text = self.vocab.detokenize(out).decode("utf-8", "replace")
        return RemoteResult(text, out, r.get("finish_reason") or "length", st)

    def _append(self, r: dict) -> None:
        k, v, pos0 = P.decode_ca(r["ca"], self.model.ca_kv_heads, self.model.head_dim, 1 << 20)
        if k.shape[0]:
            self.state.append_ca(k, v, pos0)

    def _tokens(self, r: dict) -> list:
        return [int(t) for t in P.unpack_ints(r["tokens"], "<i4", "tokens", 1 << 16)]

    def close(self) -> None:
        self.http.close()
