"""Shared pytest fixtures: locations of the golden fixtures and real models."""
from __future__ import annotations

import os
from collections import Counter
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
    from moa_cpp.models import registry as models
    try:
        return models.qwen25_coder_05b_path()
    except models.ModelNotInstalledError as e:
        pytest.skip(str(e))


# --- parallel runs (pytest-xdist: ``scripts/test.sh`` passes ``-n <cores> --dist loadfile``) -------
# Each worker gets its own share of the cores (worker i: every n-th core), so the threads that
# llama.cpp, torch and the servers a test starts default to that share (``default_threads`` reads
# the affinity, as do OpenMP and child processes) instead of two workers' thread pools spinning
# against each other on the same cores. A test that asks for 2 threads still gets 2 (on its
# share): thread-count-dependent paths (split-KV attention) stay covered. ``loadfile``: a module's
# models and servers are built once, on one worker.


def pytest_configure(config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    n = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or n < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= n:
        os.sched_setaffinity(0, cpus[int(worker[2:]) % n::n])


def pytest_collection_modifyitems(config, items) -> None:
    """On a worker, the modules with the most ``slow`` tests come first: workers take modules in
    collection order (with ``--no-loadscope-reorder``), and a long module taken last would leave
    the other workers idle at the end."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    module = lambda item: item.nodeid.split("::")[0]
    slow = Counter({module(item): 0 for item in items})
    slow.update(module(item) for item in items if item.get_closest_marker("slow"))
    order = {m: n for n, m in enumerate(sorted(slow, key=lambda m: -slow[m]))}   # stable: ties keep file order
    items.sort(key=lambda item: order[module(item)])
