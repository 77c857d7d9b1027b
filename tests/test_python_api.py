"""The llama-cpp-python-shaped Python API on the real default model (SmolLM2-135M-Instruct with its
MoA drafter): ``create_chat_completion`` and ``create_completion`` give llama-cpp-python's own
greedy text, usage and response shapes, stream the same text, and refuse (ValueError) every
llama-cpp-python argument moa_cpp does not implement unless it is at a value that changes
nothing; an unknown keyword is a TypeError, as in llama-cpp-python."""
from __future__ import annotations

import inspect

import llama_cpp
import pytest

from moa_cpp import SpeculativeGenerator
from moa_cpp.models import defaults
from moa_cpp.testing.helpers import drafting_default_generator
from moa_cpp.llama_compat import llama_sampling as _llama_sampling

pytestmark = pytest.mark.model

N_CTX = 512
MAX_TOKENS = 24
MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "List three colors."}]
PROMPT = "Q: Name three colors.\nA:"

# what moa_cpp implements; every other argument of llama-cpp-python's signature is refused
IMPLEMENTED = {"prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream",
               "model", "ignore_eos", "logprobs", "top_logprobs", "min_p", "repeat_penalty", "frequency_penalty",
               "presence_penalty", "logit_bias", "grammar", "response_format", "tools", "tool_choice", "functions",
               "function_call"}
# a value that changes the output in llama-cpp-python, per refused argument
UNSUPPORTED = {
    "suffix": "!", "typical_p": 0.9, "echo": True, "tfs_z": 0.9, "mirostat_mode": 2, "mirostat_tau": 4.0,
    "mirostat_eta": 0.2, "stopping_criteria": llama_cpp.StoppingCriteriaList([lambda ids, logits: False]),
    "logits_processor": llama_cpp.LogitsProcessorList([lambda ids, logits: logits]),
}
UNSUPPORTED_CHAT = {
    **{k: v for k, v in UNSUPPORTED.items() if k not in ("suffix", "echo", "stopping_criteria")},
}
# no-op values accepted besides the defaults
EXTRA_NOOP: dict = {}
EXTRA_NOOP_CHAT: dict = {}


@pytest.fixture(scope="module")
def gen():
    g = drafting_default_generator(n_ctx=N_CTX, n_threads=1)
    yield g
    g.close()


@pytest.fixture(scope="module")
def llm():
    return llama_cpp.Llama(model_path=defaults.default_target(), n_ctx=N_CTX, n_threads=1, verbose=False,
                           flash_attn=True)


@pytest.fixture(scope="module")
def chat(gen):
    return gen.create_chat_completion(MSGS, temperature=0, max_tokens=MAX_TOKENS)


def test_signatures_are_llama_cpp_pythons():
    """Same arguments, order and defaults as llama-cpp-python 0.3.36, plus moa_cpp's ignore_eos."""
    for name in ("create_completion", "create_chat_completion"):
        ref = dict(inspect.signature(getattr(llama_cpp.Llama, name)).parameters)
        ours = dict(inspect.signature(getattr(SpeculativeGenerator, name)).parameters)
        assert ours.pop("ignore_eos").default is False
        assert [(p.name, p.default) for p in ours.values()] == [(p.name, p.default) for p in ref.values()]
    # the tables below cover every argument moa_cpp does not implement
    assert set(inspect.signature(SpeculativeGenerator.create_completion).parameters) - IMPLEMENTED - {"self"} \
        == set(UNSUPPORTED)
    assert set(inspect.signature(SpeculativeGenerator.create_chat_completion).parameters) - IMPLEMENTED - {"self"} \
        == set(UNSUPPORTED_CHAT)


