"""Server side of the MoA client-server protocol (docs/client-server.md#split, docs/client-server.md#protocol): a remote
session holds a pool session (its target context) from open to close; each verify runs one
cycle of the ordinary :class:`SpeculativeLoop` whose proposer is the client's proposal, and
answers the verdict plus the CA K/V of the verified rows (LSA -> mean -> Ekv2E -> CA k/v run
here, ``DrafterState.compute_ca``; the client appends them).

The state rule (docs/client-server.md#state-rule): every verify carries ``(seq, n, root)``. A ``seq`` not above the
last one is stale (409). ``n`` behind the server (its answer was lost) rolls the session back
to ``n`` if ``root`` is the token the server has there; ``n`` ahead of it, or another root, is a
409 ``state_mismatch`` (the client reopens). A reopen replays the verified tokens: the prompt is
prefilled in the same chunks as at the first open, the generated tokens are re-decoded (as the
loop's carry) in batches no larger than the exact batch size, so the rebuilt target K/V equal
the uninterrupted run's.
"""
from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from moa_cpp.remote import protocol as P
from moa_cpp.speculative.loop import Generation, SpeculativeLoop
from moa_cpp.speculative.types import DraftConfig, Proposal, SamplingParams
from moa_cpp.server.sessions import Session

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
    name = "client"
    acceptance_prior = None
    row_cost = None

    def __init__(self, scratch) -> None:
        self.scratch = scratch            # any DrafterState of the model: compute_ca leaves it untouched
        self.next: Proposal = Proposal.empty()
        self.ca: list = []                # (k, v, pos0) since the last take_ca()
        self.lsa_s = 0.0                  # seconds in compute_ca since the last verify began

    def reset(self) -> None:
        self.ca = []

    def observe(self, lsa_in: np.ndarray, pos0: int) -> None:
        t = time.perf_counter()
        k, v = self.scratch.compute_ca(lsa_in, pos0)
        self.lsa_s += time.perf_counter() - t        # reported as timing.lsa_ms
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
    history: list = field(default_factory=list)   # prompt + verified tokens; history[g.n] == g.root
    n_prompt: int = 0
    last_seq: int = -1
    last_used: float = field(default_factory=time.monotonic)   # last call that made progress (see progressed)
    closed: bool = False
    furthest: int = 0                     # the largest position n this session has reached

    def progressed(self) -> None:
        """Refresh the idle clock only when the generation got further than ever: a client that
        keeps a session alive with empty verifies or rewinds to the start lets it expire."""
        if self.g is not None and self.g.n > self.furthest:
            self.furthest = self.g.n
            self.last_used = time.monotonic()


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


def open_generation(rs: RemoteSession, prompt: np.ndarray, sp: SamplingParams, max_tokens: int,
                    generated: Optional[np.ndarray] = None, root: int = -1) -> dict:
    """Prefill the prompt with capture, sample the root; CA of the whole prompt in the answer.
    A reopen (``root >= 0``) replays ``generated`` and takes ``root`` instead of sampling: its
    answer has no CA (the client has it). Runs in a worker thread."""
    t = time.perf_counter()
    rs.g, r = rs.loop.prefill(prompt.astype(np.int32), max_tokens, sp)
    rs.n_prompt = int(prompt.size)
    if root < 0:
        rs.history = [int(x) for x in prompt] + [rs.g.root]
        return _answer(rs, r, {"timing": {"prefill_ms": 1000 * (time.perf_counter() - t)}})
    g = rs.g
    gen = [int(x) for x in (generated if generated is not None else [])]
    rs.proposer.ca = []                       # the client has the CA of everything verified
    g.carry = gen                             # re-decoded ahead of the next root, in exact batches
    g.n, g.root, g.finished = int(prompt.size) + len(gen), int(root), False
    g.generated = len(gen) + 1
    rs.history = [int(x) for x in prompt] + gen + [int(root)]
    return _answer(rs, type(r)((), finished=False), {"timing": {"prefill_ms": 1000 * (time.perf_counter() - t)}})


