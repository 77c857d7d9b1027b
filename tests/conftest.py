"""Shared pytest fixtures: locations of the golden fixtures and real models."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def fixture_dirs() -> list[Path]:
    """Every golden fixture folder (moa-ref-* layout) next to the repository, or MOA_FIXTURE_DIR."""
    env = os.environ.get("MOA_FIXTURE_DIR")
    if env:
        return [Path(p) for p in env.split(os.pathsep)]
    root = REPO.parent / "shared" / "fixtures"
    return sorted(p for p in root.glob("moa-ref-*") if (p / "golden.npz").is_file())


@pytest.fixture(scope="session")
def fixture_dir() -> Path:
    """The primary golden fixture (moa-ref-tiny)."""
    dirs = fixture_dirs()
    if not dirs:
        pytest.fail("no golden fixture found: expected ../shared/fixtures/moa-ref-*/ or MOA_FIXTURE_DIR")
    for d in dirs:
        if d.name == "moa-ref-tiny":
            return d
    return dirs[0]


@pytest.fixture(scope="session")
def work_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("moa")


@pytest.fixture(scope="session")
def qwen05b_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M (the `models` extra), assembled once; skips if absent."""
    from moa_cpp import models
    try:
        return models.qwen25_coder_05b_path()
    except models.ModelNotInstalledError as e:
        pytest.skip(str(e))
