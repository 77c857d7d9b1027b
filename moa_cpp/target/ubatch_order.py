"""The order in which llama.cpp computes the rows of a batch over a *non-unified* KV cache.

With one KV stream per sequence (``kv_unified=False``), ``llama_decode`` cuts a batch into
ubatches with ``llama_batch_allocr::split_equal(n_ubatch, sequential=true)``: each ubatch takes
the same number of tokens from a run of consecutive sequence ids, and lays them out sequence by
sequence. Logits come back in batch order (llama.cpp reorders them), but anything read from the
graph itself -- the K/V capture -- comes in this order. :func:`split_equal_order` replays that
function (llama.cpp b-versions vendored by llama-cpp-python 0.3.36, ``src/llama-batch.cpp``) for
batches whose tokens each belong to one sequence, which is what the batch engine builds
(:mod:`moa_cpp.target.slots`); ``tests/target/test_target_slots.py`` checks it against real captures.
"""
from __future__ import annotations

from typing import Sequence


def split_equal_order(seq_ids: Sequence[int], n_ubatch: int) -> tuple[list, list]:
    """(order, sizes): batch indices in the order llama.cpp computes them, and the size of each
    ubatch. ``seq_ids[i]``: the one sequence of batch token ``i``."""
    n = len(seq_ids)
    used = [False] * n
    per_seq: dict = {}
    for i, s in enumerate(seq_ids):
        per_seq.setdefault(int(s), []).append(i)
    nxt = {s: 0 for s in per_seq}                      # each sequence's first unused token
    order: list = []
    sizes: list = []
    while len(order) < n:
        run: list = []                                 # a run of consecutive sequence ids
        for i in range(n):
            if used[i]:
                continue
            s = int(seq_ids[i])
            if s in run or (run and s != run[-1] + 1):
                continue
            run.append(s)
            if len(run) > n_ubatch:
                break
        taken: list = [[] for _ in run]
        while all(nxt[s] < len(per_seq[s]) for s in run):
            for k, s in enumerate(run):
                idx = per_seq[s][nxt[s]]
                nxt[s] += 1
                used[idx] = True
                taken[k].append(idx)
            if (len(taken[0]) + 1) * len(run) > n_ubatch:
                break
        ub = [i for t in taken for i in t]
        order += ub
        sizes.append(len(ub))
    return order, sizes
