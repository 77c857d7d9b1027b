"""The target's vocabulary side: tokens <-> text, special tokens and the chat template
(:class:`TargetText`, a part of :class:`moa_cpp.target.target.Target`).

Every method reads the llama.cpp vocabulary handle (``_vocab``) of the target's model or its GGUF
metadata (:meth:`TargetText.meta`); the template rendering itself is :mod:`moa_cpp.chat_template`'s,
streamed text :mod:`moa_cpp.target.text_stream`'s.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import llama_cpp
import numpy as np

from moa_cpp.chat_template import apply_chat_template
from moa_cpp.errors import MoaError
from moa_cpp.target.text_stream import TextStream, pieces_concatenate


class TargetText:
    """Tokenizing, detokenizing, special tokens, GGUF metadata and the chat template of a target (a
    part of :class:`moa_cpp.target.context.TargetContext`, which sets the attributes below)."""

    _model: Any
    _vocab: Any
    _eog_tokens: Optional[np.ndarray]
    n_vocab: int
    arch: str
    path: Path
    chat_template: Optional[str]

    def meta(self, key: str) -> Optional[str]:
        """GGUF metadata value of ``key`` as a string (None if absent)."""
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        if n >= len(buf):  # the return value is the full length: retry with room for it
            buf = ctypes.create_string_buffer(n + 1)
            n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            tools: Optional[list] = None) -> str:
        """Render ``messages`` with the chat template in use (:attr:`chat_template_text`; Jinja2, as
        llama-cpp-python does for chat completions, or a llama.cpp built-in: :mod:`moa_cpp.chat_template`;
        ``tools``: OpenAI tools, for templates that render them). Tokenize the result with
        ``add_bos=False, special=True``: the template writes any BOS itself."""
        bos = self.detokenize([self.bos_token], special=True) if self.bos_token >= 0 else ""
        eos = self.detokenize([self.eos_token], special=True) if self.eos_token >= 0 else ""
        add_bos = (self.meta("tokenizer.ggml.add_bos_token") or "").lower() == "true"
        return apply_chat_template(self.chat_template_text, messages, bos=bos, eos=eos, add_bos=add_bos,
                                   arch=self.arch, model_name=self.path.name,
                                   add_generation_prompt=add_generation_prompt, tools=tools)

    @property
    def chat_template_text(self) -> Optional[str]:
        """The chat template in use: the override, else the GGUF's (Jinja), or None."""
        return self.chat_template or self.meta("tokenizer.chat_template")

    @property
    def eos_token(self) -> int:
        return int(llama_cpp.llama_vocab_eos(self._vocab))

    @property
    def bos_token(self) -> int:
        return int(llama_cpp.llama_vocab_bos(self._vocab))

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, ...)."""
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, int(token)))

    @property
    def eog_tokens(self) -> np.ndarray:
        """Every end-of-generation token id (int64, sorted), read once from the vocabulary."""
        if self._eog_tokens is None:
            is_eog = llama_cpp.llama_vocab_is_eog
            self._eog_tokens = np.array([t for t in range(self.n_vocab) if is_eog(self._vocab, t)], np.int64)
        return self._eog_tokens

    def tokenize(self, text: Union[str, bytes], add_bos: bool = True, special: bool = False) -> np.ndarray:
        """Token ids (int32). ``add_bos`` adds BOS only if the model's tokenizer asks for it;
        ``special`` parses special-token text such as ``<|im_start|>``."""
        data = text.encode("utf-8") if isinstance(text, str) else text
        n_max = len(data) + 16
        for _ in range(2):
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_bos, special)
            if n >= 0:
                return np.ctypeslib.as_array(buf)[:n].astype(np.int32)
            n_max = -n
        raise MoaError("llama_tokenize failed")

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        """One token's text as bytes (a piece of a multi-byte character is not UTF-8 alone);
        ``special`` renders special tokens. ``token`` must be in the vocabulary."""
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, special)
        return buf.raw[:max(n, 0)]

    def text_stream(self) -> "TextStream":
        """An incremental :meth:`detokenize` for streaming (see :class:`TextStream`)."""
        concat = getattr(self, "_pieces_concat", None)
        if concat is None:                 # probed once per vocabulary
            concat = self._pieces_concat = pieces_concatenate(self._vocab)
        return TextStream(self._vocab, concat)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        """Text of ``tokens``; ``special`` renders special tokens."""
        arr = (llama_cpp.llama_token * len(tokens))(*[int(t) for t in tokens])
        size = 8 * len(tokens) + 16
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(self._vocab, arr, len(tokens), buf, size, False, special)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", "replace")
            size = -n
        raise MoaError("llama_detokenize failed")
