"""Training features from llama.cpp itself (issue 43, ``moa-cpp train --feature-source llama``).

- On the F32 fixture target the llama.cpp features (K/V rows from the native capture, post-norm
  hidden states from llama.cpp's embeddings output) equal the PyTorch target's within llama.cpp's
  flash-attention rounding (F16: measured max |diff| 0.012 on values ~1, mean 5e-4), also for a
  sample longer than one decode (chunked prefill);
- the frozen embedding / LM head read by gguf-py are the PyTorch target's;
- each source keeps its own cache: one never reuses the other's;
- what needs the PyTorch target is refused with llama.cpp features, and the PyTorch source for an
  architecture it has no copy of (gemma3), before any work, exit 2.

A short training run on llama.cpp features that beats a random drafter end to end is
``tests/train/test_train.py::test_tiny_training_run_beats_random_drafter[reduced-vocab-llama]``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from moa_cpp.train import features_llama
from moa_cpp.train.data import Dataset
from moa_cpp.train.features import cache_matches, compute_features
from moa_cpp.train.features_llama import GgufHead, compute_features_llama
from moa_cpp.train.target_torch import TorchTarget

torch.set_num_threads(1)


def _data(lens) -> Dataset:
    rng = np.random.default_rng(3)
    return Dataset(tokens=rng.integers(0, 1000, sum(lens)).astype(np.int32),
                   offsets=np.r_[0, np.cumsum(lens)].astype(np.int64), prompt_len=np.full(len(lens), 5, np.int32),
                   greedy=np.ones(len(lens), bool))


def test_llama_features_match_the_torch_target(fixture_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = fixture_dir / "target-f32.gguf"
    # 32-row decodes: the 150-token sample is prefilled in 5 chunks, positions carried on
    monkeypatch.setattr(features_llama, "_LOGITS_BYTES", 32 * 4 * 49152)
    assert features_llama.feature_batch_rows(49152, 150) == 32
    ds = _data([40, 150, 33])
    tt = TorchTarget.from_gguf(target)
    ref = compute_features(tt, ds, None, log=lambda s: None, bf16=False)
    got = compute_features_llama(str(target), ds, None, log=lambda s: None, threads=1)
    for name in ("lsa", "hidden"):
        a, b = np.asarray(getattr(ref, name), np.float32), np.asarray(getattr(got, name), np.float32)
        assert a.shape == b.shape, name
        diff = np.abs(a - b)
        # llama.cpp's flash attention rounds through F16; a chunking or position bug is ~1 off
        assert diff.max() < 0.05 and diff.mean() < 2e-3, (name, float(diff.max()), float(diff.mean()))
    head = GgufHead.from_gguf(target)
    assert torch.equal(head.embed, tt.embed) and head.n_layer == tt.n_layer and head.lsa_width == tt.lsa_width
    assert (head.lm_head is head.embed) == (tt.lm_head is tt.embed)


def test_each_feature_source_keeps_its_own_cache(fixture_dir: Path, tmp_path: Path) -> None:
    target = fixture_dir / "target-f32.gguf"
    ds = _data([30, 25])
    cache = tmp_path / "features"
    compute_features_llama(str(target), ds, cache, log=lambda s: None, threads=1)
    assert cache_matches(cache, len(ds.tokens), "llama") and not cache_matches(cache, len(ds.tokens), "torch")
    logs: list[str] = []
    compute_features(TorchTarget.from_gguf(target), ds, cache, log=logs.append, bf16=False)
    assert logs and logs[0].startswith("features:"), logs           # computed, not the llama cache reused
    assert json.loads((cache / "done.json").read_text())["source"] == "torch"
    # a cache from before the source key is the PyTorch target's
    (cache / "done.json").write_text(json.dumps({"n_tokens": len(ds.tokens)}))
    assert cache_matches(cache, len(ds.tokens), "torch") and not cache_matches(cache, len(ds.tokens), "llama")
    logs.clear()
    compute_features_llama(str(target), ds, cache, log=logs.append, threads=1)
    assert logs and logs[0].startswith("features (llama.cpp):"), logs


@pytest.mark.parametrize("extra,match", [
    (["--feature-source", "llama", "--tli", "1"], "--tli N: needs the PyTorch target"),
    (["--feature-source", "llama", "--features", "online"], "--features online: needs the PyTorch target"),
    (["--feature-source", "llama", "--init-from-target"], "--init-from-target: needs the PyTorch target"),
])
def test_llama_features_refuse_what_needs_the_torch_target(fixture_dir: Path, tmp_path: Path, extra: list,
                                                            match: str, capsys: pytest.CaptureFixture) -> None:
    from moa_cpp.cli.main import main

    out = tmp_path / "run"
    code = main(["train", "--target", str(fixture_dir / "target-f32.gguf"), "--out", str(out), "--steps", "1",
                 "--n-samples", "4", *extra])
    err = capsys.readouterr().err
    assert code == 2 and match in err, err
    assert not out.exists()


@pytest.mark.model
def test_torch_features_of_gemma3_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from moa_cpp.models import registry as models
    from moa_cpp.cli.main import main

    out = tmp_path / "run"
    code = main(["train", "--target", str(models.gemma3_270m_path()), "--out", str(out), "--steps", "1",
                 "--feature-source", "torch"])
    err = capsys.readouterr().err
    assert code == 2 and "not 'gemma3'; use --feature-source llama" in err, err
    assert not out.exists()


@pytest.mark.model
def test_install_default_refused_for_another_target(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--install-default`` overwrites the embedded default's drafter: only a drafter of that very
    target may go there (a Gemma drafter there would break ``moa-cpp generate`` with no -m/-d)."""
    from moa_cpp.cli.main import main
    from moa_cpp.models.defaults import DEFAULT_DRAFTER

    before = DEFAULT_DRAFTER.stat().st_mtime_ns
    out = tmp_path / "run"
    code = main(["train", "--target", "gemma3-270m", "--out", str(out), "--steps", "1", "--install-default"])
    err = capsys.readouterr().err
    assert code == 2 and "--install-default" in err and "gemma-3-270m-q4_k_m.gguf" in err, err
    assert not out.exists() and DEFAULT_DRAFTER.stat().st_mtime_ns == before
