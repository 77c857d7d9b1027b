"""Training that accumulates (issue 22): ``--init-from`` continues a drafter GGUF, the GGUF keeps a
training record across runs, and the cheaper steps change nothing but the time.

- a 0-step continuation writes the same tensors as the drafter it started from (Q8_0 round trip),
  for a trained fixture drafter and for the shipped SmolLM2 drafter;
- ``moa-cpp train --init-from`` twice: steps and token passes add up, run records are appended,
  the earlier ones kept byte for byte; the continuation starts at its base's held-out estimate;
- a drafter that does not fit the run (sizes, target, vocabulary, not a drafter) is refused before
  any work, exit 2;
- the LSA skipped on padded rows gives the same loss and gradients as the LSA on every row.
"""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from moa_cpp.convert import convert
from moa_cpp.format.names import Keys
from moa_cpp.testing.random_drafter import spec_from_target
from moa_cpp.train.init_from import read_drafter, to_model
from moa_cpp.train.target_torch import TorchTarget
from moa_cpp.train.batches import make_batch as _batch
from moa_cpp.train.features import compute_features
from moa_cpp.train.loss import loss_fn
from moa_cpp.train.trainer import Trainer, TrainSettings

from test_train import FIXTURE_SIZES, _prompt_dataset, _random_token_data

torch.set_num_threads(1)


def _tensor_bytes(path: Path) -> dict[str, tuple[str, bytes]]:
    return {t.name: (t.tensor_type.name, bytes(np.asarray(t.data).tobytes())) for t in gguf.GGUFReader(str(path)).tensors}


def _fields(path: Path) -> dict:
    return {k: f.contents() for k, f in gguf.GGUFReader(str(path)).fields.items() if k.startswith("moa.")}


def _reexport(src: Path, target: Path, out: Path, outtype: str = "q8_0") -> Path:
    """read_drafter -> torch model -> snapshot -> convert: a 0-step continuation's export path."""
    dw = read_drafter(src)
    m = to_model(dw, target, TorchTarget.from_gguf(target))
    return convert(m.save(out / "snapshot"), out / "again.gguf", outtype=outtype, target_gguf=target, tli=dw.tli,
                   progress=False)


@pytest.fixture(scope="module")
def fixture_run(fixture_dir: Path, tmp_path_factory) -> dict:
    """A short trained fixture drafter (reduced vocabulary, so d2t and the own head are covered),
    exported as Q8_0 by ``moa-cpp train``, and the data directory it trained on."""
    from moa_cpp.cli.main import main

    tmp = tmp_path_factory.mktemp("continue")
    target = fixture_dir / "target-f32.gguf"
    _prompt_dataset(target, tmp, 32)
    common = ["--target", str(target), "--n-samples", "0", "--extra-data", str(tmp / "data"), "--batch-tokens", "256",
              "--lr", "1e-2", "--eval-every", "0", "--outtype", "q8_0", "--threads", "1",
              "--sa-ffn", str(FIXTURE_SIZES["sa_ffn"]), "--ca-ffn", str(FIXTURE_SIZES["ca_ffn"]),
              "--lsa-ffn", str(FIXTURE_SIZES["lsa_ffn"])]
    assert main(["train", "--out", str(tmp / "a"), "--steps", "30", "--draft-vocab", "256", *common]) == 0
    return {"target": target, "tmp": tmp, "common": common, "a": tmp / "a" / "drafter.gguf"}


def test_zero_step_continuation_writes_the_same_tensors(fixture_run: dict, tmp_path: Path) -> None:
    """Q8_0 -> dequantize -> torch -> Q8_0 gives the same blocks: continuing costs no precision."""
    a = fixture_run["a"]
    again = _reexport(a, fixture_run["target"], tmp_path)
    ta, tb = _tensor_bytes(a), _tensor_bytes(again)
    assert set(ta) == set(tb) and "d2t" in ta
    assert [n for n in ta if ta[n] != tb[n]] == []
    assert {t for t, _ in ta.values()} >= {"Q8_0", "F32", "I32"}   # the quantized path was exercised


