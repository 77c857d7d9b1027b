"""Deprecated alias of :mod:`moa_cpp.speculative` (kept for one release; the oracle proposer
moved to :mod:`moa_cpp.testing.oracle`). Import from the new paths."""
