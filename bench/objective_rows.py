"""What the objective A/Bs of issue 22 part 3 change, counted on a run's own data: the share of
loss rows by depth (``T ~ U{t_min..t_max}`` as the trainer draws it), of teacher-forced tokens the
target would not have picked greedily, and of rows ``--mask-off-target`` / ``--loss-max-depth D``
leave in the loss. Reads the run's data and cached hidden states (no LSA, no training).

    python bench/objective_rows.py out/cont/c3 moa_cpp/data/moa-smollm2-135m-instruct.gguf --samples 400
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from moa_cpp.train.cli import _target_path  # noqa: E402
from moa_cpp.train.data import load_dataset  # noqa: E402
from moa_cpp.train.init_from import read_drafter  # noqa: E402
from moa_cpp.train.masks import block_starts  # noqa: E402
from moa_cpp.train.target_torch import TorchTarget  # noqa: E402
from moa_cpp.train.loss import off_path_rows  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="run directory with data-fixed/ (or data/) and features/hidden.npy")
    ap.add_argument("drafter", help="drafter GGUF (its draft vocabulary decides the greedy pick)")
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--t-range", type=int, nargs=2, default=[6, 14])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    run = Path(a.run)
    ds = load_dataset(next(d for d in (run / "data-fixed", run / "data") if (d / "data.npz").is_file()))
    hidden = np.load(run / "features" / "hidden.npy", mmap_mode="r")
    d2t = torch.as_tensor(np.asarray(read_drafter(a.drafter).d2t, dtype=np.int64))
    head = TorchTarget.from_gguf(_target_path(a.target)).lm_head.detach()[d2t]
    rng = np.random.default_rng(a.seed)
    idx = rng.choice(len(ds), size=min(a.samples, len(ds)), replace=False)
    depth_hist: dict[int, int] = {}
    rows = off_tok = masked = 0
    for j in idx:
        lo, hi = int(ds.offsets[j]), int(ds.offsets[j + 1])
        toks = torch.as_tensor(ds.sample(int(j)).astype(np.int64))[None]
        resp = torch.zeros_like(toks, dtype=torch.bool)
        resp[0, int(ds.prompt_len[j]):] = True
        T = torch.tensor([int(rng.integers(a.t_range[0], a.t_range[1] + 1))])
        start = block_starts(resp, T)
        with torch.no_grad():
            pick = d2t[(torch.from_numpy(np.array(hidden[lo:hi - 1], np.float32)) @ head.T).argmax(-1)][None]
        m = off_path_rows(toks, resp, pick, start)
        depth = (torch.arange(toks.shape[1])[None] - start)[resp]
        for d, c in zip(*np.unique(depth.numpy(), return_counts=True)):
            depth_hist[int(d)] = depth_hist.get(int(d), 0) + int(c)
        rows += int(resp.sum())
        off_tok += int((resp[:, 1:] & (toks[:, 1:] != pick)).sum())
        masked += int(m.sum())
    share = lambda f: {f"<{d}": round(sum(c for k, c in depth_hist.items() if f(k, d)) / rows, 3)  # noqa: E731
                       for d in (1, 4, 8)}
    res = {"run": str(run), "drafter": str(a.drafter), "samples": int(len(idx)), "response_rows": rows,
           "t_range": a.t_range, "rows_by_depth": {str(k): depth_hist[k] for k in sorted(depth_hist)},
           "share_of_rows_at_depth": share(lambda k, d: k < d),
           "off_target_token_share": round(off_tok / rows, 3),
           "rows_masked_by_mask_off_target": round(masked / rows, 3)}
    print(json.dumps(res, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
