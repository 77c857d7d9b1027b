"""The engine's import paths: the new package (moa_cpp.speculative, moa_cpp.testing) and the old
moa_cpp.spec paths, kept as aliases of the same modules for one release."""
from __future__ import annotations

import importlib

import pytest

OLD_TO_NEW = {
    "moa_cpp.spec.loop": "moa_cpp.speculative.loop",
    "moa_cpp.spec.proposer": "moa_cpp.speculative.proposer",
    "moa_cpp.spec.verify": "moa_cpp.speculative.verify",
    "moa_cpp.spec.scorer": "moa_cpp.speculative.scorer",
    "moa_cpp.spec.cost": "moa_cpp.speculative.policy",
    "moa_cpp.spec.proposal": "moa_cpp.speculative.types",
    "moa_cpp.spec.stats": "moa_cpp.speculative.types",
    "moa_cpp.spec.oracle": "moa_cpp.testing.oracle",
}


@pytest.mark.parametrize("old,new", sorted(OLD_TO_NEW.items()))
def test_old_path_is_the_new_module(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


def test_old_names_still_import():
    from moa_cpp.spec.cost import AcceptanceEstimate, measure_verify_cost  # noqa: F401
    from moa_cpp.spec.loop import SpeculativeLoop
    from moa_cpp.spec.oracle import OracleProposer
    from moa_cpp.spec.proposal import Proposal, Verdict  # noqa: F401
    from moa_cpp.spec.proposer import DraftConfig, MoAProposer  # noqa: F401
    from moa_cpp.spec.stats import SpecStats  # noqa: F401
    from moa_cpp.spec.verify import SamplingParams, verify  # noqa: F401
    from moa_cpp.speculative import SpeculativeLoop as New
    from moa_cpp.testing.oracle import OracleProposer as NewOracle
    assert SpeculativeLoop is New and OracleProposer is NewOracle


def test_new_package_surface():
    import moa_cpp.speculative as s
    for name in ("SpeculativeLoop", "DraftConfig", "SamplingParams", "Proposal", "Verdict", "Scores",
                 "SpecStats", "StepResult", "Proposer", "CostAwarePolicy", "FixedPolicy"):
        assert hasattr(s, name), name
    # the oracle is a test helper, not product
    assert not hasattr(s, "OracleProposer")
    r = s.StepResult((1, 2))
    with pytest.raises(Exception):
        r.tokens = ()                # immutable per-step result
