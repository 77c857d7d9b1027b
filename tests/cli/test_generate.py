"""The generation API and CLI on the fixture target (fast): lossless greedy in every draft mode
(including the cost-aware one), the reference's per-cycle accept lengths, sampling that
preserves the target's distribution end to end, and the user-facing surfaces."""
from __future__ import annotations

import functools
import json
import subprocess
import sys

import numpy as np
import pytest
from scipy.stats import chisquare

from moa_cpp.convert import convert
from moa_cpp.drafter.drafter import DrafterModel
from moa_cpp.generator import SpeculativeGenerator, parse_draft
from moa_cpp.speculative.loop import SpeculativeLoop
from moa_cpp.testing.oracle import OracleProposer
from moa_cpp.speculative.types import DraftConfig
from moa_cpp.speculative.types import SamplingParams
from moa_cpp.speculative.verify import probs_from_logits
from moa_cpp.target.target import Target

ALPHA = 1e-3


@pytest.fixture(scope="module")
def fx(fixture_dir, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("MOA_CPP_CACHE", str(tmp_path_factory.mktemp("cache")))
    g = dict(np.load(fixture_dir / "golden.npz"))
    tgt_path = fixture_dir / "target-f32.gguf"
    drafter = convert(fixture_dir / "drafter_hf", tmp_path_factory.mktemp("gen") / "d.gguf", outtype="f32",
                      target_gguf=tgt_path, progress=False)
    # F32 attention (flash attention off) to match the HF reference's greedy continuation exactly
    target = Target.from_path(tgt_path, n_ctx=512, n_batch=128, flash_attn=False)
    gen = SpeculativeGenerator(target, DrafterModel(drafter, tgt_path))
    yield g, gen, tgt_path, drafter
    gen.close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.mark.parametrize("draft", ["none", "chain:1", "chain:3", "chain:5", "tree:3,3,10", "tree:6,8,62", "auto:6"])
def test_greedy_equals_reference_greedy(fx, draft):
    g, gen, _, _ = fx
    if draft.startswith("auto"):
        # the cost-aware mode drafts only where it pays: give it a memory-bound target's verify
        # cost (T(k) = T(1), as on GPUs) so that it really drafts here
        gen.loop.policy_for(parse_draft(draft)).verify_cost = {k: 0.01 for k in range(1, 8)}
    r = gen.generate(g["prompt_ids"].tolist(), max_tokens=32, draft=draft)
    assert (r.stats.drafted > 0) == (draft != "none")      # a mode that drafts nothing proves nothing
    assert r.tokens == g["target_greedy"].tolist()        # the HF reference's own greedy output
    assert r.stats.n_generated == 32 and r.finish_reason == "length"
    assert r.stats.target_calls == len(r.stats.accept_lengths)
    assert sum(r.stats.accept_lengths) + 1 == 32          # + the token sampled after prefill


def test_tree_cycles_match_reference_generate(fx):
    """The paper tree (7, 8, 62 in the reference's terms) verifies exactly as the reference's
    own generate(): same number of verification calls, same tokens per call."""
    g, gen, _, _ = fx
    r = gen.generate(g["prompt_ids"].tolist(), max_tokens=32, draft="tree:6,8,62")
    assert r.stats.accept_lengths == g["generate_accept_lengths"].tolist()


def test_sampling_end_to_end_distribution(fx):
    """First two generated tokens under speculation ~ the target's own sampling law, at T=1.0
    and T=0.7 (chi-square, ALPHA=1e-3), with the oracle (deterministic drafts, often right) and
    the MoA drafter (drafts sampled from q)."""
    g, gen, tgt_path, _ = fx
    target = gen.target
    prompt = g["prompt_ids"].tolist()
    for temp in (1.0, 0.7):
        sp_t = SamplingParams(temp)
        target.clear()
        p1 = probs_from_logits(target.decode(prompt, capture=False)[-1], sp_t)
        support = np.flatnonzero(p1 > 1e-3)
        cond = {}
        for t1 in support:
            target.rollback(len(prompt))
            cond[int(t1)] = probs_from_logits(target.decode([int(t1)], [len(prompt)], capture=False)[0], sp_t)
        cfg = DraftConfig("chain", chain=2)
        for kind in ("oracle", "moa"):
            counts: dict = {}
            N = 1500
            for seed in range(N):
                sp = SamplingParams(temp, seed=seed)
                if kind == "oracle":
                    ref = g["target_greedy"].tolist()
                    loop = SpeculativeLoop(target, OracleProposer(ref, len(prompt), 0.8, target.n_vocab, cfg, seed), cfg)
                else:
                    loop = gen.loop
                toks = []
                for ev in loop.run(prompt, 2, sp, cfg):
                    toks += ev.tokens
                counts[tuple(toks[:2])] = counts.get(tuple(toks[:2]), 0) + 1
            # expected joint over (t1 in support, t2 with p > 1e-3); the rest pooled
            keys, exp = [], []
            for t1 in support:
                for t2 in np.flatnonzero(cond[int(t1)] > 1e-3):
                    keys.append((int(t1), int(t2)))
                    exp.append(p1[t1] * cond[int(t1)][t2])
            obs = [counts.get(k, 0) for k in keys]
            rest_obs, rest_exp = N - sum(obs), max(0.0, 1.0 - sum(exp))
            obs.append(rest_obs)
            exp.append(rest_exp)
            exp = np.array(exp) / np.sum(exp) * N
            keep = exp >= 5
            o = np.array(obs, float)
            o2 = np.append(o[keep], o[~keep].sum())
            e2 = np.append(exp[keep], exp[~keep].sum())
            if e2[-1] < 5:
                o2[-2] += o2[-1]; e2[-2] += e2[-1]; o2, e2 = o2[:-1], e2[:-1]
            pval = chisquare(o2, e2).pvalue
            assert pval > ALPHA, f"{kind} T={temp}: chi-square p={pval:.2e}"


def test_moa_chain_reports_each_drafts_own_q(fx):
    """Under sampling each chain node carries the distribution its token was drawn from: the
    drafter's own distribution after the drafts before it (recomputed here in one drafter call).
    A node drawn from another node's q (e.g. the root's) would meet the target's draw for its
    token less often (moa_cpp/speculative/draws.py)."""
    g, gen, _, _ = fx
    prompt = g["prompt_ids"].tolist()
    cfg = DraftConfig("chain", chain=4)
    for temp in (1.0, 0.6):
        sp = SamplingParams(temp, top_k=50, seed=3)
        run, _ = gen.loop.prefill(prompt, 8, sp, cfg)
        assert run.drafting
        prop = gen.loop.proposer
        proposal = prop.propose(run.feed, run.root, run.n, sp, run.cursor(), cfg)
        toks = [int(t) for t in proposal.tokens]
        assert len(proposal.q) == len(toks) == 4
        st = prop.state
        st.clear_drafts()
        rows = st.draft([run.root] + toks[:-1], list(range(run.n, run.n + 4)), [-1, 0, 1, 2])
        for i, (tok, q) in enumerate(zip(toks, proposal.q)):
            own = probs_from_logits(rows[i], sp)
            assert q[tok] > 0
            np.testing.assert_allclose(q, own, rtol=0, atol=1e-4, err_msg=f"T={temp}: node {i}'s q")
        assert not np.allclose(proposal.q[0], proposal.q[1], atol=1e-3)    # the check can tell them apart
        st.clear_drafts()


def test_stream_stop_and_completion(fx):
    g, gen, _, _ = fx
    full = gen.generate(g["prompt_ids"].tolist(), max_tokens=16, draft="chain:3")
    pieces = list(gen.stream(g["prompt_ids"].tolist(), max_tokens=16, draft="chain:3"))
    assert "".join(pieces) == full.text
    stop = full.text[5:9]
    cut = gen.generate(g["prompt_ids"].tolist(), max_tokens=16, stop=[stop], draft="chain:3")
    assert cut.text == full.text[: full.text.find(stop)] and cut.finish_reason == "stop"
    resp = gen.create_completion(g["prompt_ids"].tolist(), max_tokens=8, temperature=0.0)
    assert resp["object"] == "text_completion" and resp["choices"][0]["finish_reason"] == "length"
    assert resp["usage"]["completion_tokens"] == 8 and "tau" in resp["moa"]
    chunks = list(gen.create_completion(g["prompt_ids"].tolist(), max_tokens=8, temperature=0.0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == resp["choices"][0]["text"]


def test_sampling_is_seeded(fx):
    g, gen, _, _ = fx
    a = gen.generate(g["prompt_ids"].tolist(), max_tokens=12, temperature=1.0, seed=42, draft="chain:3")
    b = gen.generate(g["prompt_ids"].tolist(), max_tokens=12, temperature=1.0, seed=42, draft="chain:3")
    assert a.tokens == b.tokens


def test_parse_draft():
    assert parse_draft("chain:4") == DraftConfig("chain", chain=4)
    assert parse_draft("tree:6,8,62") == DraftConfig("tree", depth=6, topk=8, total=62)
    assert parse_draft("auto") == DraftConfig("auto", chain=8)
    for bad in ("chain:x", "tree:1,2", "banana", "chain:0"):
        with pytest.raises(ValueError):
            parse_draft(bad)


def test_cli_generate_json(fx):
    g, _, tgt_path, drafter = fx
    cmd = [sys.executable, "-m", "moa_cpp.cli.main", "generate", "-m", str(tgt_path), "-d", str(drafter),
           "-p", "The quick brown fox", "--max-tokens", "12", "--json"]
    out = {}
    for extra in ([], ["--no-draft"], ["--chain", "3"], ["--tree", "3,3,10"]):
        p = subprocess.run(cmd + extra, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        d = json.loads(p.stdout.strip().splitlines()[-1])
        for k in ("text", "tokens", "n_tokens", "target_calls", "tau", "tokens_per_s"):
            assert k in d
        out[" ".join(extra)] = d["tokens"]
    assert len(set(map(tuple, out.values()))) == 1          # every mode: the same greedy output


def test_cli_llama_cpp_spellings_and_draft_model(fx):
    """llama.cpp's flags (-md, -n, -c, -t, --draft-max) mean what they mean there; -md given a
    plain LLM GGUF runs draft-model speculation (the target as its own draft model: every draft
    is accepted); llama.cpp's log lines appear only with --verbose; the text mode's summary line
    says what the draft policy chose."""
    g, _, tgt_path, drafter = fx

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", "generate", "-m", str(tgt_path),
                               "-p", "The quick brown fox", *args], capture_output=True, text=True, timeout=300)

    long = run("-d", str(drafter), "--chain", "3", "--max-tokens", "12", "--n-ctx", "512", "--threads", "1", "--json")
    short = run("-md", str(drafter), "--draft-max", "3", "-n", "12", "-c", "512", "-t", "1", "--json")
    assert long.returncode == 0 and short.returncode == 0, short.stderr
    a, b = json.loads(long.stdout.splitlines()[-1]), json.loads(short.stdout.splitlines()[-1])
    assert a["tokens"] == b["tokens"] and b["draft"] == "chain:3" and b["n_tokens"] == 12
    dm = run("-md", str(tgt_path), "--draft-max", "3", "-n", "12", "--json")
    assert dm.returncode == 0, dm.stderr
    d = json.loads(dm.stdout.splitlines()[-1])
    assert d["tokens"] == a["tokens"] and d["tau"] > 2.5          # its own drafts: all accepted
    quiet = run("-d", str(drafter), "--no-draft", "-n", "4")
    loud = run("-d", str(drafter), "--no-draft", "-n", "4", "--verbose")
    assert quiet.returncode == 0 and loud.returncode == 0
    assert "llama_model_loader" not in quiet.stderr and "llama_model_loader" in loud.stderr
    assert "tok/s; plain decoding (no drafts asked for)]" in quiet.stderr


@pytest.mark.parametrize("args,msg", [
    (["--tree", "6,8"], "DEPTH,TOPK,TOTAL"),
    (["--chain", "0"], "positive"),
    (["--chain", "2", "--tree", "1,1,1"], "not allowed with"),
    (["--max-tokens", "-3"], "positive"),
    (["-n", "0"], "positive"),
    (["-t", "0"], "positive"),
    (["--draft-max", "2", "--tree", "1,1,1"], "not allowed with"),
    (["--draft-model", "x.gguf"], "not both"),
])
def test_cli_generate_bad_args(fx, args, msg):
    _, _, tgt_path, drafter = fx
    p = subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", "generate", "-m", str(tgt_path), "-d", str(drafter),
                        "-p", "x"] + args, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and msg in p.stderr


def test_cli_generate_model_alone_drafts_ngram(fx, tmp_path):
    """-m without a drafter: prompt lookup (n-gram) drafts, the same greedy output as plain
    decoding; --spec-type picks the proposer explicitly, and asking for one whose model is
    missing is a clear error."""
    g, _, tgt_path, drafter = fx

    def run(*args: str, prompt: str = "") -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", "generate", "-m", str(tgt_path), "-p",
                               prompt, "-n", "16", "-c", "512", "--json", *args],
                              capture_output=True, text=True, timeout=300)
    # a prompt that holds the model's own continuation of its start: lookups find matches
    start = "one two three four"
    first = run("--no-draft", prompt=start)
    assert first.returncode == 0, first.stderr
    prompt = start + json.loads(first.stdout.splitlines()[-1])["text"] + " " + start
    run = functools.partial(run, prompt=prompt)
    plain = run("--no-draft")
    assert plain.returncode == 0, plain.stderr
    want = json.loads(plain.stdout.splitlines()[-1])["tokens"]
    for args in ([], ["--spec-type", "ngram", "--chain", "3"], ["--spec-type", "moa,ngram", "-d", str(drafter),
                                                                  "--tree", "3,2,8"]):
        p = run(*args)
        assert p.returncode == 0, p.stderr
        d = json.loads(p.stdout.splitlines()[-1])
        assert d["tokens"] == want and d["spec_type"] == (args[1] if args else "ngram")
        if args:
            assert d["by_source"]["ngram"]["proposed"] > 0
    for args, msg in ((["--spec-type", "moa"], "needs an MoA drafter"), (["--spec-type", "eagle"], "unknown"),
                      (["--spec-type", "draft"], "needs a draft model"),
                      (["--spec-ngram-size-n", "2", "--spec-ngram-size-n-min", "3"], "must be <=")):
        p = run(*args)
        assert p.returncode == 2 and msg in p.stderr, p.stderr
    p = subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", "generate", "-m", str(tgt_path),
                        "-d", str(tmp_path / "none.gguf"), "-p", "x"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "not found" in p.stderr


