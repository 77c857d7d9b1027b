"""Bad input raises a clear Python exception and never aborts the process."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from moa_cpp.testing.helpers import rewrite_gguf
from moa_cpp.convert import convert
from moa_cpp.drafter.drafter import Drafter, DrafterModel
from moa_cpp.errors import (CacheFullError, FormatError, InvalidArgumentError, MismatchError, MoaError,
                            MoaIOError)


@pytest.fixture(scope="module")
def drafter_f32(fixture_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("err") / "drafter-f32.gguf"
    return convert(fixture_dir / "drafter_hf", out, outtype="f32", target_gguf=fixture_dir / "target-f32.gguf",
                   progress=False)


@pytest.fixture(scope="module")
def target_path(fixture_dir):
    return fixture_dir / "target-f32.gguf"


def test_missing_file(tmp_path, target_path):
    with pytest.raises(MoaIOError, match="not found"):
        DrafterModel(tmp_path / "nope.gguf", target_path)


@pytest.mark.parametrize("keep", [0, 10, 100, 4096, -1000])
def test_truncated_drafter(drafter_f32, target_path, tmp_path, keep):
    data = drafter_f32.read_bytes()
    bad = tmp_path / "trunc.gguf"
    bad.write_bytes(data[:keep] if keep >= 0 else data[:keep])
    with pytest.raises(FormatError, match="truncated|not a valid GGUF"):
        DrafterModel(bad, target_path)


def test_truncated_target(drafter_f32, target_path, tmp_path):
    bad = tmp_path / "target-trunc.gguf"
    bad.write_bytes(target_path.read_bytes()[:-4096])
    with pytest.raises(FormatError, match="truncated"):
        DrafterModel(drafter_f32, bad)


def test_garbage_file(tmp_path, target_path):
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(b"GGUF" + bytes(range(256)) * 10)
    with pytest.raises(FormatError):
        DrafterModel(bad, target_path)


def test_foreign_architecture(target_path):
    # a llama target GGUF passed as the drafter
    with pytest.raises(FormatError, match="architecture 'llama'"):
        DrafterModel(target_path, target_path)


def test_drafter_passed_as_target(drafter_f32):
    with pytest.raises(FormatError, match="not a target"):
        DrafterModel(drafter_f32, drafter_f32)


@pytest.mark.parametrize("key,value,match", [
    ("moa.vocab_size", 32000, "vocabulary"),
    ("moa.target.block_count", 7, "layer count"),
    ("moa.target.head_count_kv", 4, "KV heads|lsa.embedding_length"),
    ("moa.embedding_length", 128, "width|shape"),
])
def test_drafter_target_mismatch(drafter_f32, target_path, tmp_path, key, value, match):
    bad = rewrite_gguf(drafter_f32, tmp_path / "bad.gguf", kv={key: value})
    with pytest.raises((MismatchError, FormatError), match=match):
        DrafterModel(bad, target_path)


def test_head_dim_mismatch(drafter_f32, target_path, tmp_path):
    # consistent drafter (W = 2 * 4 * 8 = 64) for a target with head dim 8: mismatch, not format
    bad = rewrite_gguf(drafter_f32, tmp_path / "hd.gguf", kv={"moa.target.key_length": 8, "moa.target.head_count_kv": 4})
    with pytest.raises(MismatchError, match="head dim"):
        DrafterModel(bad, target_path)


def test_missing_tensor(drafter_f32, target_path, tmp_path):
    bad = rewrite_gguf(drafter_f32, tmp_path / "miss.gguf", drop_tensors=("ca.attn_k.weight",))
    with pytest.raises(FormatError, match="missing tensor 'ca.attn_k.weight'"):
        DrafterModel(bad, target_path)


def test_wrong_dtype(drafter_f32, target_path, tmp_path):
    bad = rewrite_gguf(drafter_f32, tmp_path / "dtype.gguf",
                       tensor_fn=lambda n, a: a.astype(np.float16) if n == "sa.attn_norm.weight" else a)
    with pytest.raises(FormatError, match="must be F32"):
        DrafterModel(bad, target_path)
    bad2 = rewrite_gguf(drafter_f32, tmp_path / "dtype2.gguf",
                        tensor_fn=lambda n, a: a.astype(np.int32) if n == "sa.attn_q.weight" else a)
    with pytest.raises(FormatError, match="unsupported type"):
        DrafterModel(bad2, target_path)


def test_unsupported_tli_and_layout(drafter_f32, target_path, tmp_path):
    bad = rewrite_gguf(drafter_f32, tmp_path / "layout.gguf", kv={"moa.lsa.input_layout": "llama_interleaved"})
    with pytest.raises(FormatError, match="input_layout"):
        DrafterModel(bad, target_path)


def test_unknown_device(drafter_f32, target_path):
    with pytest.raises(InvalidArgumentError, match="unknown device"):
        DrafterModel(drafter_f32, target_path, device="NoSuchGPU7")


def test_target_required(drafter_f32):
    with pytest.raises(InvalidArgumentError, match="target GGUF is required"):
        DrafterModel(drafter_f32, None)


def test_bad_calls_raise(drafter_f32, target_path, fixture_dir):
    g = np.load(fixture_dir / "golden.npz")
    d = Drafter(drafter_f32, target_path, n_ctx=32, n_draft_max=4)
    with pytest.raises(InvalidArgumentError, match="commit at least one"):
        d.draft([1], [0], [-1])
    with pytest.raises(InvalidArgumentError, match="shape"):
        d.commit(np.zeros((3, 5, 64), np.float32))
    with pytest.raises(InvalidArgumentError, match="pos0"):
        d.commit(g["lsa_in"], 3)
    with pytest.raises(CacheFullError, match="n_ctx"):
        d.commit(np.concatenate([g["lsa_in"]] * 3), 0)
    assert d.n_ca == 0
    d.commit(g["lsa_in"], 0)
    S = g["prompt_ids"].size
    with pytest.raises(InvalidArgumentError, match="out of range"):
        d.draft([10**6], [S], [-1])
    with pytest.raises(InvalidArgumentError, match="parent"):
        d.draft([5], [S], [3])
    d.draft([5], [S], [-1], feed=g["prompt_ids"])
    with pytest.raises(InvalidArgumentError, match="pending"):
        d.draft([6], [S + 1], [0], feed=[7])
    with pytest.raises(CacheFullError, match="n_draft_max"):
        d.draft([1, 2, 3, 4], [S + 1] * 4, [0, 0, 0, 0])
    # the state is still usable after every failure
    out = d.draft([6], [S + 1], [0])
    assert out.shape == (1, d.model.n_vocab) and np.isfinite(out).all()
    d.rollback(S)
    assert (d.n_ca, d.n_sa, d.n_drafts) == (S, S, 0)


# (argv, expected last line of stderr as a regex, whether argparse printed its usage first); "{tmp}" is
# tmp_path. The moa-cpp convention for bad input: exit status 2, one "moa-cpp COMMAND: error: ..."
# line on stderr (argparse's own errors add the usage above it), nothing on stdout, no traceback.
_CLI_BAD = [
    pytest.param(["convert", "{tmp}/missing", "-o", "{tmp}/o.gguf"],
                 re.escape("moa-cpp convert: error: source '{tmp}/missing': no such file or directory, "
                           "and not a hub repo id (org/name)"), False, id="convert-missing-source"),
    # the choices' quoting differs between Python versions
    pytest.param(["convert", "{tmp}", "-o", "{tmp}/o.gguf", "--outtype", "q3_x"],
                 re.escape("moa-cpp convert: error: argument --outtype: invalid choice: 'q3_x' (choose from ")
                 + r"'?f16'?, '?f32'?, '?q4_0'?, '?q8_0'?\)", True, id="convert-bad-outtype"),
    pytest.param(["check-parity", "{tmp}"],
                 re.escape("moa-cpp check-parity: error: {tmp}: missing 'golden.npz' (not a moa-ref fixture folder)"),
                 False, id="check-parity-not-a-fixture"),
    pytest.param(["frobnicate"],
                 re.escape("moa-cpp: error: argument COMMAND: invalid choice: 'frobnicate' (choose from ")
                 + r"'?generate'?, .*'?rpc-server'?\)", True, id="unknown-command"),
]


@pytest.mark.parametrize("argv,message,usage", _CLI_BAD)
def test_cli_bad_arguments(tmp_path, argv, message, usage):
    """Bad command lines end with exit status 2 and one clear error line, never a traceback."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    message = message.replace(re.escape("{tmp}"), re.escape(str(tmp_path)))
    p = subprocess.run([sys.executable, "-m", "moa_cpp.cli.main"] + argv, capture_output=True, text=True, timeout=120)
    out = f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    assert "Traceback (most recent call last)" not in p.stderr + p.stdout, out
    assert p.returncode == 2, out
    assert p.stdout == "", out
    lines = [ln for ln in p.stderr.splitlines() if not ln.startswith("INFO ")]   # log lines may precede it
    assert lines and re.fullmatch(message, lines[-1]), out
    if usage:
        assert lines[0].startswith("usage: moa-cpp"), out
    else:
        assert len(lines) == 1, out


