"""What clients send for structured output, turned into one GBNF grammar (llama.cpp's).

- OpenAI ``response_format``: ``{"type": "text"}`` (nothing), ``{"type": "json_object"}`` (any
  JSON object: llama.cpp's ``json.gbnf``; with a ``"schema"`` as llama-cpp-python accepts it),
  ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}``.
- llama.cpp's server fields ``grammar`` (GBNF text) and ``json_schema`` (a schema object).
- llama-cpp-python's ``grammar=`` argument: a ``LlamaGrammar`` (or GBNF text).

Schemas become GBNF with llama-cpp-python's own converter (``json_schema_to_gbnf``, the port of
llama.cpp's), so the same request constrains the same way in both. Every refusal is a ValueError
whose message names the field.
"""
from __future__ import annotations

import json
from typing import Any, Optional

from llama_cpp.llama_grammar import JSON_GBNF, LlamaGrammar, json_schema_to_gbnf

MAX_GRAMMAR_CHARS = 65536      # a request's grammar / schema text (the server's limit too)


class StructuredOutputError(ValueError):
    """A refused grammar / schema / response_format; ``field`` names the request field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def grammar_text(grammar: Any) -> Optional[str]:
    """A ``LlamaGrammar`` or GBNF string -> GBNF text (None stays None)."""
    if grammar is None:
        return None
    if isinstance(grammar, LlamaGrammar):
        if getattr(grammar, "_root", "root") != "root":
            raise StructuredOutputError("grammar", "only grammars whose start rule is 'root' are supported")
        return grammar._grammar
    if isinstance(grammar, str):
        return _checked("grammar", grammar)
    raise StructuredOutputError("grammar", "expected GBNF text or a llama_cpp.LlamaGrammar, "
                                           f"not {type(grammar).__name__}")


def grammar_for_json_schema(schema: Any, field: str = "json_schema") -> str:
    """A JSON schema (an object, or its JSON text) -> GBNF, as llama.cpp converts it."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise StructuredOutputError(field, f"not valid JSON ({e})") from None
    if not isinstance(schema, dict):
        raise StructuredOutputError(field, "expected a JSON schema object")
    text = json.dumps(schema)
    _checked(field, text)
    try:
        return json_schema_to_gbnf(text)
    except Exception as e:      # the converter raises plain Exceptions / KeyErrors on what it does not know
        raise StructuredOutputError(field, f"cannot be turned into a grammar ({type(e).__name__}: {e})") from None


def grammar_for_response_format(rf: Any) -> Optional[str]:
    """OpenAI's ``response_format`` -> GBNF (None for text)."""
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise StructuredOutputError("response_format",
                                    'expected {"type": "text" | "json_object" | "json_schema", ...}')
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        if rf.get("schema") is not None:     # llama-cpp-python's extension
            return grammar_for_json_schema(rf["schema"], "response_format.schema")
        return JSON_GBNF
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise StructuredOutputError("response_format", 'json_schema must be {"name": ..., "schema": {...}}')
        # OpenAI's schema is optional (any JSON then)
        return grammar_for_json_schema(spec["schema"], "response_format.json_schema.schema") \
            if spec.get("schema") is not None else JSON_GBNF
    raise StructuredOutputError("response_format", f"unknown type {kind!r:.40} (text, json_object, json_schema)")


def request_grammar(grammar: Any = None, json_schema: Any = None, response_format: Any = None) -> Optional[str]:
    """The one grammar a request asks for (ValueError if it asks for two)."""
    given = [g for g in (grammar_text(grammar),
                         grammar_for_json_schema(json_schema) if json_schema is not None else None,
                         grammar_for_response_format(response_format)) if g is not None]
    if len(given) > 1:
        raise StructuredOutputError("grammar", "grammar, json_schema and response_format each constrain the "
                                    "output: give one of them")
    return given[0] if given else None


def _checked(field: str, text: str) -> str:
    if len(text) > MAX_GRAMMAR_CHARS:
        raise StructuredOutputError(field, f"{len(text)} characters, over the limit of {MAX_GRAMMAR_CHARS}")
    if not text.strip():
        raise StructuredOutputError(field, "empty")
    return text
