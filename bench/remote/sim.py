#!/usr/bin/env python
"""Client-server MoA latency simulation (docs/client-server.md#simulation), a live check through the
fault proxy, and disconnection runs.

Cycle model (per verify): ``C = t_draft(k) + t_http + RTT + 8·S_req/B + 8·S_resp/B + T_v(k+1) +
t_lsa(a+1) + t_append + t_client``: ``t_http`` is the per-request HTTP/msgpack/server-framework
time measured on loopback (request wall minus server decode), ``t_client`` the client's other
per-cycle Python time; both are measured, not fitted. Per token ``C/tau``, server calls per token
``1/tau``. The open costs ``RTT + T_pf + 8·S_open/B``.

Inputs: (a) a real loopback trace (``RemoteGenerator(on_call=...)``: SmolLM2 + the shipped drafter, a
few eval prompts) replayed cycle by cycle; (b) measured T(k) tables (SmolLM2 Q8_0, the
8B-shape curves: ``tk-synthetic-8b`` is 8 of 32 layers, scaled x4 here, and the full 8B Q4_K_M
table of docs/cost-curves.md) with per-depth acceptance from the trace or ``--oracle p``.

Baselines on the same inputs: per-token API ``N·(RTT+T(1))``; streaming API ``RTT + T_pf +
N·T(1)``; server-side speculation + streaming ``RTT + T_pf + N·C_local/tau``; single device
``T_pf + N·C_local/tau``. Break-even RTT: where client-server = streaming API.

    python -m bench.remote sim                 # trace + tables + grid (+ --live: proxy check)
    python -m bench.remote sim --live          # also run the real client through FaultProxy
    python -m bench.remote sim --outage        # disconnection runs (remote-outage.*) only

Writes bench/results/<machine-label>/remote-sim.{json,md,png} (remote-outage.* with --outage).
"""
from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

from bench.common import BENCH_DIR, EVAL_DIR, base_parser, eval_prompts, md_table, run_info, write_results
from bench.remote.bytes import start_server

RES = BENCH_DIR / "results" / "amd-epyc-2c"
RTTS = (5, 20, 50, 100)          # ms
BWS = (10, 50)                   # Mbit/s

# docs/cost-curves.md#intel-xeon-2-vcpus, Llama-3-8B shape Q4_K_M (32 layers, 128K vocab), ms
TK_8B_Q4KM = {1: 364, 2: 600, 3: 775, 4: 555, 5: 806, 6: 950, 7: 1106, 8: 1091, 12: 1442, 16: 1285}


def tk_interp(tk: dict, k: int) -> float:
    ks = sorted(tk)
    if k in tk:
        return tk[k]
    return float(np.interp(k, ks, [tk[x] for x in ks]))


# ---------------------------------------------------------------------------- trace collection

def traced_runs(url: str, model: str, drafter: str, prompts: list, max_tokens: int, draft: str,
                **gen_kw) -> list:
    """One traced generation per prompt: dicts with tokens, wall, trace."""
    from moa_cpp.remote.client import RemoteGenerator
    calls: list = []                  # one record per server call (RemoteGenerator's on_call)
    remote_gen = RemoteGenerator(url, drafter=drafter, target=model, draft=draft, ca_dtype="f16",
                                 on_call=calls.append, **gen_kw)
    out = []
    try:
        for p in prompts:
            ids = remote_gen.chat_prompt([{"role": "user", "content": p}])
            calls.clear()
            t = time.perf_counter()
            r = remote_gen.generate(ids, max_tokens=max_tokens)
            wall = time.perf_counter() - t
            out.append({"n_prompt": len(ids), "tokens": list(r.tokens), "wall": wall, "tau": r.stats.tau,
                        "trace": list(calls)})
    finally:
        remote_gen.close()
    return out


def local_baselines(model: str, drafter: str, prompts: list, max_tokens: int, draft: str) -> dict:
    """Single-device per-token times: plain greedy (T(1)) and local speculation (C_local/tau)."""
    from moa_cpp import SpeculativeGenerator
    res = {}
    for name, d, dp in (("plain", None, "none"), ("spec", drafter, draft)):
        g = SpeculativeGenerator.from_paths(model, d, draft=dp)
        g.generate("Hello", max_tokens=8)                     # warm-up
        tot, n, pf, refs = 0.0, 0, [], []
        for p in prompts:
            r = g.generate(p, chat=True, max_tokens=max_tokens)
            tot += r.stats.t_total
            n += r.stats.n_generated
            pf.append(r.stats.t_prefill)
            refs.append(list(r.tokens))
        g.close()
        res[name] = {"s_per_token": tot / max(1, n), "t_prefill_s": statistics.fmean(pf), "tokens": refs}
    return res


