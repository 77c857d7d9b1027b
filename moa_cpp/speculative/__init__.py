"""The speculative engine, in vLLM's spec-decode roles:

- :mod:`.types` — plain data: Proposal, Scores, Verdict, DraftConfig, SamplingParams,
  StepResult, SpecStats, the Proposer protocol;
- :mod:`.proposers` — who drafts: the MoA drafter (chain or EAGLE-2 dynamic tree), a draft
  model, n-gram prompt lookup, hybrids of them; :func:`.proposers.make_proposer` builds them;
- :mod:`.scorer` — ONE target decode over root + drafts, and the target-side commit;
- :mod:`.verify` — pure NumPy verifiers (greedy; distribution-preserving sampling);
- :mod:`.policy` — draft shapes per cycle (fixed, cost-aware) and the T(k) measurement;
- :mod:`.loop` — prefill, then step() = propose -> score -> verify -> commit.
"""
from moa_cpp.speculative.loop import SpeculativeLoop, StepEvent  # noqa: F401
from moa_cpp.speculative.policy import CostAwarePolicy, FixedPolicy, Policy, measure_verify_cost  # noqa: F401
from moa_cpp.speculative.types import (DraftConfig, Proposal, Proposer, SamplingParams, Scores, SpecStats,  # noqa: F401
                    StepResult, Verdict)
