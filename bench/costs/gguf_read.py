#!/usr/bin/env python
"""What reading a GGUF's metadata with gguf-py's GGUFReader costs (moa_cpp.remote.gguf_info: the
bundle id, `serve --bundle` start, `moa-cpp bundle`): once per file per process.

    python -m bench.costs gguf-read
"""
from __future__ import annotations

import argparse
import time

from moa_cpp.models import registry as models
from moa_cpp.models.defaults import DEFAULT_DRAFTER
from moa_cpp.remote.gguf_info import gguf_info


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    files = [("SmolLM2-135M Q4_1", models.smollm2_path), ("the shipped drafter", lambda: DEFAULT_DRAFTER),
             ("Gemma-3-270M Q4_K_M (262K vocab)", models.gemma3_270m_path)]
    for name, path in files:
        try:
            p = path()
        except models.ModelNotInstalledError as e:
            print(f"{name}: not installed ({e})")
            continue
        t = time.perf_counter()
        gguf_info(p)
        print(f"{name}: {time.perf_counter() - t:.2f} s")


if __name__ == "__main__":
    main()