def rewind(rs: RemoteSession, n: int) -> None:
    """Roll the session back to position ``n`` (its root history[n] stays the root)."""
    g = rs.g
    kv_end = g.n - len(g.carry)               # positions the target's KV cache holds
    keep = min(kv_end, n)
    rs.loop.target.rollback(keep)
    g.carry = rs.history[keep:n]
    g.n, g.root, g.finished = n, rs.history[n], False
    g.generated = n + 1 - rs.n_prompt
    del rs.history[n + 1:]


def verify_cycle(rs: RemoteSession, tokens: np.ndarray, parents: np.ndarray, answer: bool = True) -> dict:
    """One cycle on the client's proposal. Runs in a worker thread. ``answer=False``: the step's
    counts and emitted tokens only (a resync piece; its CA stays queued for the answer)."""
    rs.proposer.next = proposal_from(tokens, parents)
    verdicts: list = []
    rs.loop.on_cycle = lambda pos, root, proposal, scores, verdict: verdicts.append(verdict)
    rs.proposer.lsa_s = 0.0
    t = time.perf_counter()
    try:
        r = rs.loop.step(rs.g)
    finally:
        rs.loop.on_cycle = None
    for v in verdicts:                        # positions n+1 .. n+a+1 (emitted or not)
        rs.history.extend(int(x) for x in v.tokens)
        rs.history.append(int(v.bonus))
    extra = {"accepted": r.accepted, "drafted": r.drafted,
             "timing": {"decode_ms": 1000 * (time.perf_counter() - t), "lsa_ms": 1000 * rs.proposer.lsa_s}}
    if not answer:
        return {**extra, "tokens": [int(x) for x in r.tokens]}
    return _answer(rs, r, extra)


def resync_chain(rs: RemoteSession, tokens: np.ndarray, parents: np.ndarray) -> dict:
    """A resync (docs/client-server.md#resync): the client's unverified chain u_1..u_m, verified in pieces of at most
    ``_CLIENT_SHAPE.total`` drafts (one batch each), up to the first rejection. A piece accepted
    whole ends in the target's own next token; where that is the chain's next token, the chain goes
    on from it (under sampling too: a point-mass draft is accepted with probability p(u), the
    probability that the sampled token is u). The answer is one verify's: accepted counts the
    chain's tokens the target confirmed, tokens are those and the target's token after them."""
    chain = [int(x) for x in tokens]
    piece = _CLIENT_SHAPE.total
    accepted = drafted = 0
    emitted: list = []
    decode_ms = lsa_ms = 0.0
    while True:
        part, chain = chain[:piece], chain[piece:]
        out = verify_cycle(rs, np.asarray(part, np.int32), np.arange(-1, len(part) - 1, dtype=np.int16),
                           answer=False)
        a = out["accepted"]
        accepted += a
        drafted += out["drafted"]
        emitted += out["tokens"]
        decode_ms += out["timing"]["decode_ms"]
        lsa_ms += out["timing"]["lsa_ms"]
        if a < len(part) or not chain or rs.g.finished or rs.g.root != chain[0]:
            break
        accepted += 1                          # the target's own token is the chain's next one
        chain = chain[1:]
        if not chain:
            break
    return _answer(rs, _Emitted(emitted), {"accepted": accepted, "drafted": drafted,
                                           "timing": {"decode_ms": decode_ms, "lsa_ms": lsa_ms}})


@dataclass
class _Emitted:
    """What :func:`_answer` reads of a step result."""
    tokens: list


def check_state(rs: RemoteSession, seq: int, n: int, root: int) -> bool:
    """The state rule; True if the session must first roll back to ``n`` (see :func:`rewind`)."""
    if seq <= rs.last_seq:
        raise P.ProtocolError(f"seq {seq} is not above the last one ({rs.last_seq})", "stale_request", 409)
    g = rs.g
    if g is None:
        raise P.ProtocolError("this session has no generation", "state_mismatch", 409)
    if n > g.n or n < rs.n_prompt or rs.history[n] != root:
        raise P.ProtocolError(f"state mismatch: the server is at n={g.n}, root={g.root}", "state_mismatch", 409)
    return n < g.n
