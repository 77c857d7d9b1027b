"""Distribution preservation of the sampling verifiers (pure numpy; chi-square tests).

Each test draws N independent speculative steps with a seeded Generator and compares the
empirical distribution of what is emitted with the target's own sampling distribution.
Significance: a test fails when the chi-square p-value is below ALPHA = 1e-3 (the seeds are
fixed, so the outcome is deterministic; with a correct verifier a failure would happen with
probability 1e-3 for an arbitrary seed). A deliberately wrong verifier (accepting drafts
without the p/q ratio) is rejected by the same test with p < 1e-12.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from moa_cpp.speculative.types import Proposal
from moa_cpp.speculative.types import SamplingParams
from moa_cpp.speculative.verify import probs_from_logits, verify_sampling

ALPHA = 1e-3
N = 40000
V = 8


def _p_value(counts: np.ndarray, probs: np.ndarray) -> float:
    keep = probs > 0
    assert counts[~keep].sum() == 0, "emitted a token the target can never sample"
    exp = probs[keep] * counts.sum()
    return float(chisquare(counts[keep], exp).pvalue)


@pytest.fixture
def logits():
    rng = np.random.default_rng(7)
    return rng.normal(0, 1.5, size=(4, V)).astype(np.float32)


@pytest.mark.parametrize("sp", [SamplingParams(1.0), SamplingParams(0.7), SamplingParams(1.0, top_k=5),
                                SamplingParams(0.8, top_p=0.9)], ids=["t1", "t0.7", "topk5", "topp0.9"])
def test_chain_speculative_sampling_first_token(logits, sp):
    """Drafts drawn from q; emitted first token ~ p."""
    rng = np.random.default_rng(123)
    p = probs_from_logits(logits[0], sp)
    q = probs_from_logits(logits[1] * 0.5, SamplingParams(1.0))   # a different draft distribution
    counts = np.zeros(V, np.int64)
    for _ in range(N):
        d = int(rng.choice(V, p=q))
        prop = Proposal(np.array([d], np.int32), np.array([-1], np.int32), np.array([1], np.int32), None, [q])
        v = verify_sampling(prop, logits[:2], sp, rng)
        counts[v.tokens[0] if v.tokens else v.bonus] += 1
    assert _p_value(counts, p) > ALPHA


@pytest.mark.parametrize("temp", [1.0, 0.7])
def test_tree_siblings_first_token(logits, temp):
    """Deterministic siblings (top-k children, point-mass q): emitted first token ~ p."""
    sp = SamplingParams(temp)
    rng = np.random.default_rng(5)
    p = probs_from_logits(logits[0], sp)
    kids = np.argsort(-logits[2])[:3].astype(np.int32)             # siblings chosen by the "drafter"
    prop = Proposal(kids, np.full(3, -1, np.int32), np.ones(3, np.int32))
    counts = np.zeros(V, np.int64)
    for _ in range(N):
        v = verify_sampling(prop, logits, sp, rng)
        counts[v.tokens[0] if v.tokens else v.bonus] += 1
    assert _p_value(counts, p) > ALPHA


def _toy_target(prefix: tuple) -> np.ndarray:
    """Logits of a toy target for the next token after ``prefix`` (deterministic in prefix)."""
    seed = 1000 + sum((t + 1) * 31 ** i for i, t in enumerate(prefix))
    return np.random.default_rng(seed).normal(0, 1.5, V).astype(np.float32)


@pytest.mark.parametrize("temp", [1.0, 0.7])
def test_two_token_joint_distribution_chain(temp):
    """A 2-draft chain: the joint law of the first two emitted tokens equals the target's."""
    sp = SamplingParams(temp)
    rng = np.random.default_rng(99)
    q_of = lambda prefix: probs_from_logits(_toy_target(prefix + (7,)) * 0.7, SamplingParams(1.0))
    counts = np.zeros((V, V), np.int64)
    for _ in range(N):
        q1 = q_of(())
        d1 = int(rng.choice(V, p=q1))
        q2 = q_of((d1,))
        d2 = int(rng.choice(V, p=q2))
        prop = Proposal(np.array([d1, d2], np.int32), np.array([-1, 0], np.int32), np.array([1, 2], np.int32),
                        None, [q1, q2])
        rows = np.stack([_toy_target(()), _toy_target((d1,)), _toy_target((d1, d2))])
        v = verify_sampling(prop, rows, sp, rng)
        out = v.tokens + [v.bonus]
        if len(out) < 2:   # the second token comes from the next step: plain target sampling
            out.append(int(rng.choice(V, p=probs_from_logits(_toy_target((out[0],)), sp))))
        counts[out[0], out[1]] += 1
    p1 = probs_from_logits(_toy_target(()), sp)
    joint = np.stack([p1[a] * probs_from_logits(_toy_target((a,)), sp) for a in range(V)])
    assert _p_value(counts.reshape(-1), joint.reshape(-1)) > ALPHA


def test_wrong_rule_is_detected(logits):
    """Sanity of the test itself: accepting every draft (no p/q correction) is caught."""
    sp = SamplingParams(1.0)
    rng = np.random.default_rng(1)
    p = probs_from_logits(logits[0], sp)
    q = probs_from_logits(logits[1] * 0.5, SamplingParams(1.0))
    counts = np.bincount(rng.choice(V, size=N, p=q), minlength=V)
    assert _p_value(counts, p) < 1e-12


def test_seeded_determinism(logits):
    sp = SamplingParams(1.0)
    prop = Proposal(np.array([1, 2], np.int32), np.array([-1, 0], np.int32), np.array([1, 2], np.int32))
    a = [verify_sampling(prop, logits, sp, np.random.default_rng(3)) for _ in range(2)]
    assert (a[0].path, a[0].bonus) == (a[1].path, a[1].bonus)


