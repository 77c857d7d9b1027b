#!/usr/bin/env python
"""The loop's own cost: milliseconds per generated token spent outside ``llama_decode`` and the
drafter's graph (issue 59), on the GPU-speed proxy and on SmolLM2, next to ``llama-bench`` tg.

Per target (``--targets``, default ``proxy smollm2``; ``proxy`` is bench/proxy.py's ~1 ms random
llama with SmolLM2's tokenizer), chat prompts of mt_bench and alpaca, greedy, one warm-up of each
method, then the methods interleaved per prompt (their order rotating):

- ``llama-bench`` ``-p 0 -n N -fa 1``: llama.cpp's token generation, nothing around it (the floor),
  on an empty context and at ``-d D`` (after D tokens, D = the chat prompts' mean length, where our
  decodes run: attention then reads D more cells per token);
- ``generate --no-draft``: the ``moa-cpp generate --json`` process; its in-process decode rate;
- in process (``SpeculativeGenerator``, timed hooks on ``llama_decode`` and on the drafter's native
  calls): ``api plain`` (``generate``), ``api sample`` (llama.cpp's default sampler settings,
  seeded), ``api stream`` (``stream``, pieces as a user reads them),
  ``api ngram`` (``spec_type="ngram"``, the cost-aware default), ``api moa chain:4`` (forced chain
  of 4: the shipped drafter on SmolLM2, a random drafter on the proxy: its cost, not its acceptance).
  Per generated token: the decode phase's wall time, the time inside ``llama_decode``, inside the
  drafter's native calls, and the rest -- **the loop's own cost**.

``--engine N [N ...]`` adds the server's batching engine without the server: N slots of one
shared context (``moa_cpp.server.sessions.batched_slots``, as ``moa-cpp serve --parallel N``
builds them) generate plainly at once in this process (the decode thread drives their plain
runs), against ``llama-batched-bench -npl N`` (llama.cpp's batched decoding, nothing around it) on
the same file: tok/s of the decode phase, ms per set of N tokens, its time inside
``llama_decode`` and the engine's own (``--engine-only``: just this).

``--profile`` adds one cProfile pass per in-process method (after the timed ones) and lists the
functions with the most own time per token: where the loop's milliseconds go.

    python -m bench.costs loop                          # ~4 min on 2 quiet cores (after bench/peers/build.sh)
    python -m bench.costs loop --targets proxy --profile
    python -m bench.costs loop --quick --results-dir /tmp/smoke

Writes bench/results/<machine-label>/loop_cost.json/.md/.png. Without the peers built (``bash
bench/peers/build.sh``), the llama-bench column is left empty.
"""
from __future__ import annotations

import cProfile
import json
import pstats
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Optional

from bench.common import EVAL_DIR, base_parser, eval_prompts, md_table, run_info, usable_cores, write_results
from bench.peers.compare import moa_generate_cmd, ours_record, peers_dir, rotate, run_proc
from bench.eval.spec_types import model_path
from bench.eval.spec_types import run as run_moa

SETS = ["mt_bench", "alpaca"]
API_METHODS = ["api plain", "api sample", "api stream", "api ngram", "api moa chain:4"]
# ``api sample``: llama.cpp's default sampler settings (llama-cli / llama-server), seeded
SAMPLE = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1)
HOW = {"api stream": "stream", "api sample": "sample"}


class Hooks:
    """Timed wrappers around ``llama_cpp.llama_decode`` and the drafter's native calls: every
    call's (start, seconds), so that a decode phase's share can be summed afterwards."""

    DRAFTER_CALLS = ("moa_state_draft", "moa_state_draft_rows", "moa_state_commit", "moa_state_feed",
                     "moa_state_compute_ca", "moa_state_append_ca", "moa_state_rollback", "moa_state_clear_drafts")

    def __init__(self) -> None:
        import llama_cpp

        import moa_cpp.drafter.drafter as drafter_mod
        self.calls: dict = {"decode": [], "drafter": []}
        self._llama, self._decode = llama_cpp, llama_cpp.llama_decode
        self._drafter_mod, self._lib = drafter_mod, drafter_mod.lib
        calls, decode = self.calls, self._decode

        def timed_decode(ctx, batch):
            t = time.perf_counter()
            try:
                return decode(ctx, batch)
            finally:
                calls["decode"].append((t, time.perf_counter() - t))

        real = self._lib

        class TimedLib:          # the cffi lib's attributes cannot be replaced: wrap the module's name
            def __getattr__(self, name):
                f = getattr(real, name)
                if name not in Hooks.DRAFTER_CALLS:
                    return f

                def timed(*a):
                    t = time.perf_counter()
                    try:
                        return f(*a)
                    finally:
                        calls["drafter"].append((t, time.perf_counter() - t))
                return timed

        llama_cpp.llama_decode = timed_decode
        drafter_mod.lib = TimedLib()

    def reset(self) -> None:
        for v in self.calls.values():
            v.clear()

    def since(self, kind: str, t0: float) -> float:
        return sum(d for t, d in self.calls[kind] if t >= t0)

    def close(self) -> None:
        self._llama.llama_decode = self._decode
        self._drafter_mod.lib = self._lib


