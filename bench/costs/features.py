#!/usr/bin/env python
"""Training features two ways (issue 43 item 1, "measure first"): the PyTorch re-implementation of
the target (``train/target_torch.py``, F32 weights dequantized from the GGUF, bf16 autocast as the
trainer runs it) vs llama.cpp itself (``Target.decode(capture=True)``: the per-layer K/V rows the
drafter reads at inference, from the quantized GGUF, on whatever backend llama.cpp has).

Per target, on the same teacher-forced ShareGPT conversations (first human turn + its answer,
chat template, cut to ``--max-len`` tokens; never the eval sets): features tok/s each way (warm,
the same samples, one after the other), agreement of the torch arg-max labels with llama.cpp's
(= the verifier's, which decides what is accepted), and how far the torch K/V rows are from the
ones the drafter sees at inference (mean |diff| / mean |llama.cpp|).

    python -m bench.costs features --targets smollm2 smollm2-q8_0 qwen2.5-coder-1.5b qwen-1.5b-f16 --samples 24

Writes bench/results/<machine>/feature_paths.{json,md,png}.
"""
from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import base_parser, md_table, run_info, write_results


def target_path(name: str) -> str:
    from moa_cpp.models import registry as models
    from bench.eval.spec_types import model_path
    if name == "smollm2-q8_0":
        return str(models.smollm2_q8_0_path())
    if name == "qwen2.5-coder-1.5b":
        return str(models.qwen25_coder_15b_path())
    return model_path(name)


def samples(tgt, n: int, max_len: int, skip: int) -> list:
    """Token ids of ``n`` ShareGPT first exchanges (chat template), each cut to ``max_len``."""
    from moa_cpp.train.sharegpt import fixed_answers, iter_conversations, sharegpt_path
    out = []
    for ctx, answer in itertools.islice(fixed_answers(iter_conversations(sharegpt_path()), turns="first"), skip,
                                        None):
        text = tgt.apply_chat_template(ctx + [{"role": "assistant", "content": answer}], add_generation_prompt=False)
        ids = tgt.tokenize(text, add_bos=False, special=True)
        if len(ids) >= 32:
            out.append(np.asarray(ids[:max_len], np.int32))
        if len(out) == n:
            return out
    return out


def llama_pass(path: str, seqs: list, threads: int) -> tuple:
    from moa_cpp.target.target import Target
    t = Target.from_path(path, n_ctx=max(len(s) for s in seqs) + 8, n_threads=threads)
    t.decode(seqs[0][:16], capture=True)                     # warm
    t.clear()
    lsa, top, secs = [], [], 0.0
    for s in seqs:
        t0 = time.perf_counter()
        logits = t.decode(s, np.arange(len(s), dtype=np.int32), capture=True)
        rows = t.captured_lsa_in()
        secs += time.perf_counter() - t0
        lsa.append(rows)
        top.append(np.argmax(logits, axis=1))
        t.clear()
    t.close()
    return lsa, top, secs


def torch_pass(path: str, seqs: list, threads: int, bf16: bool) -> tuple:
    import torch
    from moa_cpp.train.devices import autocast
    from moa_cpp.train.target_torch import TorchTarget
    torch.set_num_threads(threads)
    tt = TorchTarget.from_gguf(path)
    with torch.no_grad(), autocast(bf16, "cpu"):
        tt(torch.from_numpy(seqs[0][:16].astype(np.int64))[None])          # warm
    lsa, top, secs = [], [], 0.0
    for s in seqs:
        toks = torch.from_numpy(s.astype(np.int64))[None]
        t0 = time.perf_counter()
        with torch.no_grad(), autocast(bf16, "cpu"):
            out = tt(toks, want_logits=True)
        secs += time.perf_counter() - t0
        lsa.append(out.lsa_in[0].float().numpy())
        top.append(out.logits[0].float().argmax(-1).numpy())
    return lsa, top, secs


def main(argv=None) -> int:
    ap = base_parser(__doc__)
    ap.add_argument("--targets", nargs="+", default=["smollm2", "smollm2-q8_0", "qwen2.5-coder-1.5b", "qwen-1.5b-f16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--max-len", type=int, default=384)
    ap.add_argument("--skip", type=int, default=5000, help="ShareGPT pairs skipped first (away from training data heads)")
    ap.add_argument("--fp32", action="store_true", help="torch in F32 (default bf16 autocast, as the trainer)")
    ap.add_argument("--name", default="costs-features")
    ap.add_argument("--results-dir", default=None)
    args = ap.parse_args(argv)
    from moa_cpp.target.target import Target
    threads = args.threads
    rows, info = [], run_info(threads)
    for name in args.targets:
        path = target_path(name)
        vocab = Target.from_path(path, n_ctx=64, n_threads=1, install_callback=False)
        seqs = samples(vocab, args.samples, args.max_len, args.skip)
        vocab.close()
        n_tok = sum(len(s) for s in seqs)
        l_lsa, l_top, l_s = llama_pass(path, seqs, threads)
        t_lsa, t_top, t_s = torch_pass(path, seqs, threads, not args.fp32)
        agree = float(np.mean(np.concatenate([a == b for a, b in zip(l_top, t_top)])))
        diff = float(np.mean([np.abs(a - b).mean() for a, b in zip(l_lsa, t_lsa)]) /
                     np.mean([np.abs(a).mean() for a in l_lsa]))
        r = {"target": name, "file": Path(path).name, "tokens": n_tok, "llama_tok_s": n_tok / l_s,
             "torch_tok_s": n_tok / t_s, "label_agreement": agree, "kv_rel_diff": diff}
        print(r, flush=True)
        rows.append(r)
    md = ("Features of the same teacher-forced ShareGPT exchanges two ways: llama.cpp (`Target.decode(capture=True)`, "
          f"the quantized GGUF) and the PyTorch target ({'F32' if args.fp32 else 'bf16 autocast'}), {threads} threads, "
          f"{args.samples} samples cut to {args.max_len} tokens. Label agreement: torch arg-max = llama.cpp's "
          "(the verifier's). K/V diff: mean |torch - llama.cpp| / mean |llama.cpp| over all layers' rows.\n\n"
          + md_table(["target", "file", "tokens", "llama.cpp tok/s", "torch tok/s", "llama.cpp / torch",
                      "label agreement", "K/V rel. diff"],
                     [[r["target"], r["file"], r["tokens"], f"{r['llama_tok_s']:.0f}", f"{r['torch_tok_s']:.0f}",
                       f"{r['llama_tok_s'] / r['torch_tok_s']:.2f}", f"{100 * r['label_agreement']:.1f} %",
                       f"{r['kv_rel_diff']:.4f}"] for r in rows]))

    def plot(plt):
        fig, ax = plt.subplots(figsize=(7, 3.5))
        x = np.arange(len(rows))
        ax.bar(x - 0.2, [r["llama_tok_s"] for r in rows], 0.4, label="llama.cpp capture")
        ax.bar(x + 0.2, [r["torch_tok_s"] for r in rows], 0.4, label="PyTorch target")
        ax.set_xticks(x, [r["target"] for r in rows], fontsize=8)
        ax.set_ylabel("feature tokens/s")
        ax.legend()
        return fig
    write_results(args.name, {"rows": rows, "settings": vars(args)}, md, plot, out_dir=args.results_dir, info=info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
