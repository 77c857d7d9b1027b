"""Held-out chain-4 acceptance of trained drafters on ONE common held-out set (``moa-cpp train eval``).

Each training run estimates tau on its own held-out split, so runs on different data do not
compare. This scores several drafters (run directories' snapshots or drafter GGUFs) on the same
held-out conversations: a data directory written by ``moa-cpp train --data-only`` (greedy
self-distilled answers of prompts no compared run trained on, or, in a set that has none,
``--fixed-answers`` teacher-forced ones; a sample whose prompt occurs in a run's ``prompts.jsonl``
is dropped and counted). The estimate is the trainer's (``eval_acceptance``: CA bounded every 5th
position, the drafter's argmax vs the torch target's). Each row also gets a 95 % bootstrap interval
over the held-out conversations and, paired (the same resampled conversations), the interval of
its difference to the first row: what separates a real A/B difference from held-out sampling noise
(training-seed noise is not in it).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from moa_cpp.errors import InvalidArgumentError
from moa_cpp.train.paired import bootstrap, scored_indices


def label(run: str) -> str:
    """A row's name: the run directory's, or ``dir/file`` for a GGUF (continuations all write drafter.gguf)."""
    p = Path(run)
    return f"{p.parent.name}/{p.name}" if p.suffix == ".gguf" else p.name


def _load_gguf(path: Path, tt, target_path: str):
    """A drafter GGUF (dequantized, as ``moa-cpp train --init-from`` reads it) and its training record."""
    from moa_cpp.train.init_from import read_drafter, to_model

    dw = read_drafter(path)
    model = to_model(dw, target_path, tt)
    if dw.tli:
        model.attach_tli(tt, dw.tli)
    rec = dw.recorded
    return model.eval(), {"steps": dw.steps if rec else None, "total_steps": dw.steps if rec else None,
                          "token_passes": dw.token_passes if rec else None}


def _load_snapshot(run: Path, tt):
    """A run directory's ``snapshot/`` (safetensors + config) and its ``report.json``."""
    from safetensors.numpy import load_file

    from moa_cpp.train.model import MoaDrafter, spec_from_config

    snap = run / "snapshot"
    if not (snap / "config.json").is_file():
        raise InvalidArgumentError(f"{run}: neither a drafter .gguf nor a training run directory (no snapshot/)")
    cfg = json.loads((snap / "config.json").read_text())
    tensors = load_file(str(snap / "model.safetensors"))
    model = MoaDrafter(spec_from_config(cfg), tt.embed.data, None if tt.lm_head is tt.embed else tt.lm_head.data,
                       d2t=tensors.get("d2t"))
    model.load_hf(tensors)
    tli = cfg.get("moa_cpp_train", {}).get("settings", {}).get("tli", 0)
    if tli:
        model.attach_tli(tt, tli)
    rep = json.loads((run / "report.json").read_text()) if (run / "report.json").is_file() else {}
    rec = rep.get("train_record") or {}
    rep["token_passes"] = rec.get("moa.train.token_passes")
    rep["total_steps"] = rec.get("moa.train.steps")
    return model.eval(), rep


