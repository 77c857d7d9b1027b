"""python -m bench.eval COMMAND: speed and acceptance on the paper's six evaluation sets (benchmark only: never train or tune on them)."""
from bench.common import dispatch

COMMANDS = {
    "run": ("bench.eval.run", "every method in one process vs llama-cpp-python (speedup, tau, token identity)"),
    "spec-types": ("bench.eval.spec_types", "never slower: every --spec-type as whole moa-cpp generate processes vs --no-draft"),
    "policy-replay": ("bench.eval.policy_replay", "replay the cost-aware policy over recorded greedy outputs (decodes, modelled time)"),
    "near-tie": ("bench.eval.near_tie", "is a greedy divergence in a run's result a near-tie? (top-3 logits at the split)"),
}

if __name__ == "__main__":
    raise SystemExit(dispatch("eval", COMMANDS, __doc__))
