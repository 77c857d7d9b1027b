"""Paired comparisons of drafters: held-out tau with bootstrap intervals (the same resampled
conversations or prompts for every drafter compared), used by ``moa-cpp train eval`` and
``moa-cpp train compare`` (:mod:`moa_cpp.train.measure`). Pure NumPy."""
from __future__ import annotations

import numpy as np


def scored_indices(greedy: np.ndarray, keys: list, seen: set) -> list[int]:
    """The conversations scored: as the trainer's held-out estimate, the greedy self-distilled
    answers where the set has any (a sampled answer is not the target's greedy text), else every
    (teacher-forced, ``--fixed-answers``) one; never one whose prompt a compared run trained on."""
    scored = greedy if greedy.any() else np.ones(len(greedy), dtype=bool)
    return [i for i in range(len(greedy)) if scored[i] and keys[i] not in seen]


def bootstrap(per_run: list[list[tuple[int, int]]], n: int = 2000, seed: int = 0):
    """Per run: (95 % interval of tau, 95 % interval of tau minus the first run's), conversations
    resampled with replacement, the same draws for every run (paired)."""
    acc = np.array([[a for a, _ in per] for per in per_run], dtype=float)      # [runs, conversations]
    cyc = np.array([[c for _, c in per] for per in per_run], dtype=float)
    draws = np.random.default_rng(seed).integers(0, acc.shape[1], size=(n, acc.shape[1]))
    tau = 1.0 + acc[:, draws].sum(-1) / np.maximum(cyc[:, draws].sum(-1), 1)     # [runs, n]
    q = lambda x: [float(v) for v in np.percentile(x, [2.5, 97.5])]  # noqa: E731
    return [(q(t), q(t - tau[0])) for t in tau]


def per_prompt_tau(res: dict, method: str) -> dict[tuple[str, int], float]:
    """Per (set, prompt index): the tau of ``method`` in a ``python -m bench.eval run`` result."""
    return {(r["set"], r["q"]): r[method]["tau"] for r in res["records"] if method in r}


def paired(a: dict, b: dict, n: int = 4000, seed: int = 0) -> dict:
    """Mean tau difference b - a over the prompts both have, with its 95 % bootstrap interval
    (the same resampled prompts for both)."""
    keys = sorted(set(a) & set(b))
    x, y = np.array([a[k] for k in keys]), np.array([b[k] for k in keys])
    draws = np.random.default_rng(seed).integers(0, len(keys), size=(n, len(keys)))
    diff = (y[draws] - x[draws]).mean(1)
    lo, hi = np.percentile(diff, [2.5, 97.5])
    return {"prompts": len(keys), "tau_a": float(x.mean()), "tau_b": float(y.mean()),
            "diff": float((y - x).mean()), "diff_ci95": [float(lo), float(hi)]}
