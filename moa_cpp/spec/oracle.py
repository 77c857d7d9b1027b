"""Deprecated alias (one release): this module moved to :mod:`moa_cpp.testing.oracle`."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("moa_cpp.testing.oracle")
