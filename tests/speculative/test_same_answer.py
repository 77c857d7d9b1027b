"""Same request, same answer, whatever ran before (issue 41).

A request's answer must equal what a fresh process gives for it (``moa-cpp generate --chat
--no-draft``: plain decoding from empty caches, the same settings), whatever the server, the chat
or the Python object served before: the same prompt again, a prompt sharing only the system
prompt, a longer conversation, streamed or not, drafted as a chain, a tree, by n-gram lookup or
not at all, sampled with a seed.

Why these fail without exact reuse: llama.cpp's kernels switch with a batch's row count (on
SmolLM2 here batches of 64+ rows compute other bits than batches of up to 63), so a prompt that
reuses K/V cells computed inside an earlier, larger batch can part from a fresh prefill at a
near-tie (measured on the landed code: 2 of 6 server answers equal). And a seeded sampled
answer depended on what was drafted (rejection sampling draws per draft).

Every comparison is with default settings except where ``-ub`` is the point (the aligned rule of
moa_cpp/speculative/prefix_cache.py: ``-ub 64`` is one row past this target's exact batch size,
so only whole prefill chunks may be reused).
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from moa_cpp import SpeculativeGenerator
from moa_cpp.models import defaults

pytestmark = [pytest.mark.model, pytest.mark.slow]

SYSTEM = "You are a helpful assistant. Answer clearly and keep it short."
# everyday prompts of 64+ tokens with the template: the landed code prefilled them in one batch of
# more rows than this target computes like one-token decodes, so a later prompt that reused their
# cells (the system prompt, an earlier turn) could part from a fresh prefill
USERS = ["I keep waking up at 3 am and then I cannot fall asleep again for an hour or two. I drink one "
         "coffee in the morning and I use my phone in bed. Give me three tips for sleeping better.",
         "I am learning Python for data analysis at work. What is the difference between a list and a "
         "tuple in Python, and when should I use each one? Please include a short example of both.",
         "My grandmother loves autumn, especially the colours of the leaves in the park near her house. "
         "Write a short poem about autumn leaves that I could read to her on her birthday next week."]
FOLLOW = "Tell me more about the second one."
N = 48


def _msgs(*users_and_answers: str) -> list:
    m = [{"role": "system", "content": SYSTEM}]
    for i, text in enumerate(users_and_answers):
        m.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return m


@pytest.fixture(scope="module")
def fresh():
    """``moa-cpp generate --chat --no-draft`` in this process: plain decoding, caches emptied
    before every request (``cache_prompt=False``), default settings."""
    gen = SpeculativeGenerator.from_paths(defaults.default_target(), None, draft="none", n_ctx=2048, n_threads=2)
    memo: dict = {}

    def answer(msgs: list, max_tokens: int = N, **sampling) -> str:
        key = json.dumps([msgs, max_tokens, sampling], sort_keys=True)
        if key not in memo:
            memo[key] = gen.generate(msgs, chat=True, max_tokens=max_tokens, cache_prompt=False, **sampling).text
        return memo[key]
    yield answer
    gen.close()


# ---------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def server():
    from moa_cpp.testing.server_proc import ServerProc
    srv = ServerProc("--parallel", "2", "-t", "2", "-c", "2048")
    yield srv
    assert srv.terminate() == 0


def _chat(srv, msgs, *, stream=False, draft=None, max_tokens=N, **extra) -> str:
    body = {"messages": msgs, "max_tokens": max_tokens, "temperature": 0, **extra}
    if draft:
        body["moa"] = {"draft": draft}
    if not stream:
        st, _, r = srv.post("/v1/chat/completions", body)
        assert st == 200, r
        return r["choices"][0]["message"]["content"]
    from moa_cpp.testing.server_proc import streamed_chat_text
    return streamed_chat_text(srv, body)


def test_server_answers_do_not_depend_on_earlier_requests(server, fresh):
    """The issue's user: everyday prompts one after the other (all share the chat template's
    system prompt), then the same prompt again and a longer conversation; streamed and not;
    the cost-aware default, a chain, a tree."""
    plan = [(_msgs(USERS[0]), False, None), (_msgs(USERS[1]), True, "chain:4"),
            (_msgs(USERS[2]), False, "tree:4,4,16"), (_msgs(USERS[0]), True, "chain:4"),
            (_msgs(USERS[2]), True, None), (_msgs(USERS[1]), False, "tree:4,4,16")]
    got = [(_chat(server, m, stream=s, draft=d), fresh(m)) for m, s, d in plan]
    longer = _msgs(USERS[0], got[0][0], FOLLOW)
    got.append((_chat(server, longer, draft="chain:4"), fresh(longer)))
    longer2 = _msgs(USERS[0], got[0][0], FOLLOW, got[-1][0], "Thanks. One more tip?")
    got.append((_chat(server, longer2, stream=True, draft="tree:4,4,16"), fresh(longer2)))
    bad = [i for i, (a, b) in enumerate(got) if a != b]
    assert not bad, [(i, got[i]) for i in bad]


def test_server_concurrent_and_queued_requests(server, fresh):
    """Three requests at once on two sessions: one waits and is handed whichever session frees
    first (the queue's path, not the prefix-choice path); every answer is the fresh one."""
    plan = [_msgs(USERS[1]), _msgs(USERS[0]), _msgs(USERS[2], "A poem.", "Another, about winter.")]
    out: dict = {}

    def ask(i):
        out[i] = _chat(server, plan[i], stream=i == 1, draft="chain:4")
    ts = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    assert sorted(out) == [0, 1, 2]
    assert [out[i] for i in range(3)] == [fresh(m) for m in plan]


def test_server_seeded_sampling_is_repeatable(server, fresh):
    """A seeded sampled request twice (after other requests) gives the same text, and it is
    plain sampling's text with that seed: what was drafted does not move the draws."""
    m = _msgs(USERS[1])
    kw = dict(temperature=0.8, top_p=0.95, seed=1234)
    a = _chat(server, m, draft="chain:4", **kw)
    _chat(server, _msgs(USERS[2]), draft="tree:4,4,16")
    b = _chat(server, m, stream=True, draft="tree:4,4,16", **kw)
    # the server's sampling defaults (llama-cpp-python's): top_k 40, min_p 0.05
    assert a == b == fresh(m, temperature=0.8, top_p=0.95, top_k=40, min_p=0.05, seed=1234)


# ---------------------------------------------------------------------- the Python API


def test_python_api_successive_calls(fresh):
    """``create_chat_completion`` called again and again on one object (its KV cache kept), the
    MoA drafter (chain, tree) and n-gram lookup: each answer is the fresh one."""
    gen = SpeculativeGenerator.from_paths(defaults.default_target(), defaults.default_drafter(), n_ctx=2048,
                                          n_threads=2, spec_type="moa,ngram")
    try:
        for i, (m, draft) in enumerate([(_msgs(USERS[0]), "chain:4"), (_msgs(USERS[1]), "tree:4,4,16"),
                                        (_msgs(USERS[0]), "chain:4"), (_msgs(USERS[2]), None)]):
            r = gen.create_chat_completion(m, temperature=0, max_tokens=N) if draft is None else \
                gen.generate(m, chat=True, max_tokens=N, draft=draft)
            text = r["choices"][0]["message"]["content"] if isinstance(r, dict) else r.text
            assert text == fresh(m), (i, text)
        r = gen.create_chat_completion(_msgs(USERS[0], fresh(_msgs(USERS[0])), FOLLOW), temperature=0, max_tokens=N)
        assert r["choices"][0]["message"]["content"] == fresh(_msgs(USERS[0], fresh(_msgs(USERS[0])), FOLLOW))
        assert r["moa"]["n_cached"] > 0       # the earlier turn was reused
    finally:
        gen.close()


def test_ngram_reuse_and_seeded_sampling_equal_plain(fresh):
    """n-gram drafting alone, after other prompts; a seeded sampled generation with drafts
    (chain and tree) is plain sampling's, token for token."""
    gen = SpeculativeGenerator.from_paths(defaults.default_target(), defaults.default_drafter(), n_ctx=2048,
                                          n_threads=2, spec_type="ngram")
    try:
        for m in (_msgs(USERS[2]), _msgs(USERS[1]), _msgs(USERS[2])):
            assert gen.generate(m, chat=True, max_tokens=N, draft="chain:4").text == fresh(m)
    finally:
        gen.close()
    moa = SpeculativeGenerator.from_paths(defaults.default_target(), defaults.default_drafter(), n_ctx=2048,
                                          n_threads=2)
    try:
        for seed, draft in [(7, "chain:4"), (8, "tree:4,4,16"), (7, "tree:4,4,16")]:
            m = _msgs(USERS[seed % 2])
            r = moa.generate(m, chat=True, max_tokens=N, draft=draft, temperature=1.0, seed=seed)
            assert r.stats.drafted > 0
            assert r.text == fresh(m, temperature=1.0, seed=seed), (seed, draft)
    finally:
        moa.close()


def test_aligned_rule_with_a_large_ubatch():
    """``-ub 64`` (past this target's exact batch size): only whole 64-token prefill chunks are
    reused, the rest decoded again at fixed positions; the answers equal a fresh context's with
    the same -ub, turn after turn, with MoA capture (whose drafter view is cut to the grid too)."""
    opts = dict(n_ubatch=64)
    gen = SpeculativeGenerator.from_paths(defaults.default_target(), defaults.default_drafter(), n_ctx=2048,
                                          n_threads=2, target_options=opts)
    ref = SpeculativeGenerator.from_paths(defaults.default_target(), None, draft="none", n_ctx=2048, n_threads=2,
                                          target_options=opts)
    try:
        assert gen.loop.prefix.shape() == (64, False)
        m = _msgs(USERS[1])
        cached: list = []
        for turn, draft in enumerate(["chain:4", "tree:4,4,16", "chain:4"]):
            r = gen.generate(m, chat=True, max_tokens=N, draft=draft)
            want = ref.generate(m, chat=True, max_tokens=N, cache_prompt=False)
            assert r.tokens == want.tokens, (turn, r.text, want.text)
            assert r.stats.n_cached % 64 == 0, r.stats.n_cached
            cached.append(r.stats.n_cached)
            m = m + [{"role": "assistant", "content": r.text}, {"role": "user", "content": FOLLOW}]
        assert cached[-1] >= 64, cached          # the second turn's whole chunks were reused
    finally:
        gen.close()
        ref.close()


def test_default_shape_is_canonical_here():
    """With no -ub the prefill runs in chunks of the target's exact batch size (SmolLM2 on the
    CPU: batches up to 63 rows equal one-token decodes), so everything the caches hold is
    reusable; an explicit -ub is the chunk."""
    gen = SpeculativeGenerator.from_paths(defaults.default_target(), None, draft="none", n_ctx=512, n_threads=2)
    try:
        u, canonical = gen.loop.prefix.shape()
        e = gen.target.max_exact_rows
        assert canonical == (e >= 16) and (u == e if canonical else u == gen.target.n_ubatch)
        chunks = list(gen.loop.prefix.chunks(5, 200))
        assert chunks[0] == (5, u) and all(b - a == u for a, b in chunks[1:-1]) and chunks[-1][1] == 200
    finally:
        gen.close()


# ---------------------------------------------------------------------- moa-cpp chat


def test_cli_chat_turns_equal_fresh_generate(fresh):
    """`moa-cpp chat` with default settings: each turn (the earlier ones reused from the KV
    cache) answers as a fresh `moa-cpp generate --chat --no-draft` of that history does."""
    turns = [USERS[1], FOLLOW, "And a third point?"]
    p = subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", "chat", "-sys", SYSTEM, "-n", str(N), "-t", "2",
                        "-c", "2048", "--chain", "4"], input="\n".join(turns) + "\n/exit\n",
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    hist: list = []
    want = ""
    for u in turns:
        hist.append(u)
        a = fresh(_msgs(*hist))
        hist.append(a)
        want += f"> {u}\n{a}\n"
    assert p.stdout == want + "> /exit\n"
    assert p.stderr.count(" cached)") == 2, p.stderr        # turns 2 and 3 reused the earlier ones


