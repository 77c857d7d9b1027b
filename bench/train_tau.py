"""Greedy chain-4 tau and tokens/s of a trained drafter vs plain decoding on 10 own prompts
(not the evaluation sets). Usage: python bench/train_tau.py DRAFTER.gguf [--threads 1] [--max-tokens 128]
[-m TARGET.gguf (default SmolLM2 Q4_1)] [--no-chat (the raw prompt text: base models)]"""
from __future__ import annotations

import argparse
import json

from moa_cpp.generator import SpeculativeGenerator
from moa_cpp.models.registry import smollm2_path

PROMPTS = [
    "Explain how a refrigerator keeps food cold.",
    "Write a short poem about autumn leaves.",
    "What are three tips for staying focused while studying?",
    "Give me a simple recipe for pancakes.",
    "Why is the sky blue? Answer briefly.",
    "Write a Python function that reverses a string.",
    "What is the difference between a virus and a bacterium?",
    "Describe the water cycle in a few sentences.",
    "Suggest a name for a friendly robot and explain why.",
    "How do I politely decline a meeting invitation?",
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("drafter")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--draft", default="chain:4")
    ap.add_argument("-m", "--target", default=None, help="target GGUF (default: SmolLM2 Q4_1)")
    ap.add_argument("--no-chat", dest="chat", action="store_false", help="raw prompts (no chat template)")
    a = ap.parse_args()
    tgt = a.target or str(smollm2_path())
    res = {}
    for name, d in (("plain", None), ("moa", a.drafter)):
        gen = SpeculativeGenerator.from_paths(tgt, d, draft=a.draft, n_ctx=2048, n_threads=a.threads)
        gen.generate(PROMPTS[0], chat=a.chat, max_tokens=16)  # warm-up
        acc = calls = toks = 0
        secs = 0.0
        texts = []
        for p in PROMPTS:
            r = gen.generate(p, chat=a.chat, max_tokens=a.max_tokens)
            acc += r.stats.accepted
            calls += r.stats.target_calls
            toks += r.stats.n_generated
            secs += r.stats.t_total
            texts.append(r.tokens)
        gen.close()
        res[name] = {"tau": (acc + calls) / calls if calls else 0.0, "tokens": toks, "tokens_per_s": toks / secs,
                     "outputs": texts}
    same = res["plain"]["outputs"] == res["moa"]["outputs"]
    out = {k: {kk: vv for kk, vv in v.items() if kk != "outputs"} for k, v in res.items()}
    out["identical_outputs"] = same
    out["speedup"] = out["moa"]["tokens_per_s"] / out["plain"]["tokens_per_s"]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
