"""How many rows a verification batch may have while staying bit-identical to plain decoding.

Greedy speculative decoding verifies the root and k drafts in ONE ``llama_decode`` and is
lossless only if every row of that batch has exactly the logits the same token gets in a
one-token decode. Whether it does depends on the model's weight types and on llama.cpp's CPU
kernels, which switch with the number of rows: measured on this CPU (flash attention on),
SmolLM2-135M Q4_1 / Q8_0 are exact up to 63 rows, while the Q4_K_M models (Qwen2.5-Coder
0.5B / 1.5B, Gemma-3-270M) are exact up to 3 rows only with llama.cpp's weight repacking (its
default: from 4 rows the repacked Q4_K GEMM takes over) and up to 7 without it.

:func:`measure_exact_rows` finds the largest batch size R such that every b in 1..R is exact on
a few realistic token windows (tokens of a tokenized text after a context prefix, not constant
ids); :func:`exact_rows` caches the result on disk (:mod:`moa_cpp.target.calibration`, keyed by
model file, threads, flash attention, repacking, build, backend/device), so it is measured once
per model on a machine.

Example::

    from moa_cpp.target.exactness import exact_rows
    R = exact_rows(target)        # e.g. 63 for SmolLM2 Q4_1, 3 for Qwen2.5 Q4_K_M
    # verify at most R rows per batch (root + R-1 drafts) for bit-exact greedy output
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional

import numpy as np

from moa_cpp.target import calibration as calibration_cache
from moa_cpp.errors import InvalidArgumentError

if TYPE_CHECKING:      # annotations only (loading it needs the native library); Target.exact_rows calls in here
    from moa_cpp.target.context import TargetContext

# Three different realistic windows: prose, code, chat-style text (see FIRST_PREFIX for how they
# are laid out in one token stream).
TEXTS = (
    "Speculative decoding speeds up inference of large language models without changing their "
    "output. A small draft model proposes several tokens ahead, and the large target model checks "
    "all of them in a single forward pass. Every proposed token that matches what the target would "
    "have produced is accepted; at the first mismatch the target's own token is emitted instead, "
    "so each cycle yields at least one token and often several. The method works because a forward "
    "pass over a handful of tokens costs little more than a pass over one token when decoding is "
    "limited by memory bandwidth rather than by arithmetic. On a laptop CPU the weights of a "
    "quantized model are read from memory once per pass, whether the batch holds one row or eight, "
    "and the extra rows mostly reuse data that is already in the cache. The catch is that the "
    "verification pass must compute exactly the same numbers as ordinary decoding; otherwise the "
    "output can drift whenever two candidate tokens are nearly tied.",
    "import numpy as np\n\n\ndef softmax(x, axis=-1):\n    \"\"\"Numerically stable softmax.\"\"\"\n"
    "    x = np.asarray(x, dtype=np.float64)\n    m = x.max(axis=axis, keepdims=True)\n"
    "    e = np.exp(x - m)\n    return e / e.sum(axis=axis, keepdims=True)\n\n\n"
    "class RunningMean:\n    def __init__(self):\n        self.n = 0\n        self.total = 0.0\n\n"
    "    def update(self, value):\n        self.n += 1\n        self.total += float(value)\n"
    "        return self.total / self.n\n\n\ndef quicksort(xs):\n    if len(xs) <= 1:\n"
    "        return list(xs)\n    pivot, *rest = xs\n    left = [x for x in rest if x < pivot]\n"
    "    right = [x for x in rest if x >= pivot]\n    return quicksort(left) + [pivot] + quicksort(right)\n\n\n"
    "if __name__ == \"__main__\":\n    data = [5, 3, 8, 1, 9, 2]\n    print(quicksort(data))\n"
    "    print(softmax([1.0, 2.0, 3.0]))\n    mean = RunningMean()\n    for v in data:\n"
    "        print(mean.update(v))\n",
    "User: What is the difference between a list and a tuple in Python?\nAssistant: A list is "
    "mutable: you can append, remove or change its elements after it is created, and it is written "
    "with square brackets, like [1, 2, 3]. A tuple is immutable: once created, its elements cannot "
    "be changed, and it is written with parentheses, like (1, 2, 3). Because tuples cannot change, "
    "they can be used as dictionary keys and stored in sets, while lists cannot. Tuples are also a "
    "little faster to create and use slightly less memory.\nUser: When should I use each one?\n"
    "Assistant: Use a list for a collection of similar items whose size or contents will change, "
    "such as the lines of a file you are reading or the results you are collecting in a loop. Use a "
    "tuple for a fixed group of values that belong together, such as a point (x, y), a date "
    "(year, month, day) or a row returned from a database query.\n",
)
# The windows follow each other in ONE token stream (prose, then code, then chat): window 0 has
# FIRST_PREFIX tokens of context; each later one adds the rows tested before it plus NEW_CONTEXT
# tokens of the next text, so the KV cache is filled incrementally (prefill is most of the
# measurement's cost on a compute-bound CPU: 16 + 2 x (rows + 8) tokens instead of 16 + 72 + 120;
# 16 tokens of first context, not 32: that prefill was a seventh of the default calibration).
FIRST_PREFIX = 16
NEW_CONTEXT = 8
# The search: every size up to 8, then 16, 32, 63 (bisecting after a failure among those).
SMALL_STEPS = 8
JUMPS = (16, 32, 63)


def _windows(target: TargetContext, max_rows: int, n_texts: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(context, rows) of each window; window w's context is window w-1's context + rows + the
    first NEW_CONTEXT tokens of text w (BOS once, at the start)."""
    out, ctx = [], np.zeros(0, np.int32)
    for w, text in enumerate(TEXTS[:n_texts]):
        ids = target.tokenize(text, add_bos=(w == 0))
        more = target.tokenize(text, add_bos=False)
        lead = FIRST_PREFIX if w == 0 else NEW_CONTEXT
        while len(ids) < lead + max_rows:        # short tokenization: continue with the text again
            ids = np.concatenate([ids, more])
        ctx = np.concatenate([ctx, ids[:lead]]).astype(np.int32)
        rows = ids[lead: lead + max_rows].astype(np.int32)
        out.append((ctx, rows))
        ctx = np.concatenate([ctx, rows])
    return out


