"""The GPU check's CPU-side parts (issue 13), so they work the day a GPU is lent: the packer's
trimming and staging under the device tool's 64 MiB per call, the staged arrival on the device
(parts filed away call by call, sha256-checked reassembly, the build started once), and
bench/gpu/check.py's whole measurement in its tiny CPU dry run."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from bench.gpu import pack as gpu_pack

ROOT = Path(__file__).resolve().parents[2]


def _tar(path: Path, members: dict) -> None:
    with tarfile.open(path, "w:gz") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def test_trim_keeps_what_a_cuda_build_reads(tmp_path):
    top = gpu_pack.SDIST
    keep = ["CMakeLists.txt", "pyproject.toml", "llama_cpp/__init__.py",
            "vendor/llama.cpp/CMakeLists.txt", "vendor/llama.cpp/src/llama.cpp",
            "vendor/llama.cpp/ggml/src/ggml.c", "vendor/llama.cpp/ggml/src/CMakeLists.txt",
            "vendor/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu", "vendor/llama.cpp/ggml/src/ggml-cpu/ops.cpp",
            "vendor/llama.cpp/ggml/src/ggml-rpc/ggml-rpc.cpp", "vendor/llama.cpp/vendor/miniaudio/miniaudio.h",
            "vendor/llama.cpp/tools/mtmd/CMakeLists.txt", "vendor/llama.cpp/common/common.cpp"]
    drop = [".git/objects/pack/x.pack", "docs/index.md", "vendor/llama.cpp/.git/HEAD",
            "vendor/llama.cpp/models/ggml-vocab-llama.gguf", "vendor/llama.cpp/docs/build.md",
            "vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp", "vendor/llama.cpp/ggml/src/ggml-metal/x.m",
            "vendor/llama.cpp/tools/server/server.cpp", "vendor/llama.cpp/tools/mtmd/test-3.mp4",
            "vendor/llama.cpp/tests/test-backend-ops.cpp", "vendor/llama.cpp/examples/simple/simple.cpp"]
    src = tmp_path / "sdist.tar.gz"
    _tar(src, {f"{top}/{m}": b"x" * 10 for m in keep + drop})
    info = gpu_pack.trim_sdist(src, tmp_path / "trim.tar.gz")
    with tarfile.open(tmp_path / "trim.tar.gz") as t:
        names = {m.name.split("/", 1)[1] for m in t}
    assert names == set(keep)
    assert info["kept"] == len(keep) and info["dropped"] == len(drop)


def test_stages_fit_the_budget_and_reassemble(tmp_path):
    files = {"llama-src.tar.gz": os.urandom(3000), "wheels/a.whl": os.urandom(500),
             "model.gguf": os.urandom(25_000), "fixture.tar": os.urandom(7000), "empty.json": b""}
    for name, data in files.items():
        (tmp_path / "in" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / name).write_bytes(data)
    budget = 10_000
    stages, man = gpu_pack.plan_stages([(n, tmp_path / "in" / n) for n in files], budget,
                                       first=["llama-src.tar.gz", "wheels/a.whl"])
    dirs = gpu_pack.write_stages(stages, man, tmp_path / ".gpu")
    assert len(dirs) == 4                                        # 35.5 kB in 10 kB stages
    for d in dirs:
        assert sum(f.stat().st_size for f in d.iterdir() if f.name != "manifest.json") <= budget
    assert (dirs[0] / "llama-src.tar.gz").is_file() and (dirs[0] / "wheels__a.whl").is_file()

    store = tmp_path / "store"
    (store / "parts").mkdir(parents=True)
    for i, d in enumerate(dirs):                                 # one device call per stage
        for f in d.iterdir():
            (store / "parts" / f.name).write_bytes(f.read_bytes())
        missing = gpu_pack.reassemble(store)
        if i == 0:
            assert "llama-src.tar.gz" not in missing and "model.gguf" in missing
    assert missing == []
    for name, data in files.items():
        assert (store / "files" / name).read_bytes() == data

    # a part damaged in transit is caught, not built on
    (store / "files" / "model.gguf").unlink()
    part = store / "parts" / man["files"]["model.gguf"]["parts"][1]
    part.write_bytes(b"\0" + part.read_bytes()[1:])
    with pytest.raises(SystemExit, match="model.gguf: sha256"):
        gpu_pack.reassemble(store)


def test_stage_one_must_hold_the_build_inputs(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 2000)
    with pytest.raises(ValueError, match="does not fit stage 1"):
        gpu_pack.plan_stages([("big", tmp_path / "big")], 1000, first=["big"])


def test_device_calls_without_a_gpu(tmp_path):
    """gpu_check.sh's staged flow on this machine: the first call files its parts and starts the
    build, a middle call waits, the last one finds the build failed (no nvidia-smi/nvcc here) and
    says so with the build log instead of running anything."""
    files = {"llama-src.tar.gz": b"not really a tarball", "wheels/x.whl": b"w", "m.gguf": os.urandom(5000),
             "fixture.tar": b"f", "eval_prompts.json": b"{}"}
    for name, data in files.items():
        (tmp_path / "in" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / name).write_bytes(data)
    stages, man = gpu_pack.plan_stages([(n, tmp_path / "in" / n) for n in files], 2500,
                                       first=["llama-src.tar.gz", "wheels/x.whl", "eval_prompts.json"])
    man["model"] = "m.gguf"
    dirs = gpu_pack.write_stages(stages, man, tmp_path / "all")
    assert len(dirs) == 3
    store = tmp_path / "store"
    outs = []
    for i, d in enumerate(dirs):
        call = tmp_path / f"call{i}"                             # what one call carries
        (call / d.name).mkdir(parents=True)
        for f in d.iterdir():
            (call / d.name / f.name).write_bytes(f.read_bytes())
        env = dict(os.environ, MOA_GPU_STORE=str(store), MOA_GPU_STAGES=str(call), OUT=str(tmp_path / "out"))
        outs.append(subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh")], cwd=ROOT, env=env,
                                   capture_output=True, text=True, timeout=120))
    assert outs[0].returncode == 0 and "build started" in outs[0].stdout, outs[0].stderr
    assert "waiting for the next stage" in outs[0].stdout
    assert outs[1].returncode == 0 and "build started" not in outs[1].stdout   # started once
    assert outs[2].returncode == 1 and "build failed" in outs[2].stderr, outs[2].stdout + outs[2].stderr
    assert (store / "files" / "m.gguf").read_bytes() == files["m.gguf"]


@pytest.mark.model
@pytest.mark.slow
def test_gpu_check_dry_run(tmp_path, fixture_dir):
    env = dict(os.environ, MOA_GPU_DRY_RUN="1", PYTHON=sys.executable)
    p = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), str(tmp_path / "o")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads((tmp_path / "o" / "gpu_check.json").read_text())
    assert doc["dry_run"] and doc["device"] == "cpu"
    assert doc["parity"]["cpu"]["ok"] and doc["parity"]["cpu"]["device"] == ["CPU"]
    for label in ("Q4_1", "Q8_0"):
        ll = doc["lossless"][label]
        for shape in ("chain:4", "tree:4,4,16"):
            # SmolLM2 Q4_1/Q8_0 batches are bit-exact on this CPU: every prompt identical
            assert ll["shapes"][shape]["identical"] == ll["prompts"] and not ll["shapes"][shape]["failures"]
        assert set(doc["verify_cost"][label]) == {"1", "2", "4"}
        sp = doc["speed"][label]
        assert {"llama.cpp", "plain", "moa chain:4", "moa tree:4,4,16", "oracle0.9 chain:4"} <= set(sp)
        assert sp["moa chain:4"]["drafter_ms_per_row"] > 0 and sp["oracle0.9 chain:4"]["tau"] > 1.5
    md = (tmp_path / "o" / "gpu_check.md").read_text()
    assert "Parity" in md and "Lossless" in md and "T(k)/T(1)" in md
