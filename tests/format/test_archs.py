"""Every architecture moa_cpp claims, checked against ``transformers`` (docs/architectures.md).

For each row of :data:`moa_cpp.testing.tiny_archs.SPECS`: a tiny random checkpoint made with the
architecture's own ``transformers`` config class, converted by llama.cpp's own
``convert_hf_to_gguf.py`` (F32) and loaded by llama.cpp. Then:

- the K/V the native capture takes from a prompt's decode equal ``transformers``' KV cache for
  the same tokens, in the layout the drafter reads (K post-RoPE, in rotate-half order: llama.cpp's
  NORM-rope rows un-permuted), within ``KV_ATOL`` (F32 both sides);
- ``moa-cpp train`` runs a few steps on llama.cpp's own features and writes a drafter that loads;
- greedy speculation with that drafter (a chain and a tree) gives plain decoding's tokens.

The files are made once per content hash (``tiny_archs.build``) in the moa_cpp cache.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moa_cpp.format import arch as arch_table
from moa_cpp.format.llama_archs import RS_ROLLBACK
from moa_cpp.testing import tiny_archs
from moa_cpp.testing.arch_check import KV_ATOL, kv_errors, tolerance

pytestmark = pytest.mark.archs

ARCHS = [s.arch for s in tiny_archs.SPECS if not s.refused]
REFUSED = [s.arch for s in tiny_archs.SPECS if s.refused]
GEN_TOKENS = 16


@pytest.fixture(scope="module")
def built() -> dict:
    why = tiny_archs.converter_available()
    if why:
        pytest.fail(why)   # scripts/setup.sh extracts it: a missing converter is a setup bug
    return tiny_archs.build(ARCHS + REFUSED)


def _files(built: dict, arch: str) -> dict:
    entry = built[arch]
    if "error" in entry:
        pytest.fail(f"{arch}: the tiny checkpoint did not convert: {entry['error']}\n{entry.get('trace', '')}")
    return entry


@pytest.mark.parametrize("arch", ARCHS)
def test_capture_equals_transformers(built: dict, arch: str) -> None:
    err = kv_errors(_files(built, arch))
    assert err["scale"] > 0.1, err          # a real signal, not zeros on both sides
    assert err["first_layer"] < KV_ATOL, (arch, err)
    tol = tolerance(arch, err)
    assert err["k"] < tol and err["v"] < tol, (arch, err)


@pytest.mark.parametrize("arch", ARCHS)
def test_train_and_speculate(built: dict, arch: str, tmp_path: Path) -> None:
    from moa_cpp.cli.main import main
    from moa_cpp.drafter.drafter import DrafterModel
    from moa_cpp.speculative.loop import SpeculativeLoop
    from moa_cpp.speculative.proposers import MoAProposer, make_proposer
    from moa_cpp.speculative.types import DraftConfig, SamplingParams
    from moa_cpp.target.target import Target

    entry = _files(built, arch)
    out = tmp_path / "run"
    code = main(["train", "--target", str(entry["gguf"]), "--out", str(out), "--steps", "2", "--n-samples", "0",
                 "--fixed-answers", "4", "--feature-source", "llama", "--sa-ffn", "64", "--ca-ffn", "64",
                 "--lsa-ffn", "32", "--optimizer", "adamw", "--threads", "2"])
    assert code == 0 and (out / "drafter.gguf").is_file()

    def run(loop, ids, cfg):
        toks = []
        for ev in loop.run(ids, GEN_TOKENS, SamplingParams(), cfg):
            toks += ev.tokens
        return toks

    with Target.from_path(entry["gguf"], n_ctx=256) as tgt:
        if tgt.hybrid:
            # the drafter reads the attention layers only
            assert 0 < tgt.n_layer < tgt.n_layer_model
        drafter = DrafterModel(str(out / "drafter.gguf"), str(entry["gguf"]))
        if arch_table.speculation_refusal(arch, tgt.recurrent, tgt.hybrid, tgt.rollback_limit):
            # a hybrid whose recurrent state llama.cpp does not snapshot: trained on, drafts refused
            assert arch in NO_RS_HYBRIDS and tgt.rollback_limit == 0
            cfg = DraftConfig("chain", chain=3)
            assert make_proposer(("moa",), tgt, cfg, drafter=drafter, n_ctx=256, n_draft_max=32) is None
            return
        plain = SpeculativeLoop(tgt, None, DraftConfig("none"))
        for seed in (1, 2):
            ids = [int(t) for t in np.random.default_rng(seed).integers(3, tiny_archs.VOCAB, size=12)]
            ref = run(plain, ids, None)
            assert ref, "plain decoding wrote nothing"
            # (a hybrid target verifies a tree's main path: its recurrent state follows one sequence)
            for cfg in (DraftConfig("chain", chain=3), DraftConfig("tree", depth=3, topk=2, total=6)):
                proposer = make_proposer(("moa",), tgt, cfg, drafter=drafter, n_ctx=256, n_draft_max=32)
                assert isinstance(proposer, MoAProposer)
                loop = SpeculativeLoop(tgt, proposer, cfg)
                assert run(loop, ids, cfg) == ref, (arch, cfg)


_HYBRIDS = [s.arch for s in tiny_archs.SPECS if not s.refused and arch_table.llama_kind(s.arch)[0] == "hybrid"]
HYBRIDS = [a for a in _HYBRIDS if a in RS_ROLLBACK]          # llama.cpp snapshots their recurrent state
NO_RS_HYBRIDS = [a for a in _HYBRIDS if a not in RS_ROLLBACK]


@pytest.mark.parametrize("arch", HYBRIDS)
def test_hybrid_rollback_is_exact(built: dict, arch: str) -> None:
    """A hybrid target's recurrent state rolls back exactly after every partly rejected draft:
    drafts that are right for a few tokens, then wrong (an oracle that knows plain decoding's
    answer plants the errors), give plain decoding's tokens, chains longer than the recurrent
    state's snapshots are cut to them, and no cycle falls back on replaying the prompt."""
    from moa_cpp.speculative.loop import SpeculativeLoop
    from moa_cpp.speculative.types import DraftConfig, SamplingParams
    from moa_cpp.target.target import Target
    from moa_cpp.testing.oracle import OracleProposer

    entry = _files(built, arch)
    with Target.from_path(entry["gguf"], n_ctx=256) as tgt:
        assert tgt.hybrid and not tgt.holds_trees and tgt.n_seq_max == 1
        assert tgt.rollback_limit == (8 if arch in RS_ROLLBACK else 0)
        ids = [int(t) for t in np.random.default_rng(3).integers(3, tiny_archs.VOCAB, size=16)]
        n = 48

        def run(loop, sp, cfg):
            toks, stats = [], None
            for ev in loop.run(ids, n, sp, cfg):
                toks += ev.tokens
                stats = ev.stats
            return toks, stats

        for sp in (SamplingParams(ignore_eos=True), SamplingParams(temperature=0.8, seed=5, ignore_eos=True)):
            ref, _ = run(SpeculativeLoop(tgt, None, DraftConfig("none")), sp, None)
            assert len(ref) == n
            for cfg in (DraftConfig("chain", chain=4), DraftConfig("chain", chain=12),
                        DraftConfig("tree", depth=4, topk=2, total=8)):
                oracle = OracleProposer(ref, len(ids), 0.7, tgt.n_vocab, cfg, seed=11)
                loop = SpeculativeLoop(tgt, oracle, cfg)
                assert loop.batch_rows(cfg) <= tgt.rollback_limit + 1
                replays = tgt.n_replays                   # after the (cached) exactness measurement
                got, st = run(loop, sp, cfg)
                assert got == ref, (arch, cfg, sp)
                assert tgt.n_replays == replays, "a cycle replayed the prompt instead of rolling back"
                # runs of several accepted drafts, and rejected drafts (each one a rollback)
                accepted = [a - 1 for a in st.accept_lengths]
                assert max(accepted) >= 2 and st.drafted > sum(accepted), (st.drafted, accepted)