def score(runs: Sequence[str], heldout: str, target_path: str, *, exclude: Sequence[str] = (),
          first: Optional[int] = None, log=print) -> dict:
    """Score every drafter in ``runs`` on the held-out data directory ``heldout``; returns
    ``{"heldout", "n_heldout", "first", "rows": [...]}`` (one row per run, with its bootstrap intervals)."""
    from moa_cpp.train.data import load_dataset
    from moa_cpp.train.devices import resolve_bf16
    from moa_cpp.train.evaluate import eval_acceptance
    from moa_cpp.train.exclusion import prompt_key, read_prompt_keys
    from moa_cpp.train.features import compute_features
    from moa_cpp.train.target_torch import TorchTarget

    held = Path(heldout)
    if not (held / "prompts.jsonl").is_file():
        raise InvalidArgumentError(f"--heldout {held}: not a data directory (no prompts.jsonl; make one with "
                                   "moa-cpp train --data-only)")
    for r in runs:
        if not Path(r).exists():
            raise InvalidArgumentError(f"{r}: no such drafter or run directory")
    ds = load_dataset(held)
    tt = TorchTarget.from_gguf(target_path)
    fs = compute_features(tt, ds, held / "features", bf16=resolve_bf16("auto", "cpu"))
    keys = [prompt_key(json.loads(line)) for line in (held / "prompts.jsonl").read_text().splitlines()]
    seen = read_prompt_keys([*runs, *exclude])   # a GGUF: its run directory's prompts
    if not ds.greedy.any():
        log("held-out: no greedy self-distilled answers; scoring the teacher-forced ones")
    idx = scored_indices(ds.greedy, keys, seen)
    log(f"held-out: {len(idx)} of {len(ds)} conversations ({len(ds) - len(idx)} dropped: trained on or sampled)")
    if not idx:
        raise InvalidArgumentError(
            f"no held-out conversation left to score in {held} (every one trained on by a compared run, or "
            "sampled): make the held-out set with --exclude-prompts of every compared run's data")
    rows, per_run = [], []
    for r in runs:
        run = Path(r)
        model, rep = _load_gguf(run, tt, target_path) if run.suffix == ".gguf" else _load_snapshot(run, tt)
        per: list[tuple[int, int]] = []
        ev = eval_acceptance(model, ds, fs, idx, per_sample=per, first=first)
        per_run.append(per)
        rows.append({"run": str(run), **ev, "seconds": rep.get("seconds"), "steps": rep.get("steps"),
                     "token_passes": rep.get("token_passes"), "total_steps": rep.get("total_steps"),
                     "samples": rep.get("samples"), "response_tokens": rep.get("response_tokens")})
        log(f"{run}: tau {ev['tau']:.3f}  acc@1 {ev['acc@1']:.3f}  acc@4 {ev['acc@4']:.3f}  ({ev['cycles']:.0f} cycles)")
    for row, (ci, dci) in zip(rows, bootstrap(per_run)):
        row["tau_ci95"], row["diff_vs_first_ci95"] = ci, dci
        log(f"{row['run']}: tau 95% [{ci[0]:.3f}, {ci[1]:.3f}]  minus first row: [{dci[0]:+.3f}, {dci[1]:+.3f}]")
    return {"heldout": str(held), "n_heldout": len(idx), "first": first, "rows": rows}


def write_report(res: dict, out_json: Path) -> None:
    """``res`` as JSON, a markdown table and (matplotlib installed) a bar plot of tau with its 95 % interval."""
    out_json = Path(out_json)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(res, indent=2) + "\n")
    lines = [f"Held-out chain-4 tau on {res['n_heldout']} conversations ({res['heldout']}); 95 % bootstrap "
             "intervals over conversations; the difference is paired with the first row.", "",
             "| run | steps | train s | tau | 95 % | minus first row, 95 % | acc@1 |", "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        sec = (r.get("seconds") or {}).get("train")
        (lo, hi), (dlo, dhi) = r["tau_ci95"], r["diff_vs_first_ci95"]
        lines.append(f"| {label(r['run'])} | {r.get('steps')} | {'-' if sec is None else f'{sec:.0f}'} | "
                     f"{r['tau']:.3f} | {lo:.3f}-{hi:.3f} | {dlo:+.3f} to {dhi:+.3f} | {r['acc@1']:.3f} |")
    out_json.with_suffix(".md").write_text("\n".join(lines) + "\n")
    plt = _pyplot()
    if plt is None:
        return
    names = [label(r["run"]) for r in res["rows"]]
    tau = np.array([r["tau"] for r in res["rows"]])
    ci = np.array([r["tau_ci95"] for r in res["rows"]])
    fig, ax = plt.subplots(figsize=(1.2 * len(names) + 2, 3.5))
    ax.bar(names, tau - 1.0, bottom=1.0, yerr=[tau - ci[:, 0], ci[:, 1] - tau], capsize=4, color="tab:blue")
    ax.set_ylabel("held-out chain-4 tau")
    ax.set_ylim(1.0, max(ci[:, 1]) * 1.02)
    ax.set_title(f"{out_json.stem}: {res['n_heldout']} held-out conversations, 95 % bootstrap")
    fig.tight_layout()
    fig.savefig(out_json.with_suffix(".png"), dpi=100)
    plt.close(fig)


def _pyplot():
    """matplotlib's pyplot on the Agg backend, or None (with a note) when it is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        import sys
        print("matplotlib not installed: no plot (pip install 'moa_cpp[bench]')", file=sys.stderr)
        return None
    return plt