def api_method(gen: Any, how: str, hooks: Hooks, q: str, n: int) -> dict:
    """One in-process generation; the decode phase (after the first token) split by where its
    time went."""
    hooks.reset()
    t_call = time.perf_counter()
    if how == "stream":
        pieces = list(gen.stream(q, chat=True, max_tokens=n, temperature=0.0))
        text, st = "".join(p.text if hasattr(p, "text") else str(p) for p in pieces), gen.last_stats
    else:
        kw = SAMPLE if how == "sample" else dict(temperature=0.0)
        r = gen.generate(q, chat=True, max_tokens=n, **kw)
        text, st = r.text, r.stats
    t_end = time.perf_counter()
    wall = t_end - t_call
    t0 = t_end - st.t_total if how != "stream" else None
    # stream(): t_total ends at the last step, before the last pieces are yielded; take the decode
    # phase as everything after the prefill's share of the call
    if t0 is None:
        t0 = t_call + st.t_prefill
    phase = t_end - t0
    tok = max(st.n_generated - 1, 1)         # tokens of the decode phase (the first came with the prefill)
    dec, dr = hooks.since("decode", t0), hooks.since("drafter", t0)
    return {"wall": wall, "n": st.n_generated, "text": text, "t_phase": phase, "t_decode_calls": dec,
            "t_drafter_calls": dr, "ms_token": 1e3 * phase / tok, "ms_decode": 1e3 * dec / tok,
            "ms_drafter": 1e3 * dr / tok, "ms_loop": 1e3 * (phase - dec - dr) / tok,
            "decode_calls": sum(1 for t, _ in hooks.calls["decode"] if t >= t0),
            "drafted": st.drafted, "accepted": st.accepted, "decode_tok_s": tok / phase}


def profile_method(fn, n_tok: int, top: int = 12) -> list:
    """Own time per generated token (ms) of the functions that take the most, one cProfile pass."""
    pr = cProfile.Profile()
    pr.enable()
    fn()
    pr.disable()
    st = pstats.Stats(pr)
    rows = []
    for (file, line, name), (cc, nc, tt, ct, _) in st.stats.items():
        rows.append((tt, ct, nc, f"{Path(file).name}:{line}({name})" if file != "~" else name))
    rows.sort(reverse=True)
    return [{"fn": f, "own_ms_token": 1e3 * tt / n_tok, "cum_ms_token": 1e3 * ct / n_tok, "calls": nc}
            for tt, ct, nc, f in rows[:top]]


