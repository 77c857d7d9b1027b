"""Who chose each emitted token (StepResult.origins -> the chat page's highlighting): a
proposer's accepted draft or the target's own verification token, counted in
SpecStats.emitted_from. Checked against the verifier's own verdicts, cycle by cycle."""
from __future__ import annotations

import pytest

from moa_cpp.models import registry as models
from moa_cpp.speculative.loop import SpeculativeLoop
from moa_cpp.speculative.proposers import HybridProposer, NgramProposer
from moa_cpp.speculative.types import DraftConfig, SamplingParams
from moa_cpp.target.target import Target
from moa_cpp.testing.oracle import OracleProposer

pytestmark = pytest.mark.model

PROMPT = "Repeat after me: the cat sat on the mat. The cat sat on the mat. The cat"


@pytest.fixture(scope="module")
def target():
    t = Target.from_path(models.smollm2_path(), n_ctx=512)
    yield t
    t.close()


def _reference(target, ids, n):
    loop = SpeculativeLoop(target, None, DraftConfig("none"))
    return [t for ev in loop.run(ids, n, SamplingParams()) for t in ev.tokens]


@pytest.mark.parametrize("cfg", [DraftConfig("chain", chain=3), DraftConfig("tree", depth=3, topk=2, total=6)],
                         ids=["chain3", "tree3,2,6"])
def test_origins_follow_the_verdicts(target, cfg):
    ids = target.tokenize(PROMPT, add_bos=True).tolist()
    ref = _reference(target, ids, 40)
    oracle = OracleProposer(ref, len(ids), 0.7, target.n_vocab, cfg, seed=3)
    prop = HybridProposer([oracle, NgramProposer(cfg)], ["oracle", "ngram"], cfg)
    loop = SpeculativeLoop(target, prop, cfg)
    verdicts = []
    loop.on_cycle = lambda pos, root, p, sc, v: verdicts.append((p, v))
    events = list(loop.run(ids, 40, SamplingParams(), cfg))
    toks = [t for ev in events for t in ev.tokens]
    origins = [o for ev in events for o in ev.origins]
    assert toks == ref and len(origins) == len(toks)
    # prefill's token is the target's; then per cycle: the accepted path's sources, then the target's
    expect = ["target"]
    for p, v in verdicts:
        for node in v.path:
            bits = int(p.sources[node])
            expect.append("+".join(n for s, n in enumerate(["oracle", "ngram"]) if bits & (1 << s)))
        expect.append("target")
    assert origins == expect[:len(toks)]
    st = events[-1].stats
    assert sum(st.emitted_from.values()) == len(toks)
    assert st.emitted_from == {o: origins.count(o) for o in set(origins)}
    drafted = len(toks) - st.emitted_from["target"]
    assert 0 < drafted <= st.accepted
    assert {o for o in origins} >= {"target"} and any("oracle" in o for o in origins)
    assert any("ngram" in o for o in origins)        # the repetitive prompt gives prompt lookup hits
