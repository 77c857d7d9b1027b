"""The ``Host`` check against DNS rebinding.

A server bound to loopback is reachable by any web page the user opens: the page's script
cannot read answers from another origin, unless an attacker's DNS name first resolves to the
attacker and then to 127.0.0.1 (DNS rebinding) - then the browser sends ``Host: attacker.example``
to this server as a same-origin request. So on a loopback bind only loopback names and addresses
are served (``localhost``, ``*.localhost``, ``127.0.0.0/8``, ``::1``), plus what ``--allowed-hosts``
lists; ``--allowed-hosts '*'`` turns the check off. A non-loopback bind checks only when
``--allowed-hosts`` is given (its clients use whatever name routes to it). Requests without a
``Host`` header (HTTP/1.0) pass: browsers always send one.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from moa_cpp.server.errors import APIError

LOOPBACK = "<loopback names>"   # in an allowed set: every loopback name and address


def host_name(value: str) -> str:
    """The name in a Host header value, without port, brackets, trailing dot or case."""
    v = value.strip().lower()
    if v.startswith("["):                       # [::1]:8080
        return v[1:v.find("]")] if "]" in v else v[1:]
    if v.count(":") == 1:                       # name:port (a bare IPv6 address has 2+ colons)
        v = v.split(":", 1)[0]
    return v.rstrip(".")


def is_loopback_name(name: str) -> bool:
    """The bind policy's loopback names and addresses, plus ``*.localhost`` (RFC 6761: browsers
    resolve it to loopback)."""
    from moa_cpp.target.rpc import is_loopback
    return name.endswith(".localhost") or is_loopback(name)


def allowed_hosts(bind_host: str, listed: Iterable[str]) -> Optional[set]:
    """The Host names served (None: every name): loopback names on a loopback bind, plus the
    listed ones; only the listed ones (if any) elsewhere."""
    from moa_cpp.target.rpc import is_loopback
    names = {host_name(h) for h in listed if h.strip()}
    if "*" in names:
        return None
    if is_loopback(bind_host):
        return names | {LOOPBACK}
    return names or None


class HostMiddleware:
    """400 ``host_not_allowed`` for a Host outside :func:`allowed_hosts` (pure ASGI, outermost)."""

    def __init__(self, app: Any, allowed: Optional[set]) -> None:
        self.app, self.allowed = app, allowed

    def ok(self, headers: Iterable[tuple]) -> tuple[bool, str]:
        host = next((v.decode("latin-1") for n, v in headers if n.lower() == b"host"), None)
        if host is None or self.allowed is None:
            return True, ""
        name = host_name(host)
        return (name in self.allowed or (LOOPBACK in self.allowed and is_loopback_name(name))), host

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            good, host = self.ok(scope.get("headers", ()))
            if not good:
                err = APIError(400, f"Host {host[:100]!r} is not served here: this server answers to localhost names "
                                    "only (DNS rebinding protection); start it with --allowed-hosts NAME to add one",
                               code="host_not_allowed")
                await err.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
