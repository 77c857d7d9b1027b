"""llama-cpp-python's API shapes for :class:`~moa_cpp.generator.SpeculativeGenerator`'s
``create_completion`` / ``create_chat_completion``: which of its arguments moa_cpp refuses unless
they are at a value that changes nothing (:func:`refuse_unsupported`), what its sampling settings
mean (:func:`llama_sampling`), chat messages in (:func:`chat_messages`), and text completions
rewritten as its chat responses and chunks, tool calls included (:func:`chat_response`,
:func:`chat_chunks`, :func:`tool_response`, :func:`tool_chunks`)."""
from __future__ import annotations

from typing import Any, Iterator, Optional, Sequence, Union

__all__ = ["CHAT_NOOP", "NOOP", "chat_chunks", "chat_messages", "chat_response", "llama_sampling",
           "refuse_unsupported", "stop_list", "tool_chunks", "tool_response"]


# llama-cpp-python arguments moa_cpp does not implement, and the values accepted for each: those
# that change nothing (the first is llama-cpp-python's default). Any other value: ValueError.
_SAMPLING_NOOP: dict = {
    "typical_p": (1.0,), "tfs_z": (1.0,), "mirostat_mode": (0,), "mirostat_tau": (5.0,), "mirostat_eta": (0.1,),
    "logits_processor": (None,),
}
NOOP: dict = {**_SAMPLING_NOOP, "suffix": (None,), "echo": (False,),
               "stopping_criteria": (None,)}
CHAT_NOOP: dict = dict(_SAMPLING_NOOP)


def _is_value(value: Any, accepted: Any) -> bool:
    if accepted is None:
        return value is None
    return isinstance(value, (bool, int, float)) and value == accepted


def refuse_unsupported(method: str, args: dict, noop: dict) -> None:
    """ValueError naming the first argument of ``args`` that ``noop`` lists at another value."""
    for name, accepted in noop.items():
        value = args[name]
        if not any(_is_value(value, a) for a in accepted):
            shown = repr(value) if isinstance(value, (bool, int, float, str)) else "..."
            raise ValueError(f"{method}({name}={shown}): not supported by moa_cpp yet "
                             f"(accepted: {' or '.join(map(repr, accepted))})")


def stop_list(stop: Union[str, Sequence[str], None]) -> list:
    return [stop] if isinstance(stop, str) else list(stop or [])


def llama_sampling(temperature: float, top_k: int, top_p: float, min_p: float = 0.0, repeat_penalty: float = 1.0,
                    frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                    logit_bias: Optional[dict] = None) -> dict:
    """llama-cpp-python's meaning of the settings: temperature 0 is greedy, < 0 samples from the
    distribution the penalties leave (no temperature, top-k, top-p or min-p); penalties over the
    last 64 generated tokens (its ``last_n_tokens_size``)."""
    pen = dict(repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
               repeat_last_n=64, logit_bias={int(k): float(v) for k, v in (logit_bias or {}).items()})
    if temperature < 0:
        return dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, **pen)
    return dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, **pen)


def chat_messages(messages: Any) -> list:
    """OpenAI chat messages -> ``{"role", "content": str}`` dicts (text parts joined)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("create_chat_completion(messages=...): expected a non-empty list of "
                         "{'role': ..., 'content': ...} dicts")
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"create_chat_completion: a message must be a dict with a 'role' string, not {m!r:.80}")
        out.append({**m, "content": _content_text(m.get("content"))})
    return out


def _content_text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, (list, tuple)) and all(isinstance(p, dict) and p.get("type") == "text"
                                                   and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ValueError("create_chat_completion: message content other than text (a string or "
                     "{'type': 'text', 'text': ...} parts) is not supported by moa_cpp yet")


def chat_response(c: dict) -> dict:
    """A text completion as llama-cpp-python's chat completion (``_convert_text_completion_to_chat``)."""
    ch = c["choices"][0]
    return {"id": "chat" + c["id"], "object": "chat.completion", "created": c["created"], "model": c["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ch["text"]},
                         "logprobs": ch["logprobs"], "finish_reason": ch["finish_reason"]}],
            "usage": c["usage"], "moa": c["moa"]}


def chat_chunks(chunks: Iterator[dict]) -> Iterator[dict]:
    """Text chunks as llama-cpp-python's chat chunks (``_convert_text_completion_chunks_to_chat``):
    first the role, then the content pieces (empty ones skipped), last ``{}`` with the reason."""
    for i, c in enumerate(chunks):
        text, finish = c["choices"][0]["text"], c["choices"][0]["finish_reason"]
        if i == 0:
            yield _chat_chunk(c, {"role": "assistant"}, None)
        lp = c["choices"][0]["logprobs"]
        if finish is not None or text or lp:
            yield _chat_chunk(c, {} if finish is not None else {"content": text}, finish, lp)


def tool_response(r: dict, plan: Any) -> dict:
    """A chat response whose answer is read as tool calls (llama-cpp-python's shape for a forced
    call: content None, ``function_call`` and ``tool_calls``, finish_reason "tool_calls")."""
    from moa_cpp.tools import assistant_message
    ch = r["choices"][0]
    msg, called = assistant_message(plan, ch["message"]["content"], r["id"][4:])
    if called:
        ch["message"] = msg
        if plan.forced is not None:
            ch["message"]["function_call"] = dict(msg["tool_calls"][0]["function"])
        ch["finish_reason"] = "tool_calls"
    return r


def tool_chunks(chunks: Iterator[dict], plan: Any) -> Iterator[dict]:
    """Streamed tool answers: the role first, then (once the answer is complete) the calls as one
    ``tool_calls`` delta -- or the content, if no call was made -- then the reason."""
    from moa_cpp.tools import stream_delta
    text, last = [], None
    for i, c in enumerate(chunks):
        if i == 0:
            yield _chat_chunk(c, {"role": "assistant"}, None)
        text.append(c["choices"][0]["text"])
        last = c
    delta, called = stream_delta(plan, "".join(text), last["id"])
    if delta is not None:
        yield _chat_chunk(last, delta, None)
    yield _chat_chunk(last, {}, "tool_calls" if called else last["choices"][0]["finish_reason"])


def _chat_chunk(c: dict, delta: dict, finish: Optional[str], logprobs: Any = None) -> dict:
    return {"id": "chat" + c["id"], "model": c["model"], "created": c["created"], "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}