class _Window:
    """One token window: the context prefix in the KV cache, single-token reference logits of
    the rows (computed lazily, one decode per row), batch checks against them. ``keep``: how
    many leading context positions the KV cache already holds (the previous window's context)."""

    def __init__(self, target: TargetContext, ctx: np.ndarray, rows: np.ndarray, keep: int = 0,
                 timings: Optional[dict] = None) -> None:
        self.t = target
        self.ctx, self.rows = ctx, rows
        self.p = len(ctx)
        self.refs: list[np.ndarray] = []
        self.timings = timings
        if keep:
            target.rollback(keep)
        else:
            target.clear()
        for off in range(keep, len(ctx), target.n_batch):   # the context only fills the KV cache
            chunk = ctx[off: off + target.n_batch]
            target.decode(chunk, np.arange(off, off + len(chunk), dtype=np.int32), capture=False, logits="last")

    def _decode(self, b: int, start: int = 0) -> np.ndarray:
        """Rows start..start+b-1 in one decode (timed: the calibration's T(b))."""
        t0 = time.perf_counter()
        lg = self.t.decode(self.rows[start: start + b], np.arange(self.p + start, self.p + start + b, dtype=np.int32),
                           capture=False)
        if self.timings is not None:
            self.timings.setdefault(b, []).append(time.perf_counter() - t0)
        return lg

    def _refs_upto(self, n: int) -> None:
        if len(self.refs) >= n:
            return
        t, p = self.t, self.p
        t.rollback(p)
        refs = []
        for i in range(n):   # one token at a time, as plain decoding does
            refs.append(self._decode(1, i)[0])
        t.rollback(p)
        self.refs = refs

    def diffs(self, b: int, prefetch: int = 0) -> np.ndarray:
        """Per-row max |batch - single| of a ``b``-row batch (0.0 = bit-identical; inf = NaN
        or other non-equal non-finite)."""
        self._refs_upto(max(b, prefetch))
        t, p = self.t, self.p
        t.rollback(p)
        lg = self._decode(b)
        t.rollback(p)
        out = np.zeros(b)
        for i in range(b):
            if not np.array_equal(lg[i], self.refs[i]):
                with np.errstate(invalid="ignore"):
                    d = np.abs(lg[i].astype(np.float64) - self.refs[i])
                out[i] = float(d.max()) if np.isfinite(d).all() else float("inf")
        return out


