"""Random drafters sized for real targets: sizes, snapshot files, conversion, and the native
drafter on real K/V (fixture target, SmolLM2-135M, Gemma-3-270M).

The tree test checks the ancestor mask on real shapes: every row of one 8-row tree call must
give the logits of its root-to-row path drafted as a chain, one row per call.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

from moa_cpp.models import registry as models
from moa_cpp.convert import convert
from moa_cpp.errors import InvalidArgumentError
from moa_cpp.format.names import Keys
from moa_cpp.testing.random_drafter import make_random_checkpoint, make_random_drafter, spec_from_target

FIXTURE = Path(os.environ.get("MOA_FIXTURE_DIR") or
               Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "moa-ref-tiny")
TINY = FIXTURE / "target-f32.gguf"
Q = gguf.GGMLQuantizationType

TARGETS: dict[str, Callable[[], Path]] = {
    "fixture": lambda: TINY, "smollm2": models.smollm2_path, "gemma3": models.gemma3_270m_path,
}
# Expected default sizes: (lsa_heads, lsa_head_dim, lsa_kv, sa_kv, sa_ffn, lsa_ffn, head_dim, W, embedding_scale).
EXPECTED = {
    "fixture": (4, 16, 2, 2, 96, 96, 16, 64, 1.0),           # = reference construction (LSA uses H)
    "smollm2": (6, 64, 3, 3, 864, 576, 64, 384, 1.0),        # 384 / 9 not an integer -> 6 x 64
    "gemma3": (4, 128, 1, 1, 960, 768, 256, 512, math.sqrt(640)),  # head_dim 256 != 640 / 4
}
PARENTS = [-1, 0, 0, 1, 1, 2, 2, 3]   # root, 2 children, 4 grandchildren, 1 great-grandchild
# Tree row vs chain: same weights, same keys; only the masked-out keys and the batch size
# differ, so the logits agree to float rounding (measured: 0 on SmolLM2/Gemma, 3e-5 on the
# fixture whose logits reach ~380). A sibling-visible mask moves them by ~0.1.
REL_TOL = 2e-6


def target_path(name: str) -> Path:
    if name == "fixture":
        if not TINY.is_file():
            pytest.skip(f"fixture not found: {TINY}")
        return TINY
    try:
        return TARGETS[name]()
    except models.ModelNotInstalledError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def drafter_file(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """(target name, outtype) -> random drafter GGUF (seed 0), built once per module."""
    cache: dict[tuple[str, str], Path] = {}
    root = tmp_path_factory.mktemp("random")

    def get(name: str, outtype: str) -> Path:
        key = (name, outtype)
        if key not in cache:
            cache[key] = make_random_drafter(target_path(name), root / f"{name}-{outtype}.gguf", outtype)
        return cache[key]
    return get


def read_gguf(path: Path) -> tuple[dict, dict[str, gguf.ReaderTensor]]:
    r = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items()}, {t.name: t for t in r.tensors}


# ---------------------------------------------------------------- sizes and files

@pytest.mark.parametrize("name", list(TARGETS))
def test_default_sizes(name: str) -> None:
    s = spec_from_target(target_path(name))
    got = (s.lsa_heads, s.lsa_head_dim, s.lsa_kv, s.sa_kv, s.sa_ffn, s.lsa_ffn, s.head_dim, s.lsa_width)
    assert got == EXPECTED[name][:8]
    assert s.ca_kv == s.sa_kv and s.ca_ffn == s.sa_ffn
    assert s.embedding_scale == pytest.approx(EXPECTED[name][8])
    assert not s.problems()


def test_checkpoint_files(tmp_path: Path) -> None:
    ckpt = make_random_checkpoint(target_path("fixture"), tmp_path / "a", lsa_heads=2, sa_ffn=64, seed=3)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["hidden_size"] == 64 and cfg["num_attention_heads"] == 4
    assert cfg["num_key_value_heads"] == 2 and cfg["num_hidden_layers"] == 4 and cfg["head_dim"] == 16
    assert cfg["vocab_size"] == 49152 and cfg["rope_theta"] == 100000.0 and cfg["rope_scaling"] is None
    assert cfg["layer_self_attention_num_attention_heads"] == 2 and cfg["embedding_scale"] == 1.0
    st = load_file(str(ckpt / "model.safetensors"))
    assert len(st) == 29 and all(x.dtype == np.float32 for x in st.values())
    assert st["layer_self_attention.self_attn.q_proj.weight"].shape == (64, 64)
    assert st["layer_self_attention.self_attn.k_proj.weight"].shape == (64, 64)  # gcd(2, 2) kv heads x 32
    assert st["self_attention.mlp.up_proj.weight"].shape == (64, 64)
    assert st["Ekv2E.weight"].shape == (64, 64) and st["Ekv2E.bias"].shape == (64,)
    norm = st["cross_attention.input_layernorm.weight"]
    assert abs(float(norm.mean()) - 1.0) < 0.02 and 0.005 < float(norm.std()) < 0.05
    w = st["self_attention.self_attn.q_proj.weight"]
    assert abs(float(w.mean())) < 0.002 and float(w.std()) == pytest.approx(0.02, rel=0.1)
    # Seeded: same seed, same bytes; another seed, other values.
    again = load_file(str(make_random_checkpoint(TINY, tmp_path / "b", lsa_heads=2, sa_ffn=64, seed=3)
                          / "model.safetensors"))
    other = load_file(str(make_random_checkpoint(TINY, tmp_path / "c", lsa_heads=2, sa_ffn=64, seed=4)
                          / "model.safetensors"))
    assert all(np.array_equal(st[k], again[k]) for k in st)
    assert not np.array_equal(w, other["self_attention.self_attn.q_proj.weight"])


@pytest.mark.parametrize("kw,match", [
    (dict(lsa_heads=3), "lsa_heads 3"),            # 64 / 3 not an integer
    (dict(lsa_heads=64), "lsa_heads 64"),          # head dim 1 is odd
    (dict(sa_kv=3), "sa: 4 query heads"),
    (dict(lsa_heads=4, lsa_kv=3), "lsa: 4 query heads"),
])
def test_bad_sizes_rejected(tmp_path: Path, kw: dict, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        make_random_checkpoint(target_path("fixture"), tmp_path / "x", **kw)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("name", list(TARGETS))
def test_converted_metadata(name: str, drafter_file: Callable[[str, str], Path]) -> None:
    meta, tensors = read_gguf(drafter_file(name, "q8_0"))
    lh, ldim, lkv, skv, sffn, lffn, hd, W, scale = EXPECTED[name]
    assert meta[Keys.LSA_HEAD_COUNT] == lh and meta[Keys.LSA_KEY_LENGTH] == ldim
    assert meta[Keys.LSA_HEAD_COUNT_KV] == lkv and meta[Keys.LSA_WIDTH] == W and meta[Keys.LSA_FFN] == lffn
    assert meta[Keys.KEY_LENGTH] == hd and meta[Keys.TARGET_KEY_LENGTH] == hd
    assert meta[Keys.SA_HEAD_COUNT_KV] == skv and meta[Keys.SA_FFN] == sffn
    assert meta[Keys.EMBEDDING_SCALE] == pytest.approx(scale, rel=1e-6)
    assert meta[Keys.SOURCE_FORMAT] == "snapshot"
    # Every size is a multiple of 32, so every matrix is really Q8_0 (no F16 fallback).
    assert all(t.tensor_type == (Q.Q8_0 if len(t.shape) == 2 else Q.F32) for t in tensors.values())


def test_gemma_embedding_scale_from_target(tmp_path: Path) -> None:
    """Without the config key, a Gemma target's sqrt(d) layer-0 scale is recorded."""
    tp = target_path("gemma3")
    ckpt = make_random_checkpoint(tp, tmp_path / "g")
    cfg = json.loads((ckpt / "config.json").read_text())
    del cfg["embedding_scale"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    meta, _ = read_gguf(convert(ckpt, tmp_path / "g.gguf", target_gguf=tp, progress=False))
    assert meta[Keys.EMBEDDING_SCALE] == pytest.approx(math.sqrt(640), rel=1e-6)


# ---------------------------------------------------------------- native drafter on real K/V

def _path(i: int) -> list[int]:
    return ([] if PARENTS[i] < 0 else _path(PARENTS[i])) + [i]


@pytest.mark.parametrize("name,outtype", [("fixture", "f32"), ("smollm2", "f32"), ("smollm2", "q8_0"),
                                          ("gemma3", "f32")])
def test_commit_draft_tree_equals_chains(name: str, outtype: str, drafter_file: Callable[[str, str], Path]) -> None:
    from moa_cpp.drafter.drafter import Drafter
    from moa_cpp.target.target import Target

    tp = target_path(name)
    dp = drafter_file(name, outtype)
    with Target.from_path(tp, n_ctx=256) as tgt:
        ids = tgt.tokenize("Speculative decoding lets a small drafter propose several tokens, and the "
                           "target model checks them all in one batch. The quick brown fox")
        logits = tgt.decode(ids)
        lsa_in = tgt.captured_lsa_in()
        n_vocab = tgt.n_vocab
    S = len(ids)
    d = Drafter(dp, tp, n_ctx=256)
    try:
        assert d.model.n_vocab == n_vocab
        d.commit(lsa_in, 0)
        assert d.n_ca == S
        root = int(logits[-1].argmax())
        one = d.draft([root], [S], [-1], feed=ids)       # 1 row (root), SA context = prompt
        assert one.shape == (1, n_vocab) and np.isfinite(one).all()
        assert d.n_sa == S

        d.clear_drafts()
        rng = np.random.default_rng(0)
        toks = [root] + [int(t) for t in rng.integers(0, n_vocab, len(PARENTS) - 1)]
        pos = [S + len(_path(i)) - 1 for i in range(len(PARENTS))]   # depth-k node at S + k
        tree = d.draft(toks, pos, PARENTS)                            # 8 rows, one call
        assert tree.shape == (len(PARENTS), n_vocab) and np.isfinite(tree).all()
        tol = REL_TOL * float(np.abs(tree).max())
        assert float(np.abs(tree[0] - one[0]).max()) <= tol

        for i in range(len(PARENTS)):
            d.clear_drafts()
            for j in _path(i):
                chain = d.draft([toks[j]], [pos[j]])   # default parent: the previous row
            diff = float(np.abs(chain[0] - tree[i]).max())
            assert diff <= tol, f"row {i} (path {_path(i)}): max |tree - chain| = {diff:.3g} > {tol:.3g}"

        # The check is sensitive: row 2 drafted with its sibling row 1 visible differs clearly.
        d.clear_drafts()
        wrong = d.draft(toks[:3], pos[:3])[2]
        assert float(np.abs(wrong - tree[2]).max()) > 20 * tol
    finally:
        d.close()
        d.model.close()
