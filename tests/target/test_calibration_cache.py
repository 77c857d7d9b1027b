"""The one on-disk cache of per-target measurements (moa_cpp/target/calibration.py): T(k) and the
exact batch size under one fingerprint, in one file, safe under concurrent writers."""
from __future__ import annotations

import json
import multiprocessing as mp
from types import SimpleNamespace

from moa_cpp.target import calibration as calibration_cache


def _fake_target(tmp_path, name="m.gguf", threads=2):
    f = tmp_path / name
    if not f.exists():
        f.write_bytes(b"GGUF" + bytes(60))
    return SimpleNamespace(path=str(f), n_threads=threads, flash_attn=True, repack=True)


def test_both_tables_share_one_fingerprint_and_file(tmp_path, monkeypatch):
    monkeypatch.setenv("MOA_CPP_CACHE", str(tmp_path / "cache"))
    t = _fake_target(tmp_path)
    calibration_cache.store("verify_cost", t, {"1": 0.01, "2": 0.02})
    calibration_cache.store("exact_rows", t, {"exact_rows": 63, "max_rows": 63})
    calibration_cache.store("verify_cost", t, {"3": 0.03}, merge=True)
    data = json.loads((tmp_path / "cache" / "calibration.json").read_text())
    assert list(data) == [calibration_cache.fingerprint(t)]
    assert data[calibration_cache.fingerprint(t)] == {
        "verify_cost": {"1": 0.01, "2": 0.02, "3": 0.03}, "exact_rows": {"exact_rows": 63, "max_rows": 63}}
    calibration_cache.store("verify_cost", t, {"1": 0.5})            # replace, not merge
    assert calibration_cache.lookup("verify_cost", t) == {"1": 0.5}
    # another setting the measurements depend on is another entry
    other = _fake_target(tmp_path, threads=1)
    assert calibration_cache.fingerprint(other) != calibration_cache.fingerprint(t)
    assert calibration_cache.lookup("verify_cost", other) is None


def test_a_corrupt_cache_is_a_miss_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MOA_CPP_CACHE", str(tmp_path))
    (tmp_path / "calibration.json").write_text("{not json")
    t = _fake_target(tmp_path)
    assert calibration_cache.lookup("exact_rows", t) is None
    calibration_cache.store("exact_rows", t, {"exact_rows": 3})
    assert calibration_cache.lookup("exact_rows", t) == {"exact_rows": 3}


def _writer(args):
    cache, model_dir, i = args
    import os
    os.environ["MOA_CPP_CACHE"] = cache
    from pathlib import Path
    t = _fake_target(Path(model_dir), name=f"m{i}.gguf")
    for j in range(15):
        calibration_cache.store("verify_cost", t, {str(j): float(j)}, merge=True)


def test_concurrent_writers_lose_nothing(tmp_path, monkeypatch):
    """Read-modify-write under the lock: four processes merging into one file keep every entry
    (without the lock, interleaved writes drop some)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("MOA_CPP_CACHE", str(cache))
    with mp.get_context("spawn").Pool(4) as pool:
        pool.map(_writer, [(str(cache), str(tmp_path), i) for i in range(4)])
    data = json.loads((cache / "calibration.json").read_text())
    assert len(data) == 4
    assert all(len(row["verify_cost"]) == 15 for row in data.values())
