"""Learning curves of training runs: held-out chain-4 tau (and acc@1) vs response tokens seen.

Reads each run's ``history.json`` (written by ``moa-cpp train``), prints a table and writes a
JSON + PNG (matplotlib) of the curves:

    python bench/learning_curve.py out/default3 out/ab-fixed out/ab-self \
        --out bench/results/issue12-learning-curve

Each run's estimate is on its own held-out split (see bench/heldout_tau.py for one common set).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run directories holding history.json")
    ap.add_argument("--out", required=True, help="output stem (writes STEM.json and STEM.png)")
    a = ap.parse_args()
    curves = {}
    for r in a.runs:
        h = json.loads((Path(r) / "history.json").read_text())["history"]
        curves[r] = [{"step": e["step"], "tokens": e["tokens"], "tau": e["tau"], "acc@1": e.get("acc@1")} for e in h]
        print(r)
        print("  tokens seen | " + " | ".join(f"{e['tokens'] / 1000:.0f}k" for e in curves[r]))
        print("  tau         | " + " | ".join(f"{e['tau']:.2f}" for e in curves[r]))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(curves, indent=2) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
