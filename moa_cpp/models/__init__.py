"""Models by name: the GGUF targets shipped as PyPI wheels and requantizing (``registry``), the
embedded default target + drafter and the drafters shipped in ``moa_cpp/data`` (``defaults``),
and ``-hf user/repo[:quant]`` names (``hf``).
"""
from __future__ import annotations


def __getattr__(name: str):
    # moa_cpp.models.<name> for the registry's functions (moa_cpp.models.smollm2_path(), ...)
    if name.startswith("__"):
        raise AttributeError(name)
    from moa_cpp.models import registry
    try:
        return getattr(registry, name)
    except AttributeError:
        raise AttributeError(name) from None
