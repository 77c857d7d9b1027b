"""Structured output (issue 25 item 2): llama.cpp's grammar on every verification row.

- Rows: each row of a tree is constrained by the grammar state reached along its own path (a
  fresh llama.cpp grammar advanced token by token is the reference); rows under a draft the
  grammar refuses are left alone; lazily masked greedy rows keep their constrained argmax.
- Greedy: constrained output equals llama-cpp-python's constrained greedy output for the same
  prompt and grammar (JSON, a JSON schema, small GBNF grammars), with chains and trees drafting.
- Sampling: the law of a grammar-constrained sampled answer under speculation equals the exact
  constrained law, enumerated from single decodes (chi-square).
- Python API: ``create_completion(grammar=LlamaGrammar)`` and ``create_chat_completion(
  response_format=...)`` give llama-cpp-python's text; bad grammars are ValueErrors.
"""
from __future__ import annotations

import json

import llama_cpp
import numpy as np
import pytest
from llama_cpp.llama_grammar import JSON_GBNF, LlamaGrammar
from scipy.stats import chisquare

from moa_cpp.models import defaults
from moa_cpp.speculative.grammar import Grammar, constrain_rows
from moa_cpp.speculative.types import DraftConfig, Proposal, SamplingParams
from moa_cpp.speculative.verify import probs_from_logits
from moa_cpp.testing.helpers import drafting_default_generator
from moa_cpp.structured import StructuredOutputError, grammar_for_json_schema, request_grammar

pytestmark = pytest.mark.model

N_CTX = 512
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
GRAMMARS = {
    "json": JSON_GBNF,
    "schema": grammar_for_json_schema(SCHEMA),
    "yesno": 'root ::= ("yes" | "no") "." ',
    "list": 'root ::= ("- " [a-z ]+ "\\n"){3}',
}
PROMPTS = ["Describe a cat as JSON with its name and age.", "Q: Is the sky blue? Answer, then explain.\nA:",
           "Three fruits:\n"]


@pytest.fixture(scope="module")
def gen():
    g = drafting_default_generator(n_ctx=N_CTX, n_threads=2)
    yield g
    g.close()


@pytest.fixture(scope="module")
def llm():
    return llama_cpp.Llama(model_path=defaults.default_target(), n_ctx=N_CTX, n_threads=1, verbose=False,
                           flash_attn=True)


def _tok(gen, s):
    ids = gen.target.tokenize(s, add_bos=False, special=False).tolist()
    assert len(ids) == 1, (s, ids)
    return ids[0]


def _fresh_mask(gen, text, path, row):
    """The reference: a new grammar advanced along ``path`` masks ``row``."""
    g = Grammar.compile(gen.target, text)
    for t in path:
        assert g.allows(t)
        g.accept(t)
    out = np.array(row, np.float32)
    g.mask(out)
    g.close()
    return out


def test_tree_rows_follow_their_own_paths(gen):
    text = 'root ::= "ab" "c" | "xy" "z"'
    a, b, c, x, y, q = (_tok(gen, s) for s in "abcxyq")
    # root -> a (0), x (1), q (2: refused); a -> b (3), y (5: refused); x -> y (4)
    prop = Proposal(np.array([a, x, q, b, y, y], np.int32), np.array([-1, -1, -1, 0, 1, 0], np.int32),
                    np.array([1, 1, 1, 2, 2, 2], np.int32))
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(7, gen.target.n_vocab)).astype(np.float32)
    state = Grammar.compile(gen.target, text)
    out = constrain_rows(logits, state, greedy=False, proposal=prop)
    paths = {0: [], 1: [a], 2: [x], 4: [a, b], 5: [x, y]}
    for r, path in paths.items():
        ref = _fresh_mask(gen, text, path, logits[r])
        np.testing.assert_array_equal(out[r], ref)
        assert np.isfinite(ref).sum() < 50          # the grammar really constrains the row
    # row 1 (after "a") allows "b" and refuses "x"; rows under refused drafts are left as they were
    assert np.isfinite(out[1, b]) and not np.isfinite(out[1, x])
    np.testing.assert_array_equal(out[3], logits[3])
    np.testing.assert_array_equal(out[6], logits[6])
    # the generation's own state is not advanced by constraining
    assert state.allows(a) and state.allows(x) and not state.allows(b)
    # greedy: a row whose argmax the grammar allows is left alone, others get the constrained argmax
    g_logits = logits.copy()
    g_logits[0, a] = 50.0                                     # allowed at the root
    g_logits[1, x] = 50.0                                     # refused after "a"
    g_out = constrain_rows(g_logits, state, greedy=True, proposal=prop)
    np.testing.assert_array_equal(g_out[0], g_logits[0])
    assert int(np.argmax(g_out[1])) == int(np.argmax(_fresh_mask(gen, text, [a], g_logits[1])))
    state.close()