def measure_target(name: str, args, peers: Optional[Path]) -> dict:
    from moa_cpp import SpeculativeGenerator
    from moa_cpp.models import defaults
    from moa_cpp.testing.random_drafter import make_random_drafter
    model = model_path(name)
    T, n = args.threads, args.max_tokens
    if name == "smollm2":
        drafter = str(defaults.default_drafter())
    else:
        from moa_cpp.models.registry import cache_dir
        drafter = str(cache_dir() / "bench" / f"{Path(model).stem}.random-drafter.gguf")
        if not Path(drafter).is_file():
            make_random_drafter(model, drafter, outtype="q8_0")
    prompts = [(s, i, q) for s in SETS for i, q in enumerate(eval_prompts(Path(EVAL_DIR), [s], args.prompts))]
    gens = {
        "api plain": SpeculativeGenerator.from_paths(model, n_threads=T),
        "api ngram": SpeculativeGenerator.from_paths(model, n_threads=T, spec_type="ngram"),
        "api moa chain:4": SpeculativeGenerator.from_paths(model, drafter, n_threads=T, draft="chain:4"),
    }
    gens["api stream"] = gens["api sample"] = gens["api plain"]
    hooks = Hooks()
    fns: dict = {}
    for m in API_METHODS:
        fns[m] = (lambda m: lambda q: api_method(gens[m], HOW.get(m, "generate"), hooks, q, n))(m)
    ours_cmd = moa_generate_cmd(model, n, T, 4096, ["--no-draft"])
    fns["generate --no-draft"] = lambda q: ours_record(*run_moa(ours_cmd, q, None, args.timeout)[:2])
    bench_cmd = None
    # our decodes follow a chat prompt; llama-bench's tg starts on an empty context unless -d
    # (depth) fills it first: both are shown, the prompts' mean length as the depth
    depth = round(sum(len(gens["api plain"].encode(q, chat=True)) for _, _, q in prompts) / len(prompts))
    if peers is not None:
        bench_cmd = [str(peers / "llama-bench"), "-m", model, "-p", "0", "-n", str(n), "-t", str(T), "-fa", "1",
                     "-r", "1", "-o", "json"]

        def bench(q, extra=()):
            wall, out, _ = run_proc(bench_cmd + list(extra), args.timeout)
            r = json.loads(out)[0]
            return {"wall": wall, "n": n, "decode_tok_s": r["avg_ts"], "ms_token": 1e3 / r["avg_ts"]}
        fns["llama-bench"] = bench
        fns[f"llama-bench -d {depth}"] = lambda q: bench(q, ["-d", str(depth)])
    names = list(fns)
    try:
        for m in names:
            fns[m]("Hello! Who are you?")
        records = []
        for gi, (s, qi, q) in enumerate(prompts):
            rec = {"set": s, "q": qi, "order": rotate(names, gi)}
            for m in rec["order"]:
                rec[m] = fns[m](q)
                if "ms_token" not in rec[m] and rec[m].get("decode_tok_s"):
                    rec[m]["ms_token"] = 1e3 / rec[m]["decode_tok_s"]
            records.append(rec)
            print(f"[{name}] {s}[{qi}] " + " | ".join(
                f"{m} {rec[m].get('ms_token', 0):.3f} ms" + (f" (loop {rec[m]['ms_loop']:.3f})" if "ms_loop" in rec[m]
                                                           else "") for m in names), flush=True)
        profile = {}
        if args.profile:
            q = prompts[0][2]
            for m in API_METHODS:
                g = gens[m]
                st_n = []

                def once(m=m, g=g):
                    r = api_method(g, HOW.get(m, "generate"), hooks, q, n)
                    st_n.append(r["n"])
                profile[m] = profile_method(once, n)
    finally:
        hooks.close()
        for g in {id(g): g for g in gens.values()}.values():
            g.target.close()

    def total(m, key):
        rs = [r[m] for r in records]
        tok = sum(max(r["n"] - 1, 1) for r in rs)
        return 1e3 * sum(r[key] for r in rs) / tok

    summary = {}
    for m in names:
        rs = [r[m] for r in records]
        s = {"ms_token": sum(r["ms_token"] * max(r["n"] - 1, 1) for r in rs) / sum(max(r["n"] - 1, 1) for r in rs)}
        if m in API_METHODS:
            s.update(ms_decode=total(m, "t_decode_calls"), ms_drafter=total(m, "t_drafter_calls"),
                     ms_token=total(m, "t_phase"))
            s["ms_loop"] = s["ms_token"] - s["ms_decode"] - s["ms_drafter"]
            s["drafted"] = sum(r["drafted"] for r in rs)
            s["accepted"] = sum(r["accepted"] for r in rs)
            s["decode_calls"] = sum(r["decode_calls"] for r in rs)
            s["tokens"] = sum(max(r["n"] - 1, 1) for r in rs)
        s["tok_s"] = 1e3 / s["ms_token"]
        summary[m] = s
    return {"target": name, "model": model, "drafter": drafter, "prompts": len(prompts), "max_tokens": n, "depth": depth,
            "commands": {"llama-bench": bench_cmd, "generate --no-draft": ours_cmd}, "records": records,
            "summary": summary, "profile": profile}


