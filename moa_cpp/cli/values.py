"""argparse value types shared by the CLI commands and the server settings (clear messages for bad
numbers). Named for what they parse: command-line values (not ctypes' ``argtypes``)."""
from __future__ import annotations

import argparse


def int_in(lo: int, hi: "int | None" = None, what: str = "an integer"):
    """An argparse type: an int in [lo, hi] (hi None: no upper bound)."""
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
        return v
    return parse


positive = int_in(1, what="a positive integer")
non_negative = int_in(0, what="an integer >= 0")
port = int_in(0, 65535, what="a port number 0..65535 (0: pick a free one)")
