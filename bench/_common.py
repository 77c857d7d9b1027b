"""Helpers shared by the benchmark scripts (run as ``python bench/<script>.py``)."""
from __future__ import annotations

import subprocess
from pathlib import Path


def git_commit() -> str:
    """Short commit id of the checkout the benchmark runs from ("unknown" outside git)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
