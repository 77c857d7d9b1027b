"""Exact verification batch size (moa_cpp.target.exactness): the largest b whose every row equals a
single-token decode bit for bit.

Measured on the 2-core EPYCs here (AVX2 and AVX-512): SmolLM2-135M Q4_1 is exact up to 63 rows
(flash attention); Qwen2.5-Coder-0.5B Q4_K_M with llama.cpp's weight repacking only up to 3 rows
(4+ rows go through the repacked Q4_K GEMM). Those values are kernel properties of a CPU, not
asserted: each test checks the value measured here independently, on its own text, with plain
Target.decode calls (b rows bit-identical; the reported first failure reproduces).

One thread: the result does not depend on the thread count (measured: same values and
differences with 1 and 2 threads), and on a busy 2-core machine two llama.cpp threads wait on
each other's spin barriers (decodes 5-10x slower).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from moa_cpp.target import calibration as calibration_cache, exactness
from moa_cpp.models import registry as models
from moa_cpp.target.exactness import batch_row_diffs, cached_exact_rows, exact_rows, measure_exact_rows
from moa_cpp.target.target import Target


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


def _check_measurement(target, r, info, max_rows):
    """What the loop relies on, checked independently of the measurement's own windows: r-row
    batches are bit-identical on another text; and the first failure the search reported is
    real (the same r + 1-row batch, decoded again, differs), unless every size was exact."""
    if r < 2:
        pytest.skip(f"measured on this CPU: no multi-row batch is bit-identical to one-token decodes ({info}); "
                    "the loop then verifies in full batches and the lossless tests count near-ties")
    assert r <= max_rows, info
    n = min(r, 16)                  # the text's length bounds the independent check
    ok_r = [_batch_vs_single(target, *_own_window(target, p, n)) for p in (10, 30)]
    assert all(ok_r), f"a {n}-row batch is not bit-identical to single-token decodes ({info})"
    if r < max_rows:
        assert info["first_failure"] == r + 1, info
        assert batch_row_diffs(target, r + 1, window=info["window"], max_rows=info["max_rows"]).max() > 0, info
    else:
        assert info["first_failure"] is None, info


@pytest.mark.model
def test_smollm2_q4_1_exact_rows_measured_right(smollm2):
    """SmolLM2 Q4_1 with flash attention: measured 63 (every size exact) on AVX2 and AVX-512
    EPYCs. What is asserted is that the measurement is right, whatever this CPU's kernels give;
    the lossless tests then use the measured size."""
    info: dict = {}
    r = measure_exact_rows(smollm2, max_rows=63, n_texts=1, details=info)
    assert smollm2.n_past == 0      # the KV cache is left empty
    print(f"\n[exactness] SmolLM2 Q4_1: exact up to {r} rows ({info})")
    _check_measurement(smollm2, r, info, 63)


@pytest.mark.model
def test_qwen05_q4_k_m_exact_rows_measured_right(qwen05):
    """Qwen2.5-Coder-0.5B Q4_K_M with repacking: measured 3 on AVX2 (7 without repacking): 4+
    rows go through the repacked Q4_K GEMM."""
    info: dict = {}
    r = measure_exact_rows(qwen05, max_rows=16, details=info)
    print(f"\n[exactness] Qwen2.5-Coder-0.5B Q4_K_M: exact up to {r} rows ({info})")
    _check_measurement(qwen05, r, info, 16)


@pytest.mark.model
def test_cache_hit_needs_no_decode(smollm2, tmp_path, monkeypatch):
    monkeypatch.setenv("MOA_CPP_CACHE", str(tmp_path))
    assert cached_exact_rows(smollm2, 8) is None
    r = exact_rows(smollm2, max_rows=8)       # measured: 8 (every size) on the EPYCs here
    data = json.loads((tmp_path / "calibration.json").read_text())
    (key, row), = data.items()
    entry = row["exact_rows"]
    assert key == calibration_cache.fingerprint(smollm2) and entry["exact_rows"] == r and entry["max_rows"] == 8

    def no_decode(*a, **k):
        raise AssertionError("decoded on a cache hit")

    monkeypatch.setattr(smollm2, "decode", no_decode)
    assert exact_rows(smollm2, max_rows=8) == r
    assert exact_rows(smollm2, max_rows=4) == min(r, 4)
    if r == 8:
        # a larger range than the one cached as exact throughout must be measured
        with pytest.raises(AssertionError, match="decoded on a cache hit"):
            exact_rows(smollm2, max_rows=16)
    else:
        # a failure inside the cached range answers any larger range
        assert exact_rows(smollm2, max_rows=16) == r
    monkeypatch.undo()
    # the key tells the repacking setting apart
    other = Target.from_path(models.smollm2_path(), n_ctx=512, n_threads=1, install_callback=False, repack=False)
    try:
        assert other.repack is False and smollm2.repack is True
        assert calibration_cache.fingerprint(other) != calibration_cache.fingerprint(smollm2)
    finally:
        other.close()


@pytest.mark.model
def test_default_calibration_decodes_each_reference_once(smollm2, monkeypatch):
    """The cost-aware default's search (9 rows): the first window tests every size, later windows
    confirm the largest exact size; one-token references are decoded once per row and window (the
    search used to decode 8, then all 9 again: 54 one-token decodes, now 28: 2.1 s -> 1.07 s here)."""
    calls: dict = {}
    decode = smollm2.decode

    def counting(tokens, *a, **k):
        calls[len(tokens)] = calls.get(len(tokens), 0) + 1
        return decode(tokens, *a, **k)

    monkeypatch.setattr(smollm2, "decode", counting)
    info: dict = {}
    r = measure_exact_rows(smollm2, max_rows=9, details=info)
    if r < 9:                         # an inexact size on this CPU: the later windows bisect below it
        assert info["tested"][0][: info["first_failure"]] == list(range(1, info["first_failure"] + 1)), info
        return
    assert info["tested"] == [list(range(1, 10)), [9], [9]], info
    assert calls[1] == 3 * 9 + 1, calls          # the references, plus the first window's 1-row test
    assert calls[9] == 3 and all(calls[b] == 1 for b in range(2, 9)), calls
