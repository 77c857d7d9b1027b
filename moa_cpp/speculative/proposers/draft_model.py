"""Draft-model speculation (llama.cpp's classic ``speculative`` example): a small model with the
target's tokenizer drafts a chain greedily (or by sampling), the target verifies it.

The proposer owns a second llama.cpp context on the draft model and keeps its KV cache in step
with the verified tokens: every cycle it drops the rejected drafts (``rollback``), decodes the
newly verified tokens and the root in one batch (logits of the last row only), then drafts one
token per single-token decode. It reads no target state (``needs_capture = False``), so any
target works as long as the tokenizers agree (e.g. Qwen2.5-Coder-0.5B drafting for the 1.5B,
or a Q8_0 copy of a model drafting for its Q4 copy).

Example::

    from moa_cpp.speculative import DraftConfig, SpeculativeLoop
    from moa_cpp.speculative.proposers import DraftModelProposer
    from moa_cpp.target.target import Target

    target = Target.from_path("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    prop = DraftModelProposer.from_path("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", target=target)
    loop = SpeculativeLoop(target, prop, DraftConfig("chain", chain=4))
"""
from __future__ import annotations

import inspect
import os
import time
from typing import Optional, Sequence, Union

import numpy as np

from moa_cpp.errors import InvalidArgumentError, MoaError
from moa_cpp.target.target import Target
from moa_cpp.speculative.types import DraftConfig, Proposal, SamplingParams
from moa_cpp.speculative.verify import probs_from_logits

# Probe strings for the tokenizer check: prose, code, digits, whitespace, non-ASCII.
_PROBES = ("The quick brown fox jumps over the lazy dog.",
           "def f(x):\n    return [i ** 2 for i in range(x)]  # 12345",
           "Grüße, 東京 — naïve café!\t\n  end")


def _supports_last_logits() -> bool:
    try:
        return "logits" in inspect.signature(Target.decode).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False


def check_same_tokenizer(target: Target, draft: Target) -> None:
    """Raise InvalidArgumentError unless ``draft`` tokenizes like ``target`` (same ids for probe
    texts, same BOS/EOS). The vocabulary sizes may differ (padding rows), the ids may not."""
    if target.bos_token != draft.bos_token or target.eos_token != draft.eos_token:
        raise InvalidArgumentError(
            f"draft model {draft.path.name} has BOS/EOS {draft.bos_token}/{draft.eos_token}, the target "
            f"{target.path.name} {target.bos_token}/{target.eos_token}: the tokenizers differ")
    for text in _PROBES:
        a, b = target.tokenize(text), draft.tokenize(text)
        if not np.array_equal(a, b):
            raise InvalidArgumentError(f"draft model {draft.path.name} tokenizes {text!r} differently from the "
                                       f"target {target.path.name}: a draft model needs the target's tokenizer")


