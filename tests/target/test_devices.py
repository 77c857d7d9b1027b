"""Backend selection without a GPU (issue 13): what a CPU-only build says when a GPU is asked for,
and that -ngl / --device reach the target and the drafter. A CUDA machine runs bench/gpu_check.sh."""
from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

from moa_cpp.models import defaults, registry as models
from moa_cpp.target import devices
from moa_cpp.drafter.drafter import DrafterModel
from moa_cpp.errors import InvalidArgumentError
from moa_cpp.target.target import Target

GPU = bool(devices.local_gpus())
cpu_only = pytest.mark.skipif(GPU, reason="this build has a GPU: the CPU-only answers do not apply")


@pytest.fixture(scope="module")
def target_path():
    return str(models.smollm2_path())


def test_device_list_names_the_cpu():
    names = devices.list_devices()
    assert "CPU" in names
    assert set(devices.local_gpus()) <= set(names)
    assert "CPU" not in devices.local_gpus()
    text = devices.describe()
    assert "CPU" in text and "-ngl" in text


@cpu_only
@pytest.mark.parametrize("want", ["cuda", "gpu", "CUDA", "metal"])
def test_drafter_gpu_request_without_gpu_is_a_clear_error(target_path, want):
    with pytest.raises(InvalidArgumentError, match=r"no such GPU in this build.*devices: CPU.*MOA_CUDA=1"):
        DrafterModel(str(defaults.DEFAULT_DRAFTER), target_path, device=want, n_threads=1)


@cpu_only
def test_unknown_device_lists_the_choices(target_path):
    with pytest.raises(InvalidArgumentError, match=r"unknown device 'CUDA0' \(available: auto, cpu, gpu, CPU\)"):
        DrafterModel(str(defaults.DEFAULT_DRAFTER), target_path, device="CUDA0", n_threads=1)


@pytest.mark.parametrize("want", ["cpu", "CPU", "Cpu"])
def test_cpu_by_any_spelling(target_path, want):
    m = DrafterModel(str(defaults.DEFAULT_DRAFTER), target_path, device=want, n_threads=1)
    try:
        assert m.device == "CPU"
    finally:
        m.close()


def test_auto_picks_a_local_gpu_else_the_cpu(target_path):
    m = DrafterModel(str(defaults.DEFAULT_DRAFTER), target_path, device="auto", n_threads=1)
    try:
        assert m.device == (devices.local_gpus()[0] if GPU else "CPU")
    finally:
        m.close()


@cpu_only
def test_ngl_without_gpu_warns_and_runs_on_the_cpu(target_path):
    ids = [1, 504, 3458, 314, 260]
    with Target.from_path(target_path, n_ctx=128, n_threads=1) as t0:
        want = t0.decode(ids, capture=False)[-1].copy()
    devices._warned.clear()
    with pytest.warns(RuntimeWarning, match=r"n_gpu_layers=99: this llama-cpp-python build has no GPU backend"):
        t = Target.from_path(target_path, n_ctx=128, n_threads=1, n_gpu_layers=99)
    with t:
        assert t.n_gpu_layers == 99
        np.testing.assert_array_equal(t.decode(ids, capture=False)[-1], want)
    with warnings.catch_warnings():            # once per process, not per context
        warnings.simplefilter("error")
        Target.from_path(target_path, n_ctx=128, n_threads=1, n_gpu_layers=-1).close()


def test_ngl_and_device_reach_target_and_drafter(target_path):
    from moa_cpp.generator import SpeculativeGenerator
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        gen = SpeculativeGenerator.from_paths(target_path, str(defaults.DEFAULT_DRAFTER), n_ctx=256, n_threads=1,
                                              n_gpu_layers=-1, device="cpu", draft="chain:2")
    try:
        assert gen.target.n_gpu_layers == -1
        assert gen.proposer.state.model.device == "CPU"
        r = gen.generate("Hello", max_tokens=4, temperature=0.0)
        assert len(r.tokens) >= 1
    finally:
        gen.close()


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_cli_list_devices():
    r = _cli("generate", "--list-devices")
    assert r.returncode == 0, r.stderr
    assert "CPU" in r.stdout and "-ngl" in r.stdout


def test_cli_prompt_still_required():
    r = _cli("generate", "-n", "2")
    assert r.returncode == 2 and "-p/--prompt is required" in r.stderr


@cpu_only
def test_cli_gpu_drafter_without_gpu(target_path):
    r = _cli("generate", "-m", target_path, "-d", str(defaults.DEFAULT_DRAFTER), "--device", "cuda", "-p", "Hi",
             "-n", "2", "-t", "1")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no such GPU in this build" in r.stderr and "Traceback" not in r.stderr


@cpu_only
def test_cli_ngl_without_gpu_is_one_warning_line(target_path):
    r = _cli("generate", "-m", target_path, "--no-draft", "-ngl", "99", "-p", "Hi", "-n", "2", "-t", "1")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "n_gpu_layers=99" in ln]
    assert len(lines) == 1 and lines[0].startswith("WARNING"), r.stderr


@cpu_only
def test_check_parity_gpu_without_gpu(fixture_dir):
    r = _cli("check-parity", str(fixture_dir), "--device", "gpu", "--no-quantized", "--threads", "1")
    assert r.returncode == 2 and "no such GPU in this build" in r.stderr, r.stderr
