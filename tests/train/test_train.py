"""Training (issue 4): torch target vs golden / llama.cpp, torch drafter parity, a tiny real run.

Measured differences (SmolLM2-135M-Instruct Q4_1, 60-token prompt, llama.cpp CPU F32 capture vs
the torch F32 re-run of the dequantized GGUF): K/V rows mean |diff| ~0.02 (rows' mean |value|
~1.0), max ~0.6; logits mean |diff| ~0.3, max ~1.7; argmax agreement ~96 %. The differences
come from llama.cpp quantizing the activations (Q8) for its Q4_1 matmuls. On the F32 fixture
target both agree to ~5e-6 (K/V) and ~6e-5 (logits, |logits| up to 67).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from moa_cpp.testing.random_drafter import make_random_drafter, spec_from_target
from moa_cpp.target.setup import default_threads
from moa_cpp.train.data import DataSettings, generate_dataset
from moa_cpp.train.prompts import load_prompt_files
from moa_cpp.train.masks import bounded_masks
from moa_cpp.train.model import MoaDrafter
from moa_cpp.train.target_torch import TorchTarget
from moa_cpp.train.batches import make_batch as _batch
from moa_cpp.train.features import OnlineFeatures, compute_features
from moa_cpp.train.loss import loss_fn
from moa_cpp.train.settings import lr_at
from moa_cpp.train.trainer import Trainer, TrainSettings

torch.set_num_threads(1)

FIXTURE_SIZES = dict(sa_kv=2, sa_ffn=96, ca_kv=2, ca_ffn=80, lsa_heads=4, lsa_kv=2, lsa_ffn=48)


def test_torch_target_matches_golden(fixture_dir: Path) -> None:
    g = np.load(fixture_dir / "golden.npz")
    tt = TorchTarget.from_gguf(fixture_dir / "target-f32.gguf")
    out = tt(torch.tensor(g["prompt_ids"][None].astype(np.int64)), want_logits=True)
    n, L, Hk, D = len(g["prompt_ids"]), tt.n_layer, tt.n_head_kv, tt.head_dim
    kv = out.lsa_in[0].reshape(n, L, Hk, 2, D).permute(3, 1, 2, 0, 4).numpy()
    np.testing.assert_allclose(kv[0], g["target_k"], atol=2e-5)
    np.testing.assert_allclose(kv[1], g["target_v"], atol=2e-5)
    np.testing.assert_allclose(out.lsa_in[0].numpy(), g["lsa_in"], atol=2e-5)
    np.testing.assert_allclose(out.logits[0, -1].numpy(), g["target_logits_last"], atol=5e-4)


def test_torch_target_matches_llamacpp_fixture(fixture_dir: Path) -> None:
    from moa_cpp.target.target import Target

    g = np.load(fixture_dir / "golden.npz")
    ids = g["prompt_ids"]
    # flash attention off: llama.cpp's CPU flash attention rounds through F16 (K/V rows then differ by ~8e-3)
    with Target.from_path(fixture_dir / "target-f32.gguf", n_ctx=256, n_threads=1, cache_type="f32",
                          flash_attn=False) as tg:
        logits = tg.decode(ids)
        cap = tg.captured_lsa_in()
    out = TorchTarget.from_gguf(fixture_dir / "target-f32.gguf")(torch.tensor(ids[None].astype(np.int64)),
                                                               want_logits=True)
    np.testing.assert_allclose(out.lsa_in[0].numpy(), cap, atol=1e-4)
    np.testing.assert_allclose(out.logits[0].numpy(), logits, atol=2e-3, rtol=1e-4)


@pytest.mark.model
def test_torch_target_matches_llamacpp_smollm2() -> None:
    """Real quantized model: the F32 torch re-run agrees with llama.cpp's capture (tolerances above)."""
    from moa_cpp.models.registry import smollm2_path
    from moa_cpp.target.target import Target

    path = smollm2_path()
    text = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
            "combined movable metal type with an oil-based ink and a screw press. Within decades, books")
    with Target.from_path(path, n_ctx=512, n_threads=1) as tg:
        ids = tg.tokenize(text, add_bos=False)
        logits = tg.decode(ids)
        cap = tg.captured_lsa_in()
    out = TorchTarget.from_gguf(path)(torch.tensor(ids[None].astype(np.int64)), want_logits=True)
    d_kv = np.abs(out.lsa_in[0].numpy() - cap)
    d_lg = np.abs(out.logits[0].numpy() - logits)
    agree = float((out.logits[0].numpy().argmax(-1) == logits.argmax(-1)).mean())
    assert d_kv.mean() < 0.05 and d_kv.max() < 1.5, (d_kv.mean(), d_kv.max())
    assert d_lg.mean() < 0.6 and d_lg.max() < 4.0, (d_lg.mean(), d_lg.max())
    assert agree >= 0.85, agree


@pytest.mark.model
@pytest.mark.slow
def test_torch_target_matches_llamacpp_qwen2() -> None:
    """qwen2 (Q/K/V biases, NEOX rope, rows not permuted): Qwen2.5-Coder-0.5B Q4_K_M re-run in torch
    agrees with llama.cpp's capture as SmolLM2 does (K/V in the layout the native drafter reads)."""
    from moa_cpp.models.registry import qwen25_coder_05b_path
    from moa_cpp.target.target import Target

    try:
        path = qwen25_coder_05b_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    text = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n"
    with Target.from_path(path, n_ctx=512) as tg:
        ids = tg.tokenize(text, add_bos=False)
        logits = tg.decode(ids)
        cap = tg.captured_lsa_in()
    tt = TorchTarget.from_gguf(path)
    assert float(tt.layers[0].attn_q_b.abs().max()) > 0           # the biases were read
    out = tt(torch.tensor(ids[None].astype(np.int64)), want_logits=True)
    d_kv = np.abs(out.lsa_in[0].numpy() - cap)
    scale = float(np.abs(cap).mean())
    agree = float((out.logits[0].numpy().argmax(-1) == logits.argmax(-1)).mean())
    assert d_kv.mean() < 0.05 * scale, (d_kv.mean(), scale)
    assert agree >= 0.85, agree


def test_torch_drafter_reproduces_native_root_logits(fixture_dir: Path) -> None:
    """Inference-mode forward (root after the prefix, CA sees the prefix) == golden draft_logits_root."""
    from safetensors.numpy import load_file

    g = np.load(fixture_dir / "golden.npz")
    spec = spec_from_target(fixture_dir / "target-f32.gguf", **FIXTURE_SIZES)
    tt = TorchTarget.from_gguf(fixture_dir / "target-f32.gguf")
    m = MoaDrafter(spec, tt.embed.data)
    m.load_hf(load_file(str(fixture_dir / "drafter_hf" / "model.safetensors")))
    n = len(g["prompt_ids"])
    toks = torch.tensor(np.r_[g["prompt_ids"], g["root_token"]][None].astype(np.int64))
    lsa = torch.zeros(1, n + 1, *g["lsa_in"].shape[1:])
    lsa[0, :n] = torch.from_numpy(g["lsa_in"])
    resp = torch.zeros(1, n + 1, dtype=torch.bool)
    resp[0, n] = True
    sa, ca, start = bounded_masks(resp, torch.tensor([10_000]), torch.tensor([False]))
    assert int(start[0, n]) == n - 1
    with torch.no_grad():
        lg = m.logits(m(toks, lsa, sa, ca))[0, n].numpy()
    ref = g["draft_logits_root"]
    assert np.abs(lg - ref).max() <= 1e-4 * np.abs(ref).max() + 1e-4
    assert int(lg.argmax()) == int(ref.argmax())


