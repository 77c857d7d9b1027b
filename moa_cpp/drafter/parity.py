"""``moa-cpp check-parity FIXTURE_DIR``: check a conversion + the native drafter against the
golden outputs of the official MoA reference implementation.

For any folder of the moa-ref fixture layout (``golden.npz``, ``target-f32.gguf``,
``drafter_hf/``, ``drafter_snapshot/``): convert the drafter from both released layouts,
capture the target's K/V with llama.cpp, run the drafter on the golden inputs and compare every
golden array. Nothing here depends on one fixture's shapes: sizes come from the arrays.

Gate (exit status 0): F32 conversions within ``--rtol`` (relative error = max |diff| / max |golden|,
default 1e-4) everywhere and every arg-max identical. F16 / Q8_0 conversions are reported only.
"""
from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

log = logging.getLogger(__name__)

GATED_OUTTYPE = "f32"
REPORTED_OUTTYPES = ("f16", "q8_0")


@dataclass
class Row:
    """One compared array."""

    variant: str        # "<layout>/<outtype>" or "target"
    name: str           # golden array name
    shape: tuple
    max_abs: float
    max_rel: float
    argmax_ok: Optional[int] = None   # matching arg-max rows (None: not an arg-max check)
    argmax_n: Optional[int] = None
    gated: bool = True


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    devices: set = field(default_factory=set)    # ggml devices the drafter ran on

    def add(self, variant: str, name: str, got: np.ndarray, want: np.ndarray, *, argmax: bool = False,
            gated: bool = True) -> None:
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            raise AssertionError(f"{variant} {name}: shape {got.shape} != golden {want.shape}")
        diff = float(np.abs(got - want).max()) if want.size else 0.0
        scale = float(np.abs(want).max()) if want.size else 0.0
        row = Row(variant, name, tuple(want.shape), diff, diff / scale if scale > 0 else diff, gated=gated)
        if argmax:
            g2, w2 = got.reshape(-1, want.shape[-1]), want.reshape(-1, want.shape[-1])
            row.argmax_ok = int((g2.argmax(-1) == w2.argmax(-1)).sum())
            row.argmax_n = int(w2.shape[0])
        self.rows.append(row)

    def add_tokens(self, variant: str, name: str, got, want, gated: bool = True) -> None:
        got, want = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
        ok = int((got[: want.size] == want).sum()) if got.size == want.size else 0
        self.rows.append(Row(variant, name, tuple(want.shape), 0.0, 0.0, ok, int(want.size), gated))

    def gated_summary(self) -> tuple[float, int, int]:
        g = [r for r in self.rows if r.gated]
        max_rel = max((r.max_rel for r in g), default=0.0)
        ok = sum(r.argmax_ok for r in g if r.argmax_n is not None)
        n = sum(r.argmax_n for r in g if r.argmax_n is not None)
        return max_rel, ok, n

    def table(self, rtol: float) -> str:
        head = f"{'variant':<18} {'array':<22} {'shape':<16} {'max_abs_err':>12} {'max_rel_err':>12} {'argmax':>8}  status"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            am = f"{r.argmax_ok}/{r.argmax_n}" if r.argmax_n is not None else ""
            if not r.gated:
                status = "report"
            else:
                ok = r.max_rel <= rtol and (r.argmax_n is None or r.argmax_ok == r.argmax_n)
                status = "ok" if ok else "FAIL"
            lines.append(f"{r.variant:<18} {r.name:<22} {str(list(r.shape)):<16} {r.max_abs:>12.3e} "
                         f"{r.max_rel:>12.3e} {am:>8}  {status}")
        return "\n".join(lines)


