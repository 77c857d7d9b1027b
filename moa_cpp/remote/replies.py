"""The client's check of what the server answers to an open or a verify, before anything of it
is applied -- the mirror of the checks the server makes of what clients send."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from moa_cpp.remote import protocol as P
from moa_cpp.remote.transport import RemoteError


def check_reply(r: Any, n_prop: Optional[int], *, n_ctx: int, n_vocab: int, ca_heads: int, head_dim: int) -> dict:
    """The server's answer to an open (``n_prop`` None) or to a verify of ``n_prop`` drafted
    nodes, checked as the server checks what clients send: a malicious or broken server (or
    anyone on a plain-HTTP path) gets a clear :class:`RemoteError` (kind ``bad_reply``), never a
    crash (llama.cpp aborts the process on a token id outside the vocabulary) and never a
    half-applied cycle. Adds the decoded ``_tokens`` (list of ids) and ``_ca`` ((k, v, pos0))."""
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
    if not 0 <= r["n"] < n_ctx:
        raise bad(f"position n={r['n']} outside the context (0..{n_ctx - 1})")
    try:
        toks = P.unpack_ints(r["tokens"], "<i4", "tokens", a + 1)
        k, v, pos0 = P.decode_ca(r["ca"], ca_heads, head_dim, n_ctx)
    except P.ProtocolError as e:
        raise bad(str(e)) from None
    if toks.size and (toks.min() < 0 or toks.max() >= n_vocab):
        t = int(toks.min() if toks.min() < 0 else toks.max())
        raise bad(f"token id {t} is outside the vocabulary (0..{n_vocab - 1})")
    if pos0 + k.shape[0] > n_ctx:
        raise bad(f"ca rows {pos0}..{pos0 + k.shape[0]} outside the context")
    if not (np.isfinite(k).all() and np.isfinite(v).all()):
        raise bad("ca holds NaN or Inf")
    r["_tokens"], r["_ca"] = [int(t) for t in toks], (k, v, pos0)
    return r
