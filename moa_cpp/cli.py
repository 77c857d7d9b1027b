"""``moa-cpp`` command line: generate, convert, check-parity."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional

from . import __version__
from .errors import MoaError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moa-cpp", description="Mixture-of-Attentions speculative decoding for llama.cpp")
    p.add_argument("--version", action="version", version=f"moa_cpp {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    from .convert import add_convert_arguments, run_convert
    c = sub.add_parser("convert", help="convert an HF MoA checkpoint (dir or hub repo id) to a drafter GGUF")
    add_convert_arguments(c)
    c.set_defaults(func=run_convert)

    from .cli_generate import add_generate_arguments, run_generate
    c = sub.add_parser("generate", help="generate with MoA speculative decoding (or plainly with --no-draft)")
    add_generate_arguments(c)
    c.set_defaults(func=run_generate)

    from .parity import add_parity_arguments, run_parity
    c = sub.add_parser("check-parity", help="check conversion + native drafter against a golden fixture folder")
    add_parity_arguments(c)
    c.set_defaults(func=run_parity)

    from .train.cli import add_train_arguments, run_train
    c = sub.add_parser("train", help="train a MoA drafter for a GGUF target (needs the 'train' extra: torch)")
    add_train_arguments(c)
    c.set_defaults(func=run_train)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except MoaError as e:
        print(f"moa-cpp {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as e:
        print(f"moa-cpp {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