@pytest.mark.model
def test_cli_embedded_default_drafter() -> None:
    """README's main job: `moa-cpp generate` without -m/-d uses SmolLM2 + the shipped drafter
    (chain 4 forced, so drafts really run) and prints exactly what plain decoding prints."""
    def run(*extra: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", "generate", "-p", "Name three primary colors.",
                              "--chat", "--max-tokens", "24", "--threads", "1", "--json", *extra],
                             capture_output=True, text=True, timeout=600, check=True)
        return json.loads(out.stdout)

    spec, plain = run("--chain", "4"), run("--no-draft")
    assert spec["draft"] == "chain:4" and plain["draft"] == "none"
    assert spec["tokens"] == plain["tokens"] and spec["n_tokens"] > 0
    assert spec["target_calls"] < plain["target_calls"]  # the trained drafter got tokens accepted


@pytest.mark.model
def test_cli_shipped_drafter_by_name() -> None:
    """``-d NAME`` names a drafter shipped in moa_cpp/data (README's model table): the same run as
    its path; an unknown name, or a path, is looked up as a file (the not-found error)."""
    from moa_cpp.models import registry as models
    from moa_cpp.models.defaults import DEFAULT_DRAFTER, drafter_path, shipped_drafters

    assert shipped_drafters()["smollm2-135m-instruct"] == DEFAULT_DRAFTER
    assert drafter_path("moa-smollm2-135m-instruct.gguf") == str(DEFAULT_DRAFTER)
    assert drafter_path("./smollm2-135m-instruct") == "./smollm2-135m-instruct"     # a path, never a name

    def run(d: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", "generate", "-m", str(models.smollm2_path()),
                               "-d", d, "-p", "The capital of France is", "-n", "16", "--chain", "4", "--threads", "1",
                               "--json"], capture_output=True, text=True, timeout=300)
    by_name, by_path = run("smollm2-135m-instruct"), run(str(DEFAULT_DRAFTER))
    assert by_name.returncode == 0 and by_path.returncode == 0, by_name.stderr + by_path.stderr
    a, b = json.loads(by_name.stdout), json.loads(by_path.stdout)
    assert a["tokens"] == b["tokens"] and a["spec_type"] == "moa" and a["target_calls"] == b["target_calls"]
    p = run("no-such-drafter")
    assert p.returncode == 2 and "not found" in p.stderr, p.stderr