def _clamp_rows(target: TargetContext, max_rows: int) -> int:
    if max_rows < 1:
        raise InvalidArgumentError(f"max_rows must be >= 1, got {max_rows}")
    # the last window's context is FIRST_PREFIX + (n - 1) x (rows + NEW_CONTEXT) tokens
    n = len(TEXTS)
    fit = (target.n_ctx - 1 - FIRST_PREFIX - (n - 1) * NEW_CONTEXT) // n
    return min(max_rows, target.n_batch, fit)


def _plan(cap: int) -> list[int]:
    """Sizes to test up to ``cap``: 1..8, then 16, 32, 63 (clipped to ``cap``) and ``cap``."""
    small = list(range(1, min(SMALL_STEPS, cap) + 1))
    jumps = sorted({min(j, cap) for j in JUMPS} | {cap}) if cap > SMALL_STEPS else []
    return small + jumps


def _search(win: _Window, plan: list[int], best: int, exhaustive: bool) -> tuple[int, Optional[int], float, list]:
    """Test ``plan``'s sizes in order up to the first failure, then bisect between the last
    exact and the first inexact size: (largest exact, first inexact or None, its max diff, sizes)."""
    good, bad, bad_diff, sizes = 0, None, 0.0, []
    # references for several sizes at once (they are recomputed from row 0 when a size needs
    # more): all sizes when exhaustive or when the whole plan is short (the default's 9 rows:
    # 9 one-token decodes instead of 8 + 9), else the small steps
    ahead = best if exhaustive or plan[-1] <= 2 * SMALL_STEPS else min(SMALL_STEPS, best)
    for b in plan:
        d = win.diffs(b, prefetch=ahead if b <= max(SMALL_STEPS, ahead) else 0)
        sizes.append(b)
        if d.max() > 0:
            bad, bad_diff = b, float(d.max())
            break
        good = b
    while bad is not None and bad - good > 1:   # a failure after a jump: bisect
        mid = (good + bad) // 2
        d = win.diffs(mid)
        sizes.append(mid)
        if d.max() > 0:
            bad, bad_diff = mid, float(d.max())
        else:
            good = mid
    return good, bad, bad_diff, sizes


