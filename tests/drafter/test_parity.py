"""Numeric parity of conversion + target capture + native drafter with the official MoA
reference implementation's golden arrays (every fixture folder of the moa-ref layout).

Tolerance (F32 conversions): relative error max|diff| / max|golden| <= 1e-4 on every array and
identical arg-max everywhere; measured on moa-ref-tiny: 1.7e-6, 57/57.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import fixture_dirs
from moa_cpp.drafter.parity import check_parity

RTOL = 1e-4


@pytest.mark.parametrize("fx", fixture_dirs(), ids=lambda p: p.name)
def test_check_parity_f32(fx, tmp_path):
    report = check_parity(fx, rtol=RTOL, report_quantized=False, work_dir=tmp_path)
    names = {r.name for r in report.rows}
    # every golden array the issue lists is compared
    for want in ("target_k", "target_v", "lsa_mean", "ekv", "ca_k", "ca_v", "draft_logits_root",
                 "chain_logits", "chain_tokens", "cycle2_ca_k", "cycle2_ca_v", "cycle2_root_logits"):
        assert want in names
    variants = {r.variant for r in report.rows}
    assert {"target", "moa_spec/f32", "snapshot/f32"} <= variants
    bad = [r for r in report.rows if r.max_rel > RTOL or (r.argmax_n is not None and r.argmax_ok != r.argmax_n)]
    assert not bad, report.table(RTOL)


def test_check_parity_cli(fixture_dir):
    """The user-facing tool: table, final summary line, exit 0 within tolerance."""
    proc = subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", "check-parity", str(fixture_dir)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("max_rel_err=") and " argmax_match=" in last
    rel = float(last.split()[0].split("=")[1])
    ok, n = map(int, last.split()[1].split("=")[1].split("/"))
    assert rel <= RTOL and ok == n and n > 0
    # quantized variants are reported, not gated
    assert "q8_0" in proc.stdout and "f16" in proc.stdout and "report" in proc.stdout


def test_parity_detects_a_wrong_drafter(fixture_dir, tmp_path):
    """The gate can fail: a perturbed Ekv2E bias must be caught."""
    from moa_cpp.convert import convert
    from moa_cpp.drafter import parity
    from moa_cpp.testing.helpers import rewrite_gguf

    good = convert(fixture_dir / "drafter_hf", tmp_path / "good.gguf", outtype="f32",
                   target_gguf=fixture_dir / "target-f32.gguf", progress=False)
    bad = rewrite_gguf(good, tmp_path / "bad.gguf",
                       tensor_fn=lambda n, a: a + np.float32(0.01) if n == "ekv2e.bias" else a)
    g = dict(np.load(fixture_dir / "golden.npz"))
    from moa_cpp.target.target import Target
    with Target.from_path(fixture_dir / "target-f32.gguf", n_ctx=512, cache_type="f32", flash_attn=False) as tgt:
        tgt.decode(g["prompt_ids"])
        lsa = tgt.captured_lsa_in()
        S = g["prompt_ids"].size
        n_acc = g["cycle2_ca_k"].shape[1] - S
        tgt.decode(g["target_greedy"][:n_acc])
        lsa2 = tgt.captured_lsa_in()
    rep = parity.Report()
    parity._run_drafter(rep, "bad", bad, fixture_dir / "target-f32.gguf", g, lsa, lsa2, True, None)
    max_rel, _, _ = rep.gated_summary()
    assert max_rel > RTOL