def measure_engine(name: str, n_slots: int, args, peers: Optional[Path]) -> dict:
    """N slots decoding plainly on the batching engine (decode phase only: the prompts are
    prefilled by a first turn, the timed turn reuses them), next to llama-batched-bench."""
    import threading
    from moa_cpp import SpeculativeGenerator
    from moa_cpp.server.sessions import batched_slots
    from moa_cpp.server.settings import ServerSettings
    model = model_path(name)
    T, n = args.threads, args.max_tokens
    qs = [q for _, q in zip(range(n_slots), (q for s in SETS for q in eval_prompts(Path(EVAL_DIR), [s], n_slots)))]
    base, engine = batched_slots(ServerSettings(model=model, parallel=n_slots, n_ctx=1024, threads=T), model)
    hooks = Hooks()
    rounds, whole = [], []
    try:
        gens = [SpeculativeGenerator(engine.slot(i)) for i in range(n_slots)]
        pp = round(sum(len(g.encode(q, chat=True)) for g, q in zip(gens, qs)) / n_slots)

        def turn(cache_prompt: bool = True) -> tuple:
            res: list = [None] * n_slots

            def slot(i):
                engine.enter(i)
                try:
                    res[i] = gens[i].generate(qs[i], chat=True, max_tokens=n, ignore_eos=True,
                                              cache_prompt=cache_prompt)
                finally:
                    engine.leave(i)
            th = [threading.Thread(target=slot, args=(i,)) for i in range(n_slots)]
            hooks.reset()
            t0 = time.perf_counter()
            for x in th:
                x.start()
            for x in th:
                x.join()
            wall = time.perf_counter() - t0
            return wall, res
        turn()                                            # prefill (and warm-up)
        for _ in range(max(1, args.engine_rounds)):
            wall, res = turn()                            # the prompts' cells reused: decoding only
            toks = sum(r.stats.n_generated for r in res)
            calls = hooks.calls["decode"]
            rounds.append({"wall": wall, "tokens": toks, "tok_s": toks / wall, "decode_calls": len(calls),
                           "t_decode": sum(d for _, d in calls), "cached": [r.stats.n_cached for r in res]})
            # the whole requests: every prompt prefilled again beside the others' decoding, as a
            # server's clients arrive (llama-batched-bench: pp of all prompts, then tg)
            wall, res = turn(cache_prompt=False)
            calls = hooks.calls["decode"]
            whole.append({"wall": wall, "tokens": sum(r.stats.n_generated for r in res), "decode_calls": len(calls),
                          "t_decode": sum(d for _, d in calls), "t_prefill": [r.stats.t_prefill for r in res]})
    finally:
        hooks.close()
        # the engine's decode thread ends here, and its OpenMP pool with it: a pool left behind
        # would throttle every later engine's barriers (moa_cpp/target/omp_pool.py)
        engine.close()                  # (and the target)
    peer = None
    cmd = None
    if peers is not None:
        cmd = [str(peers / "llama-batched-bench"), "-m", model, "-c", str(n_slots * (pp + n + 8)), "-b", "2048",
               "-ub", "512", "-npp", str(pp), "-ntg", str(n), "-npl", str(n_slots), "-t", str(T), "-fa", "1",
               "--output-format", "jsonl"]
        peer = []
        for _ in range(max(1, args.engine_rounds)):
            _, out, _ = run_proc(cmd, args.timeout)
            r = [json.loads(x) for x in out.splitlines() if x.startswith("{")][-1]
            peer.append(r)
    best = max(rounds, key=lambda r: r["tok_s"])
    sets = best["tokens"] / n_slots
    doc = {"target": name, "slots": n_slots, "pp": pp, "tg": n, "rounds": rounds, "tok_s": best["tok_s"],
           "ms_set": 1e3 * best["wall"] / sets, "ms_decode_set": 1e3 * best["t_decode"] / max(best["decode_calls"], 1),
           "decode_calls_per_set": best["decode_calls"] / sets,
           "peer_tok_s": max(r["speed_tg"] for r in peer) if peer else None, "peer_cmd": cmd, "peer": peer}
    # whole requests (prefill + decode), best round each side: seconds for all N requests
    w = min(whole, key=lambda r: r["wall"])
    doc.update(whole=whole, whole_s=w["wall"], whole_calls=w["decode_calls"], whole_decode_s=w["t_decode"],
               peer_whole_s=min(r["t"] for r in peer) if peer else None,
               peer_pp_s=min(r["t_pp"] for r in peer) if peer else None)
    doc["ms_engine_set"] = doc["ms_set"] - 1e3 * best["t_decode"] / sets
    print(f"[engine {name} x{n_slots}] whole requests: ours {doc['whole_s']:.2f} s ({doc['whole_calls']} decode calls, "
          f"{doc['whole_decode_s']:.2f} s in llama_decode), llama-batched-bench {doc['peer_whole_s'] or 0:.2f} s "
          f"(pp {doc['peer_pp_s'] or 0:.2f} s)", flush=True)
    print(f"[engine {name} x{n_slots}] ours {doc['tok_s']:.1f} tok/s (best of {len(rounds)}), "
          f"llama-batched-bench {doc['peer_tok_s'] or 0:.1f}; ms/set {doc['ms_set']:.2f}, "
          f"in llama_decode {1e3 * best['t_decode'] / sets:.2f}", flush=True)
    return doc


