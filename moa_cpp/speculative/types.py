"""Plain data of the speculative loop (vLLM's spec-decode shape): what a proposer drafts
(:class:`Proposal`), what the scorer returns (:class:`Scores`), what the verifier decides
(:class:`Verdict`), the settings (:class:`DraftConfig`, :class:`SamplingParams`), the per-step
result (:class:`StepResult`, immutable), the per-generation statistics (:class:`SpecStats`) and
the :class:`Proposer` protocol. No behaviour beyond small helpers on the data."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional, Protocol, Sequence

import numpy as np


# ---------------------------------------------------------------------------- settings

@dataclass(frozen=True)
class SamplingParams:
    """Target sampling settings. temperature 0 = greedy.

    ``ignore_eos`` (llama.cpp's ``--ignore-eos`` / server field): end-of-generation tokens get
    logit -inf in every target row, so a generation runs to ``max_tokens`` or the context end.
    It changes the target's distribution the same way for plain and speculative decoding."""

    temperature: float = 0.0
    top_k: int = 0          # 0 = off
    top_p: float = 1.0      # 1 = off
    seed: Optional[int] = None
    ignore_eos: bool = False
    min_p: float = 0.0      # 0 = off; llama.cpp's: keep tokens with p >= min_p * p_max
    # penalties over the last ``penalty_last_n`` generated tokens (llama.cpp's penalties sampler,
    # fed the sampled tokens as llama-cpp-python feeds it): greedy decoding sees them too
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    logit_bias: tuple = ()  # ((token id, bias), ...) added to the logits first
    # GBNF text (llama.cpp's grammar): every row constrained after the penalties, as
    # llama-cpp-python chains it (:mod:`moa_cpp.speculative.grammar`)
    grammar: Optional[str] = None
    grammar_root: str = "root"

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalized(self) -> bool:
        return self.penalty_last_n != 0 and (self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0
                                              or self.presence_penalty != 0.0)

    @property
    def adjusts_logits(self) -> bool:
        """True if rows need :func:`moa_cpp.speculative.penalties.adjust_rows` (bias or penalties)."""
        return bool(self.logit_bias) or self.penalized


@dataclass(frozen=True)
class DraftConfig:
    """How much to draft per cycle.

    mode "chain": ``chain`` tokens drafted one after another.
    mode "tree": EAGLE-2 dynamic tree with ``depth`` draft levels, ``topk`` children per expanded
    node and frontier width, ``total`` nodes verified (the paper: 6, 8, 62).
    mode "auto": a chain whose length (0..``chain``) is chosen every cycle from the measured
    verify cost T(k) and the acceptance observed so far (:mod:`moa_cpp.speculative.policy`).
    mode "none": no drafts (plain decoding through the same loop).

    ``budget`` (0: none): the most draft nodes a cycle may verify in all, whatever the shape; the
    cost-aware policy sets it to the k drafts it priced, so that a proposer merging several
    sources (:mod:`moa_cpp.speculative.proposers.hybrid`) stays within that price.
    ``free_only``: such a proposer drafts with its free sources (prompt lookup) alone this cycle,
    the model sources only taking in the verified tokens (the cost-aware policy's choice while
    the model sources' rows do not pay: :class:`~moa_cpp.speculative.policy.HybridPolicy`).
    """

    mode: str = "chain"
    chain: int = 3
    depth: int = 6
    topk: int = 8
    total: int = 62
    budget: int = 0
    free_only: bool = False

    def __post_init__(self) -> None:
        if self.mode not in ("chain", "tree", "none", "auto"):
            raise ValueError(f"draft mode {self.mode!r}: expected chain, tree, auto or none")
        if self.mode in ("chain", "auto") and self.chain < 1:
            raise ValueError("chain length must be >= 1")
        if self.mode == "tree" and (self.depth < 1 or self.topk < 1 or self.total < 1):
            raise ValueError("tree depth, topk and total must be >= 1")
        if self.budget < 0:
            raise ValueError("draft budget must be >= 0")

    @property
    def max_nodes(self) -> int:
        return {"chain": self.chain, "auto": self.chain, "tree": self.total, "none": 0}[self.mode]

    @property
    def max_draft_rows(self) -> int:
        """Drafter rows per cycle (for sizing the drafter state)."""
        if self.mode in ("chain", "auto"):
            return self.chain
        if self.mode == "tree":
            return 1 + self.topk * max(0, self.depth - 1)
        return 0

    def __str__(self) -> str:
        if self.mode == "tree":
            return f"tree:{self.depth},{self.topk},{self.total}"
        if self.mode in ("chain", "auto"):
            return f"{self.mode}:{self.chain}"
        return "none"


NO_DRAFT = DraftConfig("none")


# ---------------------------------------------------------------------------- proposal / verdict

@dataclass
class Proposal:
    """Draft nodes below the root (the root itself is the last emitted token, not a draft).

    Nodes are in an order where parents precede children. ``draft_rows`` is the proposer's own
    statistic: drafter (or draft-model) rows it computed to make this proposal (a tree computes
    more rows than it proposes).
    """

    tokens: np.ndarray                 # int32 [n] target token ids
    parents: np.ndarray                # int32 [n] index of the parent node, -1 = the root
    depths: np.ndarray                 # int32 [n] 1 = child of the root
    scores: Optional[np.ndarray] = None    # float32 [n] cumulative draft log-prob (tree ranking)
    # Sampling only: the draft distribution each node was drawn from ("q"), per node, over the
    # target vocabulary; None for deterministic (arg-max / top-k) drafts.
    q: Optional[list] = None
    draft_rows: int = 0
    # Which sources proposed each node (int64 [n], bit s = source s of a hybrid proposer); None: one
    # source, the proposer itself
    sources: Optional[np.ndarray] = None
    # Seconds of this proposal's making that caught the proposer up on the prompt (a draft model
    # decoding it at a generation's first proposal): prefill work, not a cost per drafted row
    warmup_s: float = 0.0

    @property
    def n(self) -> int:
        return int(self.tokens.size)

    @staticmethod
    def empty(draft_rows: int = 0) -> "Proposal":
        z = np.zeros(0, np.int32)
        return Proposal(z, z.copy(), z.copy(), np.zeros(0, np.float32), draft_rows=draft_rows)

    @staticmethod
    def chain(tokens: Sequence[int], q: Optional[list] = None, draft_rows: int = 0) -> "Proposal":
        """A chain: node i is the child of node i - 1 (node 0 of the root)."""
        n = len(tokens)
        return Proposal(np.asarray(tokens, np.int32).reshape(-1), np.arange(-1, n - 1, dtype=np.int32),
                        np.arange(1, n + 1, dtype=np.int32), None, q, draft_rows)

    def prefix(self, k: int) -> "Proposal":
        """The first k nodes (ancestor-closed: parents precede children)."""
        if k >= self.n:
            return self
        cut = slice(0, max(0, k))
        return Proposal(self.tokens[cut], self.parents[cut], self.depths[cut],
                        None if self.scores is None else self.scores[cut],
                        None if self.q is None else self.q[cut], self.draft_rows,
                        None if self.sources is None else self.sources[cut], self.warmup_s)

    def along(self, nodes: Sequence[int]) -> "Proposal":
        """The nodes of one root-to-leaf path (``nodes``, root side first) as a chain."""
        idx = np.asarray(nodes, dtype=np.int64)
        k = len(idx)
        return Proposal(self.tokens[idx], np.arange(-1, k - 1, dtype=np.int32), np.arange(1, k + 1, dtype=np.int32),
                        None if self.scores is None else self.scores[idx],
                        None if self.q is None else [self.q[i] for i in idx.tolist()], self.draft_rows,
                        None if self.sources is None else self.sources[idx], self.warmup_s)

    def source_of(self, node: int, names: Sequence[str]) -> str:
        """Who proposed ``node``: its source's name (``names``: the proposer's sources in bit
        order), sources joined by "+" where a hybrid's sources proposed it alike."""
        if self.sources is None:
            return names[0] if names else "draft"
        bits = int(self.sources[node])
        return "+".join(n for s, n in enumerate(names) if bits & (1 << s)) or "draft"

    def children(self) -> list[list[int]]:
        """children[i + 1] = child node indices of node i; children[0] = the root's children."""
        ch: list[list[int]] = [[] for _ in range(self.n + 1)]
        for i, p in enumerate(self.parents.tolist()):
            ch[p + 1].append(i)
        return ch

    def is_chain(self) -> bool:
        return bool(np.all(self.parents == np.arange(-1, self.n - 1)))


@dataclass
class Verdict:
    """Outcome of verifying one proposal."""

    path: list[int]          # accepted node indices, root to leaf (may be empty)
    tokens: list[int]        # accepted draft tokens (= proposal.tokens[path])
    bonus: int               # the target's own token after the accepted path
    n_accepted: int = field(init=False)

    def __post_init__(self) -> None:
        self.n_accepted = len(self.path)


@dataclass
class Scores:
    """The target's verification decode of [carry, root, nodes]."""

    logits: np.ndarray                  # [1 + n, V] in node order: row 0 = root, row i + 1 = node i
    batch_row: np.ndarray               # [1 + n] batch row of the root / node i (for captured K/V)
    n_main: int = 0                     # nodes on the main path (batch rows right after the root)
    main: list = field(default_factory=list)   # main-path node indices, in order
    leaf_seq: Optional[dict] = None     # tree only: node index -> sequence id of a leaf below it


# ---------------------------------------------------------------------------- results / stats

@dataclass(frozen=True)
class StepResult:
    """What one step (prefill or one propose -> score -> verify -> commit cycle) produced.
    Immutable: the loop builds a new one per step."""

    tokens: tuple                 # tokens emitted by this step (EOG excluded)
    drafted: int = 0              # draft nodes verified
    accepted: int = 0             # draft nodes accepted
    draft_rows: int = 0           # drafter rows computed
    draft_shape: str = "none"     # the shape this step used ("chain:3", "tree:..", "none")
    finished: bool = False        # EOG, max_tokens or the context limit reached
    finish_reason: str = ""       # "stop" / "length" when finished
    t_drafter: float = 0.0
    t_target: float = 0.0
    t_capture: float = 0.0
    logprobs: tuple = ()          # TokenLogprob per emitted token, when the generation asked for them
    # per emitted token, who chose it: a proposer source whose draft the target accepted ("moa",
    # "ngram", "draft", "moa+ngram") or "target" (the verification's own token)
    origins: tuple = ()


@dataclass(frozen=True)
class TokenLogprob:
    """An emitted token's log-probability under the target's row that chose it (log-softmax of
    the logits the sampler saw), and the ``top`` most likely tokens of that row: ``((id, logprob), ...)``.
    Free under speculation: every emitted token has its verification row."""

    token: int
    logprob: float
    top: tuple = ()


@dataclass
class SpecStats:
    """Per-generation statistics, accumulated from the steps (callers print or save them)."""

    n_prompt: int = 0             # prompt tokens
    n_cached: int = 0             # of them, reused from the KV cache (not decoded again)
    n_generated: int = 0          # emitted tokens (EOG excluded)
    target_calls: int = 0         # verification decodes (one per cycle; prefill excluded)
    prefill_calls: int = 0        # prompt decodes (chunks of n_batch)
    drafted: int = 0              # draft nodes proposed (all cycles)
    accepted: int = 0             # draft nodes accepted
    draft_rows: int = 0           # drafter rows computed (a tree computes more rows than it verifies)
    # accepted_by_depth[d] = cycles whose accepted path reached depth d + 1;
    # proposed_by_depth[d] = cycles that proposed at least one node at depth d + 1
    accepted_by_depth: list = field(default_factory=list)
    accept_lengths: list = field(default_factory=list)   # per cycle: accepted + 1 (tokens it emitted)
    auto_choices: dict = field(default_factory=dict)     # cost-aware mode: chain length -> cycles
    proposed_by_depth: list = field(default_factory=list)
    t_prefill: float = 0.0        # s, prompt decode + drafter commit of the prompt
    t_target: float = 0.0         # s, verification llama_decode calls (capture included)
    t_capture: float = 0.0        # s, reading captured K/V rows (moa_capture_get)
    t_drafter: float = 0.0        # s, drafter commit + draft calls
    # s, of t_drafter: proposers catching up on the prompt (a draft model's prefill at its first
    # proposal); not a cost per drafted row, so the cost-aware policy leaves it out
    t_drafter_warmup: float = 0.0
    t_total: float = 0.0          # s, whole generation after prefill
    finish_reason: str = ""       # "stop" (EOG / stop string) or "length"
    eog_token: int = -1           # the end-of-generation token that stopped it (-1: none)
    decision: str = ""            # what the draft policy chose for this generation, and why
    # per proposer source ("moa", "ngram", "draft"): {"proposed": nodes, "accepted": nodes}; a node
    # two sources of a hybrid both proposed counts for both
    by_source: dict = field(default_factory=dict)
    # emitted tokens by who chose them (StepResult.origins): accepted drafts that were emitted
    # (not cut by EOG or max_tokens) per source, and "target" for the target's own tokens
    emitted_from: dict = field(default_factory=dict)

    @property
    def tau(self) -> float:
        """Tokens per target call: mean (accepted + 1) per verification cycle."""
        return (self.accepted + self.target_calls) / self.target_calls if self.target_calls else 0.0

    @property
    def t_overhead(self) -> float:
        """Python loop time: everything after prefill that is neither target nor drafter."""
        return max(0.0, self.t_total - self.t_target - self.t_capture - self.t_drafter)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second after the prompt (decode speed)."""
        return self.n_generated / self.t_total if self.t_total > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def record_depths(self, proposed_max_depth: int, accepted_depth: int) -> None:
        for lst, n in ((self.proposed_by_depth, proposed_max_depth), (self.accepted_by_depth, accepted_depth)):
            while len(lst) < n:
                lst.append(0)
            for d in range(n):
                lst[d] += 1

    def record_sources(self, names: Sequence[str], proposal: "Proposal", path: Sequence[int]) -> None:
        """Count one verified proposal per source (``proposal.sources`` bits; None: all ``names[0]``)."""
        if not proposal.n:
            return
        bits = proposal.sources if proposal.sources is not None else np.ones(proposal.n, np.int64)
        acc = bits[list(path)] if len(path) else bits[:0]
        for s, name in enumerate(names):
            d = self.by_source.setdefault(name, {"proposed": 0, "accepted": 0})
            d["proposed"] += int(np.count_nonzero(bits & (1 << s)))
            d["accepted"] += int(np.count_nonzero(acc & (1 << s)))

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(tau=self.tau, tokens_per_s=self.tokens_per_s, t_overhead=self.t_overhead,
                 acceptance_rate=self.acceptance_rate)
        return d


# ---------------------------------------------------------------------------- proposer protocol

class Proposer(Protocol):
    """What the loop needs from a drafter.

    ``name``: the source named in statistics ("moa", "ngram", "draft"; a hybrid has ``names``);
    ``needs_capture``: the loop must capture the target's K/V and pass it to :meth:`observe`
    (MoA drafters); ``acceptance_prior``: expected conditional acceptance per draft depth
    (or None: unknown), used by the cost-aware policy before anything is observed;
    ``row_cost``: seconds per drafted row if known a priori (None: measured as it drafts).
    """

    name: str
    needs_capture: bool
    acceptance_prior: Optional[Sequence[float]]
    row_cost: Optional[float]

    def reset(self) -> None: ...
    # optional: keep what is known of positions < n (a reused prompt prefix) and return how
    # many positions are kept (the loop feeds, and observes if it captures, from there)
    # def rewind(self, n: int) -> int: ...
    def observe(self, lsa_in: np.ndarray, pos0: int) -> None: ...
    def propose(self, feed: Sequence[int], root: int, pos: int, sp: SamplingParams,
                rng: Optional[np.random.Generator], config: Optional[DraftConfig] = None) -> Proposal: ...