# ---------------------------------------------------------------------------- the cycle model

def trace_components(runs: list) -> dict:
    """Per-call components of a loopback trace (s, bytes)."""
    cyc, opens = [], []
    for run in runs:
        for c in run["trace"]:
            if c.get("kind") == "open":
                opens.append(c)
            elif c.get("kind") == "verify":
                cyc.append(c)
    http = [c["t_wall"] - c["decode_ms"] / 1000 for c in cyc]
    other = [c["t_cycle"] - c["t_draft"] - c["t_wall"] - c.get("t_append", 0.0) for c in cyc]
    k = [c["k"] for c in cyc]
    a = [c["a"] for c in cyc]
    kmax = max(k)
    reach = [sum(1 for x in a if x >= d) for d in range(kmax + 1)]
    p_depth = [reach[d] / reach[d - 1] if reach[d - 1] else 0.0 for d in range(1, kmax + 1)]
    ca = [c for c in cyc if c.get("ca_bytes")] + [c for c in opens if c.get("ca_bytes")]
    return {
        "cycles": len(cyc), "k_mean": statistics.fmean(k), "a_mean": statistics.fmean(a),
        "tau": statistics.fmean(a) + 1, "p_depth": p_depth,
        "t_http_s": statistics.median(http), "t_http_mean_s": statistics.fmean(http),
        "t_client_s": statistics.fmean(other),
        "t_row_s": sum(c["t_draft"] for c in cyc) / max(1, sum(k)),
        "t_append_s": statistics.fmean(c.get("t_append", 0.0) for c in cyc),
        "t_lsa_per_token_s": sum(c.get("lsa_ms", 0.0) for c in cyc) / 1000 / max(1, sum(x + 1 for x in a)),
        "decode_ms_mean": statistics.fmean(c["decode_ms"] for c in cyc),
        "req_bytes_mean": statistics.fmean(c["req_bytes"] for c in cyc),
        "resp_bytes_mean": statistics.fmean(c["resp_bytes"] for c in cyc),
        "resp_fixed_bytes": statistics.fmean(c["resp_bytes"] - c.get("ca_bytes", 0) for c in cyc),
        "ca_bytes_per_token": sum(c.get("ca_bytes", 0) for c in cyc) / max(1, sum(c.get("ca_n", 0) for c in cyc)),
        "zlib1_ratio": sum(c["ca_zlib1"] for c in ca) / max(1, sum(c["ca_bytes"] for c in ca)),
        "open_http_s": statistics.fmean(c["t_wall"] - c.get("prefill_ms", 0) / 1000 for c in opens),
        "open_prefill_s": statistics.fmean(c.get("prefill_ms", 0) / 1000 for c in opens),
        "open_resp_bytes": statistics.fmean(c["resp_bytes"] for c in opens),
        "open_req_bytes": statistics.fmean(c["req_bytes"] for c in opens),
        "n_prompt_mean": statistics.fmean(c["k"] for c in opens),
    }


def net_s(rtt_ms: float, bw_mbit: float, s_req: float, s_resp: float) -> float:
    return rtt_ms / 1000 + 8 * (s_req + s_resp) / (bw_mbit * 1e6)


def replay_wall(run: dict, comp: dict, rtt_ms: float, bw_mbit: float, measured_http: bool = False) -> float:
    """Predicted wall time of one traced run at (RTT, B): its measured client parts, the server's
    measured decode / prefill, the loopback per-request overhead, plus the network terms."""
    wall = 0.0
    for c in run["trace"]:
        kind = c.get("kind")
        net = net_s(rtt_ms, bw_mbit, c["req_bytes"], c["resp_bytes"])
        if kind == "open":
            wall += comp["open_http_s"] + c.get("prefill_ms", 0) / 1000 + net + c.get("t_append", 0.0)
        elif kind in ("verify", "resync"):
            http = c["t_wall"] - c["decode_ms"] / 1000 if measured_http else comp["t_http_s"]
            wall += (c["t_cycle"] - c["t_wall"]) + http + c["decode_ms"] / 1000 + net
    return wall


def trace_grid(runs: list, comp: dict, base: dict, n_tokens: int) -> list:
    """Client-server from the trace, per condition, normalised to N tokens at the trace's rates."""
    rows = []
    toks = sum(len(r["tokens"]) for r in runs)
    cycles = comp["cycles"]
    t1, c_loc = base["plain"]["s_per_token"], base["spec"]["s_per_token"]
    t_pf = base["plain"]["t_prefill_s"]
    bytes_tok = sum(c["req_bytes"] + c["resp_bytes"] for r in runs for c in r["trace"]) / toks
    for bw in BWS:
        w0 = sum(replay_wall(r, comp, 0, bw) for r in runs)      # at RTT 0
        for rtt in RTTS:
            w = sum(replay_wall(r, comp, rtt, bw) for r in runs)
            per_tok = w / toks
            wall_cs = per_tok * n_tokens   # open amortised at the trace's prompt:token ratio
            rows.append(_row("SmolLM2 Q4_1 loopback trace (chain:4)", rtt, bw, n_tokens, comp["tau"],
                             (cycles + len(runs)) / toks, bytes_tok, wall_cs, t1, t_pf, c_loc,
                             be=_break_even(w0 / toks, cycles / toks, t1)))
    return rows


