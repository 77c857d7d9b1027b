"""``moa-cpp generate``: speculative (or plain) generation from the command line."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from moa_cpp.cli.values import positive as _positive
from moa_cpp.cli.llama_flags import add_llama_arguments, add_target_arguments, drafter_device, target_options
from moa_cpp.models.defaults import add_spec_arguments
from moa_cpp.errors import InvalidArgumentError


def _tree(s: str) -> str:
    parts = s.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"--tree expects DEPTH,TOPK,TOTAL (positive integers), got {s!r}")
    return "tree:" + ",".join(p.strip() for p in parts)


def _logit_bias(s: str) -> tuple:
    """llama.cpp's ``--logit-bias TOKEN_ID(+/-)BIAS``."""
    import re
    m = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(inf|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)\s*", s)
    if not m:
        raise argparse.ArgumentTypeError(f"--logit-bias expects TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1), got {s!r}")
    return int(m.group(1)), float(m.group(2) + m.group(3))


def add_generate_arguments(p: argparse.ArgumentParser) -> None:
    # llama.cpp's spellings (-m, -md, -n, -c, -t, -ngl, --draft-max) work alongside the long names
    p.add_argument("-m", "--model", help="target GGUF (default: the embedded default target)")
    p.add_argument("-d", "-md", "--drafter", "--model-draft", dest="drafter",
                   help="MoA drafter GGUF, or the name of a shipped one (smollm2-135m-instruct, gemma-3-270m: "
                        "README's model table; default: the embedded default drafter); a plain LLM GGUF given "
                        "here drafts as a draft model (same as --draft-model)")
    p.add_argument("--draft-model", metavar="GGUF",
                   help="classic draft-model speculation: a small LLM with the target's tokenizer drafts")
    add_spec_arguments(p)
    p.add_argument("-p", "--prompt", help="prompt text (this or -f is required)")
    p.add_argument("-f", "--file", metavar="FILE", help="read the prompt from FILE (llama.cpp's -f)")
    p.add_argument("--chat", action="store_true", help="apply the target GGUF's chat template")
    p.add_argument("-sys", "--system-prompt", dest="system_prompt", metavar="TEXT",
                   help="a system message (implies --chat)")
    p.add_argument("-cnv", "--conversation", action="store_true",
                   help="interactive chat (as `moa-cpp chat`): -sys is the system prompt, -p/-f the first message")
    p.add_argument("-no-cnv", "--no-conversation", action="store_true",
                   help="accepted (one-shot generation is what generate does)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--chain", "--draft-max", "--spec-draft-n-max", dest="chain", type=_positive, metavar="N",
                   help="draft a chain of N tokens per cycle (default: cost-aware, 0..8 chosen every cycle)")
    g.add_argument("--tree", type=_tree, metavar="DEPTH,TOPK,TOTAL", help="EAGLE-2 dynamic tree (paper: 6,8,62)")
    g.add_argument("--no-draft", action="store_true", help="plain decoding through the same loop (baseline)")
    p.add_argument("--temp", type=float, default=0.0, help="temperature (0 = greedy, lossless; default 0)")
    p.add_argument("--top-k", type=int, default=0, help="top-k (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p (1 = off)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed")
    p.add_argument("--min-p", type=float, default=0.0, help="min-p (0 = off)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="repeat penalty (1 = off; greedy sees it too)")
    p.add_argument("--repeat-last-n", type=int, default=64, help="generated tokens the penalties look at (default 64)")
    p.add_argument("--presence-penalty", type=float, default=0.0, help="presence penalty (0 = off)")
    p.add_argument("--frequency-penalty", type=float, default=0.0, help="frequency penalty (0 = off)")
    p.add_argument("-l", "--logit-bias", action="append", default=[], metavar="ID(+|-)BIAS", type=_logit_bias,
                   help="add BIAS to token ID's logit, e.g. 15043+1 or 15043-inf (repeatable)")
    p.add_argument("--grammar", metavar="GBNF", help="constrain the output with a llama.cpp GBNF grammar")
    p.add_argument("--grammar-file", metavar="FILE", help="read the GBNF grammar from FILE")
    p.add_argument("-j", "--json-schema", metavar="SCHEMA",
                   help="constrain the output to JSON following this schema (JSON text; {} = any JSON object)")
    p.add_argument("-n", "--n-predict", "--max-tokens", dest="max_tokens", type=_positive, default=256,
                   help="max new tokens (default 256)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="never stop at an end-of-generation token: run to -n or the end of the context")
    add_target_arguments(p)
    p.add_argument("--list-devices", action="store_true",
                   help="print the devices this build can use (and whether -ngl can offload) and exit")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.add_argument("--verbose", dest="llama_verbose", action="store_true", help="show llama.cpp's own log lines")
    add_llama_arguments(p)


def _resolve_models(args: argparse.Namespace) -> tuple:
    """(target, MoA drafter or None, draft model or None, speculative types, draft setting)."""
    from moa_cpp.models.defaults import resolve_models, resolve_spec_type
    from moa_cpp.speculative.draft_setting import DEFAULT_DRAFT
    target, drafter, draft_model = resolve_models(args.model, args.drafter, args.draft_model, args.no_draft)
    kinds = resolve_spec_type(args.spec_type, drafter, draft_model, args.no_draft)
    if not kinds:
        return target, None, None, (), "none"
    if args.tree and "draft" in kinds and len(kinds) == 1:
        raise InvalidArgumentError("--tree: a draft model drafts chains only (--chain N or the cost-aware default)")
    draft = args.tree or (f"chain:{args.chain}" if args.chain else DEFAULT_DRAFT)
    # a model nobody drafts with is not loaded
    return (target, drafter if "moa" in kinds else None, draft_model if "draft" in kinds else None, kinds,
            draft)


def _by_source(by_source: dict) -> str:
    """", accepted moa 12/30, ngram 8/9" (accepted / proposed drafts per proposer), or ""."""
    parts = [f"{k} {v['accepted']}/{v['proposed']}" for k, v in by_source.items() if v["proposed"]]
    return ", accepted " + ", ".join(parts) if parts else ""


def _prompt(args: argparse.Namespace) -> tuple:
    """(prompt: text or chat messages, chat) from -p / -f / -sys / --chat."""
    if args.prompt is not None and args.file:
        raise InvalidArgumentError("give -p/--prompt or -f/--file, not both")
    text = args.prompt
    if args.file:
        try:
            text = open(args.file, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidArgumentError(f"-f/--file {args.file}: {getattr(e, 'strerror', None) or e}") from None
    if text is None:
        raise InvalidArgumentError("-p/--prompt is required (or -f/--file)")
    if args.system_prompt is None:
        return text, args.chat
    return [{"role": "system", "content": args.system_prompt}, {"role": "user", "content": text}], True


def _grammar(args: argparse.Namespace):
    """The GBNF text of --grammar / --grammar-file / --json-schema (at most one), or None."""
    from moa_cpp.structured import StructuredOutputError, grammar_for_json_schema, grammar_text

    given = [n for n in ("grammar", "grammar_file", "json_schema") if getattr(args, n) is not None]
    if len(given) > 1:
        raise InvalidArgumentError("give one of --grammar, --grammar-file and -j/--json-schema")
    try:
        if args.grammar_file is not None:
            try:
                return grammar_text(open(args.grammar_file, encoding="utf-8").read())
            except (OSError, UnicodeDecodeError) as e:
                raise InvalidArgumentError(f"--grammar-file {args.grammar_file}: "
                                           f"{getattr(e, 'strerror', None) or e}") from None
        if args.json_schema is not None:
            return grammar_for_json_schema(args.json_schema, "-j/--json-schema")
        return grammar_text(args.grammar)
    except StructuredOutputError as e:
        raise InvalidArgumentError(str(e)) from None


def check_sampling_args(args: argparse.Namespace) -> None:
    if args.temp < 0 or not (0 < args.top_p <= 1) or args.top_k < 0:
        raise InvalidArgumentError("--temp must be >= 0, --top-p in (0, 1], --top-k >= 0")


def build_generator(args: argparse.Namespace, grammar: Optional[str] = None):
    """(generator, draft spec) from generate's / chat's model and speculation flags; a --grammar
    that llama.cpp cannot parse is refused here, before any output."""
    from moa_cpp.models.defaults import ngram_settings
    from moa_cpp.generator import SpeculativeGenerator
    from moa_cpp.target.rpc import parse_endpoints

    ngram = ngram_settings(args.ngram_n_min, args.ngram_n_max)
    opts = target_options(args)
    target, drafter, draft_model, kinds, draft = _resolve_models(args)
    rpc = parse_endpoints(args.rpc) if args.rpc else None
    ngl = args.n_gpu_layers if args.n_gpu_layers is not None else (-1 if rpc else 0)
    gen = SpeculativeGenerator.from_paths(target, drafter, n_ctx=args.n_ctx, n_threads=args.threads,
                                          n_gpu_layers=ngl, device=drafter_device(args), draft=draft,
                                          draft_model=draft_model, rpc=rpc, spec_type=kinds,
                                          ngram=ngram, draft_min=args.draft_min, target_options=opts)
    if grammar is not None:
        from moa_cpp.speculative.grammar import Grammar
        try:
            Grammar.compile(gen.target, grammar).close()
        except ValueError as e:
            gen.close()
            raise InvalidArgumentError(str(e)) from None
    prefill_shape(gen)
    return gen, draft


def prefill_shape(gen) -> None:
    """Decide the prompt cache's prefill chunk now (moa_cpp/speculative/prefix_cache.py), saying
    so when that measures the target's exact batch size first (once per model and machine)."""
    prefix = gen.loop.prefix
    if prefix.measures_first():
        print("[measuring this target's exact batch size once (cached for later runs)...]", file=sys.stderr,
              flush=True)
    from moa_cpp.target.omp_pool import run_in_passing_thread
    run_in_passing_thread(prefix.shape)     # its OpenMP pool ends with it (moa_cpp/target/omp_pool.py)


def sampling_kwargs(args: argparse.Namespace, grammar: Optional[str]) -> dict:
    """``SpeculativeGenerator.stream`` keywords of the sampling flags."""
    return dict(max_tokens=args.max_tokens, temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                seed=args.seed, stop=args.stop, ignore_eos=args.ignore_eos, min_p=args.min_p,
                repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
                presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                logit_bias=dict(args.logit_bias), grammar=grammar)


def stats_line(st) -> str:
    cached = f" ({st.n_cached} cached)" if st.n_cached else ""
    return (f"[{st.n_generated} tokens, prompt {st.n_prompt}{cached}, {st.target_calls} target calls, "
            f"tau {st.tau:.2f}, {st.tokens_per_s:.1f} tok/s{_by_source(st.by_source)}; {st.decision}]")


def calibrate_after(gen) -> None:
    if gen.needs_calibration():
        # after the output: the user's request is answered; the next run uses the measurement
        print("[measuring this target's verify cost once (cached for later runs)...]", file=sys.stderr, flush=True)
        gen.calibrate()


def run_generate(args: argparse.Namespace) -> int:
    from moa_cpp.target.llama_log import set_llama_log

    check_sampling_args(args)
    set_llama_log(bool(args.llama_verbose or getattr(args, "verbose", False)))
    if args.list_devices:
        from moa_cpp.target.devices import describe
        print(describe())
        return 0
    if args.conversation:       # cli.main runs `generate -cnv` as `chat`
        raise InvalidArgumentError("-cnv/--conversation: run `moa-cpp chat`")
    prompt, chat = _prompt(args)
    grammar = _grammar(args)
    gen, draft = build_generator(args, grammar)
    kw = dict(sampling_kwargs(args, grammar), chat=chat)
    if args.json:
        r = gen.generate(prompt, **kw)
        st = r.stats
        print(json.dumps({"text": r.text, "tokens": r.tokens, "n_tokens": len(r.tokens),
                          "target_calls": st.target_calls, "tau": st.tau, "tokens_per_s": st.tokens_per_s,
                          "finish_reason": r.finish_reason, "draft": draft, "spec_type": gen.spec_type,
                          "by_source": st.by_source, "decision": st.decision, "stats": st.to_dict()}), flush=True)
    else:
        stats = None
        for piece in gen.stream_steps(prompt, **kw):
            sys.stdout.write(piece.text)
            sys.stdout.flush()
            stats = piece.stats or stats
        sys.stdout.write("\n")
        sys.stdout.flush()
        if stats is not None:
            print(stats_line(stats), file=sys.stderr, flush=True)
    calibrate_after(gen)
    gen.close()
    return 0
