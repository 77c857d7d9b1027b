"""The first dynamic draft tree reproduces the reference's tree1_* arrays (fixture), and the
verifiers behave as specified (pure numpy tables)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import fixture_dirs
from moa_cpp.convert import convert
from moa_cpp.drafter.drafter import Drafter
from moa_cpp.speculative.types import Proposal
from moa_cpp.speculative.proposers import MoAProposer
from moa_cpp.speculative.types import DraftConfig
from moa_cpp.speculative.types import SamplingParams
from moa_cpp.speculative.verify import verify_greedy


@pytest.mark.parametrize("fx", fixture_dirs(), ids=lambda p: p.name)
def test_first_tree_matches_reference(fx, tmp_path):
    g = np.load(fx / "golden.npz")
    target = fx / "target-f32.gguf"
    path = convert(fx / "drafter_hf", tmp_path / "d.gguf", outtype="f32", target_gguf=target, progress=False)
    n_nodes = int(g["tree1_tokens"].size)
    depth = int(g["tree1_depths"].max())
    n_first = int((g["tree1_candidate_index"] < 0).sum())  # 0: candidate indices are all >= 0
    assert n_first == 0
    # breadth: level-1 candidates = candidates whose index < breadth; infer from the layout
    # 8 + 64 * (depth - 1) = n_candidates  ->  breadth b solves b + b*b*(depth-1) = n_cand
    n_cand = int(g["tree1_candidate_tokens"].size)
    breadth = next(b for b in range(1, 65) if b + b * b * (depth - 1) == n_cand)
    d = Drafter(path, target, n_ctx=int(g["prompt_ids"].size) + 16, n_draft_max=256)
    d.commit(g["lsa_in"], 0)
    prop = MoAProposer(d, DraftConfig("tree", depth=depth, topk=breadth, total=n_nodes))
    S = int(g["prompt_ids"].size)
    p = prop.propose(g["prompt_ids"], int(g["root_token"]), S, SamplingParams())
    tr = prop.last_tree
    np.testing.assert_array_equal(tr.cand_tokens, g["tree1_candidate_tokens"])
    np.testing.assert_allclose(tr.cand_scores, g["tree1_candidate_scores"], rtol=0, atol=2e-3)
    np.testing.assert_array_equal(tr.selected, g["tree1_candidate_index"])
    np.testing.assert_array_equal(p.tokens, g["tree1_tokens"])
    np.testing.assert_array_equal(p.parents, g["tree1_parents"])
    np.testing.assert_array_equal(p.depths, g["tree1_depths"])
    np.testing.assert_allclose(p.scores, g["tree1_scores"], rtol=0, atol=2e-3)
    assert p.draft_rows == 1 + breadth * (depth - 1)


def _logits_rows(argmaxes, V=10):
    out = np.zeros((len(argmaxes), V), np.float32)
    for i, a in enumerate(argmaxes):
        out[i, a] = 5.0
    return out


def test_greedy_chain_table():
    chain = Proposal(np.array([3, 4, 5], np.int32), np.array([-1, 0, 1], np.int32), np.array([1, 2, 3], np.int32))
    # all accepted, bonus from the last row
    v = verify_greedy(chain, _logits_rows([3, 4, 5, 7]))
    assert (v.tokens, v.bonus, v.n_accepted) == ([3, 4, 5], 7, 3)
    # early mismatch at depth 2
    v = verify_greedy(chain, _logits_rows([3, 9, 5, 7]))
    assert (v.tokens, v.bonus) == ([3], 9)
    # rejection at the root
    v = verify_greedy(chain, _logits_rows([1, 4, 5, 7]))
    assert (v.tokens, v.bonus) == ([], 1)
    # empty draft
    v = verify_greedy(Proposal.empty(), _logits_rows([6]))
    assert (v.tokens, v.bonus) == ([], 6)


def test_greedy_tree_two_branches():
    # root -> a(1) -> c(3); root -> b(2) -> d(4) -> e(5)
    tree = Proposal(np.array([1, 2, 3, 4, 5], np.int32), np.array([-1, -1, 0, 1, 3], np.int32),
                    np.array([1, 1, 2, 2, 3], np.int32))
    # target follows the b branch fully
    v = verify_greedy(tree, _logits_rows([2, 0, 4, 0, 5, 8]))
    assert v.path == [1, 3, 4] and v.tokens == [2, 4, 5] and v.bonus == 8
    # target follows a, then diverges
    v = verify_greedy(tree, _logits_rows([1, 6, 0, 0, 0, 0]))
    assert v.path == [0] and v.bonus == 6