def test_lsa_row_chunks_equal_one_call(fixture_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The LSA runs in row chunks that keep SDPA's batch x heads under CUDA's 65,535 grid limit
    (16k-token GPU batches); chunked and whole give the same CA keys/values."""
    import moa_cpp.train.model as mm
    from safetensors.numpy import load_file

    spec = spec_from_target(fixture_dir / "target-f32.gguf", **FIXTURE_SIZES)
    tt = TorchTarget.from_gguf(fixture_dir / "target-f32.gguf")
    m = MoaDrafter(spec, tt.embed.data)
    m.load_hf(load_file(str(fixture_dir / "drafter_hf" / "model.safetensors")))
    g = torch.Generator().manual_seed(0)
    lsa = torch.randn(3, 7, spec.target_layers, spec.lsa_width, generator=g)
    pos = torch.arange(7).expand(3, 7)
    with torch.no_grad():
        whole = m.ca_kv(lsa, pos)
        monkeypatch.setattr(mm, "_SDPA_MAX_BATCH", 5 * spec.lsa_heads)    # 21 rows -> chunks of 5
        chunked = m.ca_kv(lsa, pos)
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n_tli", [1, 2])
def test_torch_tli_head_matches_native_engine(fixture_dir: Path, tmp_path: Path, n_tli: int) -> None:
    """TLI N trains the computation the engine runs (docs/drafter.md#tli): the torch training forward in
    inference position (root after the prompt, then one chained draft) gives the native drafter's
    logits for the same checkpoint converted with ``tli=N`` (F32 fixture, rel 1e-4)."""
    from safetensors.numpy import load_file

    from moa_cpp.convert import convert
    from moa_cpp.drafter.drafter import Drafter

    g = np.load(fixture_dir / "golden.npz")
    target = fixture_dir / "target-f32.gguf"
    d = Drafter(convert(fixture_dir / "drafter_hf", tmp_path / "tli.gguf", outtype="f32", target_gguf=target,
                        tli=n_tli, progress=False), target, n_ctx=64)
    n = len(g["prompt_ids"])
    d.commit(g["lsa_in"], 0)
    lg0 = d.draft([int(g["root_token"])], [n], [-1], feed=g["prompt_ids"])
    t1 = int(lg0[0].argmax())
    lg1 = d.draft([t1], [n + 1])
    native = np.concatenate([lg0, lg1])

    spec = spec_from_target(target, **FIXTURE_SIZES)
    tt = TorchTarget.from_gguf(target)
    m = MoaDrafter(spec, tt.embed.data)
    m.load_hf(load_file(str(fixture_dir / "drafter_hf" / "model.safetensors")))
    m.attach_tli(tt, n_tli)
    toks = torch.tensor(np.r_[g["prompt_ids"], g["root_token"], t1][None].astype(np.int64))
    lsa = torch.zeros(1, n + 2, *g["lsa_in"].shape[1:])
    lsa[0, :n] = torch.from_numpy(g["lsa_in"])
    lsa[0, n:] = 1e3  # never visible: the draft rows see only the prompt's K/V (+ their own k/v)
    resp = torch.zeros(1, n + 2, dtype=torch.bool)
    resp[0, n:] = True
    sa, ca, start = bounded_masks(resp, torch.tensor([10_000]), torch.tensor([False]))
    assert start[0, n:].tolist() == [n - 1, n - 1]
    with torch.no_grad():
        z = m(toks, lsa, sa, ca)
        lg = m.logits(m.head_input(z, lsa, start))[0, n:].numpy()
    assert np.abs(lg - native).max() <= 1e-4 * np.abs(native).max(), np.abs(lg - native).max()
    assert (lg.argmax(-1) == native.argmax(-1)).all()
    # and it is not the TLI-0 head
    assert np.abs(m.logits(z)[0, n:].detach().numpy() - native).max() > 1e-2


def test_masks_follow_spec() -> None:
    resp = torch.tensor([[False, False, True, True, True, True, True, False]])  # last: padding
    sa, ca, start = bounded_masks(resp, torch.tensor([3]), torch.tensor([True]))
    assert start[0].tolist() == [0, 1, 1, 3, 3, 3, 6, 7]
    assert ca[0, 0, 4].tolist() == [True, True, True, True, False, False, False, False]
    assert sa[0, 0, 5].tolist() == [False, False, False, False, True, True, False, False]
    sa, _, _ = bounded_masks(resp, torch.tensor([3]), torch.tensor([False]))
    assert sa[0, 0, 5].tolist() == [True] * 6 + [False] * 2


def _length_only_data(lens: np.ndarray):
    """(dataset, feature store) of zero tokens and zero features with sample lengths ``lens``:
    enough for batching tests, which look only at lengths."""
    from moa_cpp.train.data import Dataset
    from moa_cpp.train.features import FeatureStore

    n = len(lens)
    ds = Dataset(tokens=np.zeros(int(lens.sum()), np.int32), offsets=np.r_[0, np.cumsum(lens)].astype(np.int64),
                 prompt_len=np.full(n, 5, np.int32), greedy=np.zeros(n, bool))
    fs = FeatureStore(np.zeros((len(ds.tokens), 1, 1), np.float16), np.zeros((len(ds.tokens), 1), np.float32))
    return ds, fs


def _random_token_data():
    """8 greedy samples of random tokens (seeded), for the short synthetic training runs."""
    from moa_cpp.train.data import Dataset

    rng = np.random.default_rng(1)
    lens = [40, 33, 52, 47, 29, 61, 38, 44]
    return Dataset(tokens=rng.integers(0, 1000, sum(lens)).astype(np.int32),
                   offsets=np.r_[0, np.cumsum(lens)].astype(np.int64), prompt_len=np.full(len(lens), 5, np.int32),
                   greedy=np.ones(len(lens), bool))


def test_epochs_with_different_batch_counts(fixture_dir: Path, tmp_path: Path) -> None:
    """Packing differs per epoch (shuffled order), so epochs may hold different numbers of batches:
    every epoch must still visit each training sample exactly once, across epoch boundaries."""
    ds, fs = _length_only_data(np.random.default_rng(0).integers(20, 200, size=60))
    tt = TorchTarget.from_gguf(fixture_dir / "target-f32.gguf")
    tr = Trainer(spec_from_target(fixture_dir / "target-f32.gguf", **FIXTURE_SIZES), tt, ds, fs, tmp_path,
                 TrainSettings(batch_tokens=512, holdout=0), log=lambda s: None)
    counts = [len(tr._batches_of_epoch(e)) for e in range(8)]
    assert len(set(counts)) > 1, counts  # the case that used to crash
    step = 0
    for e, n in enumerate(counts):
        seen = []
        for _ in range(n):
            epoch, ids = tr.batch_at(step)
            assert epoch == e
            seen += ids
            step += 1
        assert sorted(seen) == sorted(tr.train_idx.tolist())


def test_bucketed_batches_pad_less_and_visit_every_sample(fixture_dir: Path, tmp_path: Path) -> None:
    """``batching="bucket"``: each epoch still holds every training sample exactly once, in a
    seeded order that differs per epoch, with less padding than shuffled packing."""
    from moa_cpp.train.packing import padding_share

    lens = np.random.default_rng(0).integers(20, 400, size=300)
    ds, fs = _length_only_data(lens)
    tt = TorchTarget.from_gguf(fixture_dir / "target-f32.gguf")
    spec = spec_from_target(fixture_dir / "target-f32.gguf", **FIXTURE_SIZES)
    pads = {}
    for mode in ("random", "bucket"):
        tr = Trainer(spec, tt, ds, fs, tmp_path / mode, TrainSettings(batch_tokens=1024, holdout=0, batching=mode),
                     log=lambda s: None)
        e0, e1 = tr._batches_of_epoch(0), tr._batches_of_epoch(1)
        for ep in (e0, e1):
            assert sorted(j for b in ep for j in b) == sorted(tr.train_idx.tolist())
            assert all(max(lens[j] for j in b) * len(b) <= 1024 for b in ep)
        assert e0 != e1 and e0 == tr._batches_of_epoch(0)
        pads[mode] = padding_share(e0, lens)
    assert pads["bucket"] < 0.5 * pads["random"], pads
    with pytest.raises(ValueError, match="batching 'sorted'"):
        Trainer(spec, tt, ds, fs, tmp_path / "bad", TrainSettings(holdout=0, batching="sorted"),
                log=lambda s: None)._batches_of_epoch(0)


def test_empty_dataset_is_a_clear_error(fixture_dir: Path, tmp_path: Path) -> None:
    """A data stage that produced nothing (e.g. every prompt too long for its share of the context)
    is an error naming the cause, not a step loop that looks for a first batch for ever."""
    from moa_cpp.errors import InvalidArgumentError

    ds, fs = _length_only_data(np.zeros(0, np.int64))
    tt = TorchTarget.from_gguf(fixture_dir / "target-f32.gguf")
    with pytest.raises(InvalidArgumentError, match="no training samples"):
        Trainer(spec_from_target(fixture_dir / "target-f32.gguf", **FIXTURE_SIZES), tt, ds, fs, tmp_path,
                TrainSettings(holdout=0), log=lambda s: None)


def test_init_from_target(fixture_dir: Path) -> None:
    """SA starts as target layer 0 and CA as the last target layer; mismatched sizes are refused."""
    target = fixture_dir / "target-f32.gguf"
    tt = TorchTarget.from_gguf(target)
    ffn, kv = tt.layers[0].ffn_gate.shape[0], tt.n_head_kv
    sizes = dict(FIXTURE_SIZES, sa_ffn=ffn, ca_ffn=ffn, sa_kv=kv, ca_kv=kv)
    m = MoaDrafter(spec_from_target(target, **sizes), tt.embed.data)
    m.init_weights(0)
    m.init_from_target(tt)
    assert torch.equal(m.self_attention.self_attn.k_proj.weight, tt.layers[0].attn_k)
    assert torch.equal(m.cross_attention.mlp.down_proj.weight, tt.layers[-1].ffn_down)
    assert torch.equal(m.cross_attention.input_layernorm.weight, tt.layers[-1].attn_norm)
    bad = MoaDrafter(spec_from_target(target, **dict(sizes, sa_ffn=ffn + 32)), tt.embed.data)
    with pytest.raises(ValueError, match="target's FFN width"):
        bad.init_from_target(tt)


def test_lr_schedule() -> None:
    s = TrainSettings(lr=1e-3, warmup=50, min_lr_ratio=0.05)
    assert lr_at(0, 1000, s) == pytest.approx(2e-5)
    assert lr_at(49, 1000, s) == pytest.approx(1e-3)
    assert lr_at(999, 1000, s) == pytest.approx(5e-5, rel=0.05)


def test_prompt_files(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"prompt": "p1"}\n{"turns": ["p2", "x"]}\n'
                                      '{"messages": [{"role": "user", "content": "p3"}]}\n')
    (tmp_path / "b.txt").write_text("p4\n\n p5 \n")
    assert load_prompt_files([tmp_path / "a.jsonl", tmp_path / "b.txt"]) == ["p1", "p2", "p3", "p4", "p5"]


_PROMPTS = [
    "The quick brown fox jumps over the lazy dog near the quiet river bank.",
    "Once upon a time there was a small village at the edge of a forest.",
    "In mathematics, a prime number is a natural number greater than one.",
    "The weather today is sunny with a light breeze from the west.",
    "Python is a programming language that lets you work quickly.",
    "She opened the door and saw a letter lying on the floor.",
    "The capital of France is Paris, and it is known for its museums.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "He ran to the station but the train had already left.",
    "A good recipe for bread needs flour, water, salt and yeast.",
    "The stock market rose sharply after the announcement on Monday.",
    "Music has the power to bring people together across cultures.",
    "The spacecraft entered orbit around the red planet last week.",
    "Learning a new language takes patience and daily practice.",
    "The museum will open a new exhibition about ancient Egypt.",
    "Rain fell all night and the streets were flooded by morning.",
    "Our team won the championship after a long and hard season.",
    "The old library has thousands of books on every subject.",
    "Coffee is one of the most popular drinks in the world.",
    "The children played in the park until the sun went down.",
]


def _prompt_dataset(target: Path, tmp_path: Path, max_new_tokens: int):
    """llama.cpp's greedy continuations of the 20 training prompts (the data stage, for real)."""
    (tmp_path / "prompts.txt").write_text("\n".join(_PROMPTS) + "\n")
    ds = generate_dataset(target, tmp_path / "data",
                          DataSettings(n_samples=len(_PROMPTS), max_new_tokens=max_new_tokens, greedy_fraction=1.0,
                                       n_parallel=8, n_threads=1, chat=False, n_ctx=2048),
                          prompt_files=[tmp_path / "prompts.txt"], log=lambda s: None)
    assert len(ds) == len(_PROMPTS)
    return ds


# measured: 50 steps left tau 2.05-3.03 against the random 1.54 (not +1.0): 100 it is
TINY_STEPS = 100


def chain4_tau(target: Path, drafter: Path, prompts: list, max_tokens: int) -> float:
    """The native engine's greedy chain-4 tau of ``drafter`` over ``prompts`` (text or ids)."""
    from moa_cpp.generator import SpeculativeGenerator

    gen = SpeculativeGenerator.from_paths(target, drafter, draft="chain:4", n_ctx=1024, n_threads=1)
    try:
        accepted = calls = 0
        for p in prompts:
            r = gen.generate(p, max_tokens=max_tokens)
            accepted += r.stats.accepted
            calls += r.stats.target_calls
        return (accepted + calls) / calls
    finally:
        gen.close()


@pytest.mark.slow
@pytest.mark.parametrize("draft_vocab,tli,source", [(0, 0, "torch"), (512, 0, "llama"), (0, 1, "torch")],
                         ids=["full-vocab", "reduced-vocab-llama", "tli1"])
def test_tiny_training_run_beats_random_drafter(fixture_dir: Path, tmp_path: Path, draft_vocab: int, tli: int,
                                                source: str) -> None:
    """Data from llama.cpp, a short run on the fixture target: the loss falls, and the native
    engine's greedy chain-4 tau with the trained drafter (torch -> snapshot -> GGUF -> native)
    beats a random drafter's.

    The fixture target is random (it writes repetitive gibberish), so nothing a tiny drafter
    learns in 20 sequences generalises; tau is therefore measured on the training prompts, whose
    greedy continuations the drafter has fitted. That still checks every convention end to end
    (masks, positions, RoPE, K/V layout, names, conversion): any mismatch leaves the trained drafter
    at the random one's tau (measured: ~3.7 vs ~1.5). On 8 held-out prompts the same run measured
    1.32 (full-vocab) / 1.05 (reduced-vocab) against the random drafter's 1.54, and no affordable
    change fixed that (200 sequences, 600 steps, lr 1e-3..1e-2, SA/CA initialised from the target:
    at best 1.54): the random drafter's 1.54 is the "repeat the current token" rule (an oracle of
    it: 1.53; the target repeats 40 % of its tokens), and even a bigram table of 200 training
    sequences covering 74 % of the held-out tokens only reaches 1.35 there, since the random
    target's next token depends on more than the current one. Held-out acceptance is therefore
    measured on SmolLM2: :func:`test_tiny_smollm2_run_beats_random_drafter_on_heldout_prompts`.

    ``reduced-vocab-llama``: the same with a 512-token draft vocabulary (of 49,152; the random
    fixture target writes ~740 distinct tokens, so 96 tokens covered only half of them) (own head,
    ``d2t`` in the GGUF, draft ids mapped back to target ids by the proposer), and the features
    from llama.cpp (``--feature-source llama``: the native capture's K/V, llama.cpp's hidden
    states, the frozen head from gguf-py) instead of the PyTorch target. ``tli1``: TLI 1 (features with the
    residual entering the last layer, the GGUF converted with ``tli=1``, the engine running the
    target's last layer on every draft row).
    """
    from moa_cpp.convert import convert

    target = fixture_dir / "target-f32.gguf"
    ds = _prompt_dataset(target, tmp_path, 64)
    assert (tmp_path / "data" / "manifest.json").is_file()
    if source == "llama":
        from moa_cpp.train.features_llama import GgufHead, compute_features_llama
        tt = GgufHead.from_gguf(target)
        fs = compute_features_llama(str(target), ds, None, log=lambda s: None, threads=1)
    else:
        tt = TorchTarget.from_gguf(target)
        fs = compute_features(tt, ds, None, log=lambda s: None, bf16=False,
                              resid_layer=tt.n_layer - tli if tli else None)
    spec = spec_from_target(target, **FIXTURE_SIZES)
    ts = TrainSettings(seed=0, steps=TINY_STEPS, batch_tokens=512, lr=1e-2, holdout=3, eval_every=1000, ckpt_every=1000,
                       threads=default_threads(), bf16=False, draft_vocab=draft_vocab, tli=tli)   # the cores it may use
    tr = Trainer(spec, tt, ds, fs, tmp_path, ts, log=lambda s: None)
    if draft_vocab:
        assert tr.d2t is not None and len(tr.d2t) == draft_vocab and (np.diff(tr.d2t) > 0).all()
    batch = _batch(ds, fs, tr.train_idx[:6].tolist())
    T, stair = torch.full((6,), 8), torch.zeros(6, dtype=torch.bool)
    with torch.no_grad():
        loss0 = float(loss_fn(tr.model, batch, T, stair, 0.1, False)[0])
    summary = tr.run()
    with torch.no_grad():
        loss1 = float(loss_fn(tr.model, batch, T, stair, 0.1, False)[0])
    # TLI 1 measured 0.32x: its second regression (z vs the residual stream) fits slower
    print(f"\n[tiny run] steps {TINY_STEPS}: loss ratio {loss1 / loss0:.3f}")
    assert loss1 < (0.5 if tli else 0.3) * loss0, (loss0, loss1)
    assert summary["steps"] == TINY_STEPS
    _check_first_cap(tr.model, ds, fs, tr.train_idx[:4].tolist())
    snap = tr.model.save(tmp_path / "snapshot")
    trained = convert(snap, tmp_path / "trained.gguf", outtype="f32", target_gguf=target, tli=tli, progress=False)
    rand = make_random_drafter(target, tmp_path / "random.gguf", outtype="f32", **FIXTURE_SIZES)
    if draft_vocab:
        from moa_cpp.drafter.drafter import DrafterModel
        dm = DrafterModel(trained, target)
        try:
            np.testing.assert_array_equal(dm.d2t(), tr.d2t)
        finally:
            dm.close()

    prompts = [ds.sample(i)[: int(ds.prompt_len[i])].tolist() for i in tr.train_idx[:8]]
    t_trained, t_random = (chain4_tau(target, d, prompts, 48) for d in (trained, rand))
    print(f"[tiny run] chain-4 tau: trained {t_trained:.3f}, random {t_random:.3f}")
    assert t_trained > t_random + 1.0, (t_trained, t_random)


def _check_first_cap(model, ds, fs, idx: list[int]) -> None:
    """``eval_acceptance(first=N)`` (``moa-cpp train eval --first``): a cap past every response
    changes nothing; a cap of 3 starts at most 3 chains per response, and fewer in all than none."""
    from moa_cpp.train.evaluate import eval_acceptance
    full: list[tuple[int, int]] = []
    capped: list[tuple[int, int]] = []
    res = eval_acceptance(model, ds, fs, idx, per_sample=full)
    assert eval_acceptance(model, ds, fs, idx, first=10**6) == res
    eval_acceptance(model, ds, fs, idx, per_sample=capped, first=3)
    assert all(0 < c <= min(3, f) for (_, c), (_, f) in zip(capped, full)), (capped, full)
    assert sum(c for _, c in capped) < sum(f for _, f in full)


# Not used for training (disjoint from _PROMPTS): the held-out set of the SmolLM2 run below.
_HELDOUT_PROMPTS = [
    "The fisherman pulled his boat onto the sandy shore at dawn.",
    "Every winter the lake freezes and people skate across it.",
    "The robot vacuum cleaned the kitchen while we were at work.",
    "My grandmother keeps a garden full of roses and tomatoes.",
    "The train to the coast leaves the station every two hours.",
    "A group of volunteers cleaned the beach on Saturday morning.",
    "The pilot announced that the plane would land in ten minutes.",
    "Our cat sleeps in the sunny spot by the window all afternoon.",
]


@pytest.mark.model
@pytest.mark.slow
def test_tiny_smollm2_run_beats_random_drafter_on_heldout_prompts(tmp_path: Path) -> None:
    """What a trained drafter is for: acceptance on prompts it was not trained on. A tiny run on
    SmolLM2-135M (the 20 prompts of the fixture run, 48-token greedy continuations from llama.cpp,
    a 512-token draft vocabulary, small FFNs, 40 steps of 256 tokens) and the native engine's
    greedy chain-4 tau (torch -> snapshot -> GGUF -> native) over 8 held-out prompts, 32 tokens
    each, against a random drafter of the same sizes.

    Measured (CPU, 1 thread): trained 1.184 vs random 1.025 (seed 0); trainer seeds 1 and 2 gave
    1.179 and 1.141, so the trained drafter leads by 0.12..0.16; the assert asks for 0.08. A
    drafter that learned nothing that generalises stays near the random one: the same run at lr
    1e-2 measured 1.052. (100 steps of 512 tokens with the default sizes reach 1.22 in ~3x the
    time; the shipped drafter measures 1.44 on these prompts.)
    """
    from moa_cpp.models import defaults
    from moa_cpp.convert import convert

    assert not set(_HELDOUT_PROMPTS) & set(_PROMPTS)
    target = Path(defaults.default_target())
    ds = _prompt_dataset(target, tmp_path, 48)
    tt = TorchTarget.from_gguf(target)
    fs = compute_features(tt, ds, None, log=lambda s: None, bf16=False)
    sizes = dict(sa_ffn=64, ca_ffn=64, lsa_ffn=64)
    ts = TrainSettings(seed=0, steps=40, batch_tokens=256, lr=3e-3, holdout=3, eval_every=1000, ckpt_every=1000,
                       threads=1, bf16=False, draft_vocab=512)
    tr = Trainer(spec_from_target(target, **sizes), tt, ds, fs, tmp_path, ts, log=lambda s: None)
    assert tr.run()["steps"] == 40
    trained = convert(tr.model.save(tmp_path / "snapshot"), tmp_path / "trained.gguf", outtype="f32",
                      target_gguf=target, progress=False)
    rand = make_random_drafter(target, tmp_path / "random.gguf", outtype="f32", **sizes)

    t_trained, t_random = (chain4_tau(target, d, _HELDOUT_PROMPTS, 32) for d in (trained, rand))
    print(f"\nheld-out chain-4 tau: trained {t_trained:.3f}, random {t_random:.3f}")
    assert t_trained > t_random + 0.08, (t_trained, t_random)


def test_data_sampler_law() -> None:
    """Data-generation sampling draws from the exact temperature + top-p law (chi-square, alpha 1e-3),
    also when the vocabulary is larger than the 1024-token candidate window."""
    from scipy.stats import chisquare

    from moa_cpp.train.data import _sample

    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, 5000).astype(np.float32)
    logits[:6] = [9.0, 8.5, 8.0, 7.0, 6.5, 6.0]
    T, top_p = 0.7, 0.9
    x = logits.astype(np.float64) / T
    p = np.exp(x - x.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = order[: int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1]
    law = np.zeros_like(p)
    law[keep] = p[keep] / p[keep].sum()
    n = 20000
    draws = np.bincount([_sample(logits, T, top_p, rng) for _ in range(n)], minlength=len(p))
    assert draws[law == 0].sum() == 0
    assert chisquare(draws[keep], law[keep] * n).pvalue > 1e-3
    assert _sample(logits, 0.0, top_p, rng) == 0


@pytest.mark.model
def test_self_generated_data_in_rounds(tmp_path: Path) -> None:
    """No prompt files: SmolLM2 writes its own user turns from the chat template's user prefix and
    answers them, in rounds; prompts are chat-templated, distinct, and responses end at an
    end-of-turn token or the length cap. A second call with the same settings reuses the data."""
    from moa_cpp.models.registry import smollm2_path
    from moa_cpp.target.target import Target

    st = DataSettings(n_samples=6, round_size=4, max_prompt_tokens=48, max_new_tokens=24, n_parallel=4,
                      n_threads=1, n_ctx=1024)
    logs: list[str] = []
    ds = generate_dataset(smollm2_path(), tmp_path / "data", st, log=logs.append)
    assert 3 <= len(ds) <= 6, logs
    assert sum("conversations" in m for m in logs) >= 2, logs  # at least two rounds
    prompts = [json.loads(line)["prompt"] for line in (tmp_path / "data" / "prompts.jsonl").read_text().splitlines()]
    assert len(set(prompts)) == len(prompts) == len(ds)
    with Target.from_path(smollm2_path(), n_ctx=256, n_threads=1, install_callback=False) as tg:
        for i in range(len(ds)):
            s = ds.sample(i)
            pl = int(ds.prompt_len[i])
            want = tg.tokenize(tg.apply_chat_template([{"role": "user", "content": prompts[i]}]), add_bos=False,
                               special=True)
            np.testing.assert_array_equal(s[:pl], want)
            r = s[pl:]
            assert 1 <= len(r) <= st.max_new_tokens
            assert tg.is_eog(int(r[-1])) or len(r) == st.max_new_tokens
    again = generate_dataset(smollm2_path(), tmp_path / "data", st, log=logs.append)
    np.testing.assert_array_equal(again.tokens, ds.tokens)
    assert "reusing" in logs[-1]


@pytest.mark.model
def test_self_written_prompts_keep_their_starts(tmp_path: Path) -> None:
    """--prompt-starts: every self-written user turn begins with one of the given openings and goes
    on in the model's own words (the shipped 'tasks' list loads; a bad list is a clear error)."""
    from moa_cpp.models.registry import smollm2_path
    from moa_cpp.train.prompts import load_prompt_starts

    tasks = load_prompt_starts("tasks")
    assert len(tasks) >= 20 and any(t.startswith("Summarize") for t in tasks) and "" in tasks
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"start": 3}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: a JSON string or an object"):
        load_prompt_starts(bad)
    starts = ["Write a Python function that", "Summarize this text:\n\n"]
    st = DataSettings(n_samples=4, round_size=8, max_prompt_tokens=160, max_new_tokens=8, n_parallel=4,
                      n_threads=1, n_ctx=1024, prompt_starts=starts)
    ds = generate_dataset(smollm2_path(), tmp_path / "data", st, log=lambda m: None)
    prompts = [json.loads(line)["prompt"] for line in (tmp_path / "data" / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == len(ds) >= 1
    for p in prompts:
        head = next((s.strip() for s in starts if p.startswith(s.strip())), None)
        assert head is not None, p
        assert len(p) > len(head) + 3, p     # the model wrote the rest


def test_draft_vocab_choice() -> None:
    """Top-V response tokens by count (ties: lower id), response-ending tokens always kept, prompt
    tokens ignored; coverage is the held-in share."""
    from moa_cpp.train.data import Dataset
    from moa_cpp.train.vocab import draft_vocab, vocab_coverage

    # two samples: prompt [9, 9, 9] then response; the rare token 7 ends every response
    seqs = [[9, 9, 9, 1, 1, 1, 2, 2, 3, 7], [9, 9, 9, 1, 2, 3, 4, 4, 5, 7]]
    ds = Dataset(tokens=np.concatenate(seqs).astype(np.int32), offsets=np.array([0, 10, 20], np.int64),
                 prompt_len=np.array([3, 3], np.int32), greedy=np.ones(2, bool))
    # counts in responses: 1:4, 2:3, 3:2, 4:2, 7:2, 5:1; 9 only in prompts
    np.testing.assert_array_equal(draft_vocab(ds, [0, 1], 16, 3), [1, 2, 7])   # 7 kept: it ends responses
    np.testing.assert_array_equal(draft_vocab(ds, [0, 1], 16, 4), [1, 2, 3, 7])  # 3 beats 4 on the tie
    assert 9 not in draft_vocab(ds, [0, 1], 16, 7)
    assert vocab_coverage(ds, [0, 1], np.array([1, 2, 7])) == pytest.approx(9 / 14)
    with pytest.raises(ValueError):
        draft_vocab(ds, [0, 1], 16, 0)


def test_feature_cache_adds_residual_later(fixture_dir: Path, tmp_path: Path) -> None:
    """A feature cache made for TLI 0 gains the TLI residual by one more target pass; the result
    equals computing everything at once."""
    from moa_cpp.train.data import Dataset

    tt = TorchTarget.from_gguf(fixture_dir / "target-f32.gguf")
    rng = np.random.default_rng(0)
    lens = [12, 30, 7]
    ds = Dataset(tokens=rng.integers(0, 1000, sum(lens)).astype(np.int32),
                 offsets=np.r_[0, np.cumsum(lens)].astype(np.int64), prompt_len=np.full(3, 2, np.int32),
                 greedy=np.ones(3, bool))
    layer = tt.n_layer - 1
    at_once = compute_features(tt, ds, None, log=lambda s: None, bf16=False, resid_layer=layer)
    first = compute_features(tt, ds, tmp_path / "f", log=lambda s: None, bf16=False)
    assert first.resid is None
    later = compute_features(tt, ds, tmp_path / "f", log=lambda s: None, bf16=False, resid_layer=layer)
    np.testing.assert_array_equal(later.resid, at_once.resid)
    np.testing.assert_array_equal(np.asarray(later.lsa), at_once.lsa)
    np.testing.assert_array_equal(later.hidden, at_once.hidden)
    assert np.abs(at_once.resid).max() > 0


@pytest.mark.parametrize("args,match", [(["--tli", "99"], "--tli 99: must be in 0.."),
                                        (["--tli", "-1"], "--tli -1"),
                                        (["--draft-vocab", "-3"], "--draft-vocab -3: must be >= 0"),
                                        (["--n-samples", "0"], "no training data: --n-samples 0 needs"),
                                        (["--fixed-answers", "-1"], "must be >= 0"),
                                        (["--bf16", "maybe"], "invalid choice: 'maybe'"),
                                        (["--t-range", "6", "1"], "--t-range 6 1: need 2 <= MIN <= MAX"),
                                        (["--staircase-until", "1.5"], "--staircase-until 1.5: a fraction"),
                                        (["--batching", "sorted"], "invalid choice: 'sorted'"),
                                        (["--optimizer", "sgd"], "invalid choice: 'sgd'"),
                                        (["--lr", "0"], "--lr 0.0: must be > 0"),
                                        (["--warmup", "-1"], "--warmup, --ce-weight and --loss-max-depth must be >= 0"),
                                        (["--ce-weight", "-0.5"], "--warmup, --ce-weight and --loss-max-depth must be >= 0"),
                                        (["--loss-max-depth", "-2"], "--loss-max-depth must be >= 0"),
                                        (["--exclude-prompts", "/nonexistent/held.jsonl"],
                                         "--exclude-prompts: /nonexistent/held.jsonl: no such prompts file"),
                                        (["--muon-ns-steps", "0"], "--muon-ns-steps >= 1"),
                                        (["--prompts", "sharegpt:4", "--prompt-starts", "tasks"],
                                         "--prompt-starts: self-written prompts only"),
                                        (["--prompt-starts", "/nonexistent/starts.jsonl"],
                                         "--prompt-starts: /nonexistent/starts.jsonl: no such file, nor a shipped "
                                         "list (tasks)"),
                                        (["--max-prompt-tokens", "0"], "--max-prompt-tokens 0: must be >= 1"),
                                        (["--device", "tpu"], "--device: device 'tpu': use auto, cpu or cuda"),
                                        # no CUDA here: "sees no CUDA device"; with CUDA: "only N device(s)"
                                        (["--device", "cuda:99"], "--device: device 'cuda:99'")])
def test_train_cli_rejects_bad_arguments(fixture_dir: Path, tmp_path: Path, args: list[str], match: str,
                                         capsys: pytest.CaptureFixture) -> None:
    """Checked before any data is generated: exit 2, a clear message, nothing written. In-process
    (``moa_cpp.cli.main.main``, as the console script calls it): a subprocess cost ~8 s of imports each."""
    import logging

    from moa_cpp.cli.main import main

    try:
        code = main(["train", "--target", str(fixture_dir / "target-f32.gguf"), "--out", str(tmp_path / "run"), *args])
    except SystemExit as e:          # argparse's own rejections
        code = e.code
    finally:
        logging.captureWarnings(False)
    err = capsys.readouterr().err
    assert code == 2, err
    assert match in err
    assert not (tmp_path / "run").exists()


def test_train_cli_muon_needs_a_recent_torch(fixture_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch without ``torch.optim.Muon`` (< 2.9): ``--optimizer muon`` is refused up front."""
    monkeypatch.delattr(torch.optim, "Muon")
    test_train_cli_rejects_bad_arguments(fixture_dir, tmp_path, ["--optimizer", "muon"],
                                         "--optimizer muon: needs torch >= 2.9", capsys)


def test_minutes_budget_is_reestimated(fixture_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``minutes``: the step count follows the measured speed, not only the first 5 steps'. A fake
    clock: 3 s per step for 5 warm-up steps, then 1 s; a 60 s budget must end at ~60 s (the
    first-5-steps estimate alone stopped after 20 steps, at 30 s)."""
    import moa_cpp.train.trainer as trainer_mod

    clock = [1000.0]
    fake_time = type("FakeTime", (), {"time": staticmethod(lambda: clock[0])})
    monkeypatch.setattr(trainer_mod, "time", fake_time)
    real_loss, calls = trainer_mod.loss_fn, [0]

    def timed_loss(*a, **k):
        calls[0] += 1
        clock[0] += 3.0 if calls[0] <= 5 else 1.0
        return real_loss(*a, **k)

    monkeypatch.setattr(trainer_mod, "loss_fn", timed_loss)
    ds = _random_token_data()
    tt = TorchTarget.from_gguf(fixture_dir / "target-f32.gguf")
    fs = compute_features(tt, ds, None, log=lambda s: None, bf16=False)
    ts = TrainSettings(seed=0, minutes=1.0, epochs=100, batch_tokens=128, holdout=1, eval_every=0,
                       ckpt_every=1000, threads=1, bf16=False, draft_vocab=64)
    tr = Trainer(spec_from_target(fixture_dir / "target-f32.gguf", **FIXTURE_SIZES), tt, ds, fs, tmp_path, ts,
                 log=lambda s: None)
    t0 = clock[0]
    summary = tr.run()
    assert 55 <= clock[0] - t0 <= 61 and summary["steps"] == calls[0], (clock[0] - t0, summary["steps"])


def _synthetic_run(tt: TorchTarget, fixture_dir: Path, tmp_path: Path, device: str,
                   tli: int, online: bool = False) -> tuple[list, dict, dict]:
    """12 F32 steps on random tokens; (held-out history, initial weights, final weights)."""
    ds = _random_token_data()
    resid_layer = tt.n_layer - tli if tli else None
    fs = (OnlineFeatures(tt, bf16=False, resid_layer=resid_layer) if online else
          compute_features(tt, ds, None, log=lambda s: None, bf16=False, resid_layer=resid_layer))
    ts = TrainSettings(seed=0, steps=12, batch_tokens=128, lr=3e-3, holdout=1, eval_every=6, ckpt_every=1000,
                       threads=1, bf16=False, draft_vocab=64, tli=tli, device=device)
    tr = Trainer(spec_from_target(fixture_dir / "target-f32.gguf", **FIXTURE_SIZES), tt, ds, fs,
                 tmp_path / f"{device}-{'online' if online else 'cached'}",
                 ts, log=lambda s: None)
    w0 = tr.model.hf_state_dict()
    summary = tr.run()
    return summary["history"], w0, tr.model.hf_state_dict()


def _assert_same_run(a: tuple[list, dict, dict], b: tuple[list, dict, dict], moved_frac: float = 0.05) -> None:
    """Two runs of :func:`_synthetic_run`: same held-out steps and initial weights, losses within
    1 %, final weights within ``moved_frac`` of how far training moved them (Adam turns rounding in
    near-zero gradients into full-size steps, so an element-wise bound would be flaky)."""
    (ha, wa0, wa), (hb, wb0, wb) = a, b
    assert [h["step"] for h in hb] == [h["step"] for h in ha] == [0, 6, 12]
    for x, y in zip(ha[1:], hb[1:]):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-2)
    for k, v in wa.items():
        assert wb[k].device.type == "cpu"
        np.testing.assert_array_equal(wb0[k].numpy(), wa0[k].numpy(), err_msg=k)
        if k == "d2t":
            np.testing.assert_array_equal(wb[k].numpy(), v.numpy())
            continue
        moved = float(np.linalg.norm(v.numpy() - wa0[k].numpy()))
        assert float(np.linalg.norm(wb[k].numpy() - v.numpy())) <= moved_frac * moved + 1e-6, k


@pytest.mark.parametrize("tli", [0, 1])
def test_online_features_train_as_cached(fixture_dir: Path, tmp_path: Path, tli: int) -> None:
    """``--features online`` (the target run per batch, the GPU recipe's mode) trains as the F16
    feature cache does: the same 12 F32 steps, differing only by the cache's F16 rounding."""
    tt = TorchTarget.from_gguf(fixture_dir / "target-f32.gguf")
    cached = _synthetic_run(tt, fixture_dir, tmp_path, "cpu", tli)
    online = _synthetic_run(tt, fixture_dir, tmp_path, "cpu", tli, online=True)
    # the cache rounds to F16, the TLI residual stream too (values up to ~100 here): measured
    # 6.5 % of the movement for one norm weight at TLI 1, under 5 % at TLI 0
    _assert_same_run(cached, online, moved_frac=0.05 if tli == 0 else 0.10)
    # not vacuous: the 12 steps moved every weight
    assert all(float((cached[2][k] - cached[1][k]).abs().max()) > 1e-4 for k in cached[2] if k != "d2t")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the same run on the CPU is "
                    "test_tiny_training_run_beats_random_drafter)")
@pytest.mark.parametrize("tli", [0, 1])
def test_cuda_training_matches_cpu(fixture_dir: Path, tmp_path: Path, tli: int) -> None:
    """The same 12 F32 steps on CUDA and on the CPU (features, masks, draws, reduced vocabulary,
    TLI), compared as :func:`_assert_same_run` does. TF32 off."""
    torch.backends.cuda.matmul.allow_tf32 = False
    cpu = _synthetic_run(TorchTarget.from_gguf(fixture_dir / "target-f32.gguf"), fixture_dir, tmp_path, "cpu", tli)
    gpu = _synthetic_run(TorchTarget.from_gguf(fixture_dir / "target-f32.gguf").to("cuda"), fixture_dir, tmp_path,
                         "cuda", tli)
    _assert_same_run(cpu, gpu)


def test_bf16_auto_follows_the_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--bf16 auto``: on only where bf16 is native (emulated bf16 autocast ran the target ~5x
    slower than F32 on this project's AVX2-only CPUs); on/off are obeyed."""
    import moa_cpp.train.devices as tr

    assert tr.resolve_bf16("on", "cpu") and not tr.resolve_bf16("off", "cpu")
    for native in (True, False):
        monkeypatch.setattr(tr, "cpu_has_native_bf16", lambda: native)
        assert tr.resolve_bf16("auto", "cpu") is native
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    monkeypatch.undo()
    assert tr.cpu_has_native_bf16() == ("avx512_bf16" in flags or "amx_bf16" in flags)
    with pytest.raises(ValueError):
        tr.resolve_bf16("maybe", "cpu")


def test_heldout_bootstrap_intervals() -> None:
    """moa_cpp.train.paired's bootstrap (moa-cpp train eval): a run against itself differs by exactly 0; a run
    that accepts one more draft per cycle on every conversation lies above the first, and the
    intervals hold the point estimates."""
    from moa_cpp.train.paired import bootstrap

    rng = np.random.default_rng(0)
    cyc = rng.integers(20, 60, size=40)
    acc = (cyc * rng.uniform(0.05, 0.4, size=40)).astype(int)
    base = list(zip(acc.tolist(), cyc.tolist()))
    better = list(zip((acc + cyc).tolist(), cyc.tolist()))
    (ci0, d0), (ci1, d1), (ci2, d2) = bootstrap([base, base, better])
    tau0 = 1 + acc.sum() / cyc.sum()
    assert ci0[0] < tau0 < ci0[1] and ci1 == ci0
    assert d0 == [0.0, 0.0] and d1 == [0.0, 0.0]
    assert d2[0] == pytest.approx(1.0) and d2[1] == pytest.approx(1.0)
    assert ci2[0] > ci0[1]


def test_heldout_tau_scores_teacher_forced_sets_and_drops_trained_prompts() -> None:
    """moa-cpp train eval's choice of conversations: a self-distilled set scores only its greedy
    answers, a teacher-forced set (no greedy answer at all, e.g. ``--fixed-answers``) scores every
    one, as the trainer's held-out estimate does (it once scored none and wrote tau 1.000); a
    prompt a compared run trained on is dropped either way."""
    from moa_cpp.train.paired import scored_indices

    keys = ["a", "b", "c", "d"]
    assert scored_indices(np.array([True, False, True, False]), keys, set()) == [0, 2]
    assert scored_indices(np.array([True, False, True, False]), keys, {"c"}) == [0]
    assert scored_indices(np.zeros(4, dtype=bool), keys, set()) == [0, 1, 2, 3]
    assert scored_indices(np.zeros(4, dtype=bool), keys, {"b", "d"}) == [0, 2]


def test_muon_optimizer_splits_params_and_resumes(fixture_dir: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``optimizer="muon"``: Muon owns exactly the layers' 2-D weights (AdamW the input projection,
    draft head, norms and biases); a run killed after its step-4 checkpoint and resumed ends on the
    same weights as one uninterrupted run (both optimisers' state survives the checkpoint)."""
    import moa_cpp.train.trainer as trainer_mod
    from moa_cpp.train.optim import _MuonF32

    ds = _random_token_data()
    tt = TorchTarget.from_gguf(fixture_dir / "target-f32.gguf")
    fs = compute_features(tt, ds, None, log=lambda s: None, bf16=False)
    ts = TrainSettings(seed=0, steps=8, batch_tokens=128, lr=3e-3, holdout=1, eval_every=0, ckpt_every=4,
                       threads=1, bf16=False, draft_vocab=64, optimizer="muon")
    spec = spec_from_target(fixture_dir / "target-f32.gguf", **FIXTURE_SIZES)

    def trainer(d: str) -> Trainer:
        return Trainer(spec, tt, ds, fs, tmp_path / d, ts, log=lambda s: None)

    whole = trainer("whole")
    muon, adamw = whole.opt.opts
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    assert isinstance(muon, _MuonF32)          # bf16 off: orthogonalised in F32
    names = {id(p): n for n, p in whole.model.named_parameters()}
    in_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    in_adamw = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    assert not in_muon & in_adamw and in_muon | in_adamw == set(names.values())
    assert {"self_attention.self_attn.q_proj.weight", "layer_self_attention.mlp.down_proj.weight"} <= in_muon
    assert {"Ekv2E.weight", "Ekv2E.bias", "draft_lm_head.weight"} <= in_adamw
    assert all(whole.model.get_parameter(n).ndim == 2 for n in in_muon)
    w0 = whole.model.hf_state_dict()
    whole.run()

    real_loss, calls = trainer_mod.loss_fn, [0]

    def dies_at_step_5(*a, **k):
        calls[0] += 1
        if calls[0] == 5:
            raise KeyboardInterrupt
        return real_loss(*a, **k)

    monkeypatch.setattr(trainer_mod, "loss_fn", dies_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        trainer("killed").run()
    monkeypatch.setattr(trainer_mod, "loss_fn", real_loss)
    resumed = trainer("killed")
    resumed.run()
    assert resumed.step == 8
    for k, v in whole.model.hf_state_dict().items():
        np.testing.assert_array_equal(resumed.model.hf_state_dict()[k].numpy(), v.numpy(), err_msg=k)
        if k != "d2t":
            assert not torch.equal(v, w0[k]) or "norm" in k, k   # every trained tensor moved


def test_muon_f32_iteration_matches_torch() -> None:
    """The F32 Newton-Schulz iteration (CPUs without bf16) is torch's bf16 one up to bf16 rounding,
    for wide and tall matrices, and the patch is undone after a step."""
    from torch.optim import _muon

    from moa_cpp.train.optim import _MuonF32, _newton_schulz_f32

    g = torch.Generator().manual_seed(0)
    for shape in [(48, 96), (96, 48)]:
        x = torch.randn(shape, generator=g)
        ours = _newton_schulz_f32(x, (3.4445, -4.775, 2.0315), 5, 1e-7)
        ref = _muon._zeropower_via_newtonschulz(x, (3.4445, -4.775, 2.0315), 5, 1e-7).float()
        assert ours.dtype == torch.float32 and ours.shape == x.shape
        assert float((ours - ref).abs().max()) < 0.05 * float(ref.abs().max())
        sv = torch.linalg.svdvals(ours)                     # orthogonalised: singular values ~U(0.5, 1.5)
        assert 0.3 < float(sv.min()) and float(sv.max()) < 1.6
    w = torch.nn.Parameter(torch.randn(8, 16, generator=g))
    opt = _MuonF32([w], lr=0.1, adjust_lr_fn="match_rms_adamw")
    w.grad = torch.randn(8, 16, generator=g)
    before = w.detach().clone()
    opt.step()
    assert not torch.equal(w.detach(), before)
    assert _muon._zeropower_via_newtonschulz is not _newton_schulz_f32


def test_compare_eval_paired_interval() -> None:
    """moa-cpp train compare: a drafter against itself differs by 0; one whose tau is higher by
    0.1 on every prompt differs by 0.1 exactly; independent noise gives an interval around 0.
    Prompts only one file has are left out."""
    from moa_cpp.train.paired import paired, per_prompt_tau

    rng = np.random.default_rng(0)
    recs = [{"set": s, "q": q, "moa chain:4": {"tau": float(t)}}
            for (s, q), t in zip([(s, q) for s in ("a", "b") for q in range(30)], rng.uniform(1.0, 2.0, 60))]
    a = per_prompt_tau({"records": recs}, "moa chain:4")
    assert len(a) == 60 and paired(a, a)["diff_ci95"] == [0.0, 0.0]
    up = {k: v + 0.1 for k, v in a.items()} | {("c", 0): 9.0}
    c = paired(a, up)
    assert c["prompts"] == 60 and c["diff"] == pytest.approx(0.1) and c["diff_ci95"] == pytest.approx([0.1, 0.1])
    noise = {k: v + rng.normal(0, 0.2) for k, v in a.items()}
    lo, hi = paired(a, noise)["diff_ci95"]
    assert lo < 0 < hi and hi - lo < 0.25
