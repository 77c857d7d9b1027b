"""Tools / function calling (issue 25 item 6): rendered by the GGUF's chat template, forced calls
constrained by llama.cpp's grammar (equal to llama-cpp-python's), "required" and "auto" calls
parsed from what the template family writes; tool results go back through the template. On
Qwen2.5-Coder-0.5B (its template renders tools) in Python and through `moa-cpp serve` with the
`openai` client, and refusals where the template cannot (SmolLM2)."""
from __future__ import annotations

import json

import llama_cpp
import pytest

from moa_cpp import SpeculativeGenerator
from moa_cpp.models import defaults
from moa_cpp.structured import StructuredOutputError
from moa_cpp.tools import parse_calls, plan, template_messages

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
TOOLS = [WEATHER, TIME]
FORCE = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_parse_calls():
    hermes = 'Let me check.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n' \
             '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
    assert parse_calls(hermes) == ("Let me check.", [{"name": "f", "arguments": '{"a": 1}'},
                                                      {"name": "g", "arguments": "{}"}])
    assert parse_calls('{"name": "f", "parameters": {"x": "y"}}') == (None, [{"name": "f", "arguments": '{"x": "y"}'}])
    assert parse_calls('<|python_tag|>{"name": "f", "arguments": "{}"}') == (None, [{"name": "f", "arguments": "{}"}])
    assert parse_calls('```json\n{"name": "f", "arguments": {}}\n```')[1] == [{"name": "f", "arguments": "{}"}]
    for text in ("Paris is sunny.", '{"city": "Paris"}', "<tool_call>not json</tool_call>", "{broken"):
        assert parse_calls(text) == (text, [])


def test_plan_refusals():
    jinja_with_tools = "{% if tools %}{{ tools }}{% endif %}{{ messages }}"
    assert plan(TOOLS, None, jinja_with_tools).parse
    assert plan(TOOLS, "none", jinja_with_tools).tools is None
    assert plan(TOOLS, FORCE, "{{ messages }}").forced == "get_weather"       # forced: any template
    for tools, choice, template, field in (
            (TOOLS, "auto", "{{ messages }}", "tool_choice"),                  # the template ignores tools
            (TOOLS, {"type": "function", "function": {"name": "nope"}}, jinja_with_tools, "tool_choice"),
            (None, "required", jinja_with_tools, "tool_choice"),
            ([{"type": "function"}], None, jinja_with_tools, "tools"),
            ([{"type": "function", "function": {"name": "f", "parameters": 3}}], None, jinja_with_tools, "tools"),
            (TOOLS, "sometimes", jinja_with_tools, "tool_choice")):
        with pytest.raises(StructuredOutputError) as e:
            plan(tools, choice, template)
        assert e.value.field == field


@pytest.fixture(scope="module")
def qwen(qwen05b_path):
    g = SpeculativeGenerator.from_paths(str(qwen05b_path), None, n_ctx=2048, n_threads=2)
    yield g
    g.close()


@pytest.mark.model
def test_python_api_tools(qwen, qwen05b_path):
    llm = llama_cpp.Llama(model_path=str(qwen05b_path), n_ctx=2048, n_threads=2, verbose=False, flash_attn=True)
    ref = llm.create_chat_completion(ASK, tools=TOOLS, tool_choice=FORCE, temperature=0, max_tokens=48)
    r = qwen.create_chat_completion(ASK, tools=TOOLS, tool_choice=FORCE, temperature=0, max_tokens=48)
    rm, refm = r["choices"][0]["message"], ref["choices"][0]["message"]
    assert rm["tool_calls"][0]["function"] == refm["tool_calls"][0]["function"]          # llama-cpp-python's call
    assert rm["content"] is None and r["choices"][0]["finish_reason"] == "tool_calls"
    assert json.loads(rm["tool_calls"][0]["function"]["arguments"])["city"]
    # "required" and "auto": the model's own call, parsed
    for choice in ("required", None):
        c = qwen.create_chat_completion(ASK, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=64)
        call = c["choices"][0]["message"]["tool_calls"][0]
        assert call["function"]["name"] == "get_weather" and c["choices"][0]["finish_reason"] == "tool_calls"
        assert "Paris" in json.loads(call["function"]["arguments"])["city"]
    # the tool's result goes back through the template; the answer is content
    history = ASK + [rm, {"role": "tool", "tool_call_id": rm["tool_calls"][0]["id"], "content": "18 C, sunny"}]
    prompt = qwen.target.apply_chat_template(template_messages(history), tools=TOOLS)
    assert "<tool_response>\n18 C, sunny" in prompt and '<tool_call>\n{"name": "get_weather", "arguments": {"city": ' in prompt
    fin = qwen.create_chat_completion(history, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=32)
    assert fin["choices"][0]["message"]["content"] and "tool_calls" not in fin["choices"][0]["message"]
    chunks = list(qwen.create_chat_completion(ASK, tools=TOOLS, tool_choice=FORCE, temperature=0, max_tokens=48,
                                              stream=True))
    deltas = [ch["choices"][0]["delta"] for ch in chunks]
    assert deltas[1]["tool_calls"][0]["function"] == rm["tool_calls"][0]["function"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.model
def test_server_tools(qwen05b_path, qwen):
    import openai

    from moa_cpp.testing.server_proc import ServerProc
    srv = ServerProc("-m", str(qwen05b_path), "--draft", "none", "--n-ctx", "2048")
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=300)
        r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=FORCE, temperature=0,
                                           max_tokens=48)
        ref = qwen.create_chat_completion(ASK, tools=TOOLS, tool_choice=FORCE, temperature=0, max_tokens=48)
        call = r.choices[0].message.tool_calls[0]
        assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
        assert call.function.arguments == ref["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        auto = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, temperature=0, max_tokens=64)
        assert auto.choices[0].message.tool_calls[0].function.name == "get_weather"
        # streamed: the call arrives whole, as one tool_calls delta
        calls = [c.choices[0].delta.tool_calls for c in client.chat.completions.create(
            model="m", messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=64, stream=True)
            if c.choices and c.choices[0].delta.tool_calls]
        assert len(calls) == 1 and calls[0][0].function.name == "get_weather"
        # the tool result, then an answer in words
        history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                         {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
        fin = client.chat.completions.create(model="m", messages=history, tools=TOOLS, temperature=0, max_tokens=32)
        assert fin.choices[0].message.content
        with pytest.raises(openai.BadRequestError, match="tool_choice"):
            client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, temperature=0, max_tokens=8,
                                           tool_choice={"type": "function", "function": {"name": "nope"}})
    finally:
        assert srv.terminate() == 0


@pytest.mark.model
def test_template_without_tools_refuses_auto():
    g = SpeculativeGenerator.from_paths(defaults.default_target(), None, n_ctx=512, n_threads=2)
    try:
        with pytest.raises(ValueError, match="does not render tools"):
            g.create_chat_completion(ASK, tools=TOOLS, max_tokens=4)
        r = g.create_chat_completion(ASK, tools=TOOLS, tool_choice=FORCE, temperature=0, max_tokens=24)
        assert r["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    finally:
        g.close()
