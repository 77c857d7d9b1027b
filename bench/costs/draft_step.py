"""Draft-step cost of a SmolLM2-shaped MoA drafter vs the target's own single-token decode.

Random drafters (``moa_cpp.testing.random_drafter``; sizes: its defaults, i.e. SmolLM2-135M gets
SA/CA 9 x 64 heads / 3 KV / FFN 864, LSA 6 x 64 / 3 KV / FFN 576) are converted to ``f16`` and
``q8_0``. Each drafter state holds a realistic context: ``--ctx`` verified tokens committed
(CA cache) and fed (SA cache). Timed, interleaved round by round (alternating order, so drift
hits all alike), medians reported:

- ``target_decode1``: SmolLM2-135M-Instruct's own ``llama_decode`` of one token after ``--ctx``
  cached tokens (plain context, no eval callback; ``Target.decode``), then rolled back;
- ``draft1``: one draft call of the root row (SA over ctx + itself, CA over ctx entries, LM head);
- ``draft8``: one draft call of 8 tree rows (parents ``[-1,0,0,1,1,2,2,3]``);
- ``commit1`` / ``commit4``: LSA -> mean -> Ekv2E -> CA K/V for 1 / 4 verified tokens (per
  cycle a drafter commits the accepted drafts + the old root); reported per token too;
- ``*_tinyhead``: the same drafter with a 32-row reduced draft vocabulary
  (``draft_output.weight`` + ``d2t``), so ``1 - tinyhead / full`` is the LM head's share of a
  draft call (the tied 49152 x 576 Q8_0 ``token_embd``, plus the logits copy to Python).

All times include the Python side of the calls (argument checks, logits array), as a
speculative-decoding loop in Python would pay it.

Usage::

    python -m bench.costs draft-step [--rounds 40] [--ctx 256] [--threads N] [--out bench/results/MACHINE/costs-draft-step.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

import gguf
import numpy as np

from moa_cpp.models import registry as models
from moa_cpp.drafter.drafter import Drafter
from moa_cpp.format.names import ARCH, D2T, DRAFT_OUTPUT, Keys
from moa_cpp.testing.random_drafter import make_random_drafter, spec_from_target
from moa_cpp.target.target import Target
from bench.common import RESULTS_ROOT, git_commit, machine_label

TEXT = ("In a quiet village by the sea, the fishermen rose before dawn to prepare their boats, "
        "mend their nets and talk about the weather, the tides and the prices at the market. ")
PARENTS = [-1, 0, 0, 1, 1, 2, 2, 3]
DEPTHS = [0, 1, 1, 2, 2, 2, 2, 3]
OUTTYPES = ("f16", "q8_0")
TINY_VOCAB = 32
WARMUP = 3



def with_tiny_head(src: Path, dst: Path, n: int = TINY_VOCAB) -> Path:
    """Copy of drafter ``src`` with an ``n``-row reduced draft vocabulary (docs/gguf-format.md)."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, ARCH)  # writes general.architecture itself
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub)
    w.add_uint32(Keys.DRAFT_VOCAB_SIZE, n)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    d = int(r.get_field(Keys.EMBEDDING_LENGTH).contents())
    w.add_tensor(DRAFT_OUTPUT, (np.random.default_rng(0).standard_normal((n, d)) * 0.02).astype(np.float16))
    w.add_tensor(D2T, np.arange(n, dtype=np.int32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _timer(fn: Callable[[], object], after: Callable[[], object]) -> Callable[[], float]:
    """Time ``fn``; ``after`` (untimed) restores the state for the next round."""
    def run() -> float:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        after()
        return dt
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--ctx", type=int, default=256, help="verified tokens before the timed step")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: all usable cores)")
    ap.add_argument("--out", type=Path, default=RESULTS_ROOT / machine_label() / "costs-draft-step.json")
    args = ap.parse_args()
    threads = args.threads or len(os.sched_getaffinity(0))
    tp = models.smollm2_path()
    ctx, n_ctx = args.ctx, args.ctx + 64

    # Context tokens and their captured K/V (+ 4 more rows for the commit timings).
    with Target.from_path(tp, n_ctx=n_ctx, n_batch=ctx + 4, n_threads=threads) as cap:
        text = TEXT
        while len(toks := cap.tokenize(text)) < ctx + 4:
            text += TEXT
        toks = toks[: ctx + 4]
        cap.decode(toks)
        lsa_all = cap.captured_lsa_in()
    ids, lsa_ctx, lsa_new = toks[:ctx], lsa_all[:ctx], lsa_all[ctx:]
    plain = Target.from_path(tp, n_ctx=n_ctx, n_batch=ctx, n_threads=threads, install_callback=False)
    plain.decode(ids, capture=False)
    root = int(toks[ctx])
    tree_toks = [root] + [int(t) for t in np.random.default_rng(0).integers(100, 1000, 7)]
    tree_pos = [ctx + k for k in DEPTHS]

    ops: Dict[str, Callable[[], float]] = {
        "target_decode1": _timer(lambda: plain.decode([root], capture=False), lambda: plain.rollback(ctx)),
    }
    tmp = tempfile.TemporaryDirectory(prefix="moa-bench-")
    drafters: List[Drafter] = []
    for ot in OUTTYPES:
        full = make_random_drafter(tp, Path(tmp.name) / f"{ot}.gguf", ot)
        for variant, path in ((ot, full), (f"{ot}_tinyhead", with_tiny_head(full, Path(tmp.name) / f"{ot}-tiny.gguf"))):
            d = Drafter(path, tp, n_ctx=n_ctx, n_threads=threads)
            d.commit(lsa_ctx, 0)
            d.feed(ids)
            drafters.append(d)
            ops[f"{variant}/draft1"] = _timer(lambda d=d: d.draft([root], [ctx], [-1]), d.clear_drafts)
            ops[f"{variant}/draft8"] = _timer(lambda d=d: d.draft(tree_toks, tree_pos, PARENTS), d.clear_drafts)
            if variant == ot:  # the head plays no part in a commit
                for T in (1, 4):
                    ops[f"{variant}/commit{T}"] = _timer(lambda d=d, T=T: d.commit(lsa_new[:T], ctx),
                                                         lambda d=d: d.rollback(ctx))

    load_before = os.getloadavg()  # the machine may be shared: keep the evidence with the numbers
    times: Dict[str, List[float]] = {k: [] for k in ops}
    names = list(ops)
    for r in range(args.rounds + WARMUP):
        for k in (names if r % 2 == 0 else names[::-1]):
            dt = ops[k]()
            if r >= WARMUP:
                times[k].append(dt)
    load_after = os.getloadavg()
    plain.close()
    for d in drafters:
        d.close()
        d.model.close()
    tmp.cleanup()

    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    iqr = {k: 1e3 * float(np.subtract(*np.percentile(v, [75, 25]))) for k, v in times.items()}
    base = med["target_decode1"]
    rows = [dict(op=k, median_ms=round(med[k], 4), iqr_ms=round(iqr[k], 4), vs_target_decode1=round(med[k] / base, 4))
            for k in names]
    for r in rows:
        if "/commit" in r["op"]:
            r["per_token_ms"] = round(r["median_ms"] / int(r["op"].rsplit("commit", 1)[1]), 4)
    head_share = {f"{ot}/{op}": round(1 - med[f"{ot}_tinyhead/{op}"] / med[f"{ot}/{op}"], 4)
                  for ot in OUTTYPES for op in ("draft1", "draft8")}

    hdr = f"{'op':<24}{'median ms':>11}{'IQR ms':>9}{'x target':>10}{'per tok ms':>12}"
    print(f"SmolLM2-135M-Instruct Q4_1 target, ctx {ctx}, {threads} threads, {args.rounds} rounds, "
          f"load average {load_before[0]:.2f} -> {load_after[0]:.2f}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        pt = f"{r['per_token_ms']:>12.3f}" if "per_token_ms" in r else ""
        print(f"{r['op']:<24}{r['median_ms']:>11.3f}{r['iqr_ms']:>9.3f}{r['vs_target_decode1']:>10.3f}{pt}")
    print("LM head share of a draft call (1 - tinyhead/full): "
          + ", ".join(f"{k} {v:.0%}" for k, v in head_share.items()))

    import llama_cpp
    spec = spec_from_target(tp)
    doc = dict(bench="draft_step", commit=git_commit(), machine=platform.node(), cpu=platform.processor(),
               threads=threads, rounds=args.rounds, ctx=ctx, target=tp.name, llama_cpp_python=llama_cpp.__version__,
               drafter_spec=spec.__dict__, tree_parents=PARENTS, tiny_vocab=TINY_VOCAB,
               time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), loadavg_1min=[load_before[0], load_after[0]],
               rows=rows, lm_head_share=head_share)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
