"""What a remote generation gives its caller: the :class:`Event` stream the user sees, the
per-generation :class:`RemoteStats` and the final :class:`RemoteResult`. Plain data."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Event:
    """What the user sees (docs/client-server.md#events). kind "tokens": ``ids`` at generated index ``pos``,
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

    @property
    def tau(self) -> float:
        return self.n_generated / self.verify_calls if self.verify_calls else 0.0

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["tau"] = self.tau
        return d


@dataclass
class RemoteResult:
    text: str                     # the verified text
    tokens: list                  # verified token ids
    finish_reason: str            # stop / length / unverified (the server never came back)
    stats: RemoteStats = field(default_factory=RemoteStats)
    unverified: list = field(default_factory=list)
    events: list = field(default_factory=list)
    # the generation itself, for RemoteGenerator.verify_pending (resuming an unverified tail)
    _run: Any = field(default=None, repr=False, compare=False)