def _break_even(cs0_per_tok: float, calls_per_tok: float, t1: float) -> float:
    """RTT (ms) where client-server = streaming API: per token, cs0 + R·calls = T(1) (+ R/N on
    both sides for the open, which cancels). Negative: client-server never wins."""
    return 1000 * (t1 - cs0_per_tok) / calls_per_tok


def _row(label, rtt, bw, n, tau, calls_tok, bytes_tok, wall_cs, t1, t_pf, c_loc, be, k=None) -> dict:
    r = rtt / 1000
    return {"input": label, "rtt_ms": rtt, "bw_mbit": bw, "N": n, "chain": k, "tau": tau,
            "calls_per_token": calls_tok, "bytes_per_token": bytes_tok,
            "wall_cs": wall_cs, "tok_s_cs": n / wall_cs,
            "wall_per_token_api": n * (r + t1), "wall_streaming": r + t_pf + n * t1,
            "wall_server_spec": r + t_pf + n * c_loc, "wall_single": t_pf + n * c_loc,
            "break_even_rtt_ms": be}


def table_grid(label: str, tk: dict, p_depth: list, t_row: float, t_lsa: float, w_ca: int, comp: dict,
               n_tokens: int, n_prompt: int, kmax: int) -> list:
    """The cycle model from a T(k) table (ms) with per-depth acceptance; best chain per condition."""
    t1 = tk[1] / 1000
    t_pf = n_prompt * tk_interp(tk, 16) / 16 / 1000
    rows = []
    for bw in BWS:
        for rtt in RTTS:
            best = None
            for k in range(1, min(kmax, len(p_depth)) + 1):
                reach = np.cumprod(p_depth[:k])
                tau = 1 + float(reach.sum())
                s_req = comp["req_bytes_mean"] + 6 * (k - comp["k_mean"])        # int32 id + int16 parent
                s_resp = comp["resp_fixed_bytes"] + tau * w_ca
                fixed = (k * t_row + comp["t_http_s"] + tk_interp(tk, k + 1) / 1000 + t_lsa * tau
                         + comp["t_append_s"] + comp["t_client_s"])
                c = fixed + net_s(rtt, bw, s_req, s_resp)
                s_open = comp["open_resp_bytes"] - comp["n_prompt_mean"] * comp["ca_bytes_per_token"] + n_prompt * w_ca
                wall = rtt / 1000 + t_pf + 8 * s_open / (bw * 1e6) + n_tokens * c / tau
                c_loc = (k * t_row + tk_interp(tk, k + 1) / 1000 + t_lsa * tau) / tau
                cs0 = (fixed + 8 * (s_req + s_resp) / (bw * 1e6)) / tau + 8 * s_open / (bw * 1e6) / n_tokens
                row = _row(label, rtt, bw, n_tokens, tau, 1 / tau, (s_req + s_resp) / tau, wall, t1, t_pf,
                           min(t1, c_loc), be=_break_even(cs0, 1 / tau, t1), k=k)
                if best is None or row["wall_cs"] < best["wall_cs"]:
                    best = row
            rows.append(best)
    return rows


# ---------------------------------------------------------------------------- live check

def live_check(url_host: str, url_port: int, model, drafter, prompts, max_tokens, draft, comp, conds) -> list:
    from moa_cpp.testing.fault_proxy import FaultProxy
    out = []
    for rtt, bw in conds:
        px = FaultProxy(url_host, url_port, latency_ms=rtt / 2, bandwidth_bps=bw * 1e6)
        try:
            runs = traced_runs(px.url, model, drafter, prompts, max_tokens, draft)
        finally:
            px.close()
        meas = sum(r["wall"] for r in runs)
        # (a) the same run's trace, its network time replaced by the model's
        pred_same = sum(replay_wall(r, comp, rtt, bw) + (r["wall"] - _sum_parts(r)) for r in runs)
        out.append({"rtt_ms": rtt, "bw_mbit": bw, "prompts": len(runs), "tokens": sum(len(r["tokens"]) for r in runs),
                    "measured_s": meas, "predicted_s": pred_same, "error": pred_same / meas - 1,
                    "runs": runs})
        print(f"live RTT {rtt} ms {bw} Mbit/s: measured {meas:.2f} s, predicted {pred_same:.2f} s "
              f"({100 * (pred_same / meas - 1):+.1f} %)", flush=True)
    return out