def test_fresh_reference_is_the_cli(fresh):
    """The in-process reference is what `moa-cpp generate --chat --no-draft` prints."""
    p = subprocess.run([sys.executable, "-m", "moa_cpp.cli.main", "generate", "-sys", SYSTEM, "-p", USERS[0], "--chat",
                        "--no-draft", "-n", str(N), "-t", "2", "-c", "2048"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.rstrip("\n") == fresh(_msgs(USERS[0]))


# ---------------------------------------------------------------------- past the first KV block

LONG = ("Here is a note from our team meeting. " + " ".join(
    f"Item {i}: the {w} report is due on day {i + 3}, and {n} will review it before it goes out."
    for i, (w, n) in enumerate([("sales", "Ana"), ("budget", "Ben"), ("hiring", "Chloe"), ("security", "Dev"),
                                ("travel", "Eli"), ("support", "Fay"), ("design", "Gus"), ("legal", "Hana"),
                                ("quality", "Ivan"), ("training", "Jo"), ("vendor", "Kim"), ("roadmap", "Lee"),
                                ("pricing", "Mo"), ("partner", "Nia")])) +
        " Summarize who reviews what, as a short list.")


def _run(gen, msgs, draft, reuse):
    """(tokens, logprob of each) of a greedy generation through the loop, 12 tokens."""
    from moa_cpp.speculative.types import SamplingParams
    from moa_cpp.generator import parse_draft
    ids = gen.encode(msgs, True)
    toks, lps = [], []
    for ev in gen.loop.run(ids, 12, SamplingParams(0.0), parse_draft(draft), 1, reuse=reuse):
        toks += ev.tokens
        lps += [lp.logprob for lp in ev.logprobs]
    return toks, lps, ev.stats.n_cached, len(ids)


@pytest.mark.parametrize("draft", ["none", "chain:4"])
def test_long_prompts_reuse_bit_for_bit(draft):
    """Prompts past 256 positions, where a one-token decode takes other kernels than a batch row
    (the split-KV attention of the CPU): the same prompt again (its last token decoded again, one
    row unless it is moved into a two-row chunk) and the next turn (the earlier answer, decoded
    one token at a time, is not reused past the first KV block) give a fresh prefill's logits
    bit for bit, not only its tokens."""
    gen = SpeculativeGenerator.from_paths(defaults.default_target(), defaults.default_drafter(), n_ctx=2048,
                                          n_threads=2)
    try:
        first = _msgs(LONG)
        a = _run(gen, first, draft, True)
        assert a[3] > 300
        again = _run(gen, first, draft, True)
        assert again[2] >= a[3] - 2                        # the whole prompt but its last token or two
        turn2 = first + [{"role": "assistant", "content": gen.target.detokenize(a[0])},
                         {"role": "user", "content": "Now only the names, please."}]
        b = _run(gen, turn2, draft, True)
        assert b[2] > 256
        fresh_a = _run(gen, first, draft, False)
        fresh_b = _run(gen, turn2, draft, False)
        assert again[:2] == a[:2] == fresh_a[:2]
        assert b[:2] == fresh_b[:2]
    finally:
        gen.close()


def test_settle_makes_a_plain_answer_reusable():
    """Past the first KV block a plain-decoded answer is not reusable as it was written; settling
    between turns (the server after an answer, the chat while the user reads) decodes it again
    in batches, so the next turn reuses the whole conversation and still answers bit for bit as
    a fresh prefill."""
    gen = SpeculativeGenerator.from_paths(defaults.default_target(), None, draft="none", n_ctx=2048, n_threads=2)
    try:
        first = _msgs(LONG)
        a = _run(gen, first, "none", True)
        assert gen.target.lone_row_from is not None
        assert gen.loop.settle() > 0 and gen.target.lone_row_from is None
        turn2 = first + [{"role": "assistant", "content": gen.target.detokenize(a[0])},
                         {"role": "user", "content": "Now only the names, please."}]
        b = _run(gen, turn2, "none", True)
        assert b[2] > a[3]                                  # the earlier answer was reused too
        assert b[:2] == _run(gen, turn2, "none", False)[:2]
    finally:
        gen.close()