def md_engine(rows: list) -> str:
    table = [[r["target"], r["slots"], f"{r['tok_s']:.1f}", f"{r['peer_tok_s']:.1f}" if r["peer_tok_s"] else "",
              f"{r['tok_s'] / r['peer_tok_s']:.3f}" if r["peer_tok_s"] else "", f"{r['ms_set']:.2f}",
              f"{r['ms_set'] - r['ms_engine_set']:.2f}", f"**{r['ms_engine_set']:.2f}**",
              f"{r['decode_calls_per_set']:.2f}"] for r in rows]
    cmd = next((r["peer_cmd"] for r in rows if r["peer_cmd"]), None)
    whole = [[r["target"], r["slots"], f"{r['whole_s']:.3f}", f"{r['peer_whole_s']:.3f}" if r["peer_whole_s"] else "",
              f"{r['peer_whole_s'] / r['whole_s']:.3f}" if r["peer_whole_s"] else "", r["whole_calls"],
              f"{r['whole_decode_s']:.3f}", f"{r['whole_s'] - r['whole_decode_s']:.3f}",
              f"{r['peer_pp_s']:.3f}" if r["peer_pp_s"] else ""] for r in rows]
    return ("## The batching engine (no server): N slots decoding plainly\n\n"
            "Decode phase only (a first turn prefills; the timed turns reuse the prompts' cells), greedy, "
            "`ignore_eos`, best of the rounds each side. A set = one token for every slot. "
            "Engine's own = ms per set outside `llama_decode`.\n\n" +
            md_table(["target", "slots", "ours tok/s", "llama-batched-bench S_TG", "ratio", "ms per set",
                      "in llama_decode", "engine's own", "llama_decode calls per set"], table) +
            "\nWhole requests (every prompt prefilled again beside the others' decoding, then decoded; "
            "llama-batched-bench: its T = prefill of all prompts + decode), seconds for the N requests:\n\n" +
            md_table(["target", "slots", "ours s", "llama-batched-bench T s", "ratio", "our llama_decode calls",
                      "ours in llama_decode s", "ours outside s", "llama-batched-bench T_PP s"], whole) +
            (f"\nllama-batched-bench: `{shlex.join(cmd)}`\n" if cmd else "\n"))


def md(doc: dict) -> str:
    out = []
    if doc.get("engine"):
        out.append(md_engine(doc["engine"]))
    for t in doc["targets"]:
        s = t["summary"]
        base = s.get("llama-bench", {}).get("ms_token")
        based = s.get(f"llama-bench -d {t['depth']}", {}).get("ms_token")
        rows = []
        for m, v in s.items():
            rows.append([m, f"{v['ms_token']:.3f}", f"{v['tok_s']:.1f}", f"{base / v['ms_token']:.3f}" if base else "",
                         f"{based / v['ms_token']:.3f}" if based else "",
                         f"{v['ms_decode']:.3f}" if "ms_decode" in v else "",
                         f"{v['ms_drafter']:.3f}" if "ms_drafter" in v else "",
                         f"**{v['ms_loop']:.3f}**" if "ms_loop" in v else "",
                         f"{v['accepted']}/{v['drafted']}" if v.get("drafted") else ""])
        out.append(f"## {t['target']}: `{Path(t['model']).name}`\n\n{t['prompts']} chat prompts "
                   f"({', '.join(SETS)}), -n {t['max_tokens']}, greedy, drafter `{Path(t['drafter']).name}` "
                   "(api moa chain:4). ms/token: the decode phase (after the first token) per token; "
                   f"llama-bench: 1 / its tg rate, on an empty context and after {t['depth']} tokens (`-d`, the "
                   "prompts' mean length: where our decodes run).\n\n" + md_table(
                       ["method", "ms/token", "tok/s", "x llama-bench tg", f"x llama-bench tg -d {t['depth']}",
                        "in llama_decode", "in drafter calls",
                        "loop's own", "accepted/drafted"], rows) + "\n")
        if t["profile"]:
            for m, rows_p in t["profile"].items():
                out.append(f"Profile of {m} (cProfile, one prompt; own ms per token, slowed by the profiler):\n\n" +
                           md_table(["function", "own ms/token", "cum ms/token", "calls"],
                                    [[r["fn"], f"{r['own_ms_token']:.4f}", f"{r['cum_ms_token']:.4f}", r["calls"]]
                                     for r in rows_p]) + "\n")
        cmds = t["commands"]
        out.append("Commands: " + "; ".join(f"{k}: `{shlex.join(v)} ...`" for k, v in cmds.items() if v) + "\n")
    return "\n".join(out)


