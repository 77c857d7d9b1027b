#!/usr/bin/env python3
"""Convert a Hugging Face MoA checkpoint to a MoA drafter GGUF (thin wrapper of moa_cpp.convert).

Usage: convert_moa_to_gguf.py SRC -o OUT.gguf [--outtype f32|f16|q8_0|q4_0]
       [--target-gguf T.gguf] [--target-layers N] [--tli N] [--revision R]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Run from a source checkout without installing: the package lives one level up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from moa_cpp.convert import add_convert_arguments, run_convert  # noqa: E402
from moa_cpp.errors import MoaError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and convert; bad input is one error line and exit status 2 (argparse's)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    add_convert_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_convert(args)
    except MoaError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
