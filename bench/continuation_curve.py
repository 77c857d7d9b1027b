"""Learning curve across continuations (issue 22): common held-out chain-4 tau against the
cumulative token passes each drafter's ``moa.train.*`` record holds (log x), with 95 % bootstrap
intervals, from ``bench/heldout_tau.py`` results.

    python bench/continuation_curve.py bench/results/issue22-*.json --out bench/results/issue22-curve.png
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def points(files: list[str], skip: tuple[str, ...] = ()) -> list[dict]:
    """Every scored drafter with a training record, once (the latest file's score wins). A drafter is
    known by its cumulative token passes, not its path: the shipped file's path held a different
    round in older files, and a round is scored under two paths once shipped. Runs whose path
    contains a ``skip`` string (side branches of the lineage) are left out."""
    seen: dict[int, dict] = {}
    for f in files:
        res = json.loads(Path(f).read_text())
        for r in res["rows"]:
            if r.get("token_passes") and not any(s in r["run"] for s in skip):
                seen[r["token_passes"]] = {"run": r["run"], "token_passes": r["token_passes"], "steps": r.get("total_steps"),
                                  "tau": r["tau"], "ci": r["tau_ci95"], "n": res["n_heldout"], "file": f}
    return sorted(seen.values(), key=lambda p: p["token_passes"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--out", required=True, help="PNG (a JSON of the points is written beside it)")
    ap.add_argument("--skip", nargs="*", default=[], help="leave out runs whose path contains one of these")
    a = ap.parse_args()
    pts = points(a.results, tuple(a.skip))
    out = Path(a.out)
    out.with_suffix(".json").write_text(json.dumps(pts, indent=2) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    x = [p["token_passes"] for p in pts]
    y = [p["tau"] for p in pts]
    err = [[p["tau"] - p["ci"][0] for p in pts], [p["ci"][1] - p["tau"] for p in pts]]
    ax.errorbar(x, y, yerr=err, fmt="o-", capsize=4)
    for i, p in enumerate(pts):
        r = Path(p["run"])
        # a run's drafter.gguf is named by its directory, any other GGUF by its own name
        name = (r.parent.name if r.stem == "drafter" else r.stem) if r.suffix == ".gguf" else r.name
        ax.annotate(f"{name}, {p['steps']} steps" if p.get("steps") else name,
                    (p["token_passes"], p["tau"]),
                    textcoords="offset points", xytext=(4, -12 if i % 2 else 6), fontsize=7)  # neighbours apart
    ax.set_xscale("log")
    ax.set_xlabel("cumulative token passes (response tokens seen in training, all runs)")
    ax.set_ylabel("common held-out chain-4 tau")
    ax.set_title(f"SmolLM2 drafter across continuations ({pts[0]['n'] if pts else 0} held-out conversations)", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(json.dumps(pts, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
