"""The speculative engine, in vLLM's spec-decode roles:

- :mod:`.types` — plain data: Proposal, Scores, Verdict, DraftConfig, SamplingParams,
  StepResult, SpecStats, the Proposer protocol;
- :mod:`.proposer` — the MoA drafter as a proposer (chain or EAGLE-2 dynamic tree);
- :mod:`.scorer` — ONE target decode over root + drafts, and the target-side commit;
- :mod:`.verify` — pure NumPy verifiers (greedy; distribution-preserving sampling);
- :mod:`.policy` — draft shapes per cycle (fixed, cost-aware) and the T(k) measurement;
- :mod:`.loop` — prefill, then step() = propose -> score -> verify -> commit.
"""
from .loop import SpeculativeLoop, StepEvent  # noqa: F401
from .policy import CostAwarePolicy, FixedPolicy, measure_verify_cost  # noqa: F401
from .types import (DraftConfig, Proposal, Proposer, SamplingParams, Scores, SpecStats,  # noqa: F401
                    StepResult, Verdict)
