#!/usr/bin/env python
"""Is a greedy divergence in a ``bench/eval/run.py`` result a near-tie? For one prompt of a
results JSON, finds the first token where METHOD's output leaves the plain loop's, re-runs the
target (llama-cpp-python, flash attention on, as the loop) on the prompt + plain tokens up to it,
and prints the top-3 logits there and the margin between the plain token and METHOD's. A margin
of a few thousandths of a logit is a near-tie, the kind a batched verification row may flip on a
target without exact batch rows (README, "Lossless").

    python -m bench.eval near-tie bench/results/amd-epyc-2c/issue43-qwen15-q1-f16-humaneval-ngram.json 4 "ngram chain:4"
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


from bench.common import EVAL_DIR, eval_prompts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a run_eval.py results JSON")
    ap.add_argument("record", type=int, help="index into its records (the prompt)")
    ap.add_argument("method", help='the diverging method, e.g. "ngram chain:4"')
    ap.add_argument("--data", default=str(EVAL_DIR))
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import llama_cpp
    from moa_cpp.target.target import Target

    d = json.loads(Path(a.results).read_text())
    rec = d["records"][a.record]
    plain, other = rec["plain"]["tokens"], rec[a.method]["tokens"]
    i = next((k for k in range(min(len(plain), len(other))) if plain[k] != other[k]), None)
    if i is None:
        print(f"{a.method} equals the plain output on record {a.record}")
        return 0
    # the prompt, as run_eval built it: the set's q-th prompt, chat-templated
    q = int(rec["q"])
    prompt = eval_prompts(Path(a.data), [rec["set"]], q + 1)[q]
    t = Target.from_path(d["model"], n_ctx=64, n_threads=1)
    try:
        ids = t.tokenize(t.apply_chat_template([{"role": "user", "content": prompt}]),
                         add_bos=False, special=True).tolist()
    finally:
        t.close()
    if len(ids) != int(rec["prompt_tokens"]):
        print(f"prompt rebuilt with {len(ids)} tokens, the run had {rec['prompt_tokens']}", file=sys.stderr)
        return 1
    seq = ids + plain[:i]
    llm = llama_cpp.Llama(d["model"], n_ctx=len(seq) + 16, n_threads=a.threads, flash_attn=True,
                          logits_all=True, verbose=False)
    llm.eval(seq)
    row = np.asarray(llm.scores[len(seq) - 1])
    top = np.argsort(row)[::-1][:3]
    print(json.dumps({"record": a.record, "set": rec["set"], "q": q, "diverges_at": i, "plain": plain[i],
                      a.method: other[i], "top3": [[int(k), round(float(row[k]), 5)] for k in top],
                      "margin": round(float(row[plain[i]] - row[other[i]]), 5)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