def _sum_parts(run: dict) -> float:
    """The part of a run's wall time the trace covers (open + cycles); the rest (events,
    detokenize, DELETE) is carried over as measured."""
    return sum(c["t_wall"] + c.get("t_append", 0.0) if c.get("kind") == "open" else c.get("t_cycle", c["t_wall"])
               for c in run["trace"])


# ---------------------------------------------------------------------------- disconnection runs

def outage_runs(host, port, model, drafter, prompts, refs, prompt_ids, max_tokens, durations, at, rtt,
                max_unverified) -> list:
    from moa_cpp.remote.client import RemoteGenerator
    from moa_cpp.testing.fault_proxy import FaultProxy
    rows = []
    for d in durations:
        for pi, (p, ref) in enumerate(zip(prompts, refs)):
            px = FaultProxy(host, port, latency_ms=rtt / 2)
            remote_gen = RemoteGenerator(px.url, drafter=drafter, target=model, draft="chain:4", ca_dtype="f16",
                                         max_unverified=max_unverified, resync_wait=max(60.0, 2 * d))
            log, box = [], {}

            def hook(ev, log=log, box=box, px=px, d=d):
                now = time.perf_counter()
                log.append((now, ev.kind, ev.pos, tuple(ev.ids), ev.verified, ev.n, ev.state))
                if "cut" not in box and ev.kind == "tokens" and ev.verified and ev.pos + len(ev.ids) >= at:
                    box["cut"] = now
                    box["n_verified"] = ev.pos + len(ev.ids)
                    px.refuse()
                    tm = threading.Timer(d, lambda: (px.restore(), box.__setitem__("restored", time.perf_counter())))
                    tm.daemon = True
                    tm.start()
            ids = remote_gen.chat_prompt([{"role": "user", "content": p}])
            t0 = time.perf_counter()
            r = remote_gen.generate(ids, max_tokens=max_tokens, on_event=hook)
            t_end = time.perf_counter()
            remote_gen.close()
            px.close()
            if "cut" not in box:
                print(f"outage D={d}: prompt {pi} ended before token {at}", flush=True)
                continue
            cut, nv = box["cut"], box["n_verified"]
            restored = box.get("restored", cut + d)
            # tokens shown (verified + unverified) per event, time since the cut
            shown = [(t - cut, len(i)) for (t, k, pos, i, v, n, s) in log if k == "tokens"]
            during = sum(n for (t, n) in shown if 0 < t <= restored - cut)
            unv = [(pos, i[0], t - cut) for (t, k, pos, i, v, n, s) in log if k == "tokens" and not v]
            reconn = [t - cut for (t, k, pos, i, v, n, s) in log if k == "status" and s == "reconnected"]
            match = [(pos - nv + 1, int(pos < len(ref) and tok == ref[pos])) for pos, tok, _ in unv]
            # prefix match: the d-th offline token and all before it equal plain greedy
            pref, ok = [], True
            for dist, m in match:
                ok = ok and bool(m)
                pref.append((dist, int(ok)))
            # llama-cpp-python prompt lookup continuing offline from the same verified context
            pld = pld_offline(prompt_ids[pi] + ref[:nv], max_unverified)
            pld_match = [(j + 1, int(nv + j < len(ref) and tok == ref[nv + j])) for j, tok in enumerate(pld)]
            st = r.stats
            rows.append({
                "D_s": d, "prompt": pi, "cut_at_token": nv, "tokens": len(r.tokens), "finish": r.finish_reason,
                "identical_to_plain": list(r.tokens) == list(ref[:len(r.tokens)]),
                "outage_s": restored - cut, "reconnected_after_s": reconn[0] if reconn else None,
                "first_offline_token_s": unv[0][2] if unv else None,
                "shown_during_outage": during, "shown_per_s_during_outage": during / max(1e-9, restored - cut),
                "unverified": st.unverified_tokens, "confirmed": st.unverified_confirmed,
                "rolled_back": st.unverified_rolled_back,
                "confirmed_fraction": st.unverified_confirmed / st.unverified_tokens if st.unverified_tokens else None,
                "capped": st.unverified_tokens >= max_unverified,
                "time_to_cap_s": (unv[-1][2] if unv and st.unverified_tokens >= max_unverified else None),
                "match": match, "prefix_match": pref, "pld_tokens": len(pld), "pld_match": pld_match,
                "wall_s": t_end - t0, "shown_timeline": shown,
            })
            print({k: v for k, v in rows[-1].items() if k not in ("match", "prefix_match", "pld_match",
                                                                    "shown_timeline")}, flush=True)
    return rows