def test_long_feed_is_chunked(drafter_f32, target_path, fixture_dir):
    """A context longer than the state's n_batch is fed in chunks (no 'too many rows')."""
    g = np.load(fixture_dir / "golden.npz")
    d = Drafter(drafter_f32, target_path, n_ctx=256, n_draft_max=8, n_batch=4)
    S = g["prompt_ids"].size
    d.commit(g["lsa_in"], 0)
    a = d.draft([int(g["root_token"])], [S], [-1], feed=g["prompt_ids"])
    assert d.n_sa == S
    ref = Drafter(drafter_f32, target_path, n_ctx=256, n_draft_max=8, n_batch=64)
    ref.commit(g["lsa_in"], 0)
    b = ref.draft([int(g["root_token"])], [S], [-1], feed=g["prompt_ids"])
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * np.abs(b).max())


# ---------------------------------------------------------------------- files that are not GGUF models

# kind -> (bytes of the file from a whole GGUF's bytes, what the error says is wrong: a regex)
_NOT_GGUF = {
    "text": (lambda whole: b"hello world\nthis is a text file\n",
             re.escape("not a GGUF file: it starts with b'hell' (a GGUF file with b'GGUF')")),
    "empty": (lambda whole: b"", re.escape("empty file (0 bytes), not a GGUF model")),
    "random": (lambda whole: b"\x00" + np.random.default_rng(0).bytes(4095),
               r"not a GGUF file: it starts with b'\\x00.*' \(a GGUF file with b'GGUF'\)"),
    "cut-at-1000": (lambda whole: whole[:1000],
                    r"truncated or corrupt GGUF file: its metadata \(key \d+ of \d+\) runs past the end of the "
                    r"file \(1000 bytes\)"),
    "cut-in-data": (lambda whole: whole[:-4096], r"truncated GGUF file: \d+ bytes, its tensor data needs \d+"),
}
_NUMPY_WORDS = re.compile(r"out of bounds|axis|mmap|reshape|dtype|buffer|GGUF magic invalid")


