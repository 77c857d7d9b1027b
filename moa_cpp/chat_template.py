"""Chat templates: a prompt's text from chat messages, rendered as llama-cpp-python renders it.

A template is one of three things (:func:`apply_chat_template` tells them apart): Jinja text (a GGUF's
``tokenizer.chat_template`` or a ``--chat-template`` override; rendered with Jinja2, OpenAI
``tools`` included, by :func:`render_chat_template`), the name of one of llama.cpp's built-in
templates (``chatml``, ``llama3``, ...; :func:`render_builtin`), or nothing (GGUFs without one: the
architecture family's built-in, e.g. some Gemma-3 files). The target
(:meth:`moa_cpp.target.target.Target.apply_chat_template`) and the remote client's vocabulary both render
through here, so their prompts agree token for token.
"""
from __future__ import annotations

import ctypes
from typing import Optional, Sequence

import llama_cpp

from moa_cpp.format.arch import lookup
from moa_cpp.errors import MoaError

__all__ = ["apply_chat_template", "render_builtin", "render_chat_template"]


def render_chat_template(template: str, messages: Sequence[dict], bos: str, eos: str,
                         add_generation_prompt: bool = True, tools: Optional[list] = None) -> str:
    """A GGUF ``tokenizer.chat_template`` rendered as llama-cpp-python renders it (Jinja2), with
    the model's BOS / EOS text. One renderer for the target and the remote client's vocabulary."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    fmt = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos, add_generation_prompt=add_generation_prompt)
    return fmt(messages=list(messages), tools=tools).prompt


def render_builtin(name: str, messages: Sequence[dict], add_generation_prompt: bool) -> str:
    """llama.cpp's built-in template ``name`` applied to ``messages`` (no BOS: llama.cpp's
    built-in templates omit it)."""
    arr = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for i, m in enumerate(messages):
        role, content = str(m["role"]).encode(), str(m["content"]).encode()
        keep += [role, content]
        arr[i].role, arr[i].content = role, content
    size = 4096 + sum(len(k) for k in keep) * 2
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(name.encode(), arr, len(messages), add_generation_prompt, buf, size)
    if n < 0 or n > size:
        raise MoaError(f"llama.cpp could not apply a built-in chat template named '{name}' (not one it knows?)")
    return buf.raw[:n].decode("utf-8", "replace")


def apply_chat_template(template: Optional[str], messages: Sequence[dict], *, bos: str, eos: str, add_bos: bool,
                        arch: str, model_name: str, add_generation_prompt: bool = True,
                        tools: Optional[list] = None) -> str:
    """``messages`` rendered with ``template`` (Jinja text, a llama.cpp built-in's name, or None:
    the family's built-in for ``arch``, else :class:`MoaError` naming ``model_name``). ``bos`` /
    ``eos``: the model's BOS / EOS text; ``add_bos``: the model expects a BOS, which a built-in
    template's text then gets (llama.cpp's built-ins omit it)."""
    if template and ("{{" in template or "{%" in template):
        return render_chat_template(template, messages, bos, eos, add_generation_prompt, tools)
    # a llama.cpp built-in's name, or for GGUFs without tokenizer.chat_template the family's
    name = template or lookup(arch).builtin_chat_template
    if name is None:
        raise MoaError(f"{model_name} has no chat template (tokenizer.chat_template); use a plain prompt")
    text = render_builtin(name, messages, add_generation_prompt)
    return (bos + text) if add_bos and bos and not text.startswith(bos) else text