@pytest.mark.parametrize("arch", HYBRIDS)
def test_hybrid_batched_slots_refuse_speculation(built: dict, arch: str, caplog) -> None:
    """Continuous-batching slots of a hybrid target do not plan around the recurrent state's one
    rollback per decode: the one factory refuses drafts for them, in one line, and they decode."""
    from moa_cpp.speculative.proposers import make_proposer
    from moa_cpp.speculative.types import DraftConfig
    from moa_cpp.target.target import Target
    from moa_cpp.target.slots import BatchEngine

    entry = _files(built, arch)
    with Target.from_path(entry["gguf"], n_ctx=256, n_seq_max=2, kv_unified=False) as tgt:
        assert tgt.n_seq_max == 2 and tgt.rollback_limit == 8       # a state per stream, snapshots kept
        slot = BatchEngine(tgt, 2, max_rows=8).slot(0)
        assert make_proposer(("ngram",), slot, DraftConfig("chain", chain=3)) is None
        assert f"speculation off: {arch}: a hybrid model (recurrent layers): continuous batching" in caplog.text
        assert slot.decode([1, 2, 3]).shape == (3, tgt.n_vocab)


def test_table_claims_what_is_checked() -> None:
    """The architectures the table marks as captured are exactly the ones checked here, and every
    one the vendored llama.cpp knows is either followable or refused with its reason."""
    from moa_cpp.format.llama_archs import LLAMA_ARCHS

    assert set(arch_table.names_where("capture")) == set(ARCHS)
    assert len(LLAMA_ARCHS) > 140
    for name, (kind, why) in LLAMA_ARCHS.items():
        assert (kind in ("attention", "hybrid")) == (arch_table.drafter_refusal(name) is None), name
        assert kind == "attention" or why, name          # every refusal has its reason
    for name in ARCHS:
        assert arch_table.llama_kind(name)[0] in ("attention", "hybrid"), name
    for name in REFUSED:
        assert arch_table.drafter_refusal(name), name


