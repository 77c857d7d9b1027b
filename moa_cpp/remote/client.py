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
import select
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union
from urllib.parse import urlparse

import numpy as np


from ..drafter import DrafterModel
from ..generator import parse_draft
from ..speculative.proposers import make_proposer, moa_state
from ..speculative.types import DraftConfig, SamplingParams
from . import protocol as P


class RemoteError(RuntimeError):
    """The server answered an error (``status``, ``kind``) or broke the protocol."""

    def __init__(self, message: str, status: int = 0, kind: str = "") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


@dataclass
class Event:
    """What the user sees (spec §3.4). kind "tokens": ``ids`` at generated index ``pos``,
    ``verified`` or not; "confirm": ``n`` pending unverified tokens from ``pos`` became verified;
    "rollback": the last ``n`` unverified tokens (from ``pos``) are withdrawn; "status":
    ``state`` in connected / disconnected / reconnected / reopened / gave_up."""

    kind: str
    pos: int
    ids: tuple = ()
    verified: bool = True
    n: int = 0
    state: str = ""


@dataclass
class RemoteStats:
    server_calls: int = 0
    open_calls: int = 0
    reopen_calls: int = 0
    disconnections: int = 0
    resyncs: int = 0
    unverified_tokens: int = 0
    unverified_confirmed: int = 0
    unverified_rolled_back: int = 0
    offline_s: float = 0.0
    verify_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    t_network: float = 0.0        # s: request wall time (server time included)
    t_drafter: float = 0.0
    n_generated: int = 0
    # per server call when tracing (``RemoteGenerator(..., trace=True)``; None otherwise): dicts with
    # kind (open / verify / resync), k (proposal nodes), a (accepted), req_bytes, resp_bytes,
    # t_draft, t_wall (request wall s), t_append, t_cycle (s), server timing (decode_ms, lsa_ms,
    # prefill_ms), ca_n, ca_bytes, ca_zlib1 (zlib level-1 size of the CA k+v bytes), t (start)
    trace: Optional[list] = None

    @property
    def tau(self) -> float:
        return self.n_generated / self.verify_calls if self.verify_calls else 0.0

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["tau"] = self.tau
        if d.get("trace") is None:
            d.pop("trace", None)
        return d


@dataclass
class RemoteResult:
    text: str                     # the verified text
    tokens: list                  # verified token ids
    finish_reason: str            # stop / length / unverified (the server never came back)
    stats: RemoteStats = field(default_factory=RemoteStats)
    unverified: list = field(default_factory=list)
    events: list = field(default_factory=list)
    _run: Any = field(default=None, repr=False, compare=False)    # for RemoteGenerator.verify_pending