class DraftModelProposer:
    """Chains drafted by a small llama.cpp model (a :class:`Target` without capture).

    Satisfies the loop's Proposer protocol. ``draft_rows`` (also set on each Proposal) counts
    the draft model's logits rows of the last propose: the root's row and one per further
    drafted token (the verified tokens decoded in the root's batch are in :attr:`catchup_rows`,
    as MoAProposer does not count its SA feed either). Greedy: the chain is the draft model's arg-max; sampling (temperature > 0):
    each token is drawn from the draft model's distribution under the same temperature / top-k /
    top-p, and those distributions are returned as ``Proposal.q`` so that the verifier's
    speculative sampling keeps the target's output distribution.
    """

    name = "draft"
    chains_only = True
    needs_capture = False
    acceptance_prior = None    # unknown before drafting (the cost-aware policy learns it)
    row_cost = None            # seconds per drafted row: measured as it drafts

    def __init__(self, draft: Target, config: DraftConfig = DraftConfig("chain", chain=4), *,
                 n_target_vocab: Optional[int] = None, owns_draft: bool = False) -> None:
        if config.mode == "tree":
            raise InvalidArgumentError("DraftModelProposer drafts chains only (DraftConfig('chain', ...) or 'auto')")
        self.draft = draft
        self.config = config
        self.n_target_vocab = int(n_target_vocab or draft.n_vocab)
        self._owns = owns_draft
        self._last_only = _supports_last_logits()
        self.draft_rows = 0
        self.catchup_rows = 0
        self._hist: list[int] = []     # verified tokens (positions 0..) the proposer knows of
        self._kv: list[int] = []       # tokens whose K/V the draft context holds, positions 0..
        self._synced = 0               # leading positions where _kv is known to equal _hist
        self._fresh = True             # the next catch-up decodes a generation's prompt (warmup_s)

    @classmethod
    def from_path(cls, draft_path: Union[str, os.PathLike], config: DraftConfig = DraftConfig("chain", chain=4), *,
                  target: Optional[Target] = None, n_ctx: Optional[int] = None, n_threads: Optional[int] = None,
                  n_batch: int = 512, check_tokenizer: bool = True, **target_kwargs) -> "DraftModelProposer":
        """Load the draft model in its own context (no K/V capture, one sequence).

        ``target`` (recommended) sizes the context like the target's and checks that the
        tokenizers agree. Other keywords go to :meth:`Target.from_path` (``repack``, ...).
        """
        if n_ctx is None:
            n_ctx = target.n_ctx if target is not None else 4096
        if n_threads is None and target is not None:
            n_threads = target.n_threads
        draft = Target.from_path(draft_path, n_ctx=n_ctx, n_threads=n_threads, n_batch=n_batch, n_seq_max=1,
                                 install_callback=False, **target_kwargs)
        try:
            if target is not None and check_tokenizer:
                check_same_tokenizer(target, draft)
            return cls(draft, config, n_target_vocab=target.n_vocab if target is not None else None,
                       owns_draft=True)
        except BaseException:
            draft.close()
            raise

    # ------------------------------------------------------------------ Proposer protocol

    def reset(self) -> None:
        """Forget everything (a new generation)."""
        self.draft.clear()
        self._hist, self._kv, self._synced = [], [], 0
        self.draft_rows = self.catchup_rows = 0
        self._fresh = True

    def rewind(self, n: int) -> int:
        """Keep the verified tokens < ``n`` (a reused prompt prefix); returns how many are kept.
        The draft model's own KV cache is kept too: the next catch-up decodes only what differs."""
        m = min(int(n), len(self._hist))
        del self._hist[m:]
        self._synced = min(self._synced, m)
        self.draft_rows = self.catchup_rows = 0
        self._fresh = True
        return m

    def observe(self, lsa_in: np.ndarray, pos0: int) -> None:  # reads no target state
        pass

    def propose(self, feed: Sequence[int], root: int, pos: int, sp: SamplingParams,
                rng: Optional[np.random.Generator] = None, config: Optional[DraftConfig] = None) -> Proposal:
        """Draft ``config.chain`` tokens after ``root`` (position ``pos``); ``feed`` = the tokens
        verified since the last propose (after :meth:`reset`: the whole prompt)."""
        cfg = config or self.config
        self._hist.extend(int(t) for t in feed)
        if len(self._hist) != pos:
            raise MoaError(f"DraftModelProposer out of step: {len(self._hist)} verified tokens known, the root is at "
                           f"position {pos} (call reset() before a new generation)")
        self.draft_rows = self.catchup_rows = 0
        if cfg.mode == "none":
            return Proposal.empty()
        if cfg.mode == "tree":
            raise InvalidArgumentError("DraftModelProposer drafts chains only (DraftConfig('chain', ...) or 'auto')")
        if not sp.greedy and rng is None:
            raise ValueError("sampling drafts need an explicit np.random.Generator")
        k = int(cfg.chain)
        if pos + k > self.draft.n_ctx:
            raise MoaError(f"the draft model's context ({self.draft.n_ctx} positions) is too small for position "
                           f"{pos} + {k} drafts")
        t0 = time.perf_counter()
        logits = self._catch_up(int(root), pos)
        # the first catch-up of a generation decodes its prompt: prefill work, not a per-row cost
        warmup = time.perf_counter() - t0 if self._fresh else 0.0
        self._fresh = False
        self.draft_rows = 1
        tokens: list[int] = []
        qs: Optional[list] = None if sp.greedy else []
        for i in range(k):
            tok, q = self._pick(logits, sp, rng)
            tokens.append(tok)
            if qs is not None:
                qs.append(q)
            if i + 1 < k:                     # the last draft needs no logits: not decoded
                logits = self._decode_last([tok], pos + 1 + i)
                self._kv.append(tok)
                self.draft_rows += 1
        n = len(tokens)
        proposal = Proposal(np.array(tokens, np.int32), np.arange(-1, n - 1, dtype=np.int32),
                            np.arange(1, n + 1, dtype=np.int32), None, qs)
        proposal.draft_rows = self.draft_rows     # the loop's statistic (a Proposal field)
        proposal.warmup_s = warmup
        return proposal

    # ------------------------------------------------------------------ internals

    def _decode_last(self, tokens: Sequence[int], pos0: int) -> np.ndarray:
        """Decode ``tokens`` at positions pos0.. in one batch; the last row's logits."""
        pos = np.arange(pos0, pos0 + len(tokens), dtype=np.int32)
        if self._last_only:
            return self.draft.decode(tokens, pos, capture=False, logits="last")[-1]
        return self.draft.decode(tokens, pos, capture=False)[-1]  # pragma: no cover - older Target

    def _catch_up(self, root: int, pos: int) -> np.ndarray:
        """Bring the draft KV to ``verified + [root]`` (positions 0..pos): drop what differs
        (rejected drafts), decode the rest in n_batch chunks; the root row's logits."""
        want = self._hist
        c = self._synced
        n_kv = len(self._kv)
        while c < n_kv and c < pos and self._kv[c] == want[c]:
            c += 1
        if c < n_kv:
            self.draft.rollback(c)
            del self._kv[c:]
        todo = want[c:pos] + [root]
        nb = self.draft.n_batch
        logits = None
        for off in range(0, len(todo), nb):
            chunk = todo[off: off + nb]
            logits = self._decode_last(chunk, c + off)
        self._kv.extend(todo)
        self._synced = pos                    # positions < pos are verified and now in the KV
        self.catchup_rows = len(todo) - 1
        return logits

    def _pick(self, logits: np.ndarray, sp: SamplingParams,
              rng: Optional[np.random.Generator]) -> tuple[int, Optional[np.ndarray]]:
        v = self.n_target_vocab
        lg = logits[:v] if logits.shape[-1] > v else logits
        if sp.greedy:
            return int(np.argmax(lg)), None
        q = probs_from_logits(lg, sp)
        if q.size < v:                        # draft vocabulary smaller than the target's
            q = np.concatenate([q, np.zeros(v - q.size)])
        return int(rng.choice(q.size, p=q)), q

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Free the draft model's context (and model) if this proposer loaded it."""
        if self._owns and self.draft is not None:
            self.draft.close()

    def __enter__(self) -> "DraftModelProposer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DraftModelProposer({self.draft.path.name!r}, {self.config})"
