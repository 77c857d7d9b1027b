"""llama.cpp's command-line spellings that `moa-cpp generate` and `moa-cpp serve` share.

A llama.cpp user's command line should work as written, or fail with a message that names the
flag. What llama.cpp's flags mean here:

- ``-fa/--flash-attn [on|off|auto]``: flash attention (on by default: verification rows then
  match single-token decodes bit for bit; ``off`` works, its exact batch size is measured apart);
- ``-b/--batch-size``, ``-ub/--ubatch-size``: the target context's batch sizes;
- ``--mlock``, ``--no-mmap``: how the target's weights are held in memory;
- ``-ctk/--cache-type-k``, ``-ctv/--cache-type-v``: the KV cache type (one type for K and V here);
- ``--jinja``: accepted (the GGUF's Jinja chat template is what moa-cpp always renders);
  ``--chat-template NAME|JINJA``, ``--chat-template-file FILE``: another template;
- ``-ngld/--n-gpu-layers-draft N``: where the drafter runs (0: CPU; otherwise the GPU);
- ``--draft-p-min``: refused with a reason (the cost-aware policy sizes drafts).

llama.cpp never reads ``-ngld`` as ``-n gld``: :func:`refuse_glued_short_options` makes argparse
behave the same (a single-dash word that is not a known flag is an error naming it).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence

from moa_cpp.cli.values import positive
from moa_cpp.errors import InvalidArgumentError

CACHE_TYPES = ("f16", "f32", "q8_0")


def add_target_arguments(p, *, ctx_help: str = "context size (default 4096)",
                         threads_help: str = "CPU threads (default: all)", ngl_default: Optional[int] = None,
                         ngl_help: str = "target layers to offload to a GPU or rpc-servers (-1: all; default 0, "
                                         "all with --rpc)",
                         device_help: str = "drafter device: auto (first local GPU, else CPU), cpu, gpu, cuda, or "
                                            "a ggml device name such as CUDA0 (moa-cpp generate --list-devices)",
                         ctx: bool = True, rpc: bool = True) -> None:
    """``-c/--ctx-size``, ``-t/--threads``, ``-ngl/--n-gpu-layers``, ``--device`` and ``--rpc``: the
    flags that say where and how the target (and the drafter) run, written once for `generate`,
    `serve` and `train` (each passes the help its command needs; the spellings and types stay one)."""
    if ctx:
        p.add_argument("-c", "--ctx-size", "--n-ctx", dest="n_ctx", type=positive, default=4096, help=ctx_help)
    p.add_argument("-t", "--threads", type=positive, default=None, help=threads_help)
    p.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", dest="n_gpu_layers", type=int, default=ngl_default,
                   metavar="N", help=ngl_help)
    p.add_argument("--device", default="auto", help=device_help)
    if rpc:
        p.add_argument("--rpc", metavar="HOST:PORT,...",
                       help="llama.cpp rpc-servers holding the offloaded target layers (`moa-cpp rpc-server`; "
                            "no authentication: private networks only)")


def add_llama_arguments(p: argparse.ArgumentParser) -> None:
    h = p.add_argument_group("models from Hugging Face (llama.cpp's -hf; huggingface_hub's cache, HF_HUB_OFFLINE=1 "
                             "for the cache only)")
    h.add_argument("-hf", "--hf-repo", dest="hf_repo", metavar="USER/REPO[:QUANT]",
                   help="the target: the repo's .gguf whose name holds QUANT (default Q4_K_M, else its first .gguf)")
    h.add_argument("-hfd", "--hf-repo-draft", dest="hf_repo_draft", metavar="USER/REPO[:QUANT]",
                   help="the drafter the same way (an MoA drafter, or a plain LLM: a draft model, as -md)")
    g = p.add_argument_group("llama.cpp options")
    g.add_argument("-fa", "--flash-attn", nargs="?", const="on", default="on", choices=("on", "off", "auto"),
                   help="flash attention (default on; auto = on)")
    g.add_argument("-b", "--batch-size", dest="n_batch", type=positive, default=512, metavar="N",
                   help="target logical batch size (default 512, at least 64: verification batches hold up to 63 rows)")
    g.add_argument("-ub", "--ubatch-size", dest="n_ubatch", type=positive, default=None, metavar="N",
                   help="target physical batch size (default: --batch-size)")
    g.add_argument("--mlock", action="store_true", help="keep the target's weights in RAM (no swapping)")
    g.add_argument("--no-mmap", dest="use_mmap", action="store_false", help="read the target instead of mapping it")
    g.add_argument("-ctk", "--cache-type-k", dest="cache_type_k", choices=CACHE_TYPES, default=None,
                   help="KV cache type (moa-cpp uses one type for K and V; default f16)")
    g.add_argument("-ctv", "--cache-type-v", dest="cache_type_v", choices=CACHE_TYPES, default=None,
                   help="KV cache type for V (must equal -ctk when both are given)")
    g.add_argument("--jinja", action="store_true", help="accepted: the GGUF's Jinja chat template is always used")
    g.add_argument("--chat-template", metavar="NAME|JINJA", default=None,
                   help="chat template instead of the GGUF's: Jinja text, or a llama.cpp built-in name (chatml, "
                        "llama3, gemma, ...)")
    g.add_argument("--chat-template-file", metavar="FILE", default=None, help="a Jinja chat template file")
    g.add_argument("-ngld", "--n-gpu-layers-draft", "--gpu-layers-draft", dest="n_gpu_layers_draft", type=int,
                   default=None, metavar="N",
                   help="where the drafter runs: 0 = CPU, any other value = the GPU (the drafter is small: "
                        "all of it or none; same as --device cpu / gpu)")
    g.add_argument("--draft-p-min", type=float, default=None, metavar="P", help=argparse.SUPPRESS)


def target_options(args: argparse.Namespace) -> dict:
    """``Target.from_path`` keyword arguments from the llama.cpp flags."""
    if args.draft_p_min is not None:
        raise InvalidArgumentError("--draft-p-min is not supported by moa-cpp: the cost-aware default (auto) sizes "
                                   "each draft from measured acceptance and verify cost; use --draft-max N for a "
                                   "fixed chain")
    if args.n_batch < 64:
        raise InvalidArgumentError(f"-b/--batch-size {args.n_batch}: at least 64 (a verification batch holds up "
                                   "to 63 rows)")
    if args.n_ubatch is not None and args.n_ubatch > args.n_batch:
        raise InvalidArgumentError(f"-ub/--ubatch-size {args.n_ubatch} is larger than -b/--batch-size {args.n_batch}")
    k, v = args.cache_type_k, args.cache_type_v
    if k and v and k != v:
        raise InvalidArgumentError(f"-ctk {k} and -ctv {v}: moa-cpp keeps K and V in one type; give the same")
    return dict(n_batch=args.n_batch, n_ubatch=args.n_ubatch, use_mmap=args.use_mmap, use_mlock=args.mlock,
                cache_type=k or v or "f16", flash_attn=args.flash_attn != "off",
                chat_template=chat_template(args.chat_template, args.chat_template_file))


def chat_template(text: Optional[str], file: Optional[str]) -> Optional[str]:
    if text and file:
        raise InvalidArgumentError("give --chat-template or --chat-template-file, not both")
    if file:
        try:
            return Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidArgumentError(f"--chat-template-file {file}: {getattr(e, 'strerror', None) or e}") from None
    return text


def drafter_device(args: argparse.Namespace) -> str:
    """--device, or what -ngld says."""
    n = args.n_gpu_layers_draft
    if n is None:
        return args.device
    if args.device != "auto":
        raise InvalidArgumentError("give --device or -ngld/--n-gpu-layers-draft, not both")
    return "cpu" if n == 0 else "gpu"


def refuse_glued_short_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """argparse reads ``-ngld 99`` as ``-n gld`` and ``-cnv`` as ``-c nv``; llama.cpp never glues a
    value to a flag. A single-dash word that is not one of ``parser``'s flags is an error naming it
    (negative numbers and words with spaces or '=' are values, as argparse takes them)."""
    known = parser._option_string_actions
    for a in argv:
        if a == "--":
            return
        if len(a) > 2 and a[0] == "-" and a[1] != "-" and a not in known and " " not in a and "=" not in a:
            try:
                float(a)
                continue
            except ValueError:
                pass
            parser.error(f"unrecognized option {a!r} (moa-cpp reads llama.cpp's flags as llama.cpp does: a value "
                         f"never joins its flag; see --help for the ones it knows)")
