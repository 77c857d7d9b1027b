"""The sampling transforms (``probs_from_logits``: top-k, top-p, min-p, temperature) against an
independent reference: llama.cpp's own samplers, called through llama-cpp-python on the same
logits, on many random logit vectors.

llama.cpp's ``top_k``, ``top_p``, ``min_p`` and ``temp`` samplers are chained in llama.cpp's (and
llama-cpp-python's) order; the chain's surviving candidates, softmaxed, are the reference
distribution. The two must keep the same tokens and agree to float32 rounding. Mutations this
catches (each tried on ``probs_from_logits``): ignoring the temperature, top-k keeping k - 1
tokens, top-p keeping one token more than needed, min-p measured on the tempered distribution.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from moa_cpp.speculative.types import SamplingParams
from moa_cpp.speculative.verify import probs_from_logits

llama_cpp = pytest.importorskip("llama_cpp")


def llama_cpp_probs(logits: np.ndarray, sp: SamplingParams) -> np.ndarray:
    """The distribution llama.cpp's top_k -> top_p -> min_p -> temp chain leaves, as float64 [V]."""
    v = logits.size
    arr = (llama_cpp.llama_token_data * v)()
    for i, x in enumerate(logits.tolist()):
        arr[i].id, arr[i].logit, arr[i].p = i, x, 0.0
    cur = llama_cpp.llama_token_data_array(data=arr, size=v, selected=-1, sorted=False)
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    try:
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(sp.top_k))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_p(sp.top_p, 1))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_min_p(sp.min_p, 1))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(sp.temperature))
        llama_cpp.llama_sampler_apply(chain, ctypes.byref(cur))
    finally:
        llama_cpp.llama_sampler_free(chain)
    ids = np.array([cur.data[i].id for i in range(cur.size)], np.int64)
    lg = np.array([cur.data[i].logit for i in range(cur.size)], np.float64)
    keep = np.isfinite(lg)
    ids, lg = ids[keep], lg[keep]
    p = np.zeros(v)
    e = np.exp(lg - lg.max())
    p[ids] = e / e.sum()
    return p


def _cases(n: int = 240):
    rng = np.random.default_rng(2024)
    for i in range(n):
        v = int(rng.choice([8, 50, 1000, 5000]))
        scale = float(rng.choice([0.5, 2.0, 5.0]))
        logits = (rng.normal(0, scale, v)).astype(np.float32)
        sp = SamplingParams(float(rng.choice([0.25, 0.7, 1.0, 1.6])), int(rng.choice([0, 1, 2, 5, 40])),
                            float(rng.choice([1.0, 0.95, 0.8, 0.5, 0.1])),
                            min_p=float(rng.choice([0.0, 0.0, 0.05, 0.2])))
        yield i, logits, sp


def test_probs_from_logits_equals_llama_cpp_samplers():
    worst = 0.0
    for i, logits, sp in _cases():
        ours = probs_from_logits(logits, sp)
        ref = llama_cpp_probs(logits, sp)
        kept, ref_kept = np.flatnonzero(ours > 0), np.flatnonzero(ref > 0)
        assert np.array_equal(kept, ref_kept), (f"case {i} {sp} V={logits.size}: kept {kept.size} tokens, "
                                                f"llama.cpp {ref_kept.size}")
        diff = float(np.abs(ours - ref).max())
        worst = max(worst, diff)
        assert diff < 2e-6, f"case {i} {sp}: max |p - p_llama.cpp| = {diff:.2e}"
        assert abs(ours.sum() - 1.0) < 1e-9
    print(f"\n[sampling] 240 random cases: max |p - p_llama.cpp| = {worst:.2e}")


def test_the_reference_sees_each_transform():
    """The reference is not blind: each transform changes its answer (a wrong temperature, top-k
    or top-p would be caught)."""
    logits = np.random.default_rng(3).normal(0, 2, 200).astype(np.float32)
    base = llama_cpp_probs(logits, SamplingParams(1.0))
    assert np.abs(llama_cpp_probs(logits, SamplingParams(0.7)) - base).max() > 1e-3
    assert (llama_cpp_probs(logits, SamplingParams(1.0, top_k=5)) > 0).sum() == 5
    assert (llama_cpp_probs(logits, SamplingParams(1.0, top_k=5)) > 0).sum() != \
        (llama_cpp_probs(logits, SamplingParams(1.0, top_k=4)) > 0).sum()
    p = llama_cpp_probs(logits, SamplingParams(1.0, top_p=0.5))
    kept = np.sort(base)[::-1]
    need = int(np.searchsorted(np.cumsum(kept), 0.5) + 1)       # smallest prefix with mass >= 0.5
    assert (p > 0).sum() == need
    # min-p on the untempered distribution: the same tokens at any temperature
    m = llama_cpp_probs(logits, SamplingParams(1.0, min_p=0.1))
    assert (m > 0).sum() == (base >= 0.1 * base.max()).sum() < 200
    assert ((llama_cpp_probs(logits, SamplingParams(0.3, min_p=0.1)) > 0) == (m > 0)).all()
