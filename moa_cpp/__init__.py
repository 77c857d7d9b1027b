"""moa_cpp: Mixture-of-Attentions speculative decoding for llama.cpp GGUF models."""
from __future__ import annotations

__version__ = "0.1.0"

from moa_cpp.errors import (BackendError, CacheFullError, FormatError, InvalidArgumentError, MismatchError,  # noqa: F401
                     MoaError)


def __getattr__(name: str):
    # Lazy: importing the package (e.g. for `moa-cpp convert`) must not need the native library.
    if name in ("Drafter", "DrafterModel", "DrafterState"):
        from moa_cpp.drafter import drafter
        return getattr(drafter, name)
    if name in ("SpeculativeGenerator", "GenerationResult"):
        from moa_cpp import generator
        return getattr(generator, name)
    if name == "Target":
        from moa_cpp.target.target import Target
        return Target
    raise AttributeError(name)
