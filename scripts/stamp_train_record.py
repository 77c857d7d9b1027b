"""Give a drafter GGUF made before ``moa.train.*`` existed its training record, tensors unchanged.

A continuation (``moa-cpp train --init-from``) adds its steps and token passes to its base's
record; a base without one counts as 0. For the drafter shipped before issue 22 the numbers are in
docs/training.md ("Full length: Muon + LSA FFN 192"), so they are written once, by hand:

    python scripts/stamp_train_record.py moa_cpp/data/moa-smollm2-135m-instruct.gguf /tmp/stamped.gguf \
        --target smollm2 --steps 590 --token-passes 308000 --note "issue 12: ShareGPT mix, Muon, LSA FFN 192"

The tensors go through the continuation's own path (dequantize -> torch -> the converter at the
file's type), which writes them back bit for bit (tests/train/test_train_continue.py); the script checks
that again and refuses to write otherwise. ``moa.eval.acceptance`` is kept.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gguf  # noqa: E402
import numpy as np  # noqa: E402

from moa_cpp.convert import convert  # noqa: E402
from moa_cpp.format.names import Keys  # noqa: E402
from moa_cpp.train.cli import _target_path  # noqa: E402
from moa_cpp.train.init_from import read_drafter, to_model  # noqa: E402
from moa_cpp.train.target_torch import TorchTarget  # noqa: E402


def _tensors(path: Path) -> dict:
    return {t.name: (t.tensor_type, np.asarray(t.data).tobytes()) for t in gguf.GGUFReader(str(path)).tensors}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--target", required=True, help="the drafter's target GGUF, or smollm2")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--token-passes", type=int, required=True, help="response tokens seen in training")
    ap.add_argument("--note", default="", help="where the numbers come from")
    a = ap.parse_args()
    src, out, target = Path(a.src), Path(a.out), _target_path(a.target)
    dw = read_drafter(src)
    if dw.recorded:
        print(f"{src} already has a training record ({dw.steps} steps)", file=sys.stderr)
        return 2
    types = {t for t in dw.tensor_types.values() if t not in ("F32", "I32")}
    if len(types) != 1:
        print(f"{src}: matrices of several types {sorted(types)}", file=sys.stderr)
        return 2
    fields = gguf.GGUFReader(str(src)).fields
    acc = fields[Keys.EVAL_ACCEPTANCE].contents() if Keys.EVAL_ACCEPTANCE in fields else None
    tt = TorchTarget.from_gguf(target)
    m = to_model(dw, target, tt)
    run = {"steps": a.steps, "token_passes": a.token_passes, "stamped": True, "note": a.note}
    record = {Keys.TRAIN_STEPS: a.steps, Keys.TRAIN_TOKEN_PASSES: a.token_passes,
              Keys.TRAIN_RUNS: [json.dumps(run, sort_keys=True, separators=(",", ":"))]}
    with tempfile.TemporaryDirectory() as tmp:
        new = convert(m.save(Path(tmp) / "snapshot"), Path(tmp) / "stamped.gguf", outtype=types.pop().lower(),
                      target_gguf=target, tli=dw.tli, progress=False, eval_acceptance=acc, train_record=record)
        if _tensors(new) != _tensors(src):
            print("the re-export changed tensors: not written", file=sys.stderr)
            return 1
        out.write_bytes(new.read_bytes())
    print(f"wrote {out}: {a.steps} steps, {a.token_passes} token passes, tensors identical to {src.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