def test_bad_grammars_are_value_errors(gen):
    for bad in ("root ::= foo", "root ::= (", "", "x ::= \"a\""):
        with pytest.raises(ValueError, match="grammar"):
            Grammar.compile(gen.target, bad).close()
    with pytest.raises(ValueError, match="grammar"):
        gen.generate("hi", max_tokens=2, grammar="root ::= [")
    with pytest.raises(StructuredOutputError, match="response_format"):
        request_grammar(response_format={"type": "xml"})
    with pytest.raises(StructuredOutputError, match="give one of them"):
        request_grammar(grammar='root ::= "a"', response_format={"type": "json_object"})
    with pytest.raises(StructuredOutputError, match="json_schema"):
        request_grammar(json_schema="{not json")


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_greedy_equals_llama_cpp_python(gen, llm, name):
    text = GRAMMARS[name]
    drafted = 0
    for prompt in PROMPTS:
        ref = llm.create_completion(prompt, max_tokens=40, temperature=0,
                                    grammar=LlamaGrammar.from_string(text, verbose=False))["choices"][0]
        free = gen.generate(prompt, max_tokens=40).text
        for draft in ("chain:4", "tree:4,4,16"):
            r = gen.generate(prompt, max_tokens=40, draft=draft, grammar=text)
            assert r.text == ref["text"], (prompt, draft)
            assert r.finish_reason == ref["finish_reason"]
            drafted += r.stats.drafted
        if name in ("json", "schema") and ref["finish_reason"] == "stop":
            obj = json.loads(ref["text"])
            if name == "schema":
                assert set(obj) == {"name", "age"} and isinstance(obj["age"], int)
        assert free != ref["text"] or name == "json"      # the grammar changes what the model says
    assert drafted > 0


MAX_DEPTH = 8


def _exact_law(gen, prompt_ids, text, sp, max_depth=MAX_DEPTH):
    """{token tuple: probability} of every complete constrained answer (EOG ends it), by DFS over
    single decodes of every prefix; answers longer than ``max_depth`` tokens are lumped (None)."""
    from moa_cpp.speculative.loop import _eog_masked
    tgt = gen.target
    law: dict = {}

    def row(prefix):
        tgt.clear()
        ids = list(prompt_ids) + list(prefix)
        return tgt.decode(np.array(ids, np.int32), np.arange(len(ids), dtype=np.int32), logits="last")[-1]

    def walk(prefix, state, p):
        r = _eog_masked(row(prefix)[None], tgt, sp)[0].copy()
        state.mask(r)
        probs = probs_from_logits(r, sp)
        for t in np.flatnonzero(probs > 0):
            pt = p * float(probs[t])
            if tgt.is_eog(int(t)):
                law[tuple(prefix)] = law.get(tuple(prefix), 0.0) + pt
            elif len(prefix) + 1 >= max_depth:
                law[None] = law.get(None, 0.0) + pt
            else:
                nxt = state.clone()
                nxt.accept(int(t))
                walk(prefix + [int(t)], nxt, pt)
                nxt.close()

    walk([], Grammar.compile(tgt, text), 1.0)
    return law


