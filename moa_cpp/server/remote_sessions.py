"""Server side of the MoA client-server protocol (spec/client-server.md §1-§2): a remote
session holds a pool session (its target context) from open to close; each verify runs one
cycle of the ordinary :class:`SpeculativeLoop` whose proposer is the client's proposal, and
answers the verdict plus the CA K/V of the verified rows (LSA -> mean -> Ekv2E -> CA k/v run
here, ``DrafterState.compute_ca``; the client appends them).

Connected mode only in this version: a verify must carry the session's current ``(n, root)``
and a ``seq`` above the last one (409 otherwise); rollback / resync / reopen come next.
"""
from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from ..remote import protocol as P
from ..speculative.loop import Generation, SpeculativeLoop
from ..speculative.types import DraftConfig, Proposal, SamplingParams
from .sessions import Session

# the proposal's shape is the client's; the loop only needs a tree-shaped setting to take it
_CLIENT_SHAPE = DraftConfig("tree", depth=16, topk=16, total=62)


def proposal_from(tokens: np.ndarray, parents: np.ndarray) -> Proposal:
    depths = np.zeros(tokens.size, np.int32)
    for i, p in enumerate(parents):
        depths[i] = 1 if p < 0 else depths[p] + 1
    return Proposal(tokens.astype(np.int32), parents.astype(np.int32), depths)


class ClientProposals:
    """The proposer of a remote session: hands the loop the client's proposal, and turns the
    verified rows' captured K/V into CA entries for the response."""

    needs_capture = True
    acceptance_prior = None
    row_cost = None

    def __init__(self, scratch) -> None:
        self.scratch = scratch            # any DrafterState of the model: compute_ca leaves it untouched
        self.next: Proposal = Proposal.empty()
        self.ca: list = []                # (k, v, pos0) since the last take_ca()

    def reset(self) -> None:
        self.ca = []

    def observe(self, lsa_in: np.ndarray, pos0: int) -> None:
        k, v = self.scratch.compute_ca(lsa_in, pos0)
        self.ca.append((k, v, pos0))

    def propose(self, feed: Sequence[int], root: int, pos: int, sp: SamplingParams, rng=None,
                config: Optional[DraftConfig] = None) -> Proposal:
        return self.next

    def take_ca(self, pos: int) -> tuple:
        """The CA entries since the last call (none if the cycle verified nothing: at pos)."""
        parts, self.ca = self.ca, []
        if not parts:
            m = self.scratch.model
            empty = np.zeros((0, m.ca_kv_heads, m.head_dim), np.float32)
            return empty, empty, pos
        k = np.concatenate([p[0] for p in parts])
        v = np.concatenate([p[1] for p in parts])
        return k, v, parts[0][2]


@dataclass
class RemoteSession:
    id: str
    owner: bytes                          # sha256 of the API key that opened it ("" without auth)
    pool_session: Session
    loop: SpeculativeLoop
    proposer: ClientProposals
    ca_dtype: str
    g: Optional[Generation] = None
    last_seq: int = -1
    last_used: float = field(default_factory=time.monotonic)
    closed: bool = False


def new_session(pool_session: Session, owner_key: Optional[str], ca_dtype: str) -> RemoteSession:
    gen = pool_session.gen
    if gen.state is None:
        raise P.ProtocolError("this server runs without an MoA drafter: client-server mode needs one",
                              "no_drafter", 400)
    proposer = ClientProposals(gen.state)
    loop = SpeculativeLoop(gen.target, proposer, _CLIENT_SHAPE)
    owner = hashlib.sha256((owner_key or "").encode()).digest()
    return RemoteSession(secrets.token_urlsafe(16), owner, pool_session, loop, proposer, ca_dtype)


def _answer(rs: RemoteSession, r, extra: dict) -> dict:
    g = rs.g
    k, v, pos0 = rs.proposer.take_ca(g.n)
    return {"v": P.VERSION, "session": rs.id, "n": g.n, "root": g.root, "eog": bool(g.finished),
            "finish_reason": g.stats.finish_reason or None, "tokens": P.pack_i32(r.tokens),
            "ca": P.encode_ca(k, v, pos0, rs.ca_dtype), **extra}


def open_generation(rs: RemoteSession, prompt: np.ndarray, sp: SamplingParams, max_tokens: int) -> dict:
    """Prefill the prompt with capture, sample the root; CA of the whole prompt in the answer.
    Runs in a worker thread."""
    t = time.perf_counter()
    rs.g, r = rs.loop.prefill(prompt.astype(np.int32), max_tokens, sp)
    return _answer(rs, r, {"timing": {"prefill_ms": 1000 * (time.perf_counter() - t)}})


def verify_cycle(rs: RemoteSession, tokens: np.ndarray, parents: np.ndarray) -> dict:
    """One cycle on the client's proposal. Runs in a worker thread."""
    rs.proposer.next = proposal_from(tokens, parents)
    t = time.perf_counter()
    r = rs.loop.step(rs.g)
    return _answer(rs, r, {"accepted": r.accepted, "drafted": r.drafted,
                           "timing": {"decode_ms": 1000 * (time.perf_counter() - t)}})


def check_state(rs: RemoteSession, seq: int, n: int, root: int) -> None:
    if seq <= rs.last_seq:
        raise P.ProtocolError(f"seq {seq} is not above the last one ({rs.last_seq})", "stale_request", 409)
    g = rs.g
    if g is None or g.finished:
        raise P.ProtocolError("this session's generation has ended", "session_finished", 409)
    if n != g.n or root != g.root:
        raise P.ProtocolError(f"state mismatch: the server is at n={g.n}, root={g.root}", "state_mismatch", 409)
