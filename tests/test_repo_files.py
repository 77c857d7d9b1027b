"""What git tracks stays small: no file over 1 MB outside ``moa_cpp/data/`` (the shipped drafters
and the latest checkpoint of a lineage still being trained, ``moa_cpp/data/lineage/``, kept out of
the wheel). Candidate drafters of earlier training rounds are rebuilt from their recorded commands,
never committed: a clone stays small, and a submission's size limit is not spent on them."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIMIT = 1 << 20


def _tracked() -> list:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [f for f in out.decode().split("\0") if f]


def test_no_large_file_outside_the_package_data():
    big = [(f, (REPO / f).stat().st_size) for f in _tracked()
           if (REPO / f).is_file() and not f.startswith("moa_cpp/data/") and (REPO / f).stat().st_size > LIMIT]
    assert not big, f"tracked files over 1 MB outside moa_cpp/data/: {big}"


def test_the_check_sees_large_files(tmp_path):
    """The walk is not blind: the shipped drafters (in moa_cpp/data/) are over the limit."""
    data = [f for f in _tracked() if f.startswith("moa_cpp/data/") and f.endswith(".gguf")]
    assert data and all((REPO / f).stat().st_size > LIMIT for f in data)
