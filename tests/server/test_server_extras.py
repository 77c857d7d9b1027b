"""What llama.cpp clients and browser pages call besides the completion routes (issue 25 item 5),
on a real `moa-cpp serve` over loopback: llama-server's /tokenize, /detokenize, /apply-template
(checked against llama-cpp-python's tokenizer and the chat route's own prompt count), /metrics
in Prometheus format (its counters equal the responses' usage and speculation stats), CORS
(preflight without a key, only listed origins, no credentials), and llama.cpp's request fields
(hints and no-op values accepted, unknown fields as unknown), and structured output
(response_format json_object / json_schema through the openai client, llama.cpp's grammar and
json_schema fields, streamed too) equal to the Python API's constrained output."""
from __future__ import annotations

import time

import pytest

from moa_cpp.testing.server_proc import ServerProc

pytestmark = pytest.mark.model
pytest.importorskip("prometheus_client")

KEY = "extras-key-1"
ORIGIN = "http://page.example:3000"
CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name two colors."}],
        "max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    keys = tmp_path_factory.mktemp("k") / "keys"
    keys.write_text(KEY + "\n")
    keys.chmod(0o600)
    srv = ServerProc("--api-key-file", str(keys), "--metrics", "--cors-origins", ORIGIN, "--draft", "chain:3")
    yield srv
    assert srv.terminate() == 0


@pytest.fixture(scope="module")
def vocab():
    from llama_cpp import Llama

    from moa_cpp.models import defaults
    return Llama(model_path=defaults.default_target(), vocab_only=True, verbose=False)


def test_tokenize_detokenize_as_llama_server(server, vocab):
    text = "Hello world! Ünïcode and <|im_start|> tokens, 123."
    st, _, r = server.post("/tokenize", {"content": text}, key=KEY)
    assert st == 200
    assert r["tokens"] == vocab.tokenize(text.encode(), add_bos=False, special=True)   # parse_special defaults on
    st, _, r2 = server.post("/tokenize", {"content": text, "parse_special": False, "add_special": True}, key=KEY)
    assert st == 200 and r2["tokens"] == vocab.tokenize(text.encode(), add_bos=True, special=False)
    st, _, p = server.post("/tokenize", {"content": text, "with_pieces": True}, key=KEY)
    assert st == 200 and [t["id"] for t in p["tokens"]] == r["tokens"]
    # pieces are text, or byte lists where a piece is not UTF-8 alone; together they are the input
    raw = b"".join(t["piece"].encode() if isinstance(t["piece"], str) else bytes(t["piece"]) for t in p["tokens"])
    assert raw.decode() == text
    st, _, d = server.post("/detokenize", {"tokens": r["tokens"]}, key=KEY)
    assert st == 200 and d["content"] == text
    # ids outside the vocabulary would abort llama.cpp: refused, and the server lives on
    for bad in ([vocab.n_vocab()], [-1], ["x"], 5):
        st, _, e = server.post("/detokenize", {"tokens": bad}, key=KEY)
        assert st == 400 and e["error"]["param"].startswith("tokens"), (bad, e)
    assert server.post("/tokenize", {"content": "x", "extra": 1}, key=KEY)[0] == 400
    assert server.post("/tokenize", {"content": "x"})[0] == 401
    assert server.health() == 200


def test_apply_template_is_what_chat_completions_decodes(server):
    st, _, t = server.post("/apply-template", {"messages": CHAT["messages"]}, key=KEY)
    assert st == 200 and "Name two colors." in t["prompt"] and "Be brief." in t["prompt"]
    st, _, ids = server.post("/tokenize", {"content": t["prompt"]}, key=KEY)
    st, _, r = server.post("/v1/chat/completions", CHAT, key=KEY)
    assert st == 200 and r["usage"]["prompt_tokens"] == len(ids["tokens"])


