"""Deprecated alias (one release): this module moved to :mod:`moa_cpp.speculative.types`."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("moa_cpp.speculative.types")
