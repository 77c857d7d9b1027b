"""API keys and the bind policy.

Keys come from ``--api-key-file`` (one per line; a line starting with ``#`` is a comment, so
a key cannot start with ``#``) or ``MOA_API_KEY``; ``--api-key KEY`` (llama-server's spelling)
works with a warning: other users can read a process's argv. Keys are printable ASCII without
whitespace: HTTP headers carry bytes that clients encode differently beyond ASCII. Every route but ``/health`` needs
``Authorization: Bearer KEY`` or ``X-Api-Key: KEY``; the check compares SHA-256 digests of the
offered key with every configured key in constant time (no early exit, no length leak).
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
from pathlib import Path
from typing import Iterable, Optional, Sequence

from moa_cpp.errors import InvalidArgumentError
from moa_cpp.target.rpc import is_loopback

ENV_KEY = "MOA_API_KEY"
log = logging.getLogger("moa_cpp.server")


def load_api_keys(key_file: Optional[str] = None, environ: Optional[dict] = None,
                  inline: Optional[str] = None) -> list:
    """The configured keys: the file's non-empty, non-comment lines, else ``inline`` (``--api-key``),
    else ``$MOA_API_KEY``."""
    env = os.environ if environ is None else environ
    keys: list = []
    if key_file and inline:
        raise InvalidArgumentError("give --api-key-file or --api-key, not both")
    if key_file:
        p = Path(key_file)
        try:
            mode = p.stat().st_mode
            if mode & (stat.S_IRGRP | stat.S_IROTH):
                log.warning("--api-key-file %s is readable by other users (mode %o): chmod 600 %s",
                            p, stat.S_IMODE(mode), p)
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise InvalidArgumentError(f"--api-key-file {p}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise InvalidArgumentError(f"--api-key-file {p}: not UTF-8 text") from None
        keys = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        if not keys:
            raise InvalidArgumentError(f"--api-key-file {p}: no key in it (one key per line, '#' comments)")
    elif inline:
        log.warning("--api-key puts the key in the process list (ps, /proc) for other users to read: "
                    "prefer --api-key-file FILE (mode 600) or $%s", ENV_KEY)
        keys = [inline.strip()]
    elif env.get(ENV_KEY, "").strip():
        keys = [env[ENV_KEY].strip()]
    for k in keys:
        if not k.isascii():
            # a client's header carries bytes (latin-1 for most, UTF-8 for some): it could never match
            raise InvalidArgumentError("an API key must be ASCII (a non-ASCII key can never match what HTTP clients "
                                       "send)")
        if any(c.isspace() for c in k) or not k.isprintable():
            raise InvalidArgumentError("an API key must be printable and contain no whitespace")
    return keys


def check_bind(host: str, has_keys: bool, insecure_no_auth: bool = False) -> None:
    """Refuse to serve a non-loopback address without a key (unless explicitly insecure)."""
    if not is_loopback(host) and not has_keys and not insecure_no_auth:
        raise InvalidArgumentError(
            f"refusing to listen on {host} without an API key: anyone who can reach it could use the model. "
            f"Set --api-key-file FILE or ${ENV_KEY}, bind 127.0.0.1, or pass --insecure-no-auth")


class KeyChecker:
    """Constant-time check of an offered key against all configured keys."""

    def __init__(self, keys: Sequence[str]) -> None:
        self._digests = [hashlib.sha256(k.encode()).digest() for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def check(self, offered: Optional[str]) -> bool:
        if not self._digests:
            return True
        d = hashlib.sha256((offered or "").encode("utf-8", "surrogateescape")).digest()
        ok = False
        for ref in self._digests:           # every key, always: the time does not depend on which matched
            ok |= hmac.compare_digest(d, ref)
        return ok and offered is not None


def offered_key(headers: Iterable[tuple]) -> Optional[str]:
    """The key in ``Authorization: Bearer K`` or ``X-Api-Key: K`` (raw ASGI headers)."""
    for name, value in headers:
        n = name.lower()
        if n == b"authorization":
            v = value.decode("latin-1").strip()
            if v[:7].lower() == "bearer ":
                return v[7:].strip()
        elif n == b"x-api-key":
            return value.decode("latin-1").strip()
    return None
