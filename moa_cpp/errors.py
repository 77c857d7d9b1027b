"""Exception classes, one per native ``moa_status`` code."""
from __future__ import annotations


class MoaError(RuntimeError):
    """Base class of every moa_cpp error. ``code`` is the native status (0 if Python-side)."""

    code = 0

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class InvalidArgumentError(MoaError, ValueError):
    code = -1


class MoaIOError(MoaError, OSError):
    code = -2


class FormatError(MoaError):
    """Not a valid MoA drafter / target GGUF (truncated, foreign architecture, bad metadata)."""

    code = -3


class MismatchError(MoaError):
    """Drafter and target disagree (vocabulary, layer count, heads, head dim, ...)."""

    code = -4


class MoaMemoryError(MoaError, MemoryError):
    code = -5


class BackendError(MoaError):
    code = -6


class InternalError(MoaError):
    code = -7


class CacheFullError(MoaError):
    code = -8


_BY_CODE = {c.code: c for c in (InvalidArgumentError, MoaIOError, FormatError, MismatchError,
                                 MoaMemoryError, BackendError, InternalError, CacheFullError)}


def error_for(code: int, message: str) -> MoaError:
    """The exception instance for a native status code."""
    return _BY_CODE.get(code, MoaError)(message, code)