def measure_exact_rows(target: TargetContext, max_rows: int = 63, *, n_texts: int = 3, exhaustive: bool = False,
                       details: Optional[dict] = None, timings: Optional[dict] = None) -> int:
    """The largest R <= ``max_rows`` such that, for every b in 1..R, each row of a b-row decode
    (after a context prefix) has logits bit-identical (``np.array_equal``) to the same token
    decoded alone, on ``n_texts`` token windows of realistic text. 0 if even one-row decodes
    are not reproducible.

    Search (cheap: once per model on a machine): b = 1..8 one by one, then 16, 32, 63, bisecting
    between the last exact and the first inexact size; it stops at the first failure, so a model
    exact to 3 rows costs each window ~8 one-token decodes and 4 small batches. Sizes between the
    checkpoints are assumed to behave like their neighbours (llama.cpp's kernels switch at
    row-count thresholds); ``exhaustive=True`` tests every size instead. Windows are checked one
    after another, each bounded by the previous result: the first tests the whole plan, the later
    ones (other text, longer context) confirm the largest exact size so far and bisect below it only
    if it fails. Every decode is timed (the calibration's T(b) samples: every size once, the
    one-token decodes and the confirmed size once per window).

    ``details``, if given, receives ``first_failure`` (the smallest inexact b found, or None),
    ``max_abs_diff`` (its largest row difference), ``window`` (which window failed), ``tested``
    (sizes decoded per window) and ``seconds``. ``timings``, if given, receives the seconds of
    every decode by its row count (``{b: [s, ...]}``: the calibration's T(b) samples). Leaves the
    target's KV cache empty.
    """
    cap = _clamp_rows(target, max_rows)
    t0 = time.perf_counter()
    best = cap
    first_fail, fail_diff, fail_win, tested = None, 0.0, None, []
    try:
        keep = 0
        for w, (ctx, rows) in enumerate(_windows(target, cap, n_texts)):
            if best == 0:
                break
            win = _Window(target, ctx, rows, keep, timings)
            keep = len(ctx)
            # the first window tests every size of the plan; later windows (other text, longer
            # context) confirm the largest size still standing and bisect only if it fails: llama.cpp
            # picks its kernels by row count, which the first window has mapped (calibration time)
            plan = list(range(1, best + 1)) if exhaustive else _plan(best) if w == 0 else [best]
            good, bad, bad_diff, sizes = _search(win, plan, best, exhaustive)
            tested.append(sizes)
            if bad is not None and (first_fail is None or bad <= first_fail):
                first_fail, fail_diff, fail_win = bad, bad_diff, w
            best = min(best, good)
    finally:
        target.clear()
    if details is not None:
        details.update(first_failure=first_fail, max_abs_diff=fail_diff, window=fail_win, tested=tested,
                       seconds=time.perf_counter() - t0, max_rows=cap)
    return best


def batch_row_diffs(target: TargetContext, b: int, *, window: int = 0, max_rows: Optional[int] = None) -> np.ndarray:
    """Per-row max |logits in a ``b``-row batch - logits of the same token decoded alone| on
    token window ``window`` (0..2) of :data:`TEXTS`, laid out as a measurement up to ``max_rows``
    (default ``b``; a later window's context holds the earlier windows' rows) lays it out; zeros =
    bit-identical. Leaves the KV cache empty."""
    if not 0 <= window < len(TEXTS):
        raise InvalidArgumentError(f"window must be in [0, {len(TEXTS)})")
    m = _clamp_rows(target, max(b, max_rows or b))
    if not 1 <= b <= m:
        raise InvalidArgumentError(f"b = {b} rows do not fit this target's batch/context")
    try:
        ctx, rows = _windows(target, m, window + 1)[window]
        return _Window(target, ctx, rows).diffs(b)
    finally:
        target.clear()


# ---------------------------------------------------------------------- cache


def cached_exact_rows(target: TargetContext, max_rows: int = 63) -> Optional[int]:
    """The cached result for this target and ``max_rows``, or None (nothing cached, or cached
    for a smaller ``max_rows`` that was exact throughout)."""
    e = calibration_cache.lookup("exact_rows", target)
    if e is None or "exact_rows" not in e:
        return None
    r, tested_to = int(e["exact_rows"]), int(e.get("max_rows", 0))
    cap = _clamp_rows(target, max_rows)
    if r < tested_to or tested_to >= cap:      # a failure was found, or the range is covered
        return min(r, cap)
    return None


def exact_rows(target: TargetContext, max_rows: int = 63, *, use_cache: bool = True,
               timings: Optional[dict] = None) -> int:
    """:func:`measure_exact_rows` of ``target``, measured once and cached on disk
    (:mod:`moa_cpp.target.calibration`). ``timings``: see
    :func:`measure_exact_rows` (left empty on a cache hit)."""
    if use_cache:
        hit = cached_exact_rows(target, max_rows)
        if hit is not None:
            return hit
    info: dict = {}
    r = measure_exact_rows(target, max_rows, details=info, timings=timings)
    if use_cache:
        calibration_cache.store("exact_rows", target, {
            "exact_rows": r, "max_rows": info["max_rows"], "first_failure": info["first_failure"],
            "max_abs_diff": info["max_abs_diff"], "seconds": round(info["seconds"], 3),
            "measured_at": int(time.time())})
    return r