@pytest.mark.model
def test_shipped_drafter_round_trips(tmp_path: Path) -> None:
    """The shipped SmolLM2 drafter (what every continuation here starts from) reads back with its
    sizes and re-exports to identical tensors."""
    from moa_cpp.models import defaults

    shipped = Path(defaults.DEFAULT_DRAFTER)
    dw = read_drafter(shipped)
    assert dw.d2t is not None and dw.sizes["lsa_ffn"] == 192
    again = _reexport(shipped, Path(defaults.default_target()), tmp_path)
    ta, tb = _tensor_bytes(shipped), _tensor_bytes(again)
    assert [n for n in ta if ta[n] != tb[n]] == [] and set(ta) == set(tb)


def test_continuations_add_up_and_keep_earlier_records(fixture_run: dict) -> None:
    """a (30 steps) -> b (7 more, no re-warm) -> c (0 more): totals add up, each run's record is
    appended and the earlier ones kept; c, a 0-step continuation through the whole CLI and Trainer
    path, writes b's tensors unchanged (the weights really are carried, not re-initialised)."""
    from moa_cpp.cli.main import main

    tmp, a = fixture_run["tmp"], fixture_run["a"]
    b_dir, c_dir = tmp / "b", tmp / "c"
    assert main(["train", "--out", str(b_dir), "--steps", "7", "--init-from", str(a), "--warmup", "0",
                 *fixture_run["common"]]) == 0
    b, c = b_dir / "drafter.gguf", c_dir / "drafter.gguf"
    assert main(["train", "--out", str(c_dir), "--steps", "0", "--init-from", str(b), *fixture_run["common"]]) == 0
    fa, fb, fc = (_fields(p) for p in (a, b, c))
    assert (fa[Keys.TRAIN_STEPS], fb[Keys.TRAIN_STEPS], fc[Keys.TRAIN_STEPS]) == (30, 37, 37)
    ra, rb, rc = (json.loads(x) for x in fc[Keys.TRAIN_RUNS])
    assert fc[Keys.TRAIN_RUNS][:2] == fb[Keys.TRAIN_RUNS] and fb[Keys.TRAIN_RUNS][:1] == fa[Keys.TRAIN_RUNS]
    assert (ra["steps"], rb["steps"], rc["steps"]) == (30, 7, 0)
    assert "init_from" not in ra and rb["init_from"]["file"] == "drafter.gguf" and rb["recipe"]["warmup"] == 0
    assert rb["init_from"]["sha256"] == __import__("hashlib").sha256(a.read_bytes()).hexdigest()
    assert fb[Keys.TRAIN_TOKEN_PASSES] == ra["token_passes"] + rb["token_passes"] > ra["token_passes"] > 0
    assert fc[Keys.TRAIN_TOKEN_PASSES] == fb[Keys.TRAIN_TOKEN_PASSES]
    tb, tc, ta = _tensor_bytes(b), _tensor_bytes(c), _tensor_bytes(a)
    assert [n for n in tb if tb[n] != tc[n]] == []
    assert [n for n in ta if ta[n] != tb[n] and n != "d2t"] != []     # b trained: a 0-step c is not vacuous
    np.testing.assert_array_equal(read_drafter(b).d2t, read_drafter(a).d2t)
    # the held-out acceptance record is carried too (the cost-aware policy's prior)
    assert Keys.EVAL_ACCEPTANCE in fc and len(fc[Keys.EVAL_ACCEPTANCE]) == 4


@pytest.mark.parametrize("extra,match", [
    (["--lsa-ffn", "64"], "lsa_ffn: the drafter has 48, this run asks for 64"),
    (["--draft-vocab", "100"], "--draft-vocab 100: drafter.gguf drafts over 256 tokens"),
    (["--tli", "1"], "tli: the drafter has 0, this run asks for 1"),
])
def test_init_from_a_drafter_that_does_not_fit_is_refused(fixture_run: dict, tmp_path: Path, extra: list,
                                                           match: str, capsys: pytest.CaptureFixture) -> None:
    from moa_cpp.cli.main import main

    out = tmp_path / "run"
    code = main(["train", "--out", str(out), "--steps", "1", "--init-from", str(fixture_run["a"]),
                 *fixture_run["common"], *extra])
    err = capsys.readouterr().err
    assert code == 2 and match in err, err
    assert not out.exists()


