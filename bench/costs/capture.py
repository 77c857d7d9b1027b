"""Cost of the K/V capture on target decodes.

For each model and batch size, times one ``Target.decode`` of ``b`` tokens after a fixed
prefix, in three configurations, interleaved round by round (so drift hits all alike), and
reports medians:

- ``nocb``: a context created without ``cb_eval`` (plain llama.cpp);
- ``off``:  ``cb_eval`` installed, capture disabled (the callback asks for no tensor);
- ``on``:   capture enabled (every layer's K/V copied out);
- ``get``:  extra time of ``captured_lsa_in()`` for all rows after an ``on`` decode.

After each timed decode the cache is rolled back to the prefix. Timings include the Python
side of ``decode`` (batch fill, logits copy), which is the same in all configurations.

Usage::

    python -m bench.costs capture [--rounds 40] [--threads N] [--out bench/results/MACHINE/costs-capture.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np

from moa_cpp.models import registry as models
from moa_cpp.target.target import Target
from bench.common import RESULTS_ROOT, git_commit, machine_label

PREFIX = ("In a quiet village by the sea, the fishermen rose before dawn to prepare their boats, "
          "mend their nets and talk about the weather, the tides and the prices at the market.")
BATCHES = (1, 4, 8)
MODES = ("nocb", "off", "on")



def _time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_model(name: str, path: Path, rounds: int, threads: int) -> List[Dict]:
    """Median decode times (ms) per batch size and mode for one model."""
    kw = dict(n_ctx=1024, n_threads=threads, n_batch=64)
    with Target.from_path(path, **kw) as cb, Target.from_path(path, install_callback=False, **kw) as plain:
        prefix = cb.tokenize(PREFIX, add_bos=True)
        for t in (cb, plain):
            t.decode(prefix, capture=False)
        n0 = len(prefix)
        rng = np.random.default_rng(0)
        rows = []
        for b in BATCHES:
            toks = rng.integers(100, 1000, size=b).astype(np.int32)
            runs = {
                "nocb": lambda: plain.decode(toks, capture=False),
                "off": lambda: cb.decode(toks, capture=False),
                "on": lambda: cb.decode(toks, capture=True),
            }
            times: Dict[str, List[float]] = {m: [] for m in MODES + ("get",)}
            for r in range(rounds + 3):  # 3 warm-up rounds, discarded
                order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
                for m in order:
                    dt = _time(runs[m])
                    if m == "on":
                        dt_get = _time(cb.captured_lsa_in)
                    (plain if m == "nocb" else cb).rollback(n0)
                    if r >= 3:
                        times[m].append(dt)
                        if m == "on":
                            times["get"].append(dt_get)
            med = {m: 1e3 * statistics.median(v) for m, v in times.items()}
            rows.append(dict(model=name, batch=b, **{f"{m}_ms": round(v, 3) for m, v in med.items()},
                             on_vs_nocb=round(med["on"] / med["nocb"] - 1, 4),
                             off_vs_nocb=round(med["off"] / med["nocb"] - 1, 4),
                             iqr_on_ms=round(1e3 * float(np.subtract(*np.percentile(times["on"], [75, 25]))), 3),
                             iqr_nocb_ms=round(1e3 * float(np.subtract(*np.percentile(times["nocb"], [75, 25]))), 3)))
        return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: all usable cores)")
    ap.add_argument("--out", type=Path, default=RESULTS_ROOT / machine_label() / "costs-capture.json")
    args = ap.parse_args()
    threads = args.threads or len(os.sched_getaffinity(0))

    targets = {"SmolLM2-135M Q4_1": models.smollm2_path, "Gemma-3-270M Q4_K_M": models.gemma3_270m_path}
    rows: List[Dict] = []
    for name, getter in targets.items():
        rows += bench_model(name, getter(), args.rounds, threads)

    hdr = f"{'model':<22}{'batch':>6}{'nocb ms':>10}{'off ms':>10}{'on ms':>10}{'get ms':>9}{'on/nocb':>9}{'off/nocb':>10}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['model']:<22}{r['batch']:>6}{r['nocb_ms']:>10.2f}{r['off_ms']:>10.2f}{r['on_ms']:>10.2f}"
              f"{r['get_ms']:>9.3f}{r['on_vs_nocb']:>+9.1%}{r['off_vs_nocb']:>+10.1%}")

    import llama_cpp
    doc = dict(bench="capture_overhead", commit=git_commit(), machine=platform.node(), cpu=platform.processor(),
               threads=threads, rounds=args.rounds, llama_cpp_python=llama_cpp.__version__,
               time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), rows=rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