def _serve_answer(gguf: Path, *extra: str) -> tuple[str, str]:
    """(greedy completion text of a fixed prompt, the server's stderr) from a real `moa-cpp serve`."""
    from moa_cpp.testing.server_proc import ServerProc

    srv = ServerProc("-m", str(gguf), "--n-ctx", "256", *extra)
    try:
        status, _, body = srv.post("/v1/completions", {"prompt": "Hello", "max_tokens": 8, "temperature": 0})
        assert status == 200, body
        return body["choices"][0]["text"], "".join(srv.stderr_lines)
    finally:
        srv.terminate()


@pytest.mark.parametrize("arch", ["mamba"])
def test_refused_architecture_decodes_plainly(built: dict, arch: str, tmp_path: Path, fixture_dir: Path) -> None:
    """A recurrent target: `generate` and `serve` decode plainly with one line saying why no
    drafts (the same text as plain decoding); `train` and `convert` stop with one line naming the
    architecture; never a traceback."""
    import subprocess
    import sys

    entry = _files(built, arch)
    moa = [sys.executable, "-m", "moa_cpp.cli.main"]
    gen = [*moa, "generate", "-m", str(entry["gguf"]), "-p", "Hello", "--max-tokens", "8", "--temp", "0"]
    r = subprocess.run([*gen, "--spec-type", "ngram"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert f"speculation off: {arch}: a recurrent model" in r.stderr, r.stderr
    plain = subprocess.run([*gen, "--spec-type", "none"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and plain.stdout == r.stdout, (plain.stdout, r.stdout)
    text, err = _serve_answer(entry["gguf"], "--spec-type", "ngram")
    assert f"speculation off: {arch}: a recurrent model" in err and "Traceback" not in err, err
    assert text and text == plain.stdout[:-1], (text, plain.stdout)
    r = subprocess.run([*moa, "train", "--target", str(entry["gguf"]), "--out", str(tmp_path / "t"), "--steps", "1",
                        "--n-samples", "0", "--fixed-answers", "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert f"cannot follow {arch}: a recurrent model" in r.stderr, r.stderr
    r = subprocess.run([*moa, "convert", str(fixture_dir / "drafter_hf"), "--target-gguf", str(entry["gguf"]),
                        "-o", str(tmp_path / "d.gguf")], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert f"cannot follow {arch}: a recurrent model" in r.stderr, r.stderr
    assert not (tmp_path / "d.gguf").exists()


@pytest.mark.parametrize("arch", HYBRIDS)
def test_hybrid_generate_and_serve(built: dict, arch: str) -> None:
    """A hybrid target from the command line: `generate` and `serve` verify drafts (no refusal)
    and write plain decoding's text; `serve -np 2` answers the same (its continuous-batching slots,
    which do not plan around the recurrent state's one rollback per decode, decode plainly after
    one line saying so; a target whose batched rows are not exact gets sessions of its own)."""
    import subprocess
    import sys

    entry = _files(built, arch)
    gen = [sys.executable, "-m", "moa_cpp.cli.main", "generate", "-m", str(entry["gguf"]), "-p", "Hello",
           "--max-tokens", "8", "--temp", "0"]
    plain = subprocess.run([*gen, "--spec-type", "none"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    r = subprocess.run([*gen, "--spec-type", "ngram"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "speculation off" not in r.stderr, r.stderr
    assert r.stdout == plain.stdout
    text, err = _serve_answer(entry["gguf"], "--spec-type", "ngram")
    assert "speculation off" not in err and "Traceback" not in err, err
    assert text == plain.stdout[:-1], (text, plain.stdout)
    text, err = _serve_answer(entry["gguf"], "--spec-type", "ngram", "-np", "2")
    assert "Traceback" not in err, err
    assert text == plain.stdout[:-1], (text, plain.stdout)
    if "continuous batching off" not in err:     # (a target whose batched rows are not exact runs apart)
        assert f"speculation off: {arch}: a hybrid model (recurrent layers): continuous batching" in err, err


@pytest.mark.parametrize("arch", NO_RS_HYBRIDS)
def test_hybrid_without_snapshots_decodes_plainly(built: dict, arch: str) -> None:
    """A hybrid whose recurrent state llama.cpp keeps no snapshots of: `generate` says in one line
    why it does not draft, and writes plain decoding's text."""
    import subprocess
    import sys

    entry = _files(built, arch)
    gen = [sys.executable, "-m", "moa_cpp.cli.main", "generate", "-m", str(entry["gguf"]), "-p", "Hello",
           "--max-tokens", "8", "--temp", "0"]
    plain = subprocess.run([*gen, "--spec-type", "none"], capture_output=True, text=True, timeout=120)
    r = subprocess.run([*gen, "--spec-type", "ngram"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert (f"speculation off: {arch}: a hybrid model (recurrent layers): llama.cpp keeps no per-token snapshots"
            in r.stderr), r.stderr
    assert r.stdout == plain.stdout
