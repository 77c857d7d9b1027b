"""The speculative loop: prefill, then cycles of propose -> score (one target decode) ->
verify -> commit, until EOG, a stop string or max_tokens.

Bookkeeping per cycle (moa-architecture.md §12): the root (position n) is the last emitted
token, not yet decoded by the target. The verification decode writes the root and the draft
nodes; after acceptance of a nodes the target keeps positions n..n+a, the drafter commits the
K/V of those a+1 rows (LSA -> CA cache) and feeds their tokens to its SA context at the next
cycle, and the bonus token becomes the next root at n+a+1.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Optional, Protocol, Sequence

import numpy as np

from ..target import Target
from .proposal import Proposal
from .cost import AcceptanceTracker, best_chain_length, measure_verify_cost
from .proposer import DraftConfig
from .scorer import TargetScorer
from .stats import SpecStats
from .verify import SamplingParams, probs_from_logits, verify


class Proposer(Protocol):
    """What the loop needs from a drafter."""

    needs_capture: bool
    draft_rows: int

    def reset(self) -> None: ...
    def observe(self, lsa_in: np.ndarray, pos0: int) -> None: ...
    def propose(self, feed: Sequence[int], root: int, pos: int, sp: SamplingParams,
                rng: Optional[np.random.Generator], config: Optional[DraftConfig] = None) -> Proposal: ...


@dataclass
class StepEvent:
    """Tokens emitted by one step (prefill or cycle) of a streaming generation."""

    tokens: list
    stats: SpecStats


class SpeculativeLoop:
    """Drives one generation at a time over a :class:`Target` and an optional proposer."""

    def __init__(self, target: Target, proposer: Optional[Proposer], draft: DraftConfig) -> None:
        self.target = target
        # Verification batches are kept to at most this many rows: measured on this CPU, llama.cpp
        # computes a row bit-identically to a single-token decode in batches of up to 63 rows
        # (SmolLM2 Q4_1 / Q8_0, flash attention); at 64 rows another kernel path takes over.
        self.max_batch_rows = 63
        # cost-aware mode: T(k) of this target (measured once, cached on disk) and the
        # acceptance seen so far, kept across generations
        self._verify_cost: Optional[dict] = None
        self.tracker = AcceptanceTracker()
        self.auto_give_up = 16     # consecutive "don't draft" decisions that end drafting for a generation
        # Optional observer of every cycle: on_cycle(pos, root, proposal, scores, verdict) (tests,
        # diagnostics). Called after verification, before the commit.
        self.on_cycle = None
        self.proposer = proposer
        self.draft = draft if proposer is not None else DraftConfig("none")
        self.scorer = TargetScorer(target)

    def _sample(self, logits: np.ndarray, sp: SamplingParams, rng: Optional[np.random.Generator]) -> int:
        if sp.greedy:
            return int(np.argmax(logits))
        return int(rng.choice(logits.shape[-1], p=probs_from_logits(logits, sp)))

    def run(self, prompt: Sequence[int], max_tokens: int, sp: SamplingParams,
            draft: Optional[DraftConfig] = None) -> Iterator[StepEvent]:
        """Yield the tokens of each step; the last event's stats are final. EOG ends the
        generation (the EOG token itself is not emitted). Stop strings are the caller's job."""
        cfg = draft or self.draft
        if self.proposer is None:
            cfg = DraftConfig("none")
        tgt = self.target
        prompt = np.asarray(prompt, dtype=np.int32).reshape(-1)
        if prompt.size == 0:
            raise ValueError("empty prompt")
        if prompt.size + max_tokens + 2 * cfg.max_nodes + 1 > tgt.n_ctx:
            raise ValueError(f"prompt ({prompt.size}) + max_tokens ({max_tokens}) + drafts exceed the context "
                             f"({tgt.n_ctx} positions)")
        rng = np.random.default_rng(sp.seed) if not sp.greedy else None
        stats = SpecStats(n_prompt=int(prompt.size))
        capture = cfg.mode != "none" and bool(getattr(self.proposer, "needs_capture", False))
        if cfg.mode == "auto" and (self._verify_cost is None or cfg.chain + 1 not in self._verify_cost):
            self._verify_cost = measure_verify_cost(tgt, ks=tuple(range(1, cfg.chain + 2)))
        tgt.clear()
        if self.proposer is not None:
            self.proposer.reset()

        # Prefill, in n_batch chunks; the drafter commits every chunk's K/V.
        t0 = time.perf_counter()
        logits = None
        for off in range(0, prompt.size, tgt.n_batch):
            chunk = prompt[off: off + tgt.n_batch]
            logits = tgt.decode(chunk, np.arange(off, off + chunk.size, dtype=np.int32), capture=capture)
            stats.prefill_calls += 1
            if capture:
                self.proposer.observe(tgt.captured_lsa_in(), off)
        root = self._sample(logits[-1], sp, rng)
        stats.t_prefill = time.perf_counter() - t0
        feed = list(prompt)        # verified tokens the drafter's SA context has not seen yet
        n = int(prompt.size)
        auto = (self._verify_cost, self.tracker) if cfg.mode == "auto" else None
        idle = 0               # consecutive cost-aware decisions not to draft
        carry: list = []       # verified tokens the target must (re)decode ahead of the next root
        generated = 0

        t_start = time.perf_counter()
        if max_tokens <= 0:
            return
        if tgt.is_eog(root):
            stats.finish_reason = "stop"
            stats.eog_token = root
            stats.t_total = time.perf_counter() - t_start
            yield StepEvent([], stats)
            return
        generated = 1
        stats.n_generated = 1
        yield StepEvent([root], stats)
        while generated < max_tokens:
            # propose
            t = time.perf_counter()
            left = max_tokens - generated
            step_cfg = cfg
            if auto is not None:
                t_row = stats.t_drafter / stats.draft_rows if stats.draft_rows else 0.2 * auto[0][1]
                k = best_chain_length(auto[0], auto[1], t_row, 0.0, k_max=cfg.chain)
                idle = idle + 1 if k == 0 else 0
                if k == 0 and idle >= self.auto_give_up:
                    # drafting does not pay here: plain decoding for the rest of this generation,
                    # without capture and drafter commits
                    auto, capture = None, False
                    cfg = DraftConfig("none")
                elif k == 0 and idle % 4 == 3:
                    k = 1                  # keep measuring acceptance while plain decoding wins
                step_cfg = DraftConfig("chain", chain=k) if k else DraftConfig("none")
                stats.auto_choices[k] = stats.auto_choices.get(k, 0) + 1
            if step_cfg.mode == "chain" and step_cfg.chain > left:
                step_cfg = DraftConfig("chain", chain=left)
            if step_cfg.mode == "none":
                proposal = Proposal.empty()
            else:
                proposal = self.proposer.propose(feed, root, n, sp, rng, step_cfg)
                stats.draft_rows += self.proposer.draft_rows
                feed = []
            if len(carry) + 1 + proposal.n > self.max_batch_rows:
                proposal = proposal.prefix(self.max_batch_rows - 1 - len(carry))
            stats.t_drafter += time.perf_counter() - t
            # score: one target decode
            t = time.perf_counter()
            scores = self.scorer.score(carry, root, n, proposal, capture)
            stats.t_target += time.perf_counter() - t
            stats.target_calls += 1
            # verify
            verdict = verify(proposal, scores.logits, sp, rng)
            if self.on_cycle is not None:
                self.on_cycle(n, root, proposal, scores, verdict)
            # commit: target KV, drafter CA cache
            carry = self.scorer.commit(n, proposal, scores, verdict)
            rows = [int(scores.batch_row[0])] + [int(scores.batch_row[i + 1]) for i in verdict.path]
            if capture and cfg.mode != "none":
                t = time.perf_counter()
                lsa = tgt.captured_lsa_in(rows)
                stats.t_capture += time.perf_counter() - t
                t = time.perf_counter()
                self.proposer.observe(lsa, n)
                stats.t_drafter += time.perf_counter() - t
            a = verdict.n_accepted
            stats.drafted += proposal.n
            stats.accepted += a
            stats.record_depths(int(proposal.depths.max()) if proposal.n else 0, a)
            stats.accept_lengths.append(a + 1)
            if auto is not None and proposal.n:
                auto[1].update(proposal.n, a)
            feed = feed + [root] + verdict.tokens     # now verified, not yet in the drafter's SA context
            n += a + 1
            root = verdict.bonus
            out = []
            finished = False
            for tok in verdict.tokens + [verdict.bonus]:
                if tgt.is_eog(tok):
                    finished = True
                    stats.eog_token = tok
                    break
                out.append(tok)
                if generated + len(out) >= max_tokens:
                    break
            generated += len(out)
            stats.n_generated = generated
            stats.t_total = time.perf_counter() - t_start
            if finished:
                stats.finish_reason = "stop"
                yield StepEvent(out, stats)
                return
            yield StepEvent(out, stats)
        stats.finish_reason = "length"
        stats.t_total = time.perf_counter() - t_start
