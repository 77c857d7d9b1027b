"""-hf / -hfd (moa_cpp/models/hf.py): GGUFs named as llama.cpp users name them, resolved through a
Hugging Face cache that the test builds (offline: no network here), with llama.cpp's choice of file."""
from __future__ import annotations

import json
import shutil

import pytest

from moa_cpp.cli import main as cli
from moa_cpp.models import defaults, registry as models
from moa_cpp.errors import InvalidArgumentError, MoaIOError
from moa_cpp.models.hf import parse_spec, pick_file, resolve_hf

REV = "0123456789abcdef0123456789abcdef01234567"


def _repo(cache, repo: str, files: dict) -> None:
    """A repo in huggingface_hub's cache layout: refs/main -> snapshots/REV/<files>."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(REV)
    snap = root / "snapshots" / REV
    snap.mkdir(parents=True)
    for name, src in files.items():
        shutil.copyfile(src, snap / name)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hf") / "hub"
    _repo(cache, "testorg/SmolLM2-GGUF", {"SmolLM2-135M-Instruct-Q4_1.gguf": models.smollm2_path(),
                                           "SmolLM2-135M-Instruct-Q8_0.gguf": models.smollm2_q8_0_path(),
                                           "mmproj-SmolLM2-f16.gguf": models.smollm2_q8_0_path()})
    _repo(cache, "testorg/SmolLM2-MoA", {"moa-smollm2-135m-instruct.gguf": defaults.default_drafter()})
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_CACHE", str(cache))
    mp.setenv("HF_HUB_OFFLINE", "1")
    yield cache
    mp.undo()


def test_parse_and_pick_follow_llama_cpp():
    assert parse_spec("bartowski/SmolLM2-GGUF:q8_0") == ("bartowski/SmolLM2-GGUF", "q8_0")
    assert parse_spec("a/b") == ("a/b", None)
    for bad in ("nouser", "a/b:c:d", "a b/c", ""):
        with pytest.raises(InvalidArgumentError, match="user/repo"):
            parse_spec(bad)
    files = ["m-Q8_0.gguf", "m-Q4_K_M.gguf", "mmproj-m-Q4_K_M.gguf", "README.md"]
    assert pick_file(files, None, "r") == ["m-Q4_K_M.gguf"]            # default Q4_K_M, never mmproj
    assert pick_file(files, "q8_0", "r") == ["m-Q8_0.gguf"]            # case-insensitive tag
    assert pick_file(["b.gguf", "a.gguf"], None, "r") == ["a.gguf"]    # no Q4_K_M: the first by name
    split = ["Q4_K_M/m-Q4_K_M-00002-of-00002.gguf", "Q4_K_M/m-Q4_K_M-00001-of-00002.gguf", "m-Q8_0.gguf"]
    assert pick_file(split, "Q4_K_M", "r") == ["Q4_K_M/m-Q4_K_M-00001-of-00002.gguf",
                                                "Q4_K_M/m-Q4_K_M-00002-of-00002.gguf"]
    with pytest.raises(MoaIOError, match="no .gguf file with 'Q6_K'.*m-Q8_0.gguf"):
        pick_file(files, "Q6_K", "r")
    with pytest.raises(MoaIOError, match="no .gguf file"):
        pick_file(["README.md"], None, "r")


def test_resolves_from_the_cache_offline(hub):
    p = resolve_hf("testorg/SmolLM2-GGUF:Q8_0")
    assert p.endswith("SmolLM2-135M-Instruct-Q8_0.gguf") and REV in p
    assert resolve_hf("testorg/SmolLM2-MoA").endswith("moa-smollm2-135m-instruct.gguf")
    with pytest.raises(MoaIOError, match="not in the Hugging Face cache.*HF_HUB_OFFLINE"):
        resolve_hf("testorg/not-cached:Q4_1")
    with pytest.raises(MoaIOError, match="not in the Hugging Face cache"):
        resolve_hf("testorg/SmolLM2-GGUF:Q6_K")           # cached repo, quant not there, offline


def _json(capsys, argv) -> dict:
    assert cli.main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_with_hf_equals_the_files(hub, capsys):
    """`generate -hf ... -hfd ...` runs the cached files: the same text and drafting as -m/-d."""
    common = ["generate", "-p", "The capital of France is", "-n", "12", "--json", "-t", "2"]
    by_path = _json(capsys, common + ["-m", str(models.smollm2_path()), "-d", defaults.default_drafter(),
                                      "--chain", "3"])
    by_hf = _json(capsys, common + ["-hf", "testorg/SmolLM2-GGUF:Q4_1", "-hfd", "testorg/SmolLM2-MoA",
                                    "--chain", "3"])
    assert by_hf["text"] == by_path["text"] and by_hf["stats"]["drafted"] == by_path["stats"]["drafted"] > 0


def test_hf_errors_are_clear(hub, capsys):
    assert cli.main(["generate", "-hf", "testorg/not-cached", "-p", "x", "-n", "1"]) == 2
    assert "not in the Hugging Face cache" in capsys.readouterr().err
    assert cli.main(["generate", "-hf", "testorg/SmolLM2-GGUF:Q4_1", "-m", "x.gguf", "-p", "x", "-n", "1"]) == 2
    assert "either -m or -hf" in capsys.readouterr().err


def test_serve_settings_take_hf(hub):
    from moa_cpp.models.hf import apply_hf_args
    from moa_cpp.server.settings import settings_from_args
    args = cli.build_parser("serve").parse_args(["serve", "-hf", "testorg/SmolLM2-GGUF:Q4_1"])
    apply_hf_args(args)
    assert settings_from_args(args).model.endswith("SmolLM2-135M-Instruct-Q4_1.gguf")


def test_train_takes_hf_as_its_target(hub):
    from moa_cpp.models.hf import apply_hf_args
    args = cli.build_parser("train").parse_args(["train", "-hf", "testorg/SmolLM2-GGUF:Q4_1", "--out", "x"])
    apply_hf_args(args)
    assert args.target.endswith("SmolLM2-135M-Instruct-Q4_1.gguf")
