"""The speculative loop, in vLLM's roles: a Proposer drafts a :class:`Proposal` (a tree; a chain
is a tree with one child per node), a Scorer runs ONE target decode over it, a Verifier
(pure numpy) turns the target's logits into a :class:`Verdict`, and the loop commits it."""
