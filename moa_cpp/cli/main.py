"""``moa-cpp`` command line: generate, chat, convert, check-parity, train, serve, client, bundle, rpc-server."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional

import importlib

from moa_cpp import __version__
from moa_cpp.errors import MoaError

# name, module (imported lazily: torch only for `train`), help
SUBCOMMANDS = [
    ("generate", "moa_cpp.cli.generate", "generate with MoA speculative decoding (or plainly with --no-draft)"),
    ("chat", "moa_cpp.cli.chat", "interactive chat with the target's template (history, streaming, /exit)"),
    ("convert", "moa_cpp.convert", "convert an HF MoA checkpoint (dir or hub repo id) to a drafter GGUF"),
    ("check-parity", "moa_cpp.drafter.parity", "check conversion + native drafter against a golden fixture folder"),
    ("train", "moa_cpp.train.cli", "train a MoA drafter for a GGUF target (needs the 'train' extra: torch)"),
    ("serve", "moa_cpp.cli.serve", "OpenAI-compatible HTTP server with MoA speculation (needs the 'server' extra)"),
    ("client", "moa_cpp.cli.client", "client-server MoA: draft here, verify on a moa-cpp serve; survives disconnections"),
    ("bundle", "moa_cpp.cli.bundle", "client-server MoA: write the client bundle (drafter + embedding + tokenizer)"),
    ("rpc-server", "moa_cpp.cli.serve", "llama.cpp's RPC backend server: lend this machine to a split target (no auth!)"),
]
_ADD = {"generate": "add_generate_arguments", "chat": "add_chat_arguments", "convert": "add_convert_arguments",
        "check-parity": "add_parity_arguments", "train": "add_train_arguments",
        "serve": "add_serve_arguments", "rpc-server": "add_rpc_server_arguments", "client": "add_client_arguments",
        "bundle": "add_bundle_arguments"}
# `moa-cpp train eval|compare|curve|history` (moa_cpp.train.measure): measuring drafters
_TRAIN_MEASURES = ("eval", "compare", "curve", "history")
_RUN = {"generate": "run_generate", "chat": "run_chat", "convert": "run_convert", "check-parity": "run_parity", "train": "run_train",
        "serve": "run_serve", "rpc-server": "run_rpc_server", "client": "run_client",
        "bundle": "run_bundle"}


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """The whole parser; with ``command`` only that subcommand's module is imported (the others
    are listed by name and help), so a one-shot ``moa-cpp generate`` loads neither the converter
    nor gguf nor the web stack."""
    # allow_abbrev=False everywhere: `--api-key sk-...` must never be read as `--api-key-file` (and
    # printed in the error), and a later flag must not change what an old command line means
    p = argparse.ArgumentParser(prog="moa-cpp", description="Mixture-of-Attentions speculative decoding for llama.cpp",
                                allow_abbrev=False)
    p.add_argument("--version", action="version", version=f"moa_cpp {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p.subcommand_parsers = {}             # name -> its parser (llama.cpp-style flag checks)

    for name, module, help_text in SUBCOMMANDS:
        c = sub.add_parser(name, help=help_text, allow_abbrev=False)
        p.subcommand_parsers[name] = c
        if command is not None and name != command:
            continue
        mod = importlib.import_module(module)
        getattr(mod, _ADD[name])(c)
        c.set_defaults(func=getattr(mod, _RUN[name]))
    return p


def _command(argv: list) -> str:
    """The subcommand named in ``argv`` ("" if none: the parser then only prints help or an error)."""
    names = {n for n, _, _ in SUBCOMMANDS}
    return next((a for a in argv if a in names), "") if argv else ""


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"] and argv[1:2] and argv[1] in _TRAIN_MEASURES:   # moa-cpp train eval|compare|...
        return importlib.import_module("moa_cpp.train.measure").main(argv[1:])
    command = _command(argv)
    parser = build_parser(command)
    if command:
        from moa_cpp.cli.llama_flags import refuse_glued_short_options
        refuse_glued_short_options(parser.subcommand_parsers[command], argv[argv.index(command) + 1:])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.captureWarnings(True)   # e.g. "-ngl on a CPU-only build" as one log line, not a source excerpt
    if command == "generate" and getattr(args, "conversation", False):     # llama-cli -cnv: the chat
        args.func = importlib.import_module("moa_cpp.cli.chat").run_chat
    try:
        if getattr(args, "hf_repo", None) or getattr(args, "hf_repo_draft", None):
            from moa_cpp.models.hf import apply_hf_args
            apply_hf_args(args)
        return int(args.func(args) or 0)
    except MoaError as e:
        print(f"moa-cpp {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as e:
        print(f"moa-cpp {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