def test_tree_with_penalties_and_min_p_keeps_the_joint_law():
    """Penalties give every row its own history (the generated tokens plus the path to the row);
    with min-p and a point-mass tree (2 siblings, one child each) the joint law of the first two
    emitted tokens is the plain process's: t1 from the penalised root row, t2 from t1's row
    penalised with t1 in its window. The toy target likes to repeat its last token and each child
    draft repeats its parent, so rows given the root's history instead (the repeat not penalised)
    are caught: they emit pairs the target never samples."""
    from moa_cpp.speculative.penalties import adjust_rows
    sp = SamplingParams(0.8, min_p=0.05, repeat_penalty=2.0, frequency_penalty=0.3, presence_penalty=1.0,
                        penalty_last_n=4)
    hist = [3, 5, 3]
    rng = np.random.default_rng(17)

    def tgt(prefix: tuple) -> np.ndarray:
        x = _toy_target(prefix)
        if prefix:
            x[prefix[-1]] += 3.0
        return x

    def p_after(prefix: tuple) -> np.ndarray:
        return probs_from_logits(adjust_rows(tgt(prefix)[None], sp, hist + list(prefix))[0], sp)

    def joint_counts(rows: np.ndarray, n: int) -> np.ndarray:
        counts = np.zeros((V, V), np.int64)
        for _ in range(n):
            v = verify_sampling(prop, rows, sp, rng)
            out = v.tokens + [v.bonus]
            if len(out) < 2:
                out.append(int(rng.choice(V, p=p_after((out[0],)))))
            counts[out[0], out[1]] += 1
        return counts.reshape(-1)
    sib = [int(a) for a in np.argsort(-tgt(()))[:2]]
    prop = Proposal(np.array(sib + sib, np.int32), np.array([-1, -1, 0, 1], np.int32), np.array([1, 1, 2, 2], np.int32))
    raw = np.stack([tgt(()), tgt((sib[0],)), tgt((sib[1],)), tgt((sib[0], sib[0])), tgt((sib[1], sib[1]))])
    p1 = p_after(())
    joint = np.stack([p1[a] * p_after((a,)) for a in range(V)]).reshape(-1)
    assert _p_value(joint_counts(adjust_rows(raw, sp, hist, prop), N), joint) > ALPHA
    wrong = joint_counts(adjust_rows(raw, sp, hist), N // 4)
    # caught: it emits pairs the target never samples (min-p removed them), or the law is off
    assert wrong[joint == 0].sum() > 0 or _p_value(wrong, joint) < 1e-12


def _plain_tokens(draws, sp, n):
    out: list = []
    for j in range(n):
        out.append(draws.sample(probs_from_logits(_toy_target(tuple(out)), sp), j))
    return out


@pytest.mark.parametrize("temp", [1.0, 0.7])
def test_draws_make_the_text_plain_samplings(temp):
    """With the generation's draws (token j chosen by draw j), speculative sampling emits plain
    sampling's tokens whatever was drafted: random point-mass chains and trees, chains sampled
    from a q with the same draws; and a chain sampled from q = p is accepted whole (both inverse
    CDFs meet), so matching loses nothing where the drafter is right."""
    from moa_cpp.speculative.draws import Draws
    sp = SamplingParams(temp)
    rng = np.random.default_rng(11)
    for seed in range(20):
        want = _plain_tokens(Draws(seed), sp, 12)
        draws, out = Draws(seed), []
        while len(out) < 12:
            kind = rng.integers(3)
            d = draws.at(len(out))
            if kind == 0:                                       # random point-mass chain
                toks = [int(t) for t in rng.integers(0, V, size=3)]
                prop = Proposal.chain(toks)
            elif kind == 1:                                     # siblings below the root
                toks = [int(t) for t in rng.choice(V, size=3, replace=False)]
                prop = Proposal(np.array(toks, np.int32), np.full(3, -1, np.int32), np.ones(3, np.int32))
            else:                                               # a chain sampled from q = 0.5 * logits
                toks, qs, pre = [], [], tuple(out)
                for _ in range(3):
                    q = probs_from_logits(_toy_target(pre) * 0.5, SamplingParams(1.0))
                    toks.append(d.choice(V, p=q))
                    qs.append(q)
                    pre += (toks[-1],)
                prop = Proposal.chain(toks, qs)
            rows = np.stack([_toy_target(tuple(out))] +                # node i's row follows its path
                            [_toy_target(tuple(out) + _path(prop, i)) for i in range(prop.n)])
            v = verify_sampling(prop, rows, sp, draws.at(len(out)))
            out += v.tokens + [v.bonus]
        assert out[:12] == want, seed
    # q = p: a chain drawn with the same draws is accepted whole
    draws = Draws(5)
    toks, d, pre = [], draws.at(0), ()
    for _ in range(4):
        toks.append(d.choice(V, p=probs_from_logits(_toy_target(pre), sp)))
        pre += (toks[-1],)
    rows = np.stack([_toy_target(tuple(toks[:i])) for i in range(5)])
    v = verify_sampling(Proposal.chain(toks), rows, sp, draws.at(0))
    assert v.tokens == toks and [*toks, v.bonus] == _plain_tokens(Draws(5), sp, 5)


def _path(prop, i):
    """The tokens from the root to node i (inclusive)."""
    toks = []
    while i >= 0:
        toks.append(int(prop.tokens[i]))
        i = int(prop.parents[i])
    return tuple(reversed(toks))
