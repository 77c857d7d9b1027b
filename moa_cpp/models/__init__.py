"""Models by name: the GGUF targets shipped as PyPI wheels and requantizing (``registry``), the
embedded default target + drafter and the drafters shipped in ``moa_cpp/data`` (``defaults``),
and ``-hf user/repo[:quant]`` names (``hf``).
"""
from __future__ import annotations


import importlib


def __getattr__(name: str):
    # moa_cpp.models.<name> for the registry's functions (moa_cpp.models.smollm2_path(), ...).
    # Never for a submodule's name: ``from moa_cpp.models import registry`` asks this package for
    # it first, and must then import the submodule (a lookup here would recurse).
    if name.startswith("__") or name in ("registry", "defaults", "hf"):
        raise AttributeError(name)
    registry = importlib.import_module("moa_cpp.models.registry")
    try:
        return getattr(registry, name)
    except AttributeError:
        raise AttributeError(name) from None