def plot(doc: dict):
    def draw(plt):
        fig, axes = plt.subplots(1, len(doc["targets"]), figsize=(6 * len(doc["targets"]), 4), squeeze=False)
        for ax, t in zip(axes[0], doc["targets"]):
            s = t["summary"]
            ms = list(s)
            parts = [("ms_decode", "llama_decode"), ("ms_drafter", "drafter calls"), ("ms_loop", "loop's own")]
            bottom = [0.0] * len(ms)
            for key, label in parts:
                vals = [s[m].get(key, 0.0) if key != "ms_decode" or "ms_decode" in s[m] else s[m]["ms_token"]
                        for m in ms]
                ax.bar(ms, vals, bottom=bottom, label=label)
                bottom = [b + v for b, v in zip(bottom, vals)]
            ax.set_title(f"{t['target']}: ms per generated token")
            ax.tick_params(axis="x", rotation=30)
            ax.legend()
        fig.tight_layout()
        return fig
    return draw


def plot_engine(rows: list):
    def draw(plt):
        fig, ax = plt.subplots(figsize=(7, 4))
        labels = [f"{r['target']} x{r['slots']}" for r in rows]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["tok_s"] for r in rows], 0.4, label="moa-cpp engine (plain)")
        ax.bar([i + 0.2 for i in x], [r["peer_tok_s"] or 0 for r in rows], 0.4, label="llama-batched-bench S_TG")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels)
        ax.set_yscale("log")
        ax.set_ylabel("tok/s (decode phase, all slots)")
        ax.legend()
        fig.tight_layout()
        return fig
    return draw


def main(argv=None) -> int:
    ap = base_parser(__doc__)
    ap.add_argument("--targets", nargs="+", default=["proxy", "smollm2"], help="proxy, smollm2 or GGUF paths")
    ap.add_argument("--threads", type=int, default=None, help="default: all usable cores")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=3, help="chat prompts per set (mt_bench, alpaca)")
    ap.add_argument("--profile", action="store_true", help="one cProfile pass per in-process method")
    ap.add_argument("--quick", action="store_true", help="smoke: 1 prompt per set, 16 tokens")
    ap.add_argument("--no-llama-bench", action="store_true", help="leave the llama-bench column out (no peers build)")
    ap.add_argument("--engine", type=int, nargs="*", default=[], metavar="N",
                    help="also the batching engine with N slots (no server) against llama-batched-bench")
    ap.add_argument("--engine-only", action="store_true", help="only the --engine measurement")
    ap.add_argument("--engine-rounds", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--name", default="costs-loop")
    ap.add_argument("--results-dir", default=None)
    args = ap.parse_args(argv)
    args.threads = args.threads or usable_cores()
    if args.quick:
        args.prompts, args.max_tokens = 1, 16
    peers = None if args.no_llama_bench else peers_dir()      # builds the peers once (bench/peers/build.sh)
    doc = {"run": run_info(args.threads), "engine": [], "targets": []}
    for t in args.targets:
        doc["engine"] += [measure_engine(t, k, args, peers) for k in args.engine]
    if not args.engine_only:
        doc["targets"] = [measure_target(t, args, peers) for t in args.targets]
    write_results(args.name, doc, md(doc), plot(doc) if doc["targets"] else plot_engine(doc["engine"]), out_dir=args.results_dir)
    print(md(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
