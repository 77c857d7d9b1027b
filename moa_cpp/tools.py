"""OpenAI tools (function calling) on a GGUF chat template.

What a request's ``tools`` / ``tool_choice`` become (:func:`plan`):

- a named function (``{"type": "function", "function": {"name": F}}``): as llama-cpp-python does,
  the answer is F's arguments, constrained to F's parameter schema by llama.cpp's grammar, and it
  is returned as one tool call (finish_reason ``tool_calls``); any template;
- ``"required"``: the answer is ``{"name": ..., "arguments": {...}}`` for one of the tools
  (grammar: any of their schemas), returned as that tool call; any template;
- ``"auto"`` (the default with tools): the tools are rendered by the GGUF's chat template (it must
  use them: Qwen2.5, Llama 3.1+, Hermes-style templates do) and the answer is parsed for the
  calls the template family writes -- ``<tool_call>{json}</tool_call>`` blocks (Qwen2.5 / Hermes)
  or a bare ``{"name": ..., "parameters"/"arguments": ...}`` object (Llama 3; also in a ```json
  fence, as small models write it); text without a call is the message content;
- ``"none"``: a plain answer (the tools are not rendered).

``role: "tool"`` messages and assistant messages carrying ``tool_calls`` are passed to the template
(arguments as objects, as HF templates expect them). Every refusal is a
:class:`~moa_cpp.structured.StructuredOutputError` naming the field.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional

from moa_cpp.structured import StructuredOutputError, grammar_for_json_schema

MAX_TOOLS = 128


@dataclass
class ToolPlan:
    tools: Optional[list] = None      # rendered by the chat template (None: not rendered)
    grammar: Optional[str] = None     # the answer's grammar (forced / required calls)
    forced: Optional[str] = None      # the answer is this function's arguments
    parse: bool = False               # parse calls out of the answer (auto / required)

    @property
    def active(self) -> bool:
        return self.forced is not None or self.parse


def _functions(tools: Any) -> dict:
    if not isinstance(tools, list) or not tools or len(tools) > MAX_TOOLS:
        raise StructuredOutputError("tools", f"expected a list of 1..{MAX_TOOLS} tools")
    out = {}
    for t in tools:
        f = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise StructuredOutputError("tools", 'each tool must be {"type": "function", "function": {"name": ..., '
                                        '"parameters": {...}}}')
        params = f.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise StructuredOutputError("tools", f"{f['name']}: parameters must be a JSON schema object")
        out[f["name"]] = params
    return out


def template_renders_tools(template: Optional[str]) -> bool:
    return bool(template) and "tools" in template and ("{{" in template or "{%" in template)


def plan(tools: Any, tool_choice: Any, template: Optional[str]) -> ToolPlan:
    """What to render, constrain and parse for this request (see the module doc)."""
    if tools is None:
        if tool_choice not in (None, "none"):
            raise StructuredOutputError("tool_choice", "needs tools")
        return ToolPlan()
    funcs = _functions(tools)
    choice = "auto" if tool_choice is None else tool_choice
    rendered = tools if template_renders_tools(template) else None
    if choice == "none":
        return ToolPlan()
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type", "function") == "function" else None
        if name not in funcs:
            raise StructuredOutputError("tool_choice", f"names no tool given in tools: {name!r:.80}")
        return ToolPlan(rendered, grammar_for_json_schema(funcs[name], "tools"), forced=name)
    if choice == "required":
        schema = {"anyOf": [{"type": "object", "properties": {"name": {"const": n}, "arguments": p},
                             "required": ["name", "arguments"]} for n, p in funcs.items()]}
        return ToolPlan(rendered, grammar_for_json_schema(schema, "tools"), parse=True)
    if choice == "auto":
        if rendered is None:
            raise StructuredOutputError("tool_choice", 'auto: this model\'s chat template does not render tools; '
                                        'name a function ({"type": "function", "function": {"name": ...}}: a '
                                        'forced call) or use "required"')
        return ToolPlan(rendered, parse=True)
    raise StructuredOutputError("tool_choice", 'expected "none", "auto", "required" or {"type": "function", '
                                '"function": {"name": ...}}')


def template_messages(messages: list) -> list:
    """OpenAI messages as chat templates take them: tool-call arguments as objects."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = {**m, "tool_calls": [_template_call(c) for c in calls]}
        out.append(m)
    return out


def _template_call(c: Any) -> Any:
    if not isinstance(c, dict) or not isinstance(c.get("function"), dict):
        return c
    args = c["function"].get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    return {**c, "function": {**c["function"], "arguments": args}}


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def _call(obj: Any) -> Optional[dict]:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"name": obj["name"], "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}


def parse_calls(text: str) -> tuple:
    """(content or None, [{"name", "arguments": JSON text}]) of a generated answer."""
    calls = []
    if "<tool_call>" in text:
        for body in _HERMES.findall(text):
            try:
                c = _call(json.loads(body))
            except ValueError:
                c = None
            if c is not None:
                calls.append(c)
        rest = _HERMES.sub("", text).strip()
        return (rest or None) if calls else text, calls
    s = text.strip()
    if s.startswith("<|python_tag|>"):
        s = s[len("<|python_tag|>"):].strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", s, re.S)     # small models fence the JSON
    if fenced:
        s = fenced.group(1)
    if s.startswith("{"):
        try:
            c = _call(json.loads(s))
        except ValueError:
            c = None
        if c is not None:
            return None, [c]
    return text, []


def tool_calls(calls: list, completion_id: str) -> list:
    """OpenAI's ``tool_calls`` entries (ids as llama-cpp-python makes them)."""
    return [{"id": f"call__{i}_{c['name']}_{completion_id}", "type": "function",
             "function": {"name": c["name"], "arguments": c["arguments"]}} for i, c in enumerate(calls)]


def assistant_message(p: ToolPlan, text: str, completion_id: str) -> tuple:
    """(OpenAI assistant message, whether it holds calls) of a whole answer under plan ``p``."""
    content, calls = answer(p, text)
    if not calls:
        return {"role": "assistant", "content": content}, False
    return {"role": "assistant", "content": content, "tool_calls": tool_calls(calls, completion_id)}, True


def stream_delta(p: ToolPlan, text: str, completion_id: str) -> tuple:
    """(the delta of a held-back streamed answer -- its calls as one ``tool_calls`` delta, or its
    content; None if empty --, whether it holds calls)."""
    msg, called = assistant_message(p, text, completion_id)
    if called:
        return {"tool_calls": [{"index": i, **c} for i, c in enumerate(msg["tool_calls"])]}, True
    return ({"content": msg["content"]} if msg["content"] else None), False


def answer(p: ToolPlan, text: str) -> tuple:
    """(content, calls) of a whole answer under plan ``p``."""
    if p.forced is not None:
        return None, [{"name": p.forced, "arguments": text}]
    if p.parse:
        return parse_calls(text)
    return text, []


def may_be_call(p: ToolPlan, text: str) -> bool:
    """While streaming: could ``text`` (the answer so far) still turn out to be a tool call?
    Then it is held back, and sent as calls or content when the answer is complete."""
    if p.forced is not None:
        return True
    if not p.parse:
        return False
    s = text.lstrip()
    return any(m.startswith(s) or s.startswith(m) for m in ("<tool_call>", "<|python_tag|>", "{", "```json\n{"))