@pytest.mark.slow
def test_sampling_law_is_the_constrained_law(gen):
    """Speculative sampling under a grammar: answers drawn with drafting (chains verified against
    grammar-masked rows) follow the exact constrained law. Power (mutations run once): draft rows
    constrained by the root's state instead of their path's put answers outside the grammar
    (caught by the answer check); draft rows left unmasked change the law (p < 1e-3)."""
    # several tokens with a choice at each: draft rows at depth >= 2 decide part of the law
    text = 'root ::= ("yes" | "no") ("," | ".") (" " ("it" | "so" | "ok"))? "!"'
    prompt = gen.target.tokenize("Rain tomorrow?\nA:", add_bos=True, special=False).tolist()
    sp = SamplingParams(1.5, top_k=4, grammar=text)
    law = _exact_law(gen, prompt, text, sp)
    keys = sorted(law, key=lambda k: -law[k])
    assert abs(sum(law.values()) - 1) < 1e-4 and len(keys) >= 3
    n = 160
    counts = dict.fromkeys(keys, 0)
    drafted = accepted = 0
    for seed in range(n):
        sp_i = SamplingParams(1.5, top_k=4, seed=seed, grammar=text)
        toks: list = []
        for ev in gen.loop.run(prompt, 12, sp_i, DraftConfig("chain", chain=3)):
            toks += ev.tokens
        drafted += ev.stats.drafted
        accepted += ev.stats.accepted
        # every answer is a complete one the grammar allows (or one of the lumped long ones)
        key = tuple(toks) if tuple(toks) in law else (None if len(toks) >= MAX_DEPTH - 1 else "bad")
        assert key in counts, (gen.target.detokenize(toks), ev.stats.finish_reason)
        counts[key] += 1
    assert drafted > n and accepted > 0
    # merge cells with expected count < 5 (chi-square's rule of thumb)
    exp = np.array([law[k] * n for k in keys])
    obs = np.array([counts[k] for k in keys], float)
    small = exp < 5
    exp = np.append(exp[~small], exp[small].sum()) if small.any() else exp
    obs = np.append(obs[~small], obs[small].sum()) if small.any() else obs
    assert chisquare(obs, exp).pvalue > 1e-3


def test_python_api_structured_output(gen, llm):
    msgs = [{"role": "user", "content": "Give me a JSON object describing a dog."}]
    for rf in ({"type": "json_object"}, {"type": "json_object", "schema": SCHEMA}):
        ref = llm.create_chat_completion(msgs, temperature=0, max_tokens=48, response_format=rf)
        r = gen.create_chat_completion(msgs, temperature=0, max_tokens=48, response_format=rf)
        assert r["choices"][0]["message"]["content"] == ref["choices"][0]["message"]["content"]
    # OpenAI's json_schema shape (llama-cpp-python 0.3.36 ignores it): the same as the schema above
    r2 = gen.create_chat_completion(msgs, temperature=0, max_tokens=48,
                                    response_format={"type": "json_schema",
                                                     "json_schema": {"name": "dog", "schema": SCHEMA}})
    assert r2["choices"][0]["message"]["content"] == r["choices"][0]["message"]["content"]
    g = LlamaGrammar.from_string(GRAMMARS["yesno"], verbose=False)
    ref = llm.create_completion("Is water wet?", temperature=0, max_tokens=8, grammar=g)
    r = gen.create_completion("Is water wet?", temperature=0, max_tokens=8, grammar=g)
    assert r["choices"][0]["text"] == ref["choices"][0]["text"] and r["choices"][0]["text"] in ("yes.", "no.")
    chunks = list(gen.create_completion("Is water wet?", temperature=0, max_tokens=8, grammar=g, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == r["choices"][0]["text"]
    with pytest.raises(ValueError, match="grammar"):
        gen.create_completion("x", max_tokens=2, grammar=LlamaGrammar.from_string("root ::= nothing"))
    with pytest.raises(ValueError, match="response_format"):
        gen.create_chat_completion(msgs, max_tokens=2, response_format={"type": "yaml"})
