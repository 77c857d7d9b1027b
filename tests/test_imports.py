"""The engine's import paths: one package (moa_cpp.speculative, proposers under
moa_cpp.speculative.proposers), the oracle in moa_cpp.testing; the old moa_cpp.spec aliases and
moa_cpp.draft_model are gone."""
from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize("old", ["moa_cpp.spec", "moa_cpp.spec.loop", "moa_cpp.draft_model",
                                 "moa_cpp.speculative.proposer"])
def test_old_paths_are_gone(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_new_package_surface():
    import moa_cpp.speculative as s
    for name in ("SpeculativeLoop", "DraftConfig", "SamplingParams", "Proposal", "Verdict", "Scores",
                 "SpecStats", "StepResult", "Proposer", "Policy", "CostAwarePolicy", "FixedPolicy"):
        assert hasattr(s, name), name
    from moa_cpp.speculative.proposers import (DraftModelProposer, HybridProposer, MoAProposer,  # noqa: F401
                                               NgramProposer, make_proposer)
    # the oracle is a test helper, not product
    assert not hasattr(s, "OracleProposer")
    r = s.StepResult((1, 2))
    with pytest.raises(Exception):
        r.tokens = ()                # immutable per-step result


def test_cli_imports_only_the_command_it_runs():
    """A one-shot `moa-cpp generate` loads neither the converter nor gguf nor the web stack (the
    parser imports the chosen subcommand's module only); `moa-cpp --help` still lists them all."""
    import subprocess
    import sys
    code = ("import sys; from moa_cpp.cli.main import build_parser; p = build_parser('generate'); "
            "p.parse_args(['generate', '-p', 'x']); "
            "print(sorted(m for m in ('moa_cpp.convert', 'gguf', 'starlette', 'uvicorn', 'torch', 'moa_cpp.train') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    helptext = subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", "--help"], capture_output=True, text=True,
                              timeout=120, check=True).stdout
    assert all(c in helptext for c in ("generate", "convert", "train", "serve", "client", "bundle", "rpc-server"))
