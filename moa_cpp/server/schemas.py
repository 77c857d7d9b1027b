"""Request bodies of ``/v1/completions`` and ``/v1/chat/completions``, validated strictly.

Fields and defaults follow OpenAI and llama-cpp-python's server (temperature 0.8, top_p 0.95,
top_k 40; completions: max_tokens 16). Types are strict (``"5"`` is not a number), numbers must
be finite and in range, and an unknown field is an error, as OpenAI answers ("Unrecognized
request argument"). OpenAI fields this server does not implement are accepted only at their
no-op values (n=1, echo=false). Sampling as llama.cpp samples: logit_bias, penalties
(presence / frequency as OpenAI, llama.cpp's repeat_penalty and repeat_last_n), top-k, top-p,
min-p (0.05, llama-cpp-python's server default), temperature. llama.cpp server fields are
accepted where they are implemented (top_k, min_p, ignore_eos, penalties, cache_prompt: reuse
the prefix a session's KV cache holds, on by default as in llama-server), at their no-op values where not implemented yet (typical_p 1, tfs_z 1, mirostat 0);
``n_probs`` asks for logprobs as ``logprobs`` / ``top_logprobs`` do; ``grammar`` (GBNF),
``json_schema`` and ``response_format`` (json_object, json_schema) constrain the output with
llama.cpp's grammar (one of them per request). Fields nobody defines are ``unknown_parameter``.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from moa_cpp.generator import parse_draft
from moa_cpp.structured import MAX_GRAMMAR_CHARS, StructuredOutputError, request_grammar
from moa_cpp.tools import MAX_TOOLS, ToolPlan, plan as plan_tools, template_messages
from moa_cpp.server.errors import APIError, bad_request

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

MAX_STOP = 16
MAX_STOP_LEN = 256
MAX_MESSAGES = 1024

Int32 = Annotated[int, Field(ge=-(2 ** 31), le=2 ** 31 - 1)]


class MoaOptions(BaseModel):
    """``moa``: per-request speculation settings."""

    model_config = _STRICT
    draft: Optional[Annotated[str, Field(max_length=64)]] = None

    @field_validator("draft")
    @classmethod
    def _draft(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            parse_draft(v)     # ValueError -> a validation error naming the field
        return v


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = _STRICT

    model: Optional[Annotated[str, Field(max_length=256)]] = None
    max_tokens: Optional[Annotated[int, Field(ge=1, le=2 ** 31 - 1)]] = None
    temperature: Annotated[float, Field(ge=0.0, le=100.0)] = 0.8
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 0.95
    top_k: Annotated[int, Field(ge=0, le=2 ** 31 - 1)] = 40
    seed: Optional[Annotated[int, Field(ge=-1, le=2 ** 64 - 1)]] = None
    stop: Union[None, Annotated[str, Field(max_length=MAX_STOP_LEN)],
                Annotated[list[Annotated[str, Field(max_length=MAX_STOP_LEN)]], Field(max_length=MAX_STOP)]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: Annotated[int, Field(ge=1, le=1)] = 1
    # llama.cpp's sampling (llama-cpp-python's order and server defaults, but repeat_penalty 1: OpenAI
    # clients expect no penalty they did not ask for): bias, penalties, top-k, top-p, min-p, temperature
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.05
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    logit_bias: Optional[Annotated[dict[Annotated[str, Field(max_length=12)], Annotated[float, Field(ge=-100, le=100)]],
                                   Field(max_length=1024)]] = None
    user: Optional[Annotated[str, Field(max_length=256)]] = None
    # llama.cpp server's field: never stop at an end-of-generation token (run to max_tokens)
    ignore_eos: bool = False
    moa: Optional[MoaOptions] = None
    # llama.cpp server's fields: a hint (each request is decoded whole today), no-op values
    cache_prompt: bool = True
    n_probs: Annotated[int, Field(ge=0, le=20)] = 0           # llama.cpp: top alternatives (= logprobs)
    repeat_penalty: Annotated[float, Field(gt=0.0, le=10.0)] = 1.0
    repeat_last_n: Annotated[int, Field(ge=-1, le=1 << 20)] = 64
    typical_p: Annotated[float, Field(ge=1.0, le=1.0)] = 1.0
    tfs_z: Annotated[float, Field(ge=1.0, le=1.0)] = 1.0
    mirostat: Annotated[int, Field(ge=0, le=0)] = 0
    # structured output (moa_cpp.structured): llama.cpp's GBNF, a JSON schema, OpenAI's response_format
    grammar: Optional[Annotated[str, Field(max_length=MAX_GRAMMAR_CHARS)]] = None
    json_schema: Optional[dict] = None
    response_format: Optional[dict] = None

    @property
    def stops(self) -> list:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling_extras(self, n_vocab: int) -> dict:
        """min-p, penalties and bias as ``SpeculativeGenerator.stream_steps`` takes them."""
        bias = {}
        for k, v in (self.logit_bias or {}).items():
            if not k.strip().isdigit() or not 0 <= int(k) < n_vocab:
                raise bad_request(f"logit_bias: {k!r} is not a token id of this model (0..{n_vocab - 1})",
                                  param="logit_bias")
            bias[int(k)] = v
        try:
            grammar = request_grammar(self.grammar, self.json_schema, self.response_format)
        except StructuredOutputError as e:
            raise bad_request(str(e), param=e.field) from None
        return dict(min_p=self.min_p, repeat_penalty=self.repeat_penalty, frequency_penalty=self.frequency_penalty,
                    presence_penalty=self.presence_penalty, repeat_last_n=self.repeat_last_n, logit_bias=bias,
                    grammar=grammar, cache_prompt=self.cache_prompt)

    @property
    def seed_or_none(self) -> Optional[int]:
        return None if self.seed in (None, -1) else self.seed


TokenId = Annotated[int, Field(ge=0, le=2 ** 31 - 1)]


class CompletionRequest(_Sampling):
    prompt: Union[str, Annotated[list[TokenId], Field(min_length=1)],
                  Annotated[list[str], Field(min_length=1, max_length=1)],
                  Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1, max_length=1)]]
    max_tokens: Optional[Annotated[int, Field(ge=1, le=2 ** 31 - 1)]] = 16
    echo: Literal[False] = False
    logprobs: Optional[Annotated[int, Field(ge=0, le=5)]] = None    # OpenAI's limit
    suffix: Optional[Literal[""]] = None
    best_of: Annotated[int, Field(ge=1, le=1)] = 1

    @property
    def n_logprobs(self) -> Optional[int]:
        if self.n_probs:
            return max(self.n_probs, self.logprobs or 0)
        return self.logprobs

    def prompt_value(self) -> "str | list":
        """One prompt: text or token ids (a one-element batch is unwrapped)."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            return p[0]
        return p


class TextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, Annotated[list[TextPart], Field(max_length=256)], None] = None
    name: Optional[Annotated[str, Field(max_length=256)]] = None
    tool_calls: Optional[Annotated[list[dict], Field(min_length=1, max_length=MAX_TOOLS)]] = None  # assistant
    tool_call_id: Optional[Annotated[str, Field(max_length=256)]] = None            # tool

    @model_validator(mode="after")
    def _tool_fields(self) -> "Message":
        # as OpenAI: tool calls only on assistant messages, and a tool message names its call
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("tool_calls: only assistant messages carry tool calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("tool_call_id: a tool message needs one, and only tool messages have one")
        return self

    def as_dict(self) -> dict:
        # "developer" is OpenAI's new name for "system"; chat templates know "system"
        d: dict = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        for k in ("tool_calls", "tool_call_id", "name"):
            if getattr(self, k) is not None and (k != "name" or self.role == "tool"):
                d[k] = getattr(self, k)
        return d

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatRequest(_Sampling):
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Optional[Annotated[int, Field(ge=1, le=2 ** 31 - 1)]] = None
    logprobs: Optional[bool] = False
    top_logprobs: Optional[Annotated[int, Field(ge=0, le=20)]] = None     # OpenAI's limit
    tools: Optional[Annotated[list[dict], Field(min_length=1, max_length=MAX_TOOLS)]] = None
    tool_choice: Optional[Union[str, dict]] = None
    parallel_tool_calls: Optional[bool] = None       # accepted: every call the answer holds is returned

    @property
    def n_logprobs(self) -> Optional[int]:
        """Alternatives per token (None: no logprobs); llama.cpp's n_probs turns them on too."""
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
        if self.n_probs:
            return max(self.n_probs, self.top_logprobs or 0)
        return (self.top_logprobs or 0) if self.logprobs else None

    def message_dicts(self) -> list:
        return template_messages([m.as_dict() for m in self.messages])

    def tool_plan(self, template: Optional[str]) -> ToolPlan:
        try:
            return plan_tools(self.tools, self.tool_choice, template)
        except StructuredOutputError as e:
            raise bad_request(str(e), param=e.field) from None

    @property
    def token_limit(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def parse_body(body: bytes, model: type) -> BaseModel:
    """Validate a JSON body; every failure is a 400 naming the field."""
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        kind = err.get("type", "")
        if kind == "json_invalid":
            raise bad_request(f"the body is not valid JSON: {err.get('msg', '')}", code="invalid_json") from None
        if kind == "model_type" and not loc:
            raise bad_request("the body must be a JSON object", code="invalid_json") from None
        if kind == "extra_forbidden":
            raise bad_request(f"Unrecognized request argument supplied: {loc}", param=loc,
                              code="unknown_parameter") from None
        if kind == "unsupported":
            raise bad_request(err.get("msg", f"{loc}: not supported"), param=loc, code="unsupported_parameter") from None
        if kind == "missing":
            raise bad_request(f"missing required parameter: {loc}", param=loc, code="missing_parameter") from None
        raise bad_request(f"invalid value for {loc or 'the body'}: {err.get('msg', 'invalid')}", param=loc or None,
                          code="invalid_value") from None
    except (RecursionError, UnicodeDecodeError, ValueError) as e:
        raise bad_request(f"the body is not valid JSON: {type(e).__name__}", code="invalid_json") from None


__all__ = ["APIError", "ChatRequest", "CompletionRequest", "Message", "MoaOptions", "parse_body"]
