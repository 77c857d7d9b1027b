"""Exact verification batch size (moa_cpp.exactness): the largest b whose every row equals a
single-token decode bit for bit.

Measured on this CPU: SmolLM2-135M Q4_1 is exact up to 63 rows (flash attention); Qwen2.5-Coder
0.5B Q4_K_M with llama.cpp's weight repacking only up to 3 rows (4+ rows go through the repacked
Q4_K GEMM). The Qwen test checks the measured value independently, on its own text, with plain
Target.decode calls: b rows bit-identical, b + 1 rows not.

One thread: the result does not depend on the thread count (measured: same values and
differences with 1 and 2 threads), and on a busy 2-core machine two llama.cpp threads wait on
each other's spin barriers (decodes 5-10x slower).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from moa_cpp import exactness, models
from moa_cpp.exactness import cached_exact_rows, exact_rows, measure_exact_rows
from moa_cpp.target import Target


def test_search_plan():
    assert exactness._plan(63) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 63]
    assert exactness._plan(20) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 20]
    assert exactness._plan(5) == [1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def smollm2():
    t = Target.from_path(models.smollm2_path(), n_ctx=512, n_threads=1, install_callback=False)
    yield t
    t.close()


@pytest.fixture(scope="module")
def qwen05(qwen05b_path):
    t = Target.from_path(qwen05b_path, n_ctx=512, n_threads=1, install_callback=False)
    yield t
    t.close()


@pytest.mark.model
def test_smollm2_q4_1_is_exact_to_many_rows(smollm2):
    info: dict = {}
    r = measure_exact_rows(smollm2, max_rows=63, n_texts=1, details=info)
    assert r >= 16, info            # measured: 63 (every size tested is bit-identical)
    assert smollm2.n_past == 0      # the KV cache is left empty


def _own_window(target, prefix, n):
    text = ("Q: How do I reverse a list in Python?\nA: Use slicing, xs[::-1], which returns a new list, "
            "or xs.reverse(), which reverses the list in place and returns None. For any iterable, "
            "reversed(xs) gives an iterator over the items from the last to the first.")
    ids = target.tokenize(text)
    assert len(ids) >= prefix + n
    return ids[:prefix], ids[prefix: prefix + n]


def _batch_vs_single(target, ctx, rows):
    """True if every row of one len(rows)-row decode equals the single-token decode bit for bit."""
    target.clear()
    target.decode(ctx, capture=False)
    p = len(ctx)
    single = [target.decode(rows[i: i + 1], [p + i], capture=False)[0] for i in range(len(rows))]
    target.rollback(p)
    batch = target.decode(rows, np.arange(p, p + len(rows)), capture=False)
    target.clear()
    return all(np.array_equal(batch[i], single[i]) for i in range(len(rows)))


@pytest.mark.model
def test_qwen05_q4_k_m_exact_rows_is_small_and_right(qwen05):
    info: dict = {}
    r = measure_exact_rows(qwen05, max_rows=16, details=info)
    assert 1 <= r < 16, info        # measured: 3 with repacking (the default), 7 without
    assert info["first_failure"] == r + 1
    ok_r = [_batch_vs_single(qwen05, *_own_window(qwen05, p, r)) for p in (10, 30)]
    ok_r1 = [_batch_vs_single(qwen05, *_own_window(qwen05, p, r + 1)) for p in (10, 30)]
    assert all(ok_r), f"a {r}-row batch is not bit-identical to single-token decodes"
    assert not all(ok_r1), f"a {r + 1}-row batch was bit-identical on both windows: {r} is too small"


@pytest.mark.model
def test_cache_hit_needs_no_decode(smollm2, tmp_path, monkeypatch):
    monkeypatch.setenv("MOA_CPP_CACHE", str(tmp_path))
    assert cached_exact_rows(smollm2, 8) is None
    r = exact_rows(smollm2, max_rows=8)
    assert r == 8                   # SmolLM2 Q4_1: every size up to 8 is exact
    data = json.loads((tmp_path / "exact_rows.json").read_text())
    (key, entry), = data.items()
    assert key == exactness.cache_key(smollm2) and entry["exact_rows"] == 8 and entry["max_rows"] == 8

    def no_decode(*a, **k):
        raise AssertionError("decoded on a cache hit")

    monkeypatch.setattr(smollm2, "decode", no_decode)
    assert exact_rows(smollm2, max_rows=8) == 8
    assert exact_rows(smollm2, max_rows=4) == 4
    # a larger range than the one cached as exact throughout must be measured
    with pytest.raises(AssertionError, match="decoded on a cache hit"):
        exact_rows(smollm2, max_rows=16)
    monkeypatch.undo()
    # the key tells the repacking setting apart
    other = Target.from_path(models.smollm2_path(), n_ctx=512, n_threads=1, install_callback=False, repack=False)
    try:
        assert other.repack is False and smollm2.repack is True
        assert exactness.cache_key(other) != exactness.cache_key(smollm2)
    finally:
        other.close()
