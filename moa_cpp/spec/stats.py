"""Per-generation statistics (plain data; the loop fills it, callers print or save it)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class SpecStats:
    n_prompt: int = 0             # prompt tokens
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
    t_total: float = 0.0          # s, whole generation after prefill
    finish_reason: str = ""       # "stop" (EOG / stop string) or "length"
    eog_token: int = -1           # the end-of-generation token that stopped it (-1: none)

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

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(tau=self.tau, tokens_per_s=self.tokens_per_s, t_overhead=self.t_overhead,
                 acceptance_rate=self.acceptance_rate)
        return d