@pytest.fixture(scope="module")
def whole_gguf(fixture_dir):
    """A real GGUF's bytes to cut: the embedded drafter where this build has one (issue 41's
    example), else the fixture target."""
    from moa_cpp.models.defaults import DEFAULT_DRAFTER
    return (DEFAULT_DRAFTER if DEFAULT_DRAFTER.is_file() else fixture_dir / "target-f32.gguf").read_bytes()


def _not_gguf(tmp_path, whole: bytes, kind: str):
    make, reason = _NOT_GGUF[kind]
    bad = tmp_path / f"{kind}.gguf"
    bad.write_bytes(make(whole))
    return bad, reason


@pytest.mark.parametrize("kind", list(_NOT_GGUF))
def test_gguf_problem_says_what_is_wrong(tmp_path, whole_gguf, kind):
    from moa_cpp.format.check import gguf_problem
    bad, reason = _not_gguf(tmp_path, whole_gguf, kind)
    assert re.fullmatch(reason, gguf_problem(bad) or ""), gguf_problem(bad)


def test_gguf_problem_passes_whole_files(whole_gguf, target_path, drafter_f32, tmp_path):
    from moa_cpp.format.check import gguf_problem
    whole = tmp_path / "whole.gguf"
    whole.write_bytes(whole_gguf)
    assert [gguf_problem(p) for p in (whole, target_path, drafter_f32)] == [None, None, None]