def _metrics(server) -> dict:
    from prometheus_client.parser import text_string_to_metric_families
    st, h, raw = server.request("GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert st == 200 and h["content-type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(raw.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_count_what_the_responses_report(server):
    assert server.request("GET", "/metrics")[0] == 401               # behind the key
    before = _metrics(server)
    got = [server.post("/v1/chat/completions", {**CHAT, "max_tokens": n}, key=KEY)[2] for n in (8, 16)]
    got.append(server.post("/v1/completions", {"prompt": "1, 2, 3, 4,", "max_tokens": 10, "temperature": 0},
                           key=KEY)[2])
    after = _metrics(server)

    def delta(name, **labels):
        k = (name, tuple(sorted(labels.items())))
        return after.get(k, 0.0) - before.get(k, 0.0)
    assert delta("llamacpp:tokens_predicted_total") == sum(r["usage"]["completion_tokens"] for r in got)
    assert delta("llamacpp:prompt_tokens_total") == sum(r["usage"]["prompt_tokens"] for r in got)
    assert delta("llamacpp:n_decode_total") >= sum(r["moa"]["target_calls"] for r in got)
    assert delta("moa:requests_total", route="chat", finish_reason="length") + \
        delta("moa:requests_total", route="chat", finish_reason="stop") == 2
    assert delta("moa:requests_total", route="completions", finish_reason="length") + \
        delta("moa:requests_total", route="completions", finish_reason="stop") == 1
    for src in {s for r in got for s in r["moa"]["by_source"]}:
        assert delta("moa:spec_decode_num_draft_tokens_total", proposer=src) == \
            sum(r["moa"]["by_source"].get(src, {}).get("proposed", 0) for r in got)
        assert delta("moa:spec_decode_num_accepted_tokens_total", proposer=src) == \
            sum(r["moa"]["by_source"].get(src, {}).get("accepted", 0) for r in got)
    assert after[("moa:spec_decode_tau", ())] >= 1.0
    # the gauges: a session is given back when its thread lets go, just after the answer
    deadline = time.monotonic() + 10
    while _metrics(server)[("llamacpp:requests_processing", ())] != 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert _metrics(server)[("llamacpp:requests_deferred", ())] == 0


def test_cors_preflight_and_origins(server):
    pre = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    st, h, _ = server.request("OPTIONS", "/v1/chat/completions", headers=pre)        # no key: a preflight has none
    assert st == 200 and h["access-control-allow-origin"] == ORIGIN
    assert "authorization" in h["access-control-allow-headers"].lower()
    assert "access-control-allow-credentials" not in h                             # keys by header, never cookies
    st, h, _ = server.request("OPTIONS", "/v1/chat/completions", headers={**pre, "Origin": "http://evil.example"})
    assert st == 400 and "access-control-allow-origin" not in h
    st, h, r = server.post("/v1/chat/completions", CHAT, key=KEY, headers={"Origin": ORIGIN})
    assert st == 200 and h["access-control-allow-origin"] == ORIGIN
    st, h, _ = server.post("/v1/chat/completions", CHAT, headers={"Origin": ORIGIN})
    assert st == 401                                                               # still needs the key
    st, h, _ = server.post("/v1/chat/completions", CHAT, key=KEY, headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in h                                   # the browser will not read it


def test_llama_cpp_request_fields(server):
    base = server.post("/v1/chat/completions", CHAT, key=KEY)[2]["choices"][0]["message"]["content"]
    hints = {"cache_prompt": True, "n_probs": 0, "repeat_penalty": 1.0, "repeat_last_n": 64, "typical_p": 1.0,
             "tfs_z": 1.0, "mirostat": 0, "top_k": 40, "response_format": {"type": "text"}}
    st, _, r = server.post("/v1/chat/completions", {**CHAT, **hints}, key=KEY)
    assert st == 200 and r["choices"][0]["message"]["content"] == base
    for field, value in (("grammar", 'root ::= ['), ("json_schema", {"type": "object", "properties": 3}),
                         ("response_format", {"type": "yaml"})):
        st, _, e = server.post("/v1/chat/completions", {**CHAT, field: value}, key=KEY)
        assert st == 400 and e["error"]["param"] == field, e
    st, _, e = server.post("/v1/chat/completions", {**CHAT, "grammar": 'root ::= "a"',
                                                    "response_format": {"type": "json_object"}}, key=KEY)
    assert st == 400 and "give one of them" in e["error"]["message"]
    for field, value in (("n_probs", 21), ("repeat_penalty", 0), ("mirostat", 2)):
        st, _, e = server.post("/v1/chat/completions", {**CHAT, field: value}, key=KEY)
        assert st == 400 and e["error"]["param"] == field
    st, _, e = server.post("/v1/chat/completions", {**CHAT, "no_such_field": 1}, key=KEY)
    assert st == 400 and e["error"]["code"] == "unknown_parameter"


def test_serve_takes_llama_cpp_flags(tmp_path):
    """`serve` reads llama.cpp's flags as `generate` does: a --chat-template-file is what
    /apply-template renders and what the chat route decodes (its prompt count)."""
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>")
    srv = ServerProc("--draft", "none", "-fa", "on", "-b", "256", "-ub", "256", "--no-mmap", "-ctk", "f16",
                     "--jinja", "--chat-template-file", str(tpl), "-ngld", "0")
    try:
        st, _, t = srv.post("/apply-template", {"messages": CHAT["messages"]})
        assert st == 200 and t["prompt"] == "<system>Be brief.\n<user>Name two colors.\n<assistant>"
        ids = srv.post("/tokenize", {"content": t["prompt"]})[2]["tokens"]
        st, _, r = srv.post("/v1/chat/completions", CHAT)
        assert st == 200 and r["usage"]["prompt_tokens"] == len(ids)
    finally:
        assert srv.terminate() == 0


def _sse_chunks(server, path, body):
    import json as _json
    c = server.conn()
    try:
        c.request("POST", path, body=_json.dumps({**body, "stream": True}).encode(),
                  headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        raw = c.getresponse().read().decode()
    finally:
        c.close()
    return [_json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]


def test_chat_logprobs_whole_and_streamed(server):
    """OpenAI's chat logprobs: the tokens' bytes concatenate to the answer, each entry's top list is
    sorted and (greedy) led by the token itself; the stream's entries are the whole answer's."""
    body = {**CHAT, "max_tokens": 16, "logprobs": True, "top_logprobs": 3}
    st, _, r = server.post("/v1/chat/completions", body, key=KEY)
    assert st == 200
    text, content = r["choices"][0]["message"]["content"], r["choices"][0]["logprobs"]["content"]
    assert bytes(b for e in content for b in e["bytes"]).decode() == text
    assert len(content) == r["usage"]["completion_tokens"]
    for e in content:
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and e["logprob"] <= 0
        assert e["top_logprobs"][0]["token"] == e["token"] and e["top_logprobs"][0]["logprob"] == e["logprob"]
    chunks = _sse_chunks(server, "/v1/chat/completions", body)
    streamed = [e for c in chunks for ch in c["choices"] if ch.get("logprobs") for e in ch["logprobs"]["content"]]
    assert streamed == content
    assert "".join(ch["delta"].get("content", "") for c in chunks for ch in c["choices"]) == text
    # off by default; llama.cpp's n_probs turns them on
    assert server.post("/v1/chat/completions", CHAT, key=KEY)[2]["choices"][0]["logprobs"] is None
    r2 = server.post("/v1/chat/completions", {**CHAT, "max_tokens": 16, "n_probs": 3}, key=KEY)[2]
    assert r2["choices"][0]["logprobs"]["content"] == content


def test_completion_logprobs_with_offsets_and_a_stop(server):
    body = {"prompt": "1, 2, 3, 4,", "max_tokens": 12, "temperature": 0, "logprobs": 2}
    st, _, r = server.post("/v1/completions", body, key=KEY)
    assert st == 200
    ch = r["choices"][0]
    lp, text = ch["logprobs"], ch["text"]
    assert "".join(lp["tokens"]) == text and len(lp["tokens"]) == r["usage"]["completion_tokens"]
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
    for tok, v, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert top[tok] == v and 1 <= len(top) <= 3 and max(top.values()) == v
    stop = text[len(text) // 2: len(text) // 2 + 2]
    cut = server.post("/v1/completions", {**body, "stop": [stop]}, key=KEY)[2]["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["text"] == text[:text.index(stop)]
    joined = "".join(cut["logprobs"]["tokens"])
    # the tokens whose text starts before the cut: they cover the text, nothing past it starts a token
    assert joined.startswith(cut["text"]) and len(joined) - len(cut["logprobs"]["tokens"][-1]) < len(cut["text"])
    st, _, e = server.post("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, key=KEY)
    assert st == 400 and e["error"]["param"] == "top_logprobs"


def test_penalties_bias_and_min_p_as_llama_cpp_python(server):
    """Greedy with penalties and logit bias: the server's answer (speculative, chain 3) equals
    llama-cpp-python's own with the same settings; min-p and a seed reproduce under sampling."""
    from llama_cpp import Llama

    from moa_cpp.models import defaults
    llm = Llama(model_path=defaults.default_target(), n_ctx=512, n_threads=1, flash_attn=True, verbose=False)
    msgs = [{"role": "user", "content": "Count: one, two, three, one, two, three, one, two,"}]
    kw = {"repeat_penalty": 1.4, "presence_penalty": 0.5, "logit_bias": {"28": 3.0}}
    ref = llm.create_chat_completion(msgs, temperature=0, max_tokens=24,
                                     **{**kw, "logit_bias": {28: 3.0}})["choices"][0]["message"]["content"]
    plain = llm.create_chat_completion(msgs, temperature=0, max_tokens=24)["choices"][0]["message"]["content"]
    st, _, r = server.post("/v1/chat/completions", {"messages": msgs, "temperature": 0, "max_tokens": 24, **kw},
                           key=KEY)
    assert st == 200 and ref != plain and r["choices"][0]["message"]["content"] == ref
    body = {"messages": msgs, "temperature": 1.2, "min_p": 0.2, "seed": 4, "max_tokens": 16}
    a, b = (server.post("/v1/chat/completions", body, key=KEY)[2]["choices"][0]["message"]["content"]
            for _ in range(2))
    assert a == b
    st, _, e = server.post("/v1/chat/completions", {**body, "logit_bias": {"49152": 1}}, key=KEY)
    assert st == 400 and e["error"]["param"] == "logit_bias"


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
          "required": ["city", "population"]}


def test_structured_output(server):
    """OpenAI's response_format through the openai client; llama.cpp's grammar / json_schema
    fields over raw HTTP (completions, streamed): each equals the Python API's constrained
    greedy output (itself llama-cpp-python's: tests/speculative/test_grammar.py)."""
    import json

    import openai

    from moa_cpp import SpeculativeGenerator
    from moa_cpp.models import defaults
    gen = SpeculativeGenerator.from_paths(defaults.default_target(), None, n_ctx=1024, n_threads=1)
    msgs = [{"role": "user", "content": "Describe Paris as JSON."}]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    rf_schema = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
    for rf in ({"type": "json_object"}, rf_schema):
        r = client.chat.completions.create(model="m", messages=msgs, max_tokens=40, temperature=0,
                                           response_format=rf)
        ref = gen.create_chat_completion(msgs, max_tokens=40, temperature=0, response_format=rf)
        assert r.choices[0].message.content == ref["choices"][0]["message"]["content"]
        if r.choices[0].finish_reason == "stop":
            obj = json.loads(r.choices[0].message.content)
            assert rf is not rf_schema or (set(obj) == {"city", "population"} and isinstance(obj["population"], int))
    grammar = 'root ::= ("yes" | "no") "."'
    st, _, r = server.post("/v1/completions", {"prompt": "Is the sea salty?", "max_tokens": 8, "temperature": 0,
                                               "grammar": grammar}, key=KEY)
    ref = gen.create_completion("Is the sea salty?", max_tokens=8, temperature=0, grammar=grammar)
    assert st == 200 and r["choices"][0]["text"] == ref["choices"][0]["text"] in ("yes.", "no.")
    stream = client.completions.create(model="m", prompt="Name a city as JSON:", max_tokens=30, temperature=0,
                                       stream=True, extra_body={"json_schema": SCHEMA})
    text = "".join(c.choices[0].text for c in stream)
    ref = gen.create_completion("Name a city as JSON:", max_tokens=30, temperature=0,
                                grammar=grammar_for(SCHEMA))
    assert text == ref["choices"][0]["text"] and text.startswith("{")
    gen.close()


def grammar_for(schema):
    from moa_cpp.structured import grammar_for_json_schema
    return grammar_for_json_schema(schema)
