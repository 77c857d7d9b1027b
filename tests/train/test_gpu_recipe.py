"""The GPU training recipe (``bench/gpu_train.sh``, issue 12) in its tiny CPU dry-run mode, so the
script cannot rot between the sessions that have a GPU: the CUDA-vs-CPU check step, teacher-forced
ShareGPT data, online features, a few steps, a Q8_0 GGUF the native engine loads, the JSON report."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.model
@pytest.mark.slow
def test_gpu_recipe_dry_run(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from moa_cpp.train import sharegpt as sg

    try:
        sg.sharegpt_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    env = dict(os.environ, MOA_GPU_DRY_RUN="1", PYTHON=sys.executable)
    p = subprocess.run(["bash", str(ROOT / "bench" / "gpu_train.sh"), str(tmp_path / "gpu")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rep = json.loads((tmp_path / "gpu" / "gpu_report.json").read_text())
    assert rep["dry_run"] and rep["device"] == "cpu"
    sm = rep["smollm2"]
    assert sm["steps"] == 3 and sm["samples"] == 24 and sm["response_tokens"] > 0
    rep_run = json.loads((tmp_path / "gpu" / "smollm2" / "report.json").read_text())
    assert [p["source"] for p in rep_run["parts"]] == ["sharegpt-fixed"] and rep_run["parts"][0]["samples"] == 24
    qw = rep["qwen"]
    assert qw["target"] == "qwen2.5-coder-0.5b"            # the dry run's stand-in for the 1.5B
    from moa_cpp.models import registry as models
    try:
        qpath = models.qwen25_coder_05b_path()
    except models.ModelNotInstalledError:
        qpath = None
    if qpath is None:
        assert qw["made"] is False and "skipped" in qw["why"]
    else:
        assert qw["made"] and qw["steps"] == 1 and qw["samples"] == 8, qw
        qrun = json.loads((tmp_path / "gpu" / "qwen" / "data-fixed" / "manifest.json").read_text())
        assert qrun["settings"]["code_share"] == 0.5
    # (the dry run collects them: the suite runs them itself; with a GPU they run, CUDA half included)
    check = (tmp_path / "gpu" / "check.log").read_text()
    assert "test_cuda_training_matches_cpu" in check and "test_online_features_train_as_cached" in check, check
    run = tmp_path / "gpu" / "smollm2"
    assert not (run / "features").exists()                  # online features: no host cache
    man = json.loads((run / "data-fixed" / "manifest.json").read_text())
    assert man["source"] == "sharegpt-fixed" and man["settings"]["turns"] == "all"
    from moa_cpp.drafter.drafter import DrafterModel
    from moa_cpp.models.registry import smollm2_path

    m = DrafterModel(sm["gguf"], smollm2_path(), device="cpu", n_threads=1)   # the native engine loads it
    # the held-out per-depth acceptance travels into the GGUF (the auto policy's prior); a run whose
    # summary kept only tau once shipped a drafter without it
    from gguf import GGUFReader
    acc = GGUFReader(sm["gguf"]).fields["moa.eval.acceptance"].contents()
    assert len(acc) == 4 and all(0.0 <= a <= 1.0 for a in acc), acc
    # continued from the shipped drafter (issue 22): its draft vocabulary, its record + these 3 steps
    from moa_cpp.models.defaults import DEFAULT_DRAFTER
    from moa_cpp.train.init_from import read_drafter

    shipped, got = read_drafter(DEFAULT_DRAFTER), read_drafter(sm["gguf"])
    assert sm["init_from"] and m.n_vocab == len(shipped.d2t) == 8192 and m.n_target_vocab == 49152
    assert (got.steps, len(got.runs)) == (shipped.steps + 3, len(shipped.runs) + 1)
    m.close()
    if qpath is not None:
        q = DrafterModel(qw["gguf"], qpath, device="cpu", n_threads=1)
        assert q.n_vocab == 512 and q.n_target_vocab == 151936
        q.close()
