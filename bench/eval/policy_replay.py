"""Replay the cost-aware policy over recorded greedy outputs: how many target decodes (and how much
modelled time, from the target's measured T(k)) each draft policy would spend on the same text.

Greedy speculation emits exactly the plain output, so a run of ``bench/eval/run.py`` already holds
everything a policy's choices depend on: the prompt (rebuilt from the eval set with the target's
chat template) and the plain greedy tokens. This replays the real ``NgramProposer`` and
``CostAwarePolicy`` over them, cycle by cycle, with no model decode: each variant costs
sum over cycles of T(rows) seconds, plain costs n * T(1). It is a model of the decode phase (no
prefill, no Python time); `bench/eval/run.py` measures the real thing. Variants: ``global`` (one
acceptance estimate for every lookup, the policy before issue 23's match pricing), ``by-match``
(the default: priced per match-length class), ``oracle`` (hindsight: exactly the drafts that will
be accepted, when verifying them pays: the bound of any pricing of this lookup).

    python -m bench.eval policy-replay bench/results/amd-epyc-2c/eval-run-qwen15-f16-grounded.json \
        -m ~/.cache/moa_cpp/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


from bench.common import REPO_ROOT, eval_prompts

ROOT = REPO_ROOT


def replay(full: list, n_prompt: int, policy, proposer, verify_cost: dict, k_cap: int) -> dict:
    """Decode-phase cost of greedy speculation over ``full`` (prompt + plain greedy output), fed to
    the proposer as the loop feeds it (``SpeculativeLoop.step`` / ``_plain_step``)."""
    from moa_cpp.speculative.loop import fit_chain
    from moa_cpp.speculative.types import SamplingParams
    sp = SamplingParams()
    from moa_cpp.speculative.types import DraftConfig
    proposer.reset()
    ok = True if policy == "oracle" else policy.begin(None, proposer, lambda: k_cap)[0]
    n, end = n_prompt, len(full) - 1        # full[n] is the root; the last token is never a root
    feed = list(full[:n])
    t = 0.0
    cycles = accepted = proposed = 0
    while n < end:
        cycles += 1
        cfg = fit_chain(DraftConfig("chain", chain=k_cap) if policy == "oracle" else policy.choose(None),
                        min(end - n, k_cap)) if ok else None
        if cfg is None or cfg.mode == "none":
            t += verify_cost[1]                  # a plain step: the root joins the feed
            feed.append(full[n])
            n += 1
            continue
        prop = proposer.propose(feed, full[n], n, sp, None, cfg)
        if policy == "oracle":
            # hindsight bound: keep exactly the drafts that will be accepted, if verifying them pays
            acc = 0
            while acc < prop.n and int(prop.tokens[acc]) == full[n + 1 + acc]:
                acc += 1
            prop = prop.prefix(acc if acc and verify_cost[acc + 1] < (acc + 1) * verify_cost[1] else 0)
        elif getattr(policy, "contextual", False):          # as SpeculativeLoop._propose
            prop = prop.prefix(policy.fit(proposer.context) if prop.n else 0)
        drafts = [int(x) for x in prop.tokens]
        acc = 0
        while acc < len(drafts) and drafts[acc] == full[n + 1 + acc]:
            acc += 1
        t += verify_cost[len(drafts) + 1]
        if drafts and policy != "oracle":
            policy.update(len(drafts), acc)
        proposed += len(drafts)
        accepted += acc
        feed = full[n:n + 1 + acc]
        n += acc + 1
    return {"tokens": end - n_prompt, "cycles": cycles, "t": t, "plain": (end - n_prompt) * verify_cost[1],
            "proposed": proposed, "accepted": accepted}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", help="bench/eval/run.py result JSON files (their 'plain' tokens)")
    ap.add_argument("--dataset", action="append", default=[], metavar="DIR",
                    help="also a `moa-cpp train --data-only` directory of greedy answers (data.npz: prompt + "
                         "answer tokens), e.g. bench/data/heldout-s8/data (needs --verify-cost)")
    ap.add_argument("-m", "--model", required=True, help="a GGUF with the runs' tokenizer and chat template")
    ap.add_argument("--verify-cost", help="JSON {k: seconds}; default: the calibration cache entry of the run's model")
    ap.add_argument("--k-max", type=int, nargs="+", default=[8])
    ap.add_argument("--per-prompt", action="store_true")
    ap.add_argument("--cross-request", type=int, default=0, metavar="TOKENS",
                    help="a cross-request n-gram cache, modelled: each text is looked up after the last TOKENS "
                         "tokens of the texts before it (prompt + answer), as if one index held them all")
    args = ap.parse_args(argv)

    from moa_cpp.target import calibration as calibration_cache
    from moa_cpp.speculative.policy import CostAwarePolicy
    from moa_cpp.speculative.proposers.ngram import NgramProposer
    from moa_cpp.speculative.types import DraftConfig
    from moa_cpp.target.target import Target

    tok = Target.from_path(args.model, n_ctx=512, n_threads=1)
    texts = []
    for run in args.runs:
        d = json.loads(Path(run).read_text())
        if args.verify_cost:
            vc = {int(k): float(v) for k, v in json.loads(Path(args.verify_cost).read_text()).items()}
        else:
            vc = None
            for key, entry in json.loads((calibration_cache.path()).read_text()).items():
                if key.startswith(d["model"] + "|") and "verify_cost" in entry:
                    vc = {int(k): float(v) for k, v in entry["verify_cost"].items()}
            if vc is None:
                raise SystemExit(f"no T(k) for {d['model']} in the calibration cache: pass --verify-cost")
        prompts = {}
        for s in d["sets"]:
            data = ROOT / "bench" / "prompts" if s == "grounded" else ROOT.parent / "shared" / "data" / "eval"
            prompts[s] = eval_prompts(data, [s], d["prompts_per_set"])
        for r in d["records"]:
            text = prompts[r["set"]][int(r["q"])]
            ids = tok.tokenize(tok.apply_chat_template([{"role": "user", "content": text}]),
                               add_bos=False, special=True).tolist()
            plain = r["plain"]["tokens"]
            texts.append((f"{r['set']}[{r['q']}]", ids, plain, vc))
    for ds in args.dataset:
        import numpy as np
        z = np.load(Path(ds) / "data.npz")
        vc = {int(k): float(v) for k, v in json.loads(Path(args.verify_cost).read_text()).items()}
        for i in range(len(z["prompt_len"])):
            seq = z["tokens"][z["offsets"][i]:z["offsets"][i + 1]].tolist()
            n0 = int(z["prompt_len"][i])
            texts.append((f"{ds}[{i}]", seq[:n0], seq[n0:], vc))
    print(f"{len(texts)} prompts; T(k)/T(1): " + " ".join(f"{texts[0][3][k] / texts[0][3][1]:.2f}"
                                                         for k in sorted(texts[0][3])))
    class Global(NgramProposer):       # the same lookup, priced by one global estimate (before)
        contexts = 0

    variants = {"global": Global, "by-match": NgramProposer, "oracle": NgramProposer}
    for k_max in args.k_max:
        for vname, cls in variants.items():
            tot = {"t": 0.0, "plain": 0.0, "proposed": 0, "accepted": 0, "cycles": 0, "tokens": 0}
            # one loop answers every prompt: the estimate carries over
            pol = "oracle" if vname == "oracle" else CostAwarePolicy(k_max)
            per = []
            history: list = []
            for name, ids, out, vc in texts:
                before = history[-args.cross_request:] if args.cross_request else []
                history += ids + out
                ids = before + ids
                if pol != "oracle":
                    pol.verify_cost = vc
                k_cap = min(k_max, max(k for k in vc) - 1)
                r = replay(ids + out, len(ids), pol, cls(DraftConfig("auto", chain=k_max)), vc, k_cap)
                for key in tot:
                    tot[key] += r[key]
                per.append(f"{r['plain'] / r['t']:.2f}")
            print(f"{vname} auto:{k_max}: decode-phase {tot['plain'] / tot['t']:.3f}x, tau "
                  f"{tot['tokens'] / tot['cycles']:.2f}, accepted {tot['accepted']}/{tot['proposed']}"
                  + (f"; per prompt {' '.join(per)}" if args.per_prompt else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