def test_init_from_something_else_is_refused(fixture_run: dict, fixture_dir: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    """A missing file, a target model, bytes that are not GGUF, a drafter of another target."""
    from moa_cpp.models import defaults
    from moa_cpp.cli.main import main

    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    cases = [(tmp_path / "missing.gguf", "no such file"),
             (fixture_dir / "target-f32.gguf", "general.architecture is 'llama', not 'moa'"),
             (junk, "not a readable GGUF file")]
    if Path(defaults.DEFAULT_DRAFTER).is_file():
        cases.append((Path(defaults.DEFAULT_DRAFTER), "the drafter was made for 576, the target has 64"))
    for path, match in cases:
        code = main(["train", "--out", str(tmp_path / "run"), "--steps", "1", "--init-from", str(path),
                     *fixture_run["common"]])
        err = capsys.readouterr().err
        assert code == 2 and match in err, (path, err)
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def fixture_batch(fixture_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """(Trainer, batch of every sample, T = 7 per sample, no staircase) on the fixture target: what
    the loss-objective tests share (features computed once)."""
    ds = _random_token_data()
    target = fixture_dir / "target-f32.gguf"
    tt = TorchTarget.from_gguf(target)
    fs = compute_features(tt, ds, None, log=lambda s: None, bf16=False)
    tr = Trainer(spec_from_target(target, **FIXTURE_SIZES), tt, ds, fs, tmp_path_factory.mktemp("loss"),
                 TrainSettings(holdout=0, threads=1, bf16=False, draft_vocab=64), log=lambda s: None)
    b = _batch(ds, fs, list(range(len(ds))))
    return tr, b, torch.full((len(ds),), 7), torch.zeros(len(ds), dtype=torch.bool)


def test_lsa_skipped_on_padding_changes_nothing(fixture_batch: tuple) -> None:
    """Right padding is never attended by a real row, so skipping its LSA must give the same loss and
    gradients (to float rounding: the LSA's matmuls see fewer rows)."""
    tr, b, T, stair = fixture_batch
    assert 0.2 < 1 - float(b["valid"].float().mean()) < 0.5            # padding to skip: not vacuous
    out = {}
    for skip in (False, True):
        tr.model.zero_grad(set_to_none=True)
        loss, _ = loss_fn(tr.model, b, T, stair, 0.1, False, skip_padding=skip)
        loss.backward()
        out[skip] = (float(loss), {n: p.grad.clone() for n, p in tr.model.named_parameters() if p.grad is not None})
    assert out[True][0] == pytest.approx(out[False][0], rel=1e-6)
    assert set(out[True][1]) == set(out[False][1])
    for n, g in out[False][1].items():
        assert torch.allclose(out[True][1][n], g, rtol=1e-4, atol=1e-7 * float(g.abs().max()) + 1e-9), n


def test_loss_max_depth_trains_only_the_drafted_depths(fixture_batch: tuple) -> None:
    """``--loss-max-depth D``: the loss reads the labels of rows fewer than D past their block start
    and no others (a label changed deeper moves nothing, one inside moves the loss); D >= T is the
    full objective."""
    from moa_cpp.train.masks import block_starts

    tr, b, T, stair = fixture_batch

    def loss(batch: dict, d: int) -> float:
        with torch.no_grad():
            return float(loss_fn(tr.model, batch, T, stair, 0.1, False, max_depth=d)[0])

    assert loss(b, 7) == loss(b, 0)
    depth = torch.arange(b["response"].shape[1])[None, :] - block_starts(b["response"], T)
    for d in (1, 3):
        deep = b["response"] & (depth >= d)
        near = b["response"] & (depth < d)
        assert deep.any() and near.any()
        moved = dict(b, hidden=torch.where(deep[..., None], b["hidden"] + 5.0, b["hidden"]))
        assert loss(moved, d) == loss(b, d)
        assert loss(moved, 0) != loss(b, 0)
        moved = dict(b, hidden=torch.where(near[..., None], b["hidden"] + 5.0, b["hidden"]))
        assert loss(moved, d) != loss(b, d)


def test_mask_off_target_drops_rows_after_a_token_the_target_would_not_pick(fixture_batch: tuple) -> None:
    """``--mask-off-target``: with every teacher-forced token the target's own greedy pick nothing is
    masked; one off-target token masks exactly the rows after it up to its block's end (their labels
    stop mattering), the rows before it and other blocks keep theirs."""
    from moa_cpp.train.masks import block_starts
    from moa_cpp.train.loss import off_target_rows

    tr, b, T, stair = fixture_batch
    m = tr.model
    start = block_starts(b["response"], T)
    with torch.no_grad():
        pick = m.d2t[m.label_logits(b["hidden"]).argmax(-1)]
    on = dict(b, tokens=b["tokens"].clone())
    on["tokens"][:, 1:] = torch.where(b["response"][:, 1:], pick[:, :-1], b["tokens"][:, 1:])
    assert not off_target_rows(m, on, start).any()
    # one off-target token in sample 0, in the middle of a response block
    resp0 = torch.nonzero(b["response"][0]).flatten()
    i = int(next(j for j in resp0.tolist() if int(start[0, j]) < j - 1 and j + 2 < len(resp0) + int(resp0[0])
                 and int(start[0, j + 2]) == int(start[0, j])))
    off = dict(on, tokens=on["tokens"].clone())
    off["tokens"][0, i] = int(pick[0, i - 1]) + 1 if int(pick[0, i - 1]) + 1 < 64 else 0
    got = off_target_rows(m, off, start)
    want = torch.zeros_like(got)
    want[0] = b["response"][0] & (start[0] == start[0, i]) & (torch.arange(got.shape[1]) >= i)
    assert torch.equal(got, want) and int(want.sum()) >= 3

    def loss(batch: dict) -> float:
        with torch.no_grad():
            return float(loss_fn(m, batch, T, stair, 0.1, False, mask_off_target=True)[0])

    base = loss(off)
    moved = dict(off, hidden=off["hidden"].clone())
    moved["hidden"][0, i + 1] += 5.0                          # a masked row's label
    assert loss(moved) == base
    with torch.no_grad():                                     # the mask is in the loss
        assert float(loss_fn(m, off, T, stair, 0.1, False)[0]) != base


def test_continuations_default_to_a_lower_peak_lr():
    """A continuation re-warms to 5e-4 unless --lr says otherwise (2e-3 threw a trained drafter
    back: round c4's A/B in docs/training.md); a run from scratch keeps 2e-3."""
    import argparse

    from moa_cpp.train.cli import _peak_lr
    assert _peak_lr(argparse.Namespace(lr=None, init_from="d.gguf")) == 5e-4
    assert _peak_lr(argparse.Namespace(lr=None, init_from=None)) == 2e-3
    assert _peak_lr(argparse.Namespace(lr=1e-3, init_from="d.gguf")) == 1e-3


def test_train_eval_scores_a_gguf_and_its_run_alike_and_refuses_what_they_trained_on(fixture_run: dict,
                                                                                      tmp_path: Path) -> None:
    """``moa-cpp train eval`` tells drafters apart and reads both kinds of input alike: the fixture
    run's Q8_0 GGUF and its F32 snapshot (run directory) score alike; a drafter with noisy weights
    (std 2) scores far below a small-weight one of the same shape (on the fixture's random target
    the latter guesses its repetitive text well), its paired interval below 0; intervals hold the
    estimates; the report is written. The same set with ``--exclude`` of the data (what a held-out
    set must be: never trained on) leaves nothing to score: exit 2 with the reason, no traceback."""
    from moa_cpp.cli.main import main
    from moa_cpp.testing.random_drafter import make_random_drafter

    target, a, data = fixture_run["target"], fixture_run["a"], fixture_run["tmp"] / "data"
    small = make_random_drafter(target, tmp_path / "small.gguf", outtype="q8_0", **FIXTURE_SIZES)
    noisy = make_random_drafter(target, tmp_path / "noisy.gguf", outtype="q8_0", std=2.0, **FIXTURE_SIZES)
    out = tmp_path / "eval.json"
    assert main(["train", "eval", str(small), str(noisy), str(a), "--heldout", str(data), "--target", str(target),
                 "--threads", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    r0, rn, rg = res["rows"]
    assert res["n_heldout"] == 20 and rn["tau"] < r0["tau"] - 0.3, (r0, rn)
    assert rn["diff_vs_first_ci95"][1] < 0                   # the noisy drafter is below, beyond noise
    assert rg["token_passes"] > 0 and r0["token_passes"] is None
    for r in res["rows"]:
        assert r["tau_ci95"][0] <= r["tau"] <= r["tau_ci95"][1]
    assert out.with_suffix(".md").read_text().count("| ") > 3
    snap = tmp_path / "snap.json"                              # the run directory: its F32 snapshot
    assert main(["train", "eval", str(a.parent), "--heldout", str(data), "--target", str(target),
                 "--threads", "1", "--out", str(snap)]) == 0
    assert json.loads(snap.read_text())["rows"][0]["tau"] == pytest.approx(rg["tau"], abs=0.1)

    code = main(["train", "eval", str(a), "--heldout", str(data), "--target", str(target),
                 "--exclude", str(data), "--threads", "1"])
    assert code == 2


def test_train_compare_curve_and_history_read_results_and_refuse_other_files(tmp_path: Path, capsys) -> None:
    """``moa-cpp train compare|curve|history`` on result files of the shapes their producers write:
    compare pairs per prompt (a file against a copy 0.1 higher: +0.1 exactly); curve keeps one point
    per drafter (by its token passes, the later file winning) in token-pass order; history reads
    runs' history.json. A file of another kind is refused with exit 2 and its name."""
    from moa_cpp.cli.main import main

    recs = [{"set": "mt_bench", "q": q, "moa chain:4": {"tau": 1.2 + 0.01 * q}} for q in range(20)]
    a = {"summary": {"moa chain:4": {}}, "records": recs}
    b = {"summary": {"moa chain:4": {}}, "records": [{**r, "moa chain:4": {"tau": r["moa chain:4"]["tau"] + 0.1}}
                                                   for r in recs]}
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    assert main(["train", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                 "--out", str(tmp_path / "ab.json")]) == 0
    c = json.loads((tmp_path / "ab.json").read_text())["methods"]["moa chain:4"]
    assert c["prompts"] == 20 and c["diff"] == pytest.approx(0.1) and c["diff_ci95"] == pytest.approx([0.1, 0.1])

    def ev(rows):
        return {"n_heldout": 48, "rows": [{"run": r, "tau": t, "tau_ci95": [t - .05, t + .05], "token_passes": p,
                                           "total_steps": p // 100} for r, t, p in rows]}
    (tmp_path / "q2.json").write_text(json.dumps(ev([("q1.gguf", 1.40, 5000), ("q2.gguf", 1.50, 9000)])))
    (tmp_path / "q3.json").write_text(json.dumps(ev([("lineage.gguf", 1.52, 9000), ("q3.gguf", 1.56, 14000),
                                                     ("side/x.gguf", 1.9, 100)])))
    assert main(["train", "curve", str(tmp_path / "q2.json"), str(tmp_path / "q3.json"), "--skip", "side/",
                 "--out", str(tmp_path / "curve.png")]) == 0
    pts = json.loads((tmp_path / "curve.json").read_text())
    assert [(p["token_passes"], p["tau"]) for p in pts] == [(5000, 1.40), (9000, 1.52), (14000, 1.56)]

    run = tmp_path / "run"
    run.mkdir()
    (run / "history.json").write_text(json.dumps({"history": [{"step": 50, "tokens": 1000, "tau": 1.3},
                                                              {"step": 100, "tokens": 2000, "tau": 1.5}]}))
    assert main(["train", "history", str(run), "--out", str(tmp_path / "hist")]) == 0
    assert [e["tau"] for e in json.loads((tmp_path / "hist.json").read_text())[str(run)]] == [1.3, 1.5]

    capsys.readouterr()
    assert main(["train", "compare", str(tmp_path / "q2.json"), str(tmp_path / "b.json")]) == 2
    assert main(["train", "curve", str(tmp_path / "a.json"), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "not a `python -m bench.eval run` result" in err and "a.json: not a moa-cpp train eval result" in err
