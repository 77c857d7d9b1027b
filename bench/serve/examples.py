#!/usr/bin/env python
"""Request/response examples of `moa-cpp serve`'s client-facing features, captured from real
servers on 127.0.0.1 (SmolLM2 with its drafter; tools on Qwen2.5-Coder-0.5B, whose template
renders tools): logprobs, structured output, sampling, prompt-cache reuse, tools, llama-server's
utilities, CORS, /metrics. Writes docs/server-examples.md (answers shortened where long).

    python -m bench.serve examples
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from moa_cpp.testing.server_proc import ServerProc

from bench.common import REPO_ROOT

REPO = REPO_ROOT

MSGS = [{"role": "user", "content": "Name two colors."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


class Capture:
    def __init__(self, srv: ServerProc) -> None:
        self.srv = srv
        self.out: list = []

    def show(self, title: str, method: str, path: str, body=None, headers=None, limit: int = 900):
        st, h, r = self.srv.request(method, path, body, headers)
        req = f"`{method} {path}`" + (f"\n\n```json\n{json.dumps(body)}\n```" if body else "")
        self.out.append(f"### {title}\n\n{req}\n\n-> HTTP {st}")
        if isinstance(r, (dict, list)):
            if isinstance(r, dict):
                r = {k: v for k, v in r.items() if k not in ("id", "created")}
            txt = json.dumps(r)
            self.out.append("```json\n" + (txt[:limit] + (" ..." if len(txt) > limit else "")) + "\n```")
        else:
            self.out.append("```\n" + r.decode()[:limit] + "\n```")
        return st, h, r


def smollm2(cap: Capture) -> None:
    s = cap.show
    s("chat logprobs", "POST", "/v1/chat/completions",
      {"messages": MSGS, "max_tokens": 3, "temperature": 0, "logprobs": True, "top_logprobs": 2})
    s("completions logprobs", "POST", "/v1/completions",
      {"prompt": "1, 2, 3,", "max_tokens": 3, "temperature": 0, "logprobs": 2})
    s("structured output: response_format json_schema", "POST", "/v1/chat/completions",
      {"messages": [{"role": "user", "content": "Describe Paris as JSON."}], "max_tokens": 40, "temperature": 0,
       "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": {
           "type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
           "required": ["city", "population"]}}}})
    s("structured output: llama.cpp grammar", "POST", "/v1/completions",
      {"prompt": "Is the sea salty?", "max_tokens": 8, "temperature": 0, "grammar": 'root ::= ("yes" | "no") "."'})
    s("a grammar llama.cpp cannot parse", "POST", "/v1/completions",
      {"prompt": "x", "max_tokens": 8, "grammar": "root ::= undefined-rule"})
    s("sampling: penalties, bias, min_p", "POST", "/v1/chat/completions",
      {"messages": MSGS, "max_tokens": 12, "temperature": 0, "repeat_penalty": 1.3, "presence_penalty": 0.5,
       "logit_bias": {"28": 2.0}, "min_p": 0.1})
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    st, _, r = s("prompt cache: a chat's first turn", "POST", "/v1/chat/completions",
                 {"messages": chat, "max_tokens": 16, "temperature": 0})
    chat += [r["choices"][0]["message"], {"role": "user", "content": "And of Germany?"}]
    s("prompt cache: the next turn (usage.prompt_tokens_details.cached_tokens)", "POST", "/v1/chat/completions",
      {"messages": chat, "max_tokens": 16, "temperature": 0})
    s("tools on a template that does not render them", "POST", "/v1/chat/completions",
      {"messages": MSGS, "tools": [WEATHER], "max_tokens": 8})
    s("tokenize", "POST", "/tokenize", {"content": "Hello world", "with_pieces": True})
    s("detokenize", "POST", "/detokenize", {"tokens": [19556, 905]})
    s("apply-template", "POST", "/apply-template", {"messages": MSGS})
    _, h, _ = s("CORS preflight (no key)", "OPTIONS", "/v1/chat/completions", None,
                {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"})
    cap.out.append("headers: `" + json.dumps({k: v for k, v in h.items() if k.startswith("access-control")}) + "`")
    st, h, r = cap.srv.request("GET", "/metrics")
    lines = [ln for ln in r.decode().splitlines() if ln and not ln.startswith("#") and ("llamacpp:" in ln or "moa:" in ln)]
    cap.out.append("### /metrics (excerpt)\n\n```\n" + "\n".join(lines[:30]) + "\n```")


def qwen(cap: Capture) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    s = cap.show
    s("tools: forced call (tool_choice names the function)", "POST", "/v1/chat/completions",
      {"messages": ask, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
       "max_tokens": 32, "temperature": 0})
    st, _, r = s("tools: auto (the model's call, parsed)", "POST", "/v1/chat/completions",
                 {"messages": ask, "tools": [WEATHER], "max_tokens": 64, "temperature": 0})
    call = r["choices"][0]["message"]["tool_calls"][0]
    s("tools: the result goes back, the answer is words", "POST", "/v1/chat/completions",
      {"messages": ask + [{"role": "assistant", "content": None, "tool_calls": [call]},
                          {"role": "tool", "tool_call_id": call["id"], "content": "18 C, sunny"}],
       "tools": [WEATHER], "tool_choice": "none", "max_tokens": 32, "temperature": 0})


def captured(examples, *serve_args: str) -> list:
    """The examples ``examples(cap)`` sends to a `moa-cpp serve *serve_args` on loopback."""
    srv = ServerProc(*serve_args)
    try:
        cap = Capture(srv)
        examples(cap)
        return cap.out
    finally:
        srv.terminate()


def main() -> int:
    import argparse

    from moa_cpp.models import registry as models
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    parts = ["# `moa-cpp serve`: request/response examples\n\nCaptured by `python -m bench.serve examples` from "
             "real servers on 127.0.0.1 (greedy; `id`/`created` left out, long answers cut with `...`).\n",
             "## SmolLM2-135M-Instruct with its MoA drafter\n\n`moa-cpp serve --metrics --cors-origins "
             "http://localhost:3000 -t 2`\n"]
    parts += captured(smollm2, "--metrics", "--cors-origins", "http://localhost:3000", "-t", "2")
    parts.append("## Qwen2.5-Coder-0.5B-Instruct Q4_K_M (its template renders tools)\n\n"
                 "`moa-cpp serve -m qwen2.5-coder-0.5b-instruct-q4_k_m.gguf -t 2`\n")
    parts += captured(qwen, "-m", str(models.qwen25_coder_05b_path()), "-t", "2", "--n-ctx", "2048")
    out = REPO / "docs" / "server-examples.md"
    out.write_text("\n\n".join(parts) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