# -d: the drafter, read (gguf-py) to tell an MoA drafter from a draft model; -m: the target;
# --draft-model: a small LLM, loaded by llama.cpp after the target
_FLAGS = {"-d": ("-m", "{target}", "-d", "{bad}"), "-m": ("-m", "{bad}"),
          "--draft-model": ("-m", "{target}", "--draft-model", "{bad}")}


@pytest.mark.parametrize("flag", list(_FLAGS))
@pytest.mark.parametrize("kind", list(_NOT_GGUF))
def test_cli_names_the_file_and_what_is_wrong(tmp_path, whole_gguf, target_path, flag, kind):
    """``moa-cpp generate`` with a model file that is not a whole GGUF: exit status 2, one line
    naming the file and what is wrong with it (not numpy's words from inside gguf-py), no traceback."""
    bad, reason = _not_gguf(tmp_path, whole_gguf, kind)
    argv = [a.format(target=target_path, bad=bad) for a in _FLAGS[flag]]
    p = subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", "generate", *argv, "-p", "hi", "-n", "1"],
                       capture_output=True, text=True, timeout=300)
    out = f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    assert "Traceback (most recent call last)" not in p.stderr + p.stdout, out
    assert p.returncode == 2 and p.stdout == "", out
    lines = [ln for ln in p.stderr.splitlines() if not ln.startswith("INFO ")]
    assert len(lines) == 1, out
    who = "drafter " if flag == "-d" else "llama\\.cpp could not load the model "
    assert re.fullmatch(f"moa-cpp generate: error: {who}{re.escape(str(bad))}: {reason}", lines[0]), out
    assert not _NUMPY_WORDS.search(lines[0]), out


@pytest.mark.parametrize("kind", list(_NOT_GGUF))
def test_python_api_refuses_a_file_that_is_not_gguf(tmp_path, whole_gguf, target_path, drafter_f32, kind):
    """The constructors raise FormatError naming the file (never a numpy error); where llama.cpp
    loads the file (a target, a draft model) the message says what is wrong with it."""
    from moa_cpp.generator import SpeculativeGenerator
    bad, reason = _not_gguf(tmp_path, whole_gguf, kind)
    for make in (lambda: Drafter(bad, target_path), lambda: Drafter(drafter_f32, bad),
                 lambda: SpeculativeGenerator.from_paths(target_path, bad)):
        with pytest.raises(FormatError, match=re.escape(str(bad))) as e:
            make()
        assert not _NUMPY_WORDS.search(str(e.value)), e.value
    for make in (lambda: SpeculativeGenerator.from_paths(bad, drafter_f32),
                 lambda: SpeculativeGenerator.from_paths(target_path, draft_model=bad)):
        with pytest.raises(FormatError) as e:
            make()
        assert re.fullmatch(f"llama\\.cpp could not load the model {re.escape(str(bad))}: {reason}", str(e.value))