def pld_offline(ctx: list, limit: int) -> list:
    """llama-cpp-python's prompt lookup (defaults: max_ngram_size 2, num_pred_tokens 10)
    continuing alone: its proposals are appended and looked up again, until it finds no match
    or ``limit`` tokens."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    pld = LlamaPromptLookupDecoding()
    ids = list(ctx)
    out: list = []
    while len(out) < limit:
        cand = pld(np.array(ids, dtype=np.intc))
        if cand.size == 0:
            break
        cand = [int(x) for x in cand[: limit - len(out)]]
        out += cand
        ids += cand
    return out


def bin_rate(pairs: list, edges=(1, 5, 9, 17, 33, 65, 129)) -> list:
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        xs = [m for dd, m in pairs if lo <= dd < hi]
        out.append({"dist": f"{lo}-{hi - 1}", "n": len(xs), "rate": (sum(xs) / len(xs)) if xs else None})
    return out


# ---------------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = base_parser(__doc__)
    ap.add_argument("--prompts", type=int, default=1, help="prompts per eval set for the trace (default 1)")
    ap.add_argument("--sets", nargs="+", default=None, help="eval sets (default: all six)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("-N", type=int, default=256, help="tokens per generation in the model (default 256)")
    ap.add_argument("--draft", default="chain:4")
    ap.add_argument("--oracle", type=float, nargs="*", default=[0.8], help="oracle acceptance per depth")
    ap.add_argument("--t-row-8b", type=float, default=20.0, help="8B client drafter ms per draft row (spec, inferred)")
    ap.add_argument("--t-lsa-8b", type=float, default=25.0, help="8B server LSA ms per token (spec, inferred)")
    ap.add_argument("--live", action="store_true", help="also run the live check through FaultProxy")
    ap.add_argument("--live-rtt", type=float, nargs="+", default=[20, 50])
    ap.add_argument("--live-bw", type=float, default=10)
    ap.add_argument("--live-prompts", type=int, default=3)
    ap.add_argument("--outage", action="store_true", help="disconnection runs only (remote-outage.*)")
    ap.add_argument("--outage-s", type=float, nargs="+", default=[1, 5, 30])
    ap.add_argument("--outage-at", type=int, default=32)
    ap.add_argument("--outage-prompts", type=int, default=2)
    ap.add_argument("--outage-rtt", type=float, default=20)
    ap.add_argument("--max-unverified", type=int, default=128)
    ap.add_argument("--data", default=str(EVAL_DIR))
    ap.add_argument("--results-dir", default=None)
    args = ap.parse_args(argv)

    from moa_cpp.models import defaults
    from urllib.parse import urlparse
    model = args.model or defaults.default_target()
    drafter = args.drafter or defaults.default_drafter()
    prompts = eval_prompts(Path(args.data), args.sets or None, args.prompts)
    t_start = time.perf_counter()
    if args.outage:
        return main_outage(args, model, drafter)

    print(f"{len(prompts)} prompts; local baselines ...", flush=True)
    base = local_baselines(model, drafter, prompts, args.max_tokens, args.draft)
    proc, url, cmd = start_server(model, drafter)
    u = urlparse(url)
    try:
        traced_runs(url, model, drafter, prompts[:1], 16, args.draft)            # warm-up
        runs = traced_runs(url, model, drafter, prompts, args.max_tokens, args.draft)
        comp = trace_components(runs)
        print("trace:", json.dumps({k: v for k, v in comp.items()}, default=float)[:900], flush=True)
        live = []
        if args.live:
            live = live_check(u.hostname, u.port, model, drafter, prompts[: args.live_prompts], args.max_tokens,
                              args.draft, comp, [(r, args.live_bw) for r in args.live_rtt])
    finally:
        proc.terminate()
        proc.wait(30)
    same = sum(r["tokens"] == ref[: len(r["tokens"])] for r, ref in zip(runs, base["plain"]["tokens"]))

    rows = trace_grid(runs, comp, base, args.N)
    p_trace = comp["p_depth"]
    tk_smol = {int(k): v for k, v in json.loads((RES / "costs-curves-tk-smollm2-q8_0-gemma3.json").read_text())["targets"][0]
               ["tk_ms"].items()}
    syn = json.loads((RES / "costs-curves-tk-synthetic-8b.json").read_text())["targets"][0]
    tk_syn = {int(k): 4 * v for k, v in syn["tk_ms"].items()}        # 8 of 32 layers -> x4
    n_prompt = int(round(comp["n_prompt_mean"]))
    accs = [("trace", p_trace, len(p_trace))] + [(f"oracle {p}", [p] * 8, 8) for p in args.oracle]
    smol_row, smol_lsa = comp["t_row_s"], comp["t_lsa_per_token_s"]
    for acc_label, pd, kmax in accs:
        rows += table_grid(f"T(k) SmolLM2 Q8_0, acc {acc_label}", tk_smol, pd, smol_row, smol_lsa, 768, comp,
                           args.N, n_prompt, kmax)
        rows += table_grid(f"T(k) 8B-shape Q4_K_M (tk-synthetic-8b x4), acc {acc_label}", tk_syn, pd,
                           args.t_row_8b / 1000, args.t_lsa_8b / 1000, 2048, comp, args.N, n_prompt, kmax)
        rows += table_grid(f"T(k) 8B-shape Q4_K_M (cpu-cost-curves), acc {acc_label}", TK_8B_Q4KM, pd,
                           args.t_row_8b / 1000, args.t_lsa_8b / 1000, 2048, comp, args.N, n_prompt, kmax)

    def f(x, d=1):
        return f"{x:.{d}f}"
    table = md_table(
        ["input", "RTT ms", "Mbit/s", "chain", "tau", "calls/tok", "B/tok", "client-server s", "tok/s",
         "per-token API s", "streaming API s", "server spec s", "single device s", "break-even RTT ms"],
        [[r["input"], r["rtt_ms"], r["bw_mbit"], r["chain"] or "4", f(r["tau"], 2), f(r["calls_per_token"], 3),
          f(r["bytes_per_token"], 0), f(r["wall_cs"], 2), f(r["tok_s_cs"], 1), f(r["wall_per_token_api"], 2),
          f(r["wall_streaming"], 2), f(r["wall_server_spec"], 2), f(r["wall_single"], 2),
          f(r["break_even_rtt_ms"], 0) if r["break_even_rtt_ms"] > 0 else "never"] for r in rows])
    be_rows = sorted({(r["input"], r["bw_mbit"]): r["break_even_rtt_ms"] for r in rows if r["rtt_ms"] == 20}.items())
    be_table = md_table(["input", "Mbit/s", "break-even RTT vs streaming API (ms, at the RTT-20 chain)"],
                        [[i, b, f(v, 0) if v > 0 else "never (client-server slower at RTT 0)"] for (i, b), v in be_rows])
    live_md = ""
    if live:
        live_md = ("\n\n## Live check (real client + server through FaultProxy, one-way latency RTT/2, "
                   f"{args.live_bw} Mbit/s each way; {args.live_prompts} prompts, {args.max_tokens} tokens)\n\n" +
                   md_table(["RTT ms", "Mbit/s", "tokens", "measured s", "predicted s (same run's trace)", "error"],
                            [[x["rtt_ms"], x["bw_mbit"], x["tokens"], f(x["measured_s"], 2), f(x["predicted_s"], 2),
                              f"{100 * x['error']:+.1f} %"] for x in live]))
    c = comp
    head = (
        f"{Path(model).name} + {Path(drafter).name}; trace: loopback `{' '.join(Path(x).name for x in cmd[2:])}`, "
        f"{len(prompts)} chat prompts (first turn, {args.prompts} per eval set), greedy, {args.max_tokens} tokens, "
        f"{args.draft}, f16 CA; verified output = single-device plain greedy (2 threads) in {same}/{len(runs)} "
        "(at long contexts greedy speculation equals 1-thread plain decoding: README, Lossless). N = {args.N}.\n\n"
        f"Trace: {c['cycles']} cycles, tau {c['tau']:.2f}, per-depth acceptance "
        f"{', '.join(f'{p:.2f}' for p in c['p_depth'])}; drafter {1000 * c['t_row_s']:.2f} ms/row; server decode "
        f"{c['decode_ms_mean']:.1f} ms/cycle of which LSA {1000 * c['t_lsa_per_token_s']:.2f} ms per verified token; "
        f"loopback HTTP+msgpack+framework overhead t_http {1000 * c['t_http_s']:.2f} ms/request (median); client "
        f"other {1000 * c['t_client_s']:.2f} ms/cycle, CA append {1000 * c['t_append_s']:.2f} ms; request "
        f"{c['req_bytes_mean']:.0f} B, response {c['resp_bytes_mean']:.0f} B (CA {c['ca_bytes_per_token']:.0f} "
        f"B/token); zlib-1 of the real CA payloads: {100 * c['zlib1_ratio']:.1f} % of raw "
        f"({'saves < 20 %: compression stays off' if c['zlib1_ratio'] > 0.8 else 'saves >= 20 %'}).\n\n"
        f"Local baselines (same machine, single process): plain greedy {1000 * base['plain']['s_per_token']:.2f} "
        f"ms/token (T(1)), local {args.draft} {1000 * base['spec']['s_per_token']:.2f} ms/token (C_local/tau), "
        f"prefill {1000 * base['plain']['t_prefill_s']:.1f} ms.\n\n"
        "T(k) rows: chain length chosen per condition (best client-server wall; its break-even). 8B rows: client "
        f"drafter {args.t_row_8b} ms/row and server LSA {args.t_lsa_8b} ms/token are the spec's inferred values "
        "(no 8B MoA drafter measured), per-request overhead and client Python time from the SmolLM2 trace, CA "
        "2048 B/token; `tk-synthetic-8b` measured 8 of the 32 layers (32K vocab), scaled x4. Server-side speculation "
        "and single device use the same drafter cost on the server (or plain decoding if that is faster). Per-token "
        "API = N·(RTT+T(1)); streaming = RTT+T_pf+N·T(1).\n\n## Break-even RTT\n\n" + be_table +
        "\n\n## Grid\n\n")

    def plot(plt):
        inputs = list(dict.fromkeys(r["input"] for r in rows))
        sel = [i for i in inputs if "oracle" not in i]
        fig, axes = plt.subplots(1, len(sel), figsize=(4.2 * len(sel), 3.6), squeeze=False)
        for ax, inp in zip(axes[0], sel):
            for bw, ls in zip(BWS, ("-", "--")):
                rr = [r for r in rows if r["input"] == inp and r["bw_mbit"] == bw]
                x = [r["rtt_ms"] for r in rr]
                ax.plot(x, [1000 * r["wall_cs"] / r["N"] for r in rr], "o" + ls, color="C0",
                        label=f"client-server {bw} Mbit/s")
                if bw == BWS[0]:
                    ax.plot(x, [1000 * r["wall_streaming"] / r["N"] for r in rr], "s-", color="C1", label="streaming API")
                    ax.plot(x, [1000 * r["wall_per_token_api"] / r["N"] for r in rr], "^-", color="C3",
                            label="per-token API")
                    ax.plot(x, [1000 * r["wall_server_spec"] / r["N"] for r in rr], "d-", color="C2",
                            label="server-side spec + stream")
                    ax.axhline(1000 * rr[0]["wall_single"] / rr[0]["N"], color="gray", ls=":", label="single device")
            ax.set_title(inp.replace(", acc", "\nacc"), fontsize=7)
            ax.set_xlabel("RTT ms")
            ax.set_ylabel("ms per token (N=%d)" % args.N)
        axes[0][0].legend(fontsize=6)
        fig.tight_layout()
        return fig
    doc = {"rows": rows, "trace_components": comp, "local": {k: {kk: vv for kk, vv in v.items() if kk != "tokens"}
                                                             for k, v in base.items()},
           "trace": [{k: v for k, v in r.items() if k != "tokens"} for r in runs],
           "live": [{k: v for k, v in x.items() if k != "runs"} for x in live],
           "live_traces": [[{k: v for k, v in r.items() if k != "tokens"} for r in x["runs"]] for x in live],
           "prompts": prompts, "settings": vars(args), "elapsed_s": time.perf_counter() - t_start}
    write_results("remote-sim", doc, head + table + live_md, plot, out_dir=args.results_dir, info=run_info(None))
    return 0


def main_outage(args, model, drafter) -> int:
    from urllib.parse import urlparse

    from moa_cpp import SpeculativeGenerator
    t_start = time.perf_counter()
    prompts = eval_prompts(Path(args.data), None, 1)[: args.outage_prompts]
    plain = SpeculativeGenerator.from_paths(model, None, draft="none")
    refs = [list(plain.generate(p, chat=True, max_tokens=args.max_tokens).tokens) for p in prompts]
    plain.close()
    proc, url, cmd = start_server(model, drafter)
    u = urlparse(url)
    try:
        from moa_cpp.remote.client import RemoteGenerator
        remote_gen = RemoteGenerator(url, drafter=drafter, target=model)
        prompt_ids = [remote_gen.chat_prompt([{"role": "user", "content": p}]) for p in prompts]
        remote_gen.generate(prompt_ids[0], max_tokens=8)                 # warm-up
        remote_gen.close()
        rows = outage_runs(u.hostname, u.port, model, drafter, prompts, refs, prompt_ids, args.max_tokens,
                           args.outage_s, args.outage_at, args.outage_rtt, args.max_unverified)
    finally:
        proc.terminate()
        proc.wait(30)

    def f(x, d=2):
        return "-" if x is None else f"{x:.{d}f}"
    t1 = md_table(["outage s", "prompt", "cut at token", "1st offline token after s", "reconnected after s",
                   "shown during outage",
                   "shown tok/s during outage", "unverified", "capped at max_unverified", "time to cap s",
                   "confirmed", "rolled back", "confirmed fraction", "output = plain greedy", "finish"],
                  [[r["D_s"], r["prompt"], r["cut_at_token"], f(r["first_offline_token_s"]),
                    f(r["reconnected_after_s"]), r["shown_during_outage"],
                    f(r["shown_per_s_during_outage"], 1), r["unverified"], r["capped"], f(r["time_to_cap_s"]),
                    r["confirmed"], r["rolled_back"], f(r["confirmed_fraction"]), r["identical_to_plain"], r["finish"]]
                   for r in rows])
    allm = [x for r in rows for x in r["match"]]
    allp = [x for r in rows for x in r["prefix_match"]]
    pldm = [x for r in rows if r["D_s"] == args.outage_s[0] for x in r["pld_match"]]
    pldp = []
    for r in rows:
        if r["D_s"] != args.outage_s[0]:
            continue
        ok = True
        for dd, m in r["pld_match"]:
            ok = ok and bool(m)
            pldp.append((dd, int(ok)))
    bm, bp, bl, blp = bin_rate(allm), bin_rate(allp), bin_rate(pldm), bin_rate(pldp)
    t2 = md_table(["distance from last server update (tokens)", "MoA offline n", "MoA match rate",
                   "MoA prefix-match rate", "PLD offline n", "PLD match rate", "PLD prefix-match rate"],
                  [[a["dist"], a["n"], f(a["rate"]), f(b["rate"]), c["n"], f(c["rate"]), f(d["rate"])]
                   for a, b, c, d in zip(bm, bp, bl, blp)])
    pld_n = [r["pld_tokens"] for r in rows if r["D_s"] == args.outage_s[0]]
    head = (f"{Path(model).name} + {Path(drafter).name}: real client + server (loopback) through FaultProxy "
            f"(RTT {args.outage_rtt} ms, no bandwidth cap), {len(prompts)} chat prompts, greedy, chain:4, "
            f"{args.max_tokens} tokens. When token {args.outage_at} is shown verified, the client's event hook calls "
            "`proxy.refuse()` (connections reset, new ones refused: ECONNREFUSED) and a timer calls `restore()` after "
            f"D s. max_unverified = {args.max_unverified}; resync_wait = max(60, 2D) s. A plain (streaming or "
            "per-token) API shows 0 tokens during the outage.\n\n"
            "Match: offline token at generated index i equals plain greedy's token i (position-aligned); prefix "
            "match: it and every offline token before it do (i.e. the target would confirm it). PLD: llama-cpp-python "
            "0.3.36 `LlamaPromptLookupDecoding()` (max_ngram_size 2, num_pred_tokens 10) continuing alone from the "
            "same verified context, its proposals appended and looked up again until no n-gram match or "
            f"{args.max_unverified} tokens; offline PLD tokens per prompt: {pld_n}.\n\n")
    tail = "\n\n## Match rate vs distance from the last server update\n\n" + t2

    def plot(plt):
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
        ax = axes[0]
        for j, d in enumerate(args.outage_s):
            rr = [r for r in rows if r["D_s"] == d][:1]
            for r in rr:
                tl = sorted(r["shown_timeline"])
                xs = [t for t, _ in tl]
                ys = np.cumsum([n for _, n in tl])
                ax.step(xs, ys, where="post", color=f"C{j}", label=f"MoA client-server, outage {d:g} s")
                ax.axvspan(0, r["outage_s"], color=f"C{j}", alpha=0.08)
        ax.set_xlabel("s since the server became unreachable (token %d)" % args.outage_at)
        ax.set_ylabel("tokens shown (verified + unverified)")
        ax.set_xlim(-1, max(args.outage_s) + 5)
        ax.legend(fontsize=7)
        ax = axes[1]
        mids = [a["dist"] for a in bm]
        ax.plot(mids, [a["rate"] if a["rate"] is not None else np.nan for a in bm], "o-", label="MoA offline: match")
        ax.plot(mids, [a["rate"] if a["rate"] is not None else np.nan for a in bp], "o--", label="MoA: prefix match")
        ax.plot(mids, [a["rate"] if a["rate"] is not None else np.nan for a in bl], "s-", label="PLD offline: match")
        ax.plot(mids, [a["rate"] if a["rate"] is not None else np.nan for a in blp], "s--", label="PLD: prefix match")
        ax.set_xlabel("distance from the last server update (tokens)")
        ax.set_ylabel("rate vs plain greedy")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=7)
        fig.tight_layout()
        return fig
    doc = {"rows": rows, "match_bins": {"moa": bm, "moa_prefix": bp, "pld": bl, "pld_prefix": blp},
           "prompts": prompts, "settings": vars(args), "elapsed_s": time.perf_counter() - t_start}
    write_results("remote-outage", doc, head + t1 + tail, plot, out_dir=args.results_dir, info=run_info(None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
