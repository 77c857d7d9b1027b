"""llama.cpp's own log lines, process-wide: shown (``--verbose``) or kept quiet, their recent
error lines kept for our error messages. Its own module: the target, the model store and the
remote client all set it, and none of them should import another for it."""
from __future__ import annotations

import collections
import ctypes

import llama_cpp


def set_llama_log(verbose: bool) -> None:
    """Let llama.cpp / ggml print their own log lines (model loading, quantizing: hundreds of
    lines) or keep them quiet (the default of the CLI without --verbose). Process-wide."""
    global _log_chosen
    from llama_cpp import _logger
    _logger.set_verbose(bool(verbose))
    # Quiet means silent: llama.cpp logs harmless lines at error level too (Gemma-3: "control-
    # looking token ... probably a bug in the model"); its recent error lines are kept and put
    # into our exception when a load fails (llama_errors()).
    llama_cpp.llama_log_set(_logger.llama_log_callback if verbose else _quiet_log, ctypes.c_void_p(0))
    _log_chosen = True


_recent_errors: "collections.deque[str]" = collections.deque(maxlen=8)


@llama_cpp.llama_log_callback
def _quiet_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if level == 3:  # GGML_LOG_LEVEL_ERROR
        _recent_errors.append(text.decode("utf-8", "replace").strip())


def llama_errors() -> str:
    """llama.cpp's latest error lines while quiet (for error messages), then forget them."""
    lines = [x for x in _recent_errors if x]
    _recent_errors.clear()
    return ("; llama.cpp said: " + " | ".join(lines)) if lines else ""


_log_chosen = False   # set_llama_log was called: Target.from_path(verbose=None) keeps that choice


def log_chosen() -> bool:
    """True once :func:`set_llama_log` was called (``Target.from_path(verbose=None)`` keeps it)."""
    return _log_chosen