def test_chat_greedy_equals_llama_cpp_python(chat, llm, gen):
    ref = llm.create_chat_completion(MSGS, temperature=0, max_tokens=MAX_TOKENS)
    assert chat["choices"][0]["message"] == ref["choices"][0]["message"]
    assert chat["choices"][0]["finish_reason"] == ref["choices"][0]["finish_reason"]
    assert chat["usage"] == ref["usage"]
    u = chat["usage"]
    assert u["prompt_tokens"] == len(gen.encode(MSGS, chat=True)) == chat["moa"]["n_prompt"]
    assert u["completion_tokens"] == chat["moa"]["n_generated"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert chat["moa"]["drafted"] > 0                    # it went through speculation
    assert set(chat) == set(ref) | {"moa"} and set(chat["choices"][0]) == set(ref["choices"][0])
    assert chat["object"] == "chat.completion" and chat["id"].startswith("chatcmpl-")
    assert isinstance(chat["created"], int) and chat["model"] == str(gen.target.path)


def test_chat_text_parts_and_model_name(gen, chat):
    parts = [{"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
             {"role": "user", "content": [{"type": "text", "text": "List three "}, {"type": "text", "text": "colors."}]}]
    r = gen.create_chat_completion(parts, temperature=0, max_tokens=MAX_TOKENS, model="my-model")
    assert r["choices"][0]["message"]["content"] == chat["choices"][0]["message"]["content"]
    assert r["model"] == "my-model"


def test_chat_stream(gen, chat, llm):
    chunks = list(gen.create_chat_completion(MSGS, temperature=0, max_tokens=MAX_TOKENS, stream=True))
    ref = list(llm.create_chat_completion(MSGS, temperature=0, max_tokens=MAX_TOKENS, stream=True))
    first, last, middle = chunks[0]["choices"][0], chunks[-1]["choices"][0], [c["choices"][0] for c in chunks[1:-1]]
    assert first["delta"] == {"role": "assistant"} and first["finish_reason"] is None
    assert last["delta"] == {} and last["finish_reason"] == chat["choices"][0]["finish_reason"]
    assert all(set(c["delta"]) == {"content"} and c["finish_reason"] is None for c in middle)
    text = "".join(c["delta"]["content"] for c in middle)
    assert text == chat["choices"][0]["message"]["content"]
    assert text == "".join(c["choices"][0]["delta"].get("content", "") for c in ref)
    for ours, theirs in ((chunks[0], ref[0]), (chunks[-1], ref[-1])):   # llama-cpp-python's chunk shape
        assert {k: v for k, v in ours.items() if k not in ("id", "created")} == \
            {k: v for k, v in theirs.items() if k not in ("id", "created")}
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_completion_greedy_equals_llama_cpp_python(gen, llm):
    r = gen.create_completion(PROMPT, temperature=0, max_tokens=MAX_TOKENS)
    ref = llm.create_completion(PROMPT, temperature=0, max_tokens=MAX_TOKENS)
    assert r["choices"][0]["text"] == ref["choices"][0]["text"]
    assert r["choices"][0]["finish_reason"] == ref["choices"][0]["finish_reason"]
    assert r["usage"] == ref["usage"]
    assert set(r) == set(ref) | {"moa"} and r["object"] == "text_completion" and r["id"].startswith("cmpl-")
    chunks = list(gen.create_completion(PROMPT, temperature=0, max_tokens=MAX_TOKENS, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == r["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == r["choices"][0]["finish_reason"]


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_CHAT))
def test_chat_refuses_unsupported(gen, name):
    msg = rf"create_chat_completion\({name}=.*\): not supported by moa_cpp yet"
    with pytest.raises(ValueError, match=msg):
        gen.create_chat_completion(MSGS, max_tokens=1, **{name: UNSUPPORTED_CHAT[name]})
    with pytest.raises(ValueError, match=msg):                  # before any chunk is asked for
        gen.create_chat_completion(MSGS, max_tokens=1, stream=True, **{name: UNSUPPORTED_CHAT[name]})


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_completion_refuses_unsupported(gen, name):
    with pytest.raises(ValueError, match=rf"create_completion\({name}=.*\): not supported by moa_cpp yet"):
        gen.create_completion(PROMPT, max_tokens=1, **{name: UNSUPPORTED[name]})


@pytest.mark.parametrize("method, unsupported, extra", [
    ("create_chat_completion", UNSUPPORTED_CHAT, EXTRA_NOOP_CHAT),
    ("create_completion", UNSUPPORTED, EXTRA_NOOP),
])
def test_defaults_and_noop_values_pass(gen, method, unsupported, extra):
    params = inspect.signature(getattr(SpeculativeGenerator, method)).parameters
    first = MSGS if method == "create_chat_completion" else PROMPT
    for kw in ({k: params[k].default for k in unsupported}, extra):
        r = getattr(gen, method)(first, max_tokens=1, temperature=0, model="m", **kw)
        assert r["usage"]["completion_tokens"] == 1 and r["model"] == "m"


def test_unknown_keyword_is_type_error(gen):
    with pytest.raises(TypeError, match="n_predict"):
        gen.create_completion(PROMPT, n_predict=4)
    with pytest.raises(TypeError, match="n_predict"):
        gen.create_chat_completion(MSGS, n_predict=4)


@pytest.mark.parametrize("messages", [[], "hi", [{"content": "no role"}],
                                      [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]])
def test_chat_bad_messages(gen, messages):
    with pytest.raises(ValueError, match="create_chat_completion"):
        gen.create_chat_completion(messages, max_tokens=1)


def test_negative_temperature_is_llama_cpp_pythons():
    """llama-cpp-python samples from what the penalties leave at temperature < 0 (no top-k, top-p,
    min-p or temperature)."""
    pen = dict(repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, repeat_last_n=64, logit_bias={})
    assert _llama_sampling(-1.0, 40, 0.95, 0.05) == dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, **pen)
    assert _llama_sampling(0.0, 40, 0.95, 0.05) == dict(temperature=0.0, top_k=40, top_p=0.95, min_p=0.05, **pen)


def test_max_tokens_up_to_the_context(gen):
    """llama-cpp-python's limit: None or <= 0 is up to the end of the context, never past it."""
    room = gen.target.n_ctx - 10
    assert [gen._token_limit(m, 10) for m in (None, 0, -1, room + 1, 10 ** 6, 5)] == [room] * 5 + [5]
    with pytest.raises(ValueError, match="does not fit the context"):
        gen.create_completion([1] * gen.target.n_ctx, max_tokens=None)


def test_completion_logprobs_equal_llama_cpp_pythons(gen, llm):
    """logprobs=N: the same tokens, log-probabilities (to 1e-4: its float32 log-softmax) and
    alternatives as llama-cpp-python's own (which needs logits_all); from verification rows."""
    ref_llm = llama_cpp.Llama(model_path=defaults.default_target(), n_ctx=N_CTX, n_threads=1, verbose=False,
                              flash_attn=True, logits_all=True)
    ref = ref_llm.create_completion(PROMPT, temperature=0, max_tokens=MAX_TOKENS, logprobs=2)["choices"][0]
    got = gen.create_completion(PROMPT, temperature=0, max_tokens=MAX_TOKENS, logprobs=2)
    ours = got["choices"][0]["logprobs"]
    assert got["choices"][0]["text"] == ref["text"]
    assert ours["tokens"] == ref["logprobs"]["tokens"]
    assert ours["token_logprobs"] == pytest.approx(ref["logprobs"]["token_logprobs"], abs=1e-4)
    for a, b in zip(ours["top_logprobs"], ref["logprobs"]["top_logprobs"]):
        assert a.keys() == b.keys() and list(a.values()) == pytest.approx(list(b.values()), abs=1e-4)
    chunks = list(gen.create_completion(PROMPT, temperature=0, max_tokens=MAX_TOKENS, logprobs=2, stream=True))
    assert [t for c in chunks if c["choices"][0]["logprobs"] for t in c["choices"][0]["logprobs"]["tokens"]] \
        == ours["tokens"]


def test_chat_logprobs(gen, chat):
    r = gen.create_chat_completion(MSGS, temperature=0, max_tokens=MAX_TOKENS, logprobs=True, top_logprobs=2)
    content = r["choices"][0]["logprobs"]["content"]
    assert r["choices"][0]["message"]["content"] == chat["choices"][0]["message"]["content"]
    assert bytes(b for e in content for b in e["bytes"]).decode() == r["choices"][0]["message"]["content"]
    assert all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["token"] == e["token"] for e in content)
    streamed = [e for c in gen.create_chat_completion(MSGS, temperature=0, max_tokens=MAX_TOKENS, logprobs=True,
                                                      top_logprobs=2, stream=True)
                if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == content
    with pytest.raises(ValueError, match="top_logprobs"):
        gen.create_chat_completion(MSGS, max_tokens=2, top_logprobs=2)


@pytest.mark.parametrize("kw", [dict(repeat_penalty=1.5), dict(frequency_penalty=0.8, presence_penalty=0.5),
                                dict(logit_bias={1073: -100.0, 30: 4.0}),
                                dict(repeat_penalty=1.3, presence_penalty=0.4, logit_bias={28: 2.0})],
                         ids=["repeat", "freq+presence", "bias", "all"])
def test_greedy_with_penalties_and_bias_equals_llama_cpp_python(gen, llm, kw):
    """Penalties and logit bias change greedy decoding (as in llama.cpp); each verification row
    carries its own history (the path to it), so speculation stays token-identical to
    llama-cpp-python's own greedy decoding with the same settings."""
    prompt = "List the numbers one, two, three, one, two, three, one,"
    ref = llm.create_completion(prompt, temperature=0, max_tokens=32, **kw)["choices"][0]["text"]
    plain = llm.create_completion(prompt, temperature=0, max_tokens=32)["choices"][0]["text"]
    got = gen.create_completion(prompt, temperature=0, max_tokens=32, **kw)
    assert ref != plain                                        # the settings do change the answer
    assert got["choices"][0]["text"] == ref and got["moa"]["target_calls"] < got["usage"]["completion_tokens"]


def test_typed_request_is_the_keyword_api(gen):
    """The server's path: one typed GenerationRequest (sampling checked once by sampling_params,
    the draft setting parsed once) gives what the keyword API gives; a bad value is refused when
    the request is typed, before anything runs."""
    from moa_cpp.generator import GenerationRequest
    from moa_cpp.speculative.draft_setting import parse_draft
    prompt = "List three colors."
    for kw in (dict(temperature=0.0), dict(temperature=0.8, top_k=40, top_p=0.95, seed=7, min_p=0.05)):
        want = gen.generate(prompt, chat=True, max_tokens=24, draft="chain:3", **kw)
        req = GenerationRequest(prompt, 24, gen.sampling_params(**kw), parse_draft("chain:3"), chat=True)
        pieces = list(gen.stream_request(req))
        assert [t for p in pieces for t in p.tokens] == want.tokens
        assert "".join(p.text for p in pieces) == want.text
        # the statistics travel typed on the last piece only (no side attribute to read)
        assert [p.stats is not None for p in pieces] == [False] * (len(pieces) - 1) + [True]
        st = pieces[-1].stats
        assert (st.finish_reason, st.target_calls, st.accepted) == (want.stats.finish_reason,
                                                                    want.stats.target_calls, want.stats.accepted)
    stopped = list(gen.stream_steps(prompt, chat=True, max_tokens=24, stop=[" "]))   # a stop string ends it
    assert stopped[-1].stats.finish_reason == "stop" and all(p.stats is None for p in stopped[:-1])
    with pytest.raises(ValueError, match="out of range"):
        gen.sampling_params(temperature=0.8, top_p=0.0)