def _kv_from_lsa_in(lsa_in: np.ndarray, n_kv: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """[T, L, W] head-interleaved -> K, V as [L, n_kv, T, D] (the golden layout)."""
    T, L, _ = lsa_in.shape
    x = lsa_in.reshape(T, L, n_kv, 2, head_dim).transpose(3, 1, 2, 0, 4)
    return x[0], x[1]


def _run_drafter(report: Report, variant: str, drafter_path: Path, target_path: Path, g: dict,
                 lsa_prompt: np.ndarray, lsa_cycle2: np.ndarray, gated: bool, n_threads: Optional[int],
                 device: str = "auto") -> None:
    from moa_cpp.drafter.drafter import Drafter

    S = int(g["prompt_ids"].size)
    n_chain = int(g["chain_tokens"].size)
    n_acc = int(g["cycle2_ca_k"].shape[1]) - S          # root + accepted drafts of cycle 1
    n_ctx = S + max(n_chain, n_acc + 1) + 8
    d = Drafter(drafter_path, target_path, n_ctx=n_ctx, n_threads=n_threads, device=device)
    report.devices.add(d.model.device)
    dbg = d.commit(lsa_prompt, 0, debug=True)
    report.add(variant, "lsa_out", dbg.lsa_out, g["lsa_out"], gated=gated)
    report.add(variant, "lsa_mean", dbg.lsa_mean, g["lsa_mean"], gated=gated)
    report.add(variant, "ekv", dbg.ekv, g["ekv"], gated=gated)
    ca_k, ca_v = d.ca_cache()
    report.add(variant, "ca_k", ca_k, g["ca_k"], gated=gated)
    report.add(variant, "ca_v", ca_v, g["ca_v"], gated=gated)

    # Root at position S (SA over the prompt + root), then a greedy chain: step i feeds
    # chain_tokens[i-1] at S+i (golden README "chain_*").
    root = int(g["root_token"])
    logits = [d.draft([root], [S], [-1], feed=g["prompt_ids"])[0]]
    tokens = [int(logits[0].argmax())]
    for i in range(1, n_chain):
        logits.append(d.draft([tokens[-1]], [S + i])[0])
        tokens.append(int(logits[-1].argmax()))
    report.add(variant, "draft_logits_root", logits[0], g["draft_logits_root"], argmax=True, gated=gated)
    report.add(variant, "chain_logits", np.stack(logits), g["chain_logits"], argmax=True, gated=gated)
    report.add_tokens(variant, "chain_tokens", tokens, g["chain_tokens"], gated=gated)

    # Cycle 2: target_greedy[0:n_acc] verified -> their CA entries appended; the SA context
    # becomes prompt + those tokens; the bonus target_greedy[n_acc] is the next root.
    d.clear_drafts()
    d.commit(lsa_cycle2, S)
    k2, v2 = d.ca_cache()
    report.add(variant, "cycle2_ca_k", k2, g["cycle2_ca_k"], gated=gated)
    report.add(variant, "cycle2_ca_v", v2, g["cycle2_ca_v"], gated=gated)
    greedy = g["target_greedy"]
    lg2 = d.draft([int(greedy[n_acc])], [S + n_acc], [-1], feed=greedy[:n_acc])[0]
    report.add(variant, "cycle2_root_logits", lg2, g["cycle2_root_logits"], argmax=True, gated=gated)
    d.close()
    d.model.close()


def check_parity(fixture_dir: str | Path, *, rtol: float = 1e-4, report_quantized: bool = True,
                 work_dir: Optional[Path] = None, n_threads: Optional[int] = None, device: str = "auto",
                 n_gpu_layers: int = 0) -> Report:
    """Run every comparison for one fixture folder; returns the report (see :func:`main`).

    ``device`` places the drafter (as ``moa-cpp generate --device``), ``n_gpu_layers`` the target's
    layers (``-ngl``): the golden values are the reference's F32 CPU outputs, so a GPU run measures
    the backend's error against them with the same tolerance."""
    from moa_cpp.convert import convert
    from moa_cpp.target.target import Target

    fx = Path(fixture_dir)
    for need in ("golden.npz", "target-f32.gguf", "drafter_hf", "drafter_snapshot"):
        if not (fx / need).exists():
            raise FileNotFoundError(f"{fx}: missing '{need}' (not a moa-ref fixture folder)")
    g = dict(np.load(fx / "golden.npz"))
    target_path = fx / "target-f32.gguf"
    report = Report()
    S = int(g["prompt_ids"].size)
    n_acc = int(g["cycle2_ca_k"].shape[1]) - S

    # Target side: K/V capture and logits of the prompt, then of the cycle-1 verified tokens.
    n_greedy = int(g["target_greedy"].size)
    with Target.from_path(target_path, n_ctx=max(512, S + n_greedy + 16), n_threads=n_threads, cache_type="f32", flash_attn=False,
                          n_gpu_layers=n_gpu_layers) as tgt:
        logits = tgt.decode(g["prompt_ids"])
        lsa_prompt = tgt.captured_lsa_in()
        k, v = _kv_from_lsa_in(lsa_prompt, tgt.n_head_kv, tgt.head_dim)
        report.add("target", "target_k", k, g["target_k"])
        report.add("target", "target_v", v, g["target_v"])
        report.add("target", "lsa_in", lsa_prompt, g["lsa_in"])
        report.add("target", "target_logits_last", logits[-1], g["target_logits_last"], argmax=True)
        tgt.decode(g["target_greedy"][:n_acc])
        lsa_cycle2 = tgt.captured_lsa_in()
        # Greedy continuation: one token per decode, exactly as plain decoding.
        tgt.rollback(S)
        out = [int(logits[-1].argmax())]
        for _ in range(n_greedy - 1):
            out.append(int(tgt.decode([out[-1]], capture=False)[-1].argmax()))
        report.add_tokens("target", "target_greedy", out, g["target_greedy"])

    tmp_ctx = tempfile.TemporaryDirectory(prefix="moa-parity-") if work_dir is None else None
    wd = Path(tmp_ctx.name) if tmp_ctx else Path(work_dir)
    try:
        outtypes = [GATED_OUTTYPE] + (list(REPORTED_OUTTYPES) if report_quantized else [])
        for layout in ("drafter_hf", "drafter_snapshot"):
            for ot in outtypes:
                path = wd / f"{layout}-{ot}.gguf"
                convert(fx / layout, path, outtype=ot, target_gguf=target_path, progress=False)
                name = f"{'moa_spec' if layout == 'drafter_hf' else 'snapshot'}/{ot}"
                _run_drafter(report, name, path, target_path, g, lsa_prompt, lsa_cycle2,
                             gated=(ot == GATED_OUTTYPE), n_threads=n_threads, device=device)
    finally:
        if tmp_ctx:
            tmp_ctx.cleanup()
    return report


def add_parity_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("fixture_dir", help="folder with golden.npz, target-f32.gguf, drafter_hf/, drafter_snapshot/")
    p.add_argument("--rtol", type=float, default=1e-4, help="max relative error for F32 (default 1e-4)")
    p.add_argument("--no-quantized", action="store_true", help="skip the reported (ungated) f16 / q8_0 runs")
    p.add_argument("--threads", type=int, default=None, help="CPU threads")
    p.add_argument("--device", default="auto", help="drafter device: auto (first GPU, else CPU), cpu or a ggml "
                   "device name such as CUDA0 (`moa-cpp generate --list-devices`)")
    p.add_argument("-ngl", "--n-gpu-layers", dest="n_gpu_layers", type=int, default=0,
                   help="target layers to offload to the GPU (-1: all; default 0)")


def run_parity(args: argparse.Namespace) -> int:
    report = check_parity(args.fixture_dir, rtol=args.rtol, report_quantized=not args.no_quantized,
                          n_threads=args.threads, device=args.device, n_gpu_layers=args.n_gpu_layers)
    print(report.table(args.rtol))
    print(f"drafter device: {', '.join(sorted(report.devices))}; target layers offloaded: {args.n_gpu_layers}")
    max_rel, ok, n = report.gated_summary()
    print(f"max_rel_err={max_rel:.3e} argmax_match={ok}/{n}")
    return 0 if (max_rel <= args.rtol and ok == n) else 1


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="moa-cpp check-parity", description=__doc__.splitlines()[0], allow_abbrev=False)
    add_parity_arguments(p)
    return run_parity(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
