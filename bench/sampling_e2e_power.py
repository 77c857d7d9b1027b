"""Power of tests/speculative/test_sampling_e2e.py's chi-square law check: how often it rejects laws that
are off by a given total variation (TV), for the test's N and a larger one. Multinomial draws
from perturbed copies of the enumerated target law (no generation), 300 repetitions each.

    .venv/bin/python bench/sampling_e2e_power.py

Perturbations: "concentrated" moves TV of mass from the most likely 4-token sequence to the
second; "spread" from the 10 most likely to the next 10; "last-token" shifts TV of each 3-token
prefix's mass from its most likely fourth token to its second.
"""
import sys, numpy as np
REPO = __import__("pathlib").Path(__file__).resolve().parents[1]
import test_sampling_e2e as T
fx = REPO.parent / "shared" / "fixtures" / "moa-ref-tiny"
prompt = np.load(fx / "golden.npz")["prompt_ids"].tolist()[:6]
lk = T.Lookup(fx / "target-f32.gguf", prompt)
law = lk.law(T.SP, 4)
keys = sorted(law); p = np.array([law[k] for k in keys])
rng = np.random.default_rng(0)
order = np.argsort(-p)
def power(q, n, reps=300):
    hits = 0
    for _ in range(reps):
        c = rng.multinomial(n, q)
        counts = {k: int(v) for k, v in zip(keys, c) if v}
        hits += T._p_value(counts, law, n) <= T.ALPHA
    return hits / reps
for tv in (0.02, 0.05):
    # concentrated: mass tv moved from the most likely sequence to the 2nd
    q = p.copy(); q[order[0]] -= tv; q[order[1]] += tv
    # spread: tv moved from the 10 most likely to the next 10
    q2 = p.copy(); q2[order[:10]] -= tv / 10; q2[order[10:20]] += tv / 10
    # depth-4 token only: within each 3-token prefix, tv of mass shifted from its top to its second token
    q3 = p.copy()
    by = {}
    for i, k in enumerate(keys): by.setdefault(k[:3], []).append(i)
    for pre, idx in by.items():
        idx = sorted(idx, key=lambda i: -p[i])
        if len(idx) > 1:
            m = sum(p[i] for i in idx); d = min(tv * m, p[idx[0]]); q3[idx[0]] -= d; q3[idx[1]] += d
    for n in (2000, 8000):
        print(f"TV {tv}: N={n}: concentrated {power(q, n):.2f}, spread {power(q2, n):.2f}, last-token {power(q3, n):.2f}")
print("cells", len(p), "max", p.max())
