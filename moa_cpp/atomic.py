"""Atomic file writes: a file appears whole or not at all, however many processes and threads
write it at once (model assembly in parallel test workers, two servers calibrating the same
cache). Each writer writes to its own temporary name beside the destination (process id and
thread id in it) and renames it into place (``os.replace``); a failed write leaves nothing."""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable, Union

__all__ = ["temp_path", "write_atomic", "write_text_atomic"]

PathLike = Union[str, "os.PathLike[str]"]


def temp_path(dst: PathLike) -> Path:
    """This process and thread's temporary name beside ``dst`` (hidden, ends in ``.tmp``)."""
    d = Path(dst)
    return d.with_name(f".{d.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def write_atomic(dst: PathLike, write: Callable[[Path], object]) -> Path:
    """``write(tmp)`` to :func:`temp_path`, then rename it to ``dst`` (returned). The temporary
    file is removed if anything fails."""
    d = Path(dst)
    tmp = temp_path(d)
    try:
        write(tmp)
        os.replace(tmp, d)
    finally:
        tmp.unlink(missing_ok=True)
    return d


def write_text_atomic(dst: PathLike, text: str) -> Path:
    """:func:`write_atomic` of a text file (UTF-8)."""
    return write_atomic(dst, lambda tmp: tmp.write_text(text, encoding="utf-8"))
