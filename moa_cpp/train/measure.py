"""``moa-cpp train eval|compare|curve|history``: measuring drafters, paired and with intervals.

- ``eval``: chain-4 tau of several drafters on ONE common held-out set (:mod:`moa_cpp.train.heldout`),
  95 % bootstrap intervals, paired differences to the first drafter; ``--out X.json`` also writes
  ``X.md`` and ``X.png``.
- ``compare``: two ``python -m bench.eval run`` results of the same prompts and target (two
  drafters), per-prompt tau paired: the mean difference of every ``moa ...`` method the two files
  share, with its 95 % bootstrap interval over prompts (greedy decoding is deterministic: the
  interval is the prompt-sampling noise, not run-to-run noise).
- ``curve``: a lineage's learning curve across continuations: held-out tau from ``eval`` results
  against the cumulative token passes each drafter's ``moa.train.*`` record holds (log x).
- ``history``: learning curves inside runs (each run's own held-out split, from ``history.json``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from moa_cpp.errors import InvalidArgumentError

COMMANDS = ("eval", "compare", "curve", "history")


def _read_json(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InvalidArgumentError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidArgumentError(f"{path}: not a JSON results file ({e})") from None


# ------------------------------------------------------------------ eval

def add_eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", help="drafter GGUFs or training run directories (with snapshot/)")
    p.add_argument("--heldout", required=True, help="data directory of the held-out conversations "
                                                    "(moa-cpp train --data-only)")
    p.add_argument("--target", default="smollm2", help="the target: a GGUF path or a named model (default smollm2)")
    p.add_argument("--exclude", nargs="*", default=[],
                   help="more directories holding prompts.jsonl (or data/, data-fixed/) of prompts a compared "
                        "drafter trained on (a GGUF does not say): their held-out conversations are dropped")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all usable cores)")
    p.add_argument("--first", type=int, default=None, metavar="N",
                   help="score only chains that start within each answer's first N tokens (default: whole answers)")
    p.add_argument("--out", default=None, metavar="X.json", help="write X.json, X.md and X.png")


def run_eval(a: argparse.Namespace) -> int:
    import torch

    from moa_cpp.train.cli import _target_path
    from moa_cpp.train.heldout import score, write_report

    if a.threads:
        torch.set_num_threads(a.threads)
    res = score(a.runs, a.heldout, _target_path(a.target), exclude=a.exclude, first=a.first)
    if a.out:
        write_report(res, Path(a.out))
        print(f"wrote {a.out} (+ .md, .png)")
    return 0


# ------------------------------------------------------------------ compare

def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="results JSON of the first drafter (the reference), from python -m bench.eval run")
    p.add_argument("b", help="results JSON of the second drafter")
    p.add_argument("--out", default=None, help="also write the comparison as JSON")


def compare(ra: dict, rb: dict) -> dict:
    """Per shared ``moa ...`` method: :func:`moa_cpp.train.paired.paired` of the per-prompt tau."""
    from moa_cpp.train.paired import paired, per_prompt_tau

    for r in (ra, rb):
        if "summary" not in r or "records" not in r:
            raise InvalidArgumentError("not a `python -m bench.eval run` result (no summary/records)")
    methods = [m for m in ra["summary"] if m.startswith("moa ") and m in rb["summary"]]
    if not methods:
        raise InvalidArgumentError("no common 'moa ...' method in the two files")
    return {m: paired(per_prompt_tau(ra, m), per_prompt_tau(rb, m)) for m in methods}


def run_compare(a: argparse.Namespace) -> int:
    res = compare(_read_json(a.a), _read_json(a.b))
    for m, c in res.items():
        print(f"{m}: tau {c['tau_a']:.3f} -> {c['tau_b']:.3f}, difference {c['diff']:+.3f} "
              f"(95 % {c['diff_ci95'][0]:+.3f} to {c['diff_ci95'][1]:+.3f}, {c['prompts']} prompts)")
    if a.out:
        Path(a.out).write_text(json.dumps({"a": a.a, "b": a.b, "methods": res}, indent=2) + "\n")
    return 0


# ------------------------------------------------------------------ curve

def add_curve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", help="moa-cpp train eval results (JSON)")
    p.add_argument("--out", required=True, help="PNG (a JSON of the points is written beside it)")
    p.add_argument("--skip", nargs="*", default=[], help="leave out runs whose path contains one of these")
    p.add_argument("--title", default="drafter lineage", help="the plot's title")


def curve_points(results: Sequence[dict], skip: Sequence[str] = ()) -> list[dict]:
    """Every scored drafter with a training record, once (a later file's score wins). A drafter is
    known by its cumulative token passes, not its path: one file is scored under several paths as a
    lineage moves on. Runs whose path contains a ``skip`` string (side branches) are left out."""
    seen: dict[int, dict] = {}
    for res in results:
        for r in res["rows"]:
            if r.get("token_passes") and not any(s in r["run"] for s in skip):
                seen[r["token_passes"]] = {"run": r["run"], "token_passes": r["token_passes"],
                                           "steps": r.get("total_steps"), "tau": r["tau"], "ci": r["tau_ci95"],
                                           "n": res["n_heldout"], "file": res.get("_file")}
    return sorted(seen.values(), key=lambda p: p["token_passes"])


def run_curve(a: argparse.Namespace) -> int:
    from moa_cpp.train.heldout import _pyplot

    results = []
    for f in a.results:
        res = _read_json(f)
        if "rows" not in res or "n_heldout" not in res:
            raise InvalidArgumentError(f"{f}: not a moa-cpp train eval result (no rows/n_heldout)")
        results.append({**res, "_file": f})
    pts = curve_points(results, a.skip)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(pts, indent=2) + "\n")
    for p in pts:
        print(f"{p['token_passes']:>10,} token passes  tau {p['tau']:.3f} [{p['ci'][0]:.3f}, {p['ci'][1]:.3f}]  {p['run']}")
    plt = _pyplot()
    if plt is None:
        return 0
    fig, ax = plt.subplots(figsize=(8, 4.5))
    err = [[p["tau"] - p["ci"][0] for p in pts], [p["ci"][1] - p["tau"] for p in pts]]
    ax.errorbar([p["token_passes"] for p in pts], [p["tau"] for p in pts], yerr=err, fmt="o-", capsize=4)
    for i, p in enumerate(pts):
        r = Path(p["run"])
        # a run's drafter.gguf is named by its directory, any other GGUF by its own name
        name = (r.parent.name if r.stem == "drafter" else r.stem) if r.suffix == ".gguf" else r.name
        ax.annotate(f"{name}, {p['steps']} steps" if p.get("steps") else name, (p["token_passes"], p["tau"]),
                    textcoords="offset points", xytext=(4, -12 if i % 2 else 6), fontsize=7)  # neighbours apart
    ax.set_xscale("log")
    ax.set_xlabel("cumulative token passes (response tokens seen in training, all runs)")
    ax.set_ylabel("common held-out chain-4 tau")
    ax.set_title(f"{a.title} ({pts[0]['n'] if pts else 0} held-out conversations)", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


# ------------------------------------------------------------------ history

def add_history_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", help="training run directories (holding history.json)")
    p.add_argument("--out", required=True, help="output stem (writes STEM.json and STEM.png)")


def run_history(a: argparse.Namespace) -> int:
    from moa_cpp.train.heldout import _pyplot

    curves = {}
    for r in a.runs:
        h = _read_json(str(Path(r) / "history.json")).get("history")
        if not isinstance(h, list):
            raise InvalidArgumentError(f"{r}/history.json: no 'history' list (written by moa-cpp train)")
        curves[r] = [{"step": e["step"], "tokens": e["tokens"], "tau": e["tau"], "acc@1": e.get("acc@1")} for e in h]
        print(r)
        print("  tokens seen | " + " | ".join(f"{e['tokens'] / 1000:.0f}k" for e in curves[r]))
        print("  tau         | " + " | ".join(f"{e['tau']:.2f}" for e in curves[r]))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(curves, indent=2) + "\n")
    plt = _pyplot()
    if plt is None:
        return 0
    fig, ax = plt.subplots(figsize=(7, 4))
    for r, c in curves.items():
        ax.plot([e["tokens"] / 1000 for e in c], [e["tau"] for e in c], marker="o", label=Path(r).name)
    ax.set_xlabel("response tokens seen (thousands)")
    ax.set_ylabel("held-out chain-4 tau (own split)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    plt.close(fig)
    return 0


_HELP = {"eval": "chain-4 tau of drafters on one common held-out set, paired 95 % intervals",
         "compare": "two evaluation-set results compared per prompt (paired 95 % interval)",
         "curve": "a lineage's held-out tau against cumulative token passes (from eval results)",
         "history": "learning curves inside training runs (their history.json)"}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``moa-cpp train COMMAND ...`` for the measuring commands (``argv`` starts with the command)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="moa-cpp train", allow_abbrev=False, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="measure", metavar="COMMAND", required=True)
    for name in COMMANDS:
        c = sub.add_parser(name, help=_HELP[name], description=_HELP[name], allow_abbrev=False)
        globals()[f"add_{name}_arguments"](c)
        c.set_defaults(func=globals()[f"run_{name}"])
    a = p.parse_args(argv)
    try:
        return int(a.func(a) or 0)
    except InvalidArgumentError as e:
        print(f"moa-cpp train {a.measure}: error: {e}", file=sys.stderr)
        return 2