class _Transport:
    """One keep-alive HTTP connection; bytes counted as sent / read (headers estimated by the
    request line and header block we write and the status line + headers we read)."""

    def __init__(self, url: str, api_key: Optional[str], timeout: float, content_type: str) -> None:
        u = urlparse(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"server URL must be http(s)://HOST:PORT, got {url!r}")
        self.host, self.port, self.https = u.hostname, u.port or (443 if u.scheme == "https" else 80), u.scheme == "https"
        self.headers = {"Content-Type": content_type}     # the server answers in the request's type
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.ctype, self.timeout = content_type, timeout
        self.conn: Optional[http.client.HTTPConnection] = None
        self.last_used = 0.0

    # A kept-alive connection idle this long may have been closed by the server (uvicorn's default
    # keep-alive is 5 s; moa-cpp serve keeps 75 s): start a fresh one rather than find out by a
    # failed request, which would be ambiguous (was the request processed?).
    REUSE_IDLE_S = 4.0

    def _dropped(self) -> bool:
        """The kept-alive connection was closed by the other side (urllib3's check: an idle
        connection with something to read has an EOF or a reset waiting)."""
        sock = self.conn.sock if self.conn is not None else None
        if sock is None:
            return True
        try:
            return bool(select.select([sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def _connect(self) -> tuple:
        """(connection, reused): the kept-alive one if it is still good, else a fresh one."""
        if self.conn is not None and (time.monotonic() - self.last_used > self.REUSE_IDLE_S or self._dropped()):
            self.close()
        if self.conn is not None:
            return self.conn, True
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        self.conn = cls(self.host, self.port, timeout=self.timeout)
        # http.client writes the header block and the body in two send()s: with Nagle on, the
        # body waits for the ACK of the headers (a delayed ACK: ~40 ms per request)
        self.conn.connect()
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.conn, False

    MAX_REPLY = 64 << 20      # a verify answer is KBs (CA of the accepted tokens); an open's, MBs at most

    def _read_bounded(self, r: http.client.HTTPResponse) -> bytes:
        """The body, refused before it is read if it declares more than MAX_REPLY and cut off
        past it if it does not say (a server must not make the client buffer gigabytes)."""
        declared = r.getheader("Content-Length")
        if declared is not None and (not declared.strip().isdigit() or int(declared) > self.MAX_REPLY):
            self.close()
            raise RemoteError(f"the server's answer declares {declared[:20]} bytes (at most {self.MAX_REPLY})", 0,
                              "bad_reply")
        data = r.read(self.MAX_REPLY + 1)
        if len(data) > self.MAX_REPLY:
            self.close()
            raise RemoteError(f"the server's answer is larger than {self.MAX_REPLY} bytes", 0, "bad_reply")
        return data

    def _exchange(self, method: str, path: str, body: Optional[bytes]) -> tuple:
        """(response, body bytes). A request that could not even be sent on a reused connection
        (the server had closed it) is sent once more on a fresh one: the server cannot have
        processed a request it did not receive. A failure after sending is the caller's."""
        for attempt in (0, 1):
            reused = False
            try:
                c, reused = self._connect()
                c.request(method, path, body=body, headers=self.headers)
            except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                self.close()
                if attempt or not reused:
                    raise
                continue
            except (OSError, http.client.HTTPException):
                self.close()
                raise
            try:
                r = c.getresponse()
                data = self._read_bounded(r)
            except (OSError, http.client.HTTPException):
                self.close()
                raise
            self.last_used = time.monotonic()
            if r.will_close:
                self.close()
            return r, data
        raise AssertionError("unreachable")

    def call(self, method: str, path: str, obj: Optional[dict], stats: RemoteStats) -> dict:
        body = P.encode_body(obj, self.ctype) if obj is not None else None
        t = time.perf_counter()
        r, data = self._exchange(method, path, body)
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
        try:
            return P.decode_body(data, rtype, self.MAX_REPLY)
        except P.ProtocolError as e:
            raise RemoteError(f"the server's answer is malformed: {e}", 0, "bad_reply") from None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class RemoteGenerator:
    """Generate with the drafter here and the target on a ``moa-cpp serve`` at ``url``.

    ``trace=True`` records one entry per server call in ``result.stats.trace`` (for
    ``bench/remote_sim.py``).

    What the client loads, in order:

    - ``bundle``: a client bundle directory (``moa-cpp bundle``): its ``client.gguf`` (the drafter
      without the server-only parts, with the token embedding) and ``vocab.gguf`` (tokenizer and
      chat template). Its ``bundle_id`` goes with every open; a server with other files answers
      409 ``bundle_mismatch`` (raised as :class:`RemoteError`).
    - ``drafter`` and ``target``: the full drafter GGUF and the target GGUF (only its vocabulary,
      metadata and embedding are read here).
    - neither: the server's bundle if it serves one (``moa-cpp serve --bundle``) and the user
      consents (``trust_server_bundle=True``, or ``bundle_id=`` pinning exactly that bundle: its
      files are parsed and run here), downloaded once into ``<cache>/bundles/<bundle_id>/`` and
      checked against its sha256 (every read bounded); without consent a BundleError says how to
      give it. A server without a bundle: the embedded default drafter and target.

    Greedy output equals the target's plain greedy decoding; with temperature > 0 every token is
    the target's own sample (drafts are deterministic and verified as point masses)."""

    def __init__(self, url: str, *, bundle: Union[str, Path, None] = None, drafter: Union[str, Path, None] = None,
                 target: Union[str, Path, None] = None,
                 api_key: Optional[str] = None, draft: str = "chain:4", ca_dtype: str = "f16", timeout: float = 30.0,
                 n_ctx: int = 4096, n_threads: Optional[int] = None, use_msgpack: bool = True,
                 max_unverified: int = 128, resync_wait: float = 30.0, probe_timeout: float = 1.0,
                 trace: bool = False, trust_server_bundle: bool = False, bundle_id: Optional[str] = None) -> None:
        import llama_cpp

        from ..llama_log import log_chosen, set_llama_log
        if not log_chosen():                 # llama.cpp's log lines only if someone asked for them
            set_llama_log(False)
        if ca_dtype not in P.CA_DTYPES:
            raise ValueError(f"ca_dtype must be one of {', '.join(P.CA_DTYPES)}")
        self.draft = parse_draft(draft)
        if self.draft.mode not in ("chain", "tree"):
            raise ValueError("draft must be chain:N or tree:D,K,T in client-server mode")
        self.ca_dtype = ca_dtype
        key = api_key if api_key is not None else os.environ.get("MOA_API_KEY") or None
        drafter, target, vocab_path, self.bundle = self._resolve_files(url, key, timeout, bundle, drafter, target,
                                                                        trust_server_bundle, bundle_id)
        self.bundle_id: Optional[str] = self.bundle.bundle_id if self.bundle is not None else None
        self.model = DrafterModel(drafter, target, n_threads=n_threads)
        self.max_unverified, self.resync_wait, self.probe_timeout = int(max_unverified), resync_wait, probe_timeout
        # offline drafting keeps the unverified chain as pending draft rows
        self.proposer = make_proposer("moa", None, self.draft, drafter=self.model, n_ctx=n_ctx,
                                      n_draft_max=max(1 + 16 * 16, self.max_unverified + 2))
        self.state = moa_state(self.proposer)
        self.vocab = llama_cpp.Llama(str(vocab_path), vocab_only=True, verbose=False)
        self.n_ctx, self.n_vocab = int(n_ctx), int(self.vocab.n_vocab())
        ctype = P.MSGPACK if use_msgpack and P._has_msgpack() else P.JSON
        self.http = _Transport(url, key, timeout, ctype)
        self._last_run: Optional[_Run] = None
        self.trace = bool(trace)

    @staticmethod
    def _resolve_files(url: str, key: Optional[str], timeout: float, bundle, drafter, target,
                       trust: bool = False, pin: Optional[str] = None) -> tuple:
        """(drafter GGUF, target GGUF or None (bundled), GGUF to tokenize with, Bundle or None): see
        the class docstring. The server's bundle is downloaded and run only with the user's
        consent: ``trust`` (any bundle it offers) or ``pin`` (exactly this bundle_id)."""
        from . import bundle as B
        if bundle is not None:
            if drafter is not None or target is not None:
                raise ValueError("pass either bundle= or drafter= / target=, not both")
            b = B.load_bundle(bundle)
            return b.client, None, b.vocab, b
        if drafter is not None or target is not None:
            if drafter is None or target is None:
                raise ValueError("drafter= and target= go together (or pass bundle=)")
            return drafter, target, target, None
        try:
            m = B.fetch_manifest(url, key, timeout)
        except (OSError, http.client.HTTPException) as e:   # unreachable now: draft alone with the defaults
            import logging
            logging.getLogger(__name__).warning("cannot ask %s for its bundle (%s: %s): using the embedded default "
                                                "drafter and target", url, type(e).__name__, e)
            m = None
        if m is not None:
            size = sum(e["size"] for e in m["files"].values()) / 2 ** 20
            if pin is not None and pin != m["bundle_id"]:
                raise B.BundleMismatchError(f"the server at {url} offers bundle_id {m['bundle_id']}, not the pinned "
                                            f"{pin}: its drafter or target changed")
            if pin is None and not trust:
                raise B.BundleError(
                    f"the server at {url} offers its client bundle (bundle_id {m['bundle_id']}, {size:.0f} MiB: a "
                    "drafter and the target's tokenizer and embedding, to be parsed and run here). Running files a "
                    "server sends is your call: pass --trust-server-bundle (trust_server_bundle=True) to download "
                    f"and run it, or --bundle-id {m['bundle_id']} (bundle_id=...) to accept exactly this one; or "
                    "use your own files: --bundle DIR, or -m TARGET -d DRAFTER")
            b = B.download_bundle(url, key, timeout=timeout, manifest=m, progress=True)
            return b.client, None, b.vocab, b
        from .. import defaults
        target = defaults.default_target()
        return defaults.default_drafter(), target, target, None

    def chat_prompt(self, messages: list) -> list:
        """Token ids of ``messages`` in the target GGUF's chat template (as single-device
        ``generate(chat=True)`` builds them)."""
        from ..target import render_chat_template
        template = self.vocab.metadata.get("tokenizer.chat_template")
        if not template:
            raise ValueError("the target GGUF has no chat template; send a plain prompt")
        v = self.vocab

        def special(tok: int) -> str:
            return v.detokenize([tok], special=True).decode("utf-8", "replace") if tok >= 0 else ""
        text = render_chat_template(template, messages, special(v.token_bos()), special(v.token_eos()))
        return v.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def encode(self, prompt: Union[str, Sequence[int]]) -> list:
        if isinstance(prompt, str):
            return self.vocab.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)
        return [int(t) for t in prompt]

    def generate(self, prompt: Union[str, Sequence[int]], *, max_tokens: int = 256, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: Optional[int] = None, ignore_eos: bool = False,
                 on_event: Optional[Callable[[Event], None]] = None) -> RemoteResult:
        """Generate; through a disconnection it keeps drafting alone (unverified tokens), then
        resyncs (or reopens by replay) when the server is back. ``on_event`` sees every
        :class:`Event` as it happens. ``ignore_eos``: the server never stops at an
        end-of-generation token (llama.cpp's ``--ignore-eos``)."""
        sampling = {"temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p)}
        if ignore_eos:
            sampling["ignore_eos"] = True
        if seed is not None:
            sampling["seed"] = int(seed)
        run = self._last_run = _Run(self, self.encode(prompt), int(max_tokens), sampling, on_event)
        return run.go()

    def verify_pending(self, result: RemoteResult, wait: float = 30.0) -> RemoteResult:
        """Resolve a result that ended with an unverified tail (``finish_reason == "unverified"``:
        the server did not come back in time): wait up to ``wait`` seconds for the server, have
        the tail confirmed or rolled back, and finish the generation. Events go to the same
        ``on_event``; the new result's events and stats continue the old ones. Only the latest
        generation of this generator can be resumed (the drafter state is its)."""
        if result.finish_reason != "unverified":
            return result
        if result._run is None or result._run is not self._last_run:
            raise ValueError("only the latest generation of this RemoteGenerator can be resumed")
        return result._run.resume(wait)

    def _append(self, r: dict) -> None:
        k, v, pos0 = r["_ca"]
        if k.shape[0]:
            self.state.append_ca(k, v, pos0)

    def _tokens(self, r: dict) -> list:
        return r["_tokens"]

    def checked(self, r: Any, n_prop: Optional[int] = None) -> dict:
        """The server's answer to an open (``n_prop`` None) or to a verify of ``n_prop`` drafted
        nodes, checked as the server checks what clients send, before anything is applied: a
        malicious or broken server (or anyone on a plain-HTTP path) gets a clear
        :class:`RemoteError` (kind ``bad_reply``), never a crash (llama.cpp aborts the process on
        a token id outside the vocabulary) and never a half-applied cycle. Adds the decoded
        ``_tokens`` and ``_ca``."""
        def bad(msg: str) -> RemoteError:
            return RemoteError(f"the server's answer is malformed: {msg}", 0, "bad_reply")

        if not isinstance(r, dict):
            raise bad("not a map")
        need = {"n": int, "eog": bool, "tokens": (bytes, bytearray), "ca": dict}
        need.update({"session": str} if n_prop is None else {"accepted": int})
        for key, typ in need.items():
            if key not in r:
                raise bad(f"'{key}' is missing")
            if not isinstance(r[key], typ) or (typ is int and isinstance(r[key], bool)):
                raise bad(f"'{key}' is not {getattr(typ, '__name__', 'binary')}")
        if n_prop is None and not (0 < len(r["session"]) <= 128 and r["session"].replace("-", "").replace("_", "")
                                   .isalnum() and r["session"].isascii()):
            raise bad("'session' is not a session id")     # it goes into our request paths
        a = 0 if n_prop is None else r["accepted"]
        if not 0 <= a <= (n_prop or 0):
            raise bad(f"accepted {a} of {n_prop} drafted tokens")
        drafted = r.get("drafted", n_prop or 0)
        if not isinstance(drafted, int) or isinstance(drafted, bool) or not 0 <= drafted <= (n_prop or 0):
            raise bad("'drafted' is not a count of the proposal's nodes")
        fr = r.get("finish_reason")
        if fr is not None and not (isinstance(fr, str) and len(fr) <= 32 and fr.isidentifier()):
            raise bad("'finish_reason' is not a reason")
        if not 0 <= r["n"] < self.n_ctx:
            raise bad(f"position n={r['n']} outside the context (0..{self.n_ctx - 1})")
        try:
            toks = P.unpack_ints(r["tokens"], "<i4", "tokens", a + 1)
            k, v, pos0 = P.decode_ca(r["ca"], self.model.ca_kv_heads, self.model.head_dim, self.n_ctx)
        except P.ProtocolError as e:
            raise bad(str(e)) from None
        if toks.size and (toks.min() < 0 or toks.max() >= self.n_vocab):
            t = int(toks.min() if toks.min() < 0 else toks.max())
            raise bad(f"token id {t} is outside the vocabulary (0..{self.n_vocab - 1})")
        if pos0 + k.shape[0] > self.n_ctx:
            raise bad(f"ca rows {pos0}..{pos0 + k.shape[0]} outside the context")
        if not (np.isfinite(k).all() and np.isfinite(v).all()):
            raise bad("ca holds NaN or Inf")
        r["_tokens"], r["_ca"] = [int(t) for t in toks], (k, v, pos0)
        return r

    def close(self) -> None:
        self.http.close()


# ---------------------------------------------------------------------------- one generation

class Unavailable(Exception):
    """The server cannot be reached (refused, reset, timed out, 502-504): go offline."""


_UNAVAILABLE = (OSError, http.client.HTTPException)


class _Run:
    """The state of one remote generation.

    ``out``: verified generated tokens, the last one the root (at position ``n``, not yet decoded
    by the target); ``unverified``: tokens drafted past the root while the server was away (CA
    frozen). Verified tokens are never withdrawn; each unverified one is confirmed or rolled back
    exactly once.
    """

    MAX_CHAIN = 62          # tokens per verify of an unverified tail where the server has no resync

    def __init__(self, gen: "RemoteGenerator", prompt: list, max_tokens: int, sampling: dict,
                 on_event: Optional[Callable]) -> None:
        self.g, self.prompt, self.max_tokens, self.sampling = gen, prompt, max_tokens, sampling
        self.on_event = on_event
        self.st = RemoteStats(trace=[] if gen.trace else None)
        self.events: list = []
        self.out: list = []
        self.unverified: list = []
        self.feed: list = list(prompt)
        self.sid: Optional[str] = None
        self.max_resync = 0     # the server's max_resync_tokens (0: it verifies no resync chains)
        self.seq = 0
        self.n = 0
        self.done = False
        self.finish = "length"

    # -------------------------------------------------------------- events

    def _emit(self, ev: Event) -> None:
        self.events.append(ev)
        if self.on_event is not None:
            self.on_event(ev)

    @property
    def root(self) -> int:
        return self.out[-1]

    # -------------------------------------------------------------- server calls

    def _call(self, method: str, path: str, obj: Optional[dict]) -> dict:
        st = self.st
        b0, b1, t = st.bytes_sent, st.bytes_received, time.perf_counter()
        try:
            r = self.g.http.call(method, path, obj, st)
            if st.trace is not None:
                rec = {"t": t, "t_wall": time.perf_counter() - t, "req_bytes": st.bytes_sent - b0,
                       "resp_bytes": st.bytes_received - b1, **(r.get("timing") or {})}
                ca = r.get("ca")
                if isinstance(ca, dict) and ca.get("n"):
                    import zlib
                    raw = bytes(ca.get("k", b"")) + bytes(ca.get("v", b""))
                    rec.update(ca_n=ca["n"], ca_bytes=len(raw), ca_zlib1=len(zlib.compress(raw, 1)))
                st.trace.append(rec)
            return r
        except RemoteError as e:
            if e.status in (502, 503, 504):
                raise Unavailable(str(e)) from None
            raise
        except _UNAVAILABLE as e:
            raise Unavailable(f"{type(e).__name__}: {e}") from None

    def _open(self, replay: bool) -> dict:
        msg = {"v": P.VERSION, "seq": self.seq, "prompt": P.pack_i32(self.prompt), "sampling": self.sampling,
               "ca_dtype": self.g.ca_dtype, "max_tokens": self.max_tokens}
        if self.g.bundle_id is not None:
            msg["bundle_id"] = self.g.bundle_id
        if replay:
            msg.update(generated=P.pack_i32(self.out[:-1]), root=self.root)
        try:
            r = self._call("POST", "/moa/v1/sessions", msg)
        except RemoteError as e:
            if e.kind == "bundle_mismatch":
                raise RemoteError(f"the client bundle '{self.g.bundle.dir}' (bundle_id {self.g.bundle_id[:16]}…) "
                                  f"was made for another drafter/target than the server's: {e}. Rebuild it with "
                                  "`moa-cpp bundle`, or run the client without --bundle to download the server's",
                                  e.status, e.kind) from None
            raise
        r = self.g.checked(r)
        self.sid = r["session"]
        m = r.get("max_resync_tokens")
        self.max_resync = m if isinstance(m, int) and not isinstance(m, bool) and 0 < m <= 1 << 16 else 0
        if replay:
            self.st.reopen_calls += 1
        else:
            self.st.open_calls += 1
        return r

    # -------------------------------------------------------------- main loop

    def go(self) -> RemoteResult:
        st = self.st
        g = self.g
        g.state.rollback(0)
        try:
            r = self._open(False)
        except Unavailable as e:       # nothing generated yet: nothing to continue offline from
            raise RemoteError(f"cannot reach the server at {g.http.host}:{g.http.port} ({e})", 0,
                              "unavailable") from None
        t_app = time.perf_counter()
        self.g._append(r)
        if st.trace:
            st.trace[-1].update(kind="open", k=len(self.prompt), a=0, t_append=time.perf_counter() - t_app)
        first = self.g._tokens(r)
        self.out += first
        self.n = r["n"]
        self._emit(Event("tokens", 0, tuple(first), True))
        self.done = r["eog"] or not first
        self.finish = r.get("finish_reason") or "stop"
        return self._loop()

    def resume(self, wait: float) -> RemoteResult:
        """Go on after a generation gave up with an unverified tail: wait up to ``wait`` seconds
        for the server, have the tail verified (reopening by replay if the server restarted) and
        finish the generation."""
        g = self.g
        old, g.resync_wait = g.resync_wait, wait
        self.done, self.finish = False, "length"
        try:
            return self._loop()
        finally:
            g.resync_wait = old

    def _loop(self) -> RemoteResult:
        st, g = self.st, self.g
        try:
            while not self.done:
                self._cycle()
        finally:
            if self.sid is not None and not self.done:
                try:
                    self._call("DELETE", f"/moa/v1/sessions/{self.sid}", None)
                except (Unavailable, RemoteError):
                    pass
        st.n_generated = len(self.out)
        text = g.vocab.detokenize(self.out).decode("utf-8", "replace")
        return RemoteResult(text, list(self.out), self.finish, st, list(self.unverified), self.events, self)

    def _cycle(self) -> None:
        g = self.g
        t_cycle, t_draft, resync = time.perf_counter(), 0.0, bool(self.unverified)
        if self.unverified:
            # the unverified tail as one resync (the server verifies it in batch-sized pieces), or
            # in 62-token verifies where the server has no resync
            toks = self.unverified[: self.max_resync or self.MAX_CHAIN]
            prop_tokens, prop_parents = toks, list(range(-1, len(toks) - 1))
        else:
            t = time.perf_counter()
            prop = g.proposer.propose(self.feed, self.root, self.n, SamplingParams(), None, self._shape())
            self.feed = []
            t_draft = time.perf_counter() - t
            self.st.t_drafter += t_draft
            prop_tokens, prop_parents = [int(x) for x in prop.tokens], [int(x) for x in prop.parents]
        self.seq += 1
        msg = {"v": P.VERSION, "seq": self.seq, "n": self.n, "root": self.root,
               "tokens": P.pack_i32(prop_tokens), "parents": P.pack_i16(prop_parents)}
        if resync and self.max_resync:
            msg["resync"] = True
        try:
            r = self._call("POST", f"/moa/v1/sessions/{self.sid}/verify", msg)
        except Unavailable:
            self._offline()
            return
        except RemoteError as e:
            if e.status == 404 or e.kind == "state_mismatch":
                try:
                    self._reopen()
                except Unavailable:          # gone again while reopening: keep drafting alone
                    self._offline()
                return
            raise
        r = g.checked(r, len(prop_tokens))
        tr = self.st.trace
        n_tr = len(tr) if tr is not None else 0
        self._verified(r, prop_tokens)
        if tr is not None and n_tr:
            tr[n_tr - 1].update(kind="resync" if resync else "verify", k=len(prop_tokens),
                                a=int(r["accepted"]), t_draft=t_draft, t_cycle=time.perf_counter() - t_cycle)

    def _shape(self):
        """The draft shape for this cycle: a chain no longer than the tokens still wanted (as the
        single-device loop does; longer would only cost drafter work and bytes)."""
        d = self.g.draft
        left = self.max_tokens - len(self.out)
        if d.mode == "chain" and d.chain > left:
            return DraftConfig("chain", chain=max(1, left))
        return d

    def _verified(self, r: dict, prop_tokens: list) -> None:
        """Apply a verify answer: CA, confirmed / rolled-back unverified tokens, new tokens."""
        st = self.st
        st.verify_calls += 1
        a = int(r["accepted"])
        st.drafted += int(r.get("drafted", len(prop_tokens)))     # what the server verified of it
        st.accepted += a
        t_app = time.perf_counter()
        self.g._append(r)
        if st.trace:
            st.trace[-1]["t_append"] = time.perf_counter() - t_app
        new = self.g._tokens(r)
        self.feed = [self.root] + new[:a]        # the accepted path (a tree's need not be its first nodes)
        pos = len(self.out)
        if self.unverified:
            tail = self.unverified
            k = a
            matched = len(new) > a and a < len(tail) and new[a] == tail[a]
            if matched:
                k += 1                       # the target's own next token is the drafted one
            if k:
                self._emit(Event("confirm", pos, n=k))
                st.unverified_confirmed += k
            rest = tail[k:]
            if rest and not matched:
                self._emit(Event("rollback", pos + k, tuple(rest), False, n=len(rest)))
                st.unverified_rolled_back += len(rest)
                rest = []
            self.unverified = rest
            fresh = new[k:]
        else:
            fresh = new
        self.out += new
        if fresh:
            self._emit(Event("tokens", len(self.out) - len(fresh), tuple(fresh), True))
        self.n = r["n"]
        if r["eog"]:
            self.done = True
            self.finish = r.get("finish_reason") or "stop"
            if self.unverified:                                 # drafted past the end: withdrawn
                self._emit(Event("rollback", len(self.out), tuple(self.unverified), False, n=len(self.unverified)))
                st.unverified_rolled_back += len(self.unverified)
                self.unverified = []

    # -------------------------------------------------------------- disconnection

    def _offline(self) -> None:
        """Keep drafting alone (CA frozen) until the server answers /health again, then return
        (the next cycle resyncs). Gives up after ``resync_wait`` seconds at the limit."""
        g, st = self.g, self.st
        st.disconnections += 1
        self._emit(Event("status", len(self.out), state="disconnected"))
        t0 = time.monotonic()
        self._draft_from_root()
        probe_at, delay = 0.0, 0.1
        while True:
            now = time.monotonic()
            if now >= probe_at:
                if self._healthy():
                    break
                delay = min(2.0, delay * 2)
                probe_at = now + delay
            total = len(self.out) + len(self.unverified)
            if len(self.unverified) < g.max_unverified and total < self.max_tokens:
                self._draft_more(1)
            elif now - t0 > g.resync_wait:
                st.offline_s += time.monotonic() - t0
                self._emit(Event("status", len(self.out), state="gave_up"))
                self.done, self.finish = True, "unverified"
                return
            else:
                time.sleep(min(0.05, max(0.0, probe_at - now)))
        st.offline_s += time.monotonic() - t0
        st.resyncs += 1
        self._emit(Event("status", len(self.out), state="reconnected"))

    def _draft_from_root(self) -> None:
        """(Re)build the offline chain's draft rows: the root, then the unverified tokens already
        shown (a failure during a resync keeps them); with none yet, draft the first one."""
        g = self.g
        g.state.clear_drafts()
        chain = [self.root] + self.unverified
        logits = g.state.draft(chain, list(range(self.n, self.n + len(chain))), list(range(-1, len(chain) - 1)),
                               feed=self.feed)
        self.feed = []
        if not self.unverified:
            self._push(logits[0])

    def _draft_more(self, k: int) -> None:
        g = self.g
        for _ in range(k):
            last, pos = self.unverified[-1], self.n + len(self.unverified)
            self._push(g.state.draft([last], [pos])[0])

    def _push(self, logits: np.ndarray) -> None:
        g = self.g
        tok = int(np.argmax(logits))
        tok = int(g.proposer.target_ids(np.array([tok]))[0])
        self.unverified.append(tok)
        self.st.unverified_tokens += 1
        self._emit(Event("tokens", len(self.out) + len(self.unverified) - 1, (tok,), False))

    def _healthy(self) -> bool:
        g = self.g
        try:
            c = http.client.HTTPConnection(g.http.host, g.http.port, timeout=g.probe_timeout)
            try:
                c.request("GET", "/health")
                return c.getresponse().status == 200
            finally:
                c.close()
        except _UNAVAILABLE:
            return False

    def _reopen(self) -> None:
        """The session is gone (server restarted): reopen by replaying the verified tokens."""
        self._open(True)
        self._emit(Event("status", len(self.out), state="reopened"))
        self.seq += 1
