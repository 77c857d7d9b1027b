"""The speculative loop: :meth:`SpeculativeLoop.prefill`, then :meth:`SpeculativeLoop.step` =
propose -> score (one target decode) -> verify -> commit, until EOG, max_tokens or the context
is full. :meth:`SpeculativeLoop.run` drives both and yields each step's tokens.

Bookkeeping per cycle (docs/drafter.md#one-cycle): the root (position n) is the last emitted
token, not yet decoded by the target. The verification decode writes the root and the draft
nodes; after acceptance of a nodes the target keeps positions n..n+a, the drafter commits the
K/V of those a+1 rows (LSA -> CA cache) and feeds their tokens to its SA context at the next
cycle, and the bonus token becomes the next root at n+a+1.

Thread safety: one loop drives one generation at a time (it owns the target's KV cache);
several loops on several targets / drafter states may run in parallel threads.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from moa_cpp.errors import CacheFullError
from moa_cpp.target.target import MAX_VERIFY_ROWS, Target
from moa_cpp.speculative.policy import Policy, make_policy
from moa_cpp.speculative.scorer import TargetScorer, main_path
from moa_cpp.speculative.types import (NO_DRAFT, DraftConfig, Proposal, Proposer, SamplingParams, Scores, SpecStats, StepResult,
                    TokenLogprob, Verdict)
from moa_cpp.speculative.grammar import Grammar, constrain_rows
from moa_cpp.speculative.penalties import adjust_rows
from moa_cpp.speculative.prefix_cache import PrefixCache
from moa_cpp.speculative.draws import Draws, DrawCursor
from moa_cpp.speculative.verify import probs_from_logits, sample_logits, verify


@dataclass
class StepEvent:
    """Tokens emitted by one step (prefill or cycle) of a streaming generation."""

    tokens: list
    stats: SpecStats
    logprobs: list = field(default_factory=list)   # TokenLogprob per token (when asked for)
    origins: list = field(default_factory=list)    # who chose each token (StepResult.origins)


@dataclass
class Generation:
    """The mutable state of one generation (owned by the loop between steps)."""

    max_tokens: int
    sp: SamplingParams
    policy: Policy
    draws: Optional[Draws]         # sampling: the uniform that chooses each token (None: greedy)
    stats: SpecStats
    root: int = -1                 # last emitted token, not yet decoded by the target
    n: int = 0                     # its position (= verified tokens in the target's KV cache)
    drafting: bool = False         # proposer active (capture + drafter commits)
    feed: list = field(default_factory=list)    # verified tokens the drafter's SA context has not seen
    carry: list = field(default_factory=list)   # verified tokens to re-decode ahead of the next root
    generated: int = 0
    max_rows: int = 1              # largest exact verification batch (resolved before prefill)
    finished: bool = False
    t_start: float = 0.0
    n_logprobs: int = -1           # >= 0: each emitted token's logprob and this many top alternatives
    history: list = field(default_factory=list)  # emitted tokens (the root last): penalties' window
    grammar: Optional[Grammar] = None  # the grammar's state after every emitted token (the root too)
    ids: list = field(default_factory=list)      # the token at every position: prompt, then the roots
    drawn: int = 0                 # sampling: tokens chosen so far (the next one takes draw ``drawn``)
    run: Any = None                # a batched slot's plain run (moa_cpp.target.slots.PlainRun) while it lives
    # drafts a plain run's lookup found for the root it ended at (:class:`_Lookahead`): the next
    # step verifies them as its own proposal, (proposal, shape, seconds of the lookup)
    lookahead: Any = None

    def cursor(self) -> Optional[DrawCursor]:
        """The draws from the next token on (None when greedy)."""
        return None if self.draws is None else self.draws.at(self.drawn)


def _eog_masked(logits: np.ndarray, target: Target, sp: SamplingParams) -> np.ndarray:
    """``logits`` as the sampler sees them: with ``ignore_eos`` every end-of-generation token
    gets -inf (llama.cpp's ``--ignore-eos``), in the plain and the speculative path alike."""
    if not sp.ignore_eos:
        return logits
    out = np.array(logits, dtype=np.float32, copy=True)
    out[..., target.eog_tokens] = -np.inf
    return out


def token_logprobs(rows: np.ndarray, tokens: Sequence[int], n_top: int) -> list:
    """:class:`TokenLogprob` of ``tokens[i]`` under logits row ``rows[i]`` (log-softmax in float64),
    with the ``n_top`` most likely tokens of each row (ties: the lower id first)."""
    out = []
    for row, tok in zip(rows, tokens):
        x = np.asarray(row, np.float64)
        lse = x.max() + np.log(np.exp(x - x.max()).sum())
        top: tuple = ()
        if n_top > 0:
            idx = np.argpartition(-x, min(n_top, x.size - 1))[:n_top]
            idx = idx[np.lexsort((idx, -x[idx]))]
            top = tuple((int(i), float(x[i] - lse)) for i in idx)
        out.append(TokenLogprob(int(tok), float(x[int(tok)] - lse), top))
    return out


def fit_chain(cfg: DraftConfig, left: int) -> DraftConfig:
    """``cfg`` cut to ``left`` drafts: a chain longer than the tokens left, the free context or
    the exact batch size would only waste drafter work, so ask for no more than fits (NO_DRAFT
    when nothing does). The loop's and the remote client's cycle both shape drafts with it."""
    if cfg.mode == "chain" and cfg.chain > left:
        return replace(cfg, chain=left, budget=min(cfg.budget, left)) if left > 0 else NO_DRAFT
    return cfg


def _sample(logits: np.ndarray, g: Generation) -> int:
    """The next token from one row, as plain decoding chooses it (arg-max, or the generation's
    next draw: :mod:`~moa_cpp.speculative.draws`)."""
    if g.sp.greedy:
        return int(np.argmax(logits))
    g.drawn += 1
    return sample_logits(logits, g.sp, g.draws.u(g.drawn - 1))


class _Lookahead:
    """A plain run's lookups (:meth:`SpeculativeLoop._run_step`), called by the engine's decode
    thread with each token it chooses: shapes and looks up the cycle that token would start
    exactly as :meth:`SpeculativeLoop.step` would (the policy's choice, the contextual fit,
    ``draft_min``, the room), and ends the run at the first token whose lookup has drafts,
    leaving them in ``g.lookahead``. Only the decode thread touches the proposer while the run
    lives; a lookup that finds nothing counts in the statistics as a plain step's would."""

    def __init__(self, loop: "SpeculativeLoop", g: Generation) -> None:
        self.loop, self.g = loop, g
        self.n0, self.gen0 = g.n, g.generated
        self.toks = [g.root]             # the token at each position from n0 on
        self.synced = g.n                # the root position of the proposer's latest lookup

    def __call__(self, tok: int, pos: int) -> bool:
        loop, g = self.loop, self.g
        self.toks.append(int(tok))       # chosen for ``pos``, not decoded yet
        room = loop.target.n_ctx - pos - 1
        if room < 0:
            return False
        cfg = loop._shape(g, room, generated=self.gen0 + pos - self.n0)
        if cfg.mode == "none":
            return False
        t = time.perf_counter()
        proposal = loop._propose(g, cfg, (self.feed_until(pos), int(tok), pos))
        self.synced = pos
        dt = time.perf_counter() - t
        if not proposal.n:
            g.stats.t_drafter += dt
            return False
        g.lookahead = (proposal, cfg, dt)
        return True

    def feed_until(self, pos: int) -> list:
        """The tokens from the proposer's latest root up to (not including) position ``pos``."""
        return self.toks[self.synced - self.n0:pos - self.n0]


class SpeculativeLoop:
    """Drives one generation at a time over a :class:`Target` and an optional proposer.

    ``draft`` is the default draft setting (``DraftConfig``); ``auto`` modes use a
    :class:`CostAwarePolicy` kept across generations (its acceptance estimate is learned)."""

    def __init__(self, target: Target, proposer: Optional[Proposer], draft: DraftConfig) -> None:
        self.target = target
        self.proposer = proposer
        self.draft = draft if proposer is not None else NO_DRAFT
        self.scorer = TargetScorer(target)
        self.draft_min = 0            # a proposal of fewer drafts is not verified (llama.cpp's --draft-min)
        self._policies: dict = {}
        # Optional observer of every cycle: on_cycle(pos, root, proposal, scores, verdict) (tests,
        # diagnostics). Called after verification, before the commit.
        self.on_cycle = None
        # what the caches hold after this loop's latest generation: the next prompt reuses the
        # prefix it shares with it
        self.prefix = PrefixCache(target)

    # ------------------------------------------------------------------ settings

    def batch_rows(self, cfg: DraftConfig) -> int:
        """Largest verification batch (root + carry + drafts) for drafting ``cfg``: the largest
        batch whose rows the target computes bit-identically to single-token decodes (measured
        once per model, only as far as ``cfg`` needs: :meth:`Target.exact_rows`), so greedy
        speculation stays token-identical to plain decoding. A target on which no batch of 2+
        rows is exact (e.g. some F32 builds, GPUs) gets the full 63 rows: there exactness is
        impossible without giving up speculation, and greedy output can differ from plain
        decoding at near-ties only."""
        need = MAX_VERIFY_ROWS if cfg.mode == "tree" else cfg.max_nodes + 1
        # a recurrent state rolls back at most rollback_limit drafts exactly (llama.cpp's snapshots)
        limit = getattr(self.target, "rollback_limit", None)
        if limit is not None:
            need = min(need, limit + 1)
        r = self.target.exact_rows(need)
        rows = r if r >= 2 else MAX_VERIFY_ROWS
        return rows if limit is None else min(rows, limit + 1)

    @property
    def max_batch_rows(self) -> int:
        """:meth:`batch_rows` of the loop's default draft setting."""
        return self.batch_rows(self.draft)

    def policy_for(self, cfg: DraftConfig) -> Policy:
        """The policy object of a draft setting (cost-aware ones persist across generations)."""
        key = str(cfg)
        if key not in self._policies:
            self._policies[key] = make_policy(cfg, self.proposer)
        return self._policies[key]

    def needs_calibration(self) -> bool:
        """True if a cost-aware generation ran plainly because T(k) was not measured yet."""
        return any(p.needs_calibration() for p in self._policies.values())

    def calibrate(self) -> None:
        """Measure (once, cached on disk) what the cost-aware policies need: T(k) and the exact
        batch size. Call it when a user is not waiting (after a CLI run, at server start)."""
        for p in self._policies.values():
            widest = p.calibrate(self.target)
            if widest is not None:
                self.batch_rows(widest)
        if self.draft.mode != "none":
            self.batch_rows(self.draft)          # the default setting's exact batch size

    # ------------------------------------------------------------------ prefill

    def prefill(self, prompt: Sequence[int], max_tokens: int, sp: SamplingParams,
                draft: Optional[DraftConfig] = None, logprobs: Optional[int] = None,
                reuse: bool = True) -> tuple[Generation, StepResult]:
        """Decode the prompt (n_batch chunks; the drafter commits each chunk's K/V when the
        policy drafts) and sample the first token. ``logprobs`` (None: off): every emitted token's
        logprob and this many top alternatives (:class:`TokenLogprob` in the results).
        ``reuse``: decode only what follows the prefix the KV caches (target and drafter) still
        hold from this loop's previous generation (:class:`PrefixCache`)."""
        tgt = self.target
        prompt = np.asarray(prompt, dtype=np.int32).reshape(-1)
        if prompt.size == 0:
            raise ValueError("empty prompt")
        if prompt.size >= tgt.n_ctx:
            raise ValueError(f"the prompt ({prompt.size} tokens) does not fit the context ({tgt.n_ctx} positions)")
        cfg = (draft or self.draft) if self.proposer is not None else NO_DRAFT
        policy = self.policy_for(cfg)
        drafting, why = policy.begin(tgt, self.proposer, lambda: max(0, self.batch_rows(cfg) - 1))
        g = Generation(max_tokens, sp, policy, Draws(sp.seed) if not sp.greedy else None,
                       SpecStats(n_prompt=int(prompt.size), decision=why), drafting=drafting,
                       n_logprobs=-1 if logprobs is None else int(logprobs),
                       grammar=Grammar.compile(tgt, sp.grammar, sp.grammar_root) if sp.grammar else None)
        if drafting:
            # before the prefill: measuring it (once per model, cached) uses the KV cache
            g.max_rows = self.batch_rows(cfg)
        capture = drafting and bool(getattr(self.proposer, "needs_capture", False))
        self.prefix.shape()      # the prefill chunk: may measure the exact batch size (once per model)
        t0 = time.perf_counter()
        kept, seen = self.prefix.prepare(prompt, self.proposer, drafting, capture, reuse)
        g.stats.n_cached = kept
        for off, end in self.prefix.chunks(kept, prompt.size):    # fixed absolute positions
            logits = tgt.decode(prompt[off:end], np.arange(off, end, dtype=np.int32), capture=capture,
                                logits="last" if end == prompt.size else None)
            g.stats.prefill_calls += 1
            if capture:
                self.proposer.observe(tgt.captured_lsa_in(), off)
        last_row = adjust_rows(_eog_masked(logits[-1:], tgt, sp), sp, g.history)[0]
        g.root = _sample(self._constrained(g, last_row[None])[0], g)
        g.stats.t_prefill = time.perf_counter() - t0
        g.feed, g.n = list(prompt[seen:]), int(prompt.size)
        g.ids = list(prompt) + [g.root]
        g.t_start = time.perf_counter()
        return g, self._emit(g, [g.root], drafted=0, accepted=0, rows=0, shape="none",
                             lp=self._logprobs(g, last_row[None], [g.root]))

    def cached_prefix(self, prompt: Sequence[int]) -> int:
        """How many leading tokens of ``prompt`` the next prefill would not decode again."""
        return self.prefix.common(np.asarray(prompt, dtype=np.int32).reshape(-1))

    def settle(self) -> int:
        """Call between generations, when no one waits (a server after sending an answer, a chat
        while the user reads): re-decodes what plain one-token decodes wrote past the first KV
        block, so that the next turn reuses the whole conversation (:meth:`PrefixCache.settle`)."""
        return self.prefix.settle()

    @property
    def n_cached(self) -> int:
        """Tokens the target's KV cache holds from this loop's latest generation (0: none valid)."""
        return self.prefix.n_cached

    # ------------------------------------------------------------------ one cycle

    def step(self, g: Generation) -> StepResult:
        """One cycle: propose -> score -> verify -> commit. Call until ``result.finished``."""
        if g.run is not None:
            # a batched slot's plain run still decodes (and looks up drafts) on the engine's
            # thread: take what it chose; nothing else may touch the slot or the proposer meanwhile
            return self._run_step(g)
        room = self.target.n_ctx - g.n - 1      # KV cells left for drafts after the root
        if room < 0:
            return self._finish(g, "length")
        if g.lookahead is not None:              # drafts found on the engine's decode thread
            (proposal, cfg, t_draft), g.lookahead = g.lookahead, None
        else:
            cfg = self._shape(g, room)
            if cfg.mode == "none" and not g.carry and not g.drafting:
                if self._engine_runs(g):
                    return self._run_step(g)
                return self._plain_step(g)
            t = time.perf_counter()
            proposal = self._propose(g, cfg)
            t_draft = time.perf_counter() - t
            if not proposal.n and not g.carry and not self._captures():
                # nothing to verify (no n-gram match): a plain step, or a plain run that looks up
                # each next cycle on the decode thread until it finds drafts
                if self._lookahead_runs(g):
                    g.stats.t_drafter += t_draft
                    return self._run_step(g, lookahead=True)
                return self._plain_step(g, t_draft)
        t = time.perf_counter()
        try:
            scores = self.scorer.score(g.carry, g.root, g.n, proposal, g.drafting and self._captures(),
                                       g.max_rows)
        except CacheFullError:
            return self._finish(g, "length")     # llama.cpp left the cache unchanged
        t_target = time.perf_counter() - t
        rows = adjust_rows(_eog_masked(scores.logits, self.target, g.sp), g.sp, g.history, proposal)
        scores.logits = self._constrained(g, rows, proposal)
        verdict = verify(proposal, scores.logits, g.sp, g.cursor())
        if not g.sp.greedy:
            g.drawn += verdict.n_accepted + 1
        if self.on_cycle is not None:
            self.on_cycle(g.n, g.root, proposal, scores, verdict)
        g.carry = self.scorer.commit(g.n, proposal, scores, verdict)
        t_capture, t_commit = self._commit_drafter(g, scores, verdict)
        g.policy.update(proposal.n, verdict.n_accepted)
        g.feed = g.feed + [g.root] + verdict.tokens
        g.ids += verdict.tokens + [verdict.bonus]
        g.n += verdict.n_accepted + 1
        g.root = verdict.bonus
        st = g.stats
        st.target_calls += 1
        st.t_target += t_target
        st.t_drafter += t_draft + t_commit
        st.t_capture += t_capture
        st.record_depths(int(proposal.depths.max()) if proposal.n else 0, verdict.n_accepted)
        st.record_sources(self._source_names(), proposal, verdict.path)
        st.accept_lengths.append(verdict.n_accepted + 1)
        emitted = verdict.tokens + [verdict.bonus]
        # row 0 (the root's) chose the first token, node i's row (i + 1) its child on the path
        lp = self._logprobs(g, rows[[0] + [i + 1 for i in verdict.path]], emitted)
        names = self._source_names()
        origins = [proposal.source_of(i, names) for i in verdict.path] + ["target"]
        return self._emit(g, emitted, proposal.n, verdict.n_accepted,
                          proposal.draft_rows, str(cfg), t_draft + t_commit, t_target, t_capture, lp=lp,
                          origins=origins)

    def _plain_step(self, g: Generation, t_draft: float = 0.0) -> StepResult:
        """Plain decoding (nothing drafted, nothing to commit): decode the root alone, sample.
        The same as a step with an empty proposal, without the bookkeeping (it is the baseline
        a user compares with, so it must cost no more than llama.cpp's own loop). ``t_draft``:
        a proposer's time on this cycle that found nothing to draft."""
        t = time.perf_counter()
        one = getattr(self.target, "decode_one", None)
        try:
            if one is not None and self.on_cycle is None:
                logits = one(g.root, g.n)       # a view, read before the next decode
            else:
                logits = self.target.decode((g.root,), (g.n,), capture=False)
        except CacheFullError:
            return self._finish(g, "length")
        t_target = time.perf_counter() - t
        logits = adjust_rows(_eog_masked(logits, self.target, g.sp), g.sp, g.history)
        nxt = _sample(self._constrained(g, logits)[0], g)
        if self.on_cycle is not None:
            self.on_cycle(g.n, g.root, Proposal.empty(), Scores(logits, np.zeros(1, np.int64)), Verdict([], [], nxt))
        g.feed.append(g.root)
        g.ids.append(nxt)
        g.n += 1
        g.root = nxt
        st = g.stats
        st.target_calls += 1
        st.t_target += t_target
        st.t_drafter += t_draft
        st.accept_lengths.append(1)
        return self._emit(g, [nxt], 0, 0, 0, "none", t_draft, t_target, 0.0, lp=self._logprobs(g, logits[:1], [nxt]))

    def _engine_runs(self, g: Generation) -> bool:
        """Whether the rest of ``g`` decodes plainly on a batched slot's engine (:meth:`_run_step`):
        the next token is the argmax or the draw of one row, nothing else reads it (no grammar,
        penalties, bias, logprobs or cycle observer)."""
        return hasattr(self.target, "plain_run") and g.grammar is None \
            and not g.sp.adjusts_logits and g.n_logprobs < 0 and self.on_cycle is None

    def _lookahead_runs(self, g: Generation) -> bool:
        """Whether ``g``'s cycles that find nothing to draft run on the engine (:meth:`_run_step`
        with a :class:`_Lookahead`): the proposer's lookups are deterministic and read only the
        tokens (``engine_lookup``: the n-gram proposer), and the policy prices nothing it measures
        in time (fixed, or per lookup after the fact), so the decode thread can shape and look up
        each next cycle exactly as :meth:`step` would. On chat text most cycles find nothing:
        they then cost a plain run's step, not two thread switches each."""
        return bool(getattr(self.proposer, "engine_lookup", False)) and self._engine_runs(g) \
            and not g.carry and (g.policy.contextual or not g.policy.adaptive)

    def _run_step(self, g: Generation, lookahead: bool = False) -> StepResult:
        """Plain decoding on a batched slot, driven by the engine's decode thread
        (:class:`~moa_cpp.target.slots.PlainRun`: it chooses each token with :func:`_sample`, as
        :meth:`_plain_step` does, and decodes it at once); this takes the tokens chosen since the
        last step, at least one, and emits them. ``lookahead``: the decode thread also looks up
        drafts for each token it chooses and ends the run at the first that has some
        (:class:`_Lookahead`); the next step verifies them."""
        if g.run is None:
            tgt, sp = self.target, g.sp
            probe = _Lookahead(self, g) if lookahead else None
            g.run = tgt.plain_run(g.root, g.n, lambda row: _sample(_eog_masked(row[None], tgt, sp)[0], g),
                                  g.max_tokens - g.generated, probe=probe)
        run = g.run
        t = time.perf_counter()
        toks, ended, err = run.take()
        t_target = time.perf_counter() - t
        if ended:
            g.run = None
        if err is not None:
            if isinstance(err, CacheFullError):
                return self._finish(g, "length")
            raise err
        probe = run.probe
        if probe is None:
            g.feed.append(g.root)
            g.feed += toks[:-1]
        elif ended:
            # the proposer has seen the text up to the root of its last lookup
            g.feed = probe.feed_until(g.n + len(toks))
        g.ids += toks
        g.n += len(toks)
        g.root = toks[-1]
        st = g.stats
        st.target_calls += len(toks)
        st.t_target += t_target
        st.accept_lengths += [1] * len(toks)
        return self._emit(g, toks, 0, 0, 0, "none", 0.0, t_target, 0.0)

    def stop(self, g: Generation) -> None:
        """End ``g`` early (a stop string, a client gone): a batched slot's plain run is stopped
        and the cells it decoded past ``g``'s root dropped, so the caches hold what a plain loop
        would have left. :meth:`run` calls it when its consumer stops early."""
        if g.run is None:
            return
        run, g.run = g.run, None
        self.target.stop_run(run)
        self.target.rollback(g.n)
        self.prefix.record(g)

    @staticmethod
    def _constrained(g: Generation, rows: np.ndarray, proposal: Optional[Proposal] = None) -> np.ndarray:
        """``rows`` under the generation's grammar (each row by its own path's state), if any."""
        return rows if g.grammar is None else constrain_rows(rows, g.grammar, g.sp.greedy, proposal)

    @staticmethod
    def _logprobs(g: Generation, rows: np.ndarray, tokens: list) -> Optional[list]:
        # rows before the grammar: logprobs are the model's, as llama-cpp-python reports them
        return token_logprobs(rows, tokens, g.n_logprobs) if g.n_logprobs >= 0 else None

    def _captures(self) -> bool:
        return bool(getattr(self.proposer, "needs_capture", False))

    def _source_names(self) -> list:
        """The statistics' names of the proposer's sources (bit order of ``Proposal.sources``)."""
        names = getattr(self.proposer, "names", None)
        return list(names) if names else [getattr(self.proposer, "name", "draft")]

    def _shape(self, g: Generation, room: int, generated: Optional[int] = None) -> DraftConfig:
        """This cycle's draft shape: the policy's choice, cut to the tokens left and the room
        (``generated``: the tokens emitted by then, when a plain run is ahead of ``g``)."""
        if not g.drafting:
            return NO_DRAFT
        st = g.stats
        policy = g.policy
        if policy.adaptive:
            # seconds per drafted row, without a proposer's catch-up on the prompt (warmup_s: a
            # draft model prefilling 200 prompt tokens at its first proposal priced each of its
            # first rows like 50 and stopped drafting at 75 % acceptance)
            cfg = policy.choose((st.t_drafter - st.t_drafter_warmup) / st.draft_rows if st.draft_rows else None)
            if cfg.mode == "none" and policy.gave_up():
                # drafting does not pay here: plain decoding for the rest of this generation,
                # without capture and drafter commits
                g.drafting = False
                st.decision += "; stopped drafting: the observed acceptance does not pay"
            if not policy.contextual:    # else counted once fit() priced the lookup
                st.auto_choices[cfg.chain if cfg.mode == "chain" else 0] = \
                    st.auto_choices.get(cfg.chain if cfg.mode == "chain" else 0, 0) + 1
        else:
            cfg = policy.choose(None)
        left = g.max_tokens - (g.generated if generated is None else generated)
        return fit_chain(cfg, min(left, room, g.max_rows - 1 - len(g.carry)))

    def _propose(self, g: Generation, cfg: DraftConfig, at: Optional[tuple] = None) -> Proposal:
        """The proposer's drafts for ``g``'s root (``at``: (feed, root, pos) of a root a plain
        run is at, ahead of ``g``), cut to what the policy prices and what fits."""
        if cfg.mode == "none":
            return Proposal.empty()
        if cfg.mode == "tree" and not getattr(self.target, "holds_trees", True):
            cfg = replace(cfg, mode="chain", chain=min(cfg.depth, cfg.total))   # a batched slot: its main path
        if at is None:
            feed, root, pos = g.feed, g.root, g.n
            g.feed = []
        else:
            feed, root, pos = at
        proposal = self.proposer.propose(feed, root, pos, g.sp, g.cursor(), cfg)
        if proposal.n and not getattr(self.target, "holds_trees", True) and not proposal.is_chain():
            # a batched slot has one sequence: verify the tree's main path (its best guess)
            proposal = proposal.along(main_path(proposal))
        if g.policy.contextual:
            # a free lookup priced after the fact: keep the drafts that pay for this match
            k = g.policy.fit(self.proposer.context) if proposal.n else 0
            proposal = proposal.prefix(k)
            g.stats.auto_choices[k] = g.stats.auto_choices.get(k, 0) + 1
        if proposal.n < self.draft_min:
            proposal = replace(Proposal.empty(proposal.draft_rows), warmup_s=proposal.warmup_s)
        room = self.target.n_ctx - pos - 1
        cap = min(g.max_rows - 1 - len(g.carry), room) if proposal.n else 0
        if proposal.n > cap:
            proposal = proposal.prefix(max(0, cap))
        g.stats.draft_rows += proposal.draft_rows
        g.stats.t_drafter_warmup += proposal.warmup_s
        g.stats.drafted += proposal.n
        return proposal

    def _commit_drafter(self, g: Generation, scores, verdict) -> tuple[float, float]:
        """The drafter commits the K/V of the root and the accepted rows (LSA -> CA cache)."""
        if not (g.drafting and self._captures()):
            return 0.0, 0.0
        rows = [int(scores.batch_row[0])] + [int(scores.batch_row[i + 1]) for i in verdict.path]
        t = time.perf_counter()
        lsa = self.target.captured_lsa_in(rows)
        t_capture = time.perf_counter() - t
        t = time.perf_counter()
        self.proposer.observe(lsa, g.n)
        return t_capture, time.perf_counter() - t

    # ------------------------------------------------------------------ results

    def _emit(self, g: Generation, candidates: list, drafted: int, accepted: int, rows: int, shape: str,
              t_drafter: float = 0.0, t_target: float = 0.0, t_capture: float = 0.0,
              lp: Optional[list] = None, origins: Sequence[str] = ()) -> StepResult:
        """Emit verified tokens up to EOG / max_tokens; update the generation's stats.
        ``origins``: who chose each candidate (default: the target, as in prefill and plain steps)."""
        self.prefix.record(g)
        out: list = []
        reason = ""
        for tok in candidates:
            if self.target.is_eog(tok):
                reason = "stop"
                g.stats.eog_token = tok
                break
            if g.generated + len(out) >= g.max_tokens:
                reason = "length"
                break
            if g.grammar is not None:
                if not g.grammar.allows(tok):
                    if self._grammar_done(g):
                        reason = "stop"    # the grammar is complete and EOG was masked (ignore_eos)
                        break
                    raise RuntimeError(f"internal error: token {tok} was verified against a row the grammar "
                                       "does not allow it in")
                g.grammar.accept(tok)
            out.append(tok)
        g.generated += len(out)
        if g.sp.penalized:
            g.history += out
        if not reason and g.generated >= g.max_tokens:
            reason = "length"
        st = g.stats
        origins = tuple(origins[:len(out)]) if origins else ("target",) * len(out)
        for o in origins:
            st.emitted_from[o] = st.emitted_from.get(o, 0) + 1
        st.n_generated = g.generated
        st.accepted += accepted
        st.t_total = time.perf_counter() - g.t_start
        if reason:
            g.finished = True
            st.finish_reason = reason
        return StepResult(tuple(out), drafted, accepted, rows, shape, g.finished, reason, t_drafter, t_target,
                          t_capture, tuple(lp[:len(out)]) if lp else (), origins)

    def _grammar_done(self, g: Generation) -> bool:
        return any(g.grammar.allows(int(t)) for t in self.target.eog_tokens)

    def _finish(self, g: Generation, reason: str) -> StepResult:
        self.prefix.record(g)
        g.finished = True
        g.stats.finish_reason = reason
        g.stats.t_total = time.perf_counter() - g.t_start
        return StepResult((), finished=True, finish_reason=reason)

    # ------------------------------------------------------------------ driver

    def run(self, prompt: Sequence[int], max_tokens: int, sp: SamplingParams,
            draft: Optional[DraftConfig] = None, logprobs: Optional[int] = None,
            reuse: bool = True) -> Iterator[StepEvent]:
        """Yield the tokens of each step; the last event's stats are final. EOG ends the
        generation (the EOG token itself is not emitted); so do ``max_tokens`` and a full
        context (finish_reason "length"). Stop strings are the caller's job."""
        if max_tokens <= 0:
            return
        g, r = self.prefill(prompt, max_tokens, sp, draft, logprobs, reuse)
        try:
            yield StepEvent(list(r.tokens), g.stats, list(r.logprobs), list(r.origins))
            while not g.finished:
                r = self.step(g)
                yield StepEvent(list(r.tokens), g.stats, list(r.logprobs), list(r.origins))
        finally:
            self.stop(g)
