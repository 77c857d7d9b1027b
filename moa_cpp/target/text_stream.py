"""Incremental detokenisation for streaming (:class:`TextStream`): the text of a growing token
sequence, exactly as :meth:`moa_cpp.target.target.Target.detokenize` renders the whole sequence."""
from __future__ import annotations

import codecs
import ctypes
from typing import Sequence

import llama_cpp

from moa_cpp.errors import MoaError

__all__ = ["TextStream", "pieces_concatenate"]

# text on which llama.cpp's clean-up of tokenization spaces (a vocabulary's clean_spaces: " ?" -> "?",
# " ' " -> "'") shows: where it changes nothing, a sequence's text is its pieces put end to end
_PROBE = ("Hi , there ! What ' s up ? Yes . No 'a' b \u00e9t\u00e9 \u4e2d\u6587 \U0001f600 12,5 x.y", " lead")


def _detok_bytes(vocab, toks, n: int, buf) -> tuple[bytes, object]:
    for _ in range(2):
        k = llama_cpp.llama_detokenize(vocab, toks, n, buf, len(buf), False, False)
        if k >= 0:
            return ctypes.string_at(buf, k), buf
        buf = ctypes.create_string_buffer(max(-k, 2 * len(buf)))
    raise MoaError("llama_detokenize failed")


def _piece(vocab, tok: int, buf) -> bytes:
    k = llama_cpp.llama_token_to_piece(vocab, int(tok), buf, len(buf), 0, False)
    if k < 0:
        big = ctypes.create_string_buffer(-k)
        k = llama_cpp.llama_token_to_piece(vocab, int(tok), big, len(big), 0, False)
        return ctypes.string_at(big, max(k, 0))
    return ctypes.string_at(buf, k)


def pieces_concatenate(vocab) -> bool:
    """Whether this vocabulary's text of a sequence is its first token's text followed by the
    other tokens' pieces (llama.cpp's ``detokenize`` without the clean-up of tokenization spaces,
    which some vocabularies turn on): checked on a probe text."""
    buf = ctypes.create_string_buffer(4096)
    piece = ctypes.create_string_buffer(64)
    for text in _PROBE:
        data = text.encode()
        ids = (llama_cpp.llama_token * (len(data) + 16))()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), ids, len(ids), False, False)
        if n <= 0:
            return False
        whole, buf = _detok_bytes(vocab, ids, n, buf)
        first, buf = _detok_bytes(vocab, ids, 1, buf)
        if whole != first + b"".join(_piece(vocab, ids[i], piece) for i in range(1, n)):
            return False
    return True


class TextStream:
    """The text of a growing token sequence, exactly as :meth:`Target.detokenize` renders it
    (leading-space and clean-up rules apply to the whole sequence).

    Where the vocabulary's text is its pieces end to end (``concatenate``, see
    :func:`pieces_concatenate`), each new token costs one ``llama_token_to_piece`` and the text
    grows by an incremental UTF-8 decode; else the whole sequence is detokenised again on every
    call (tokens and the text buffer kept and grown by doubling)."""

    def __init__(self, vocab, concatenate: bool = False) -> None:
        self._vocab = vocab
        self._concat = bool(concatenate)
        self._toks = (llama_cpp.llama_token * 256)()
        self._n = 0
        self._buf = ctypes.create_string_buffer(2048)
        self._piece = ctypes.create_string_buffer(64)
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")
        self._text = ""                   # the decoded text of whole UTF-8 characters

    def extend(self, tokens: Sequence[int]) -> str:
        """Append tokens; return the whole text so far."""
        if self._concat:
            return self._extend_pieces(tokens)
        need = self._n + len(tokens)
        if need > len(self._toks):
            grown = (llama_cpp.llama_token * max(need, 2 * len(self._toks)))()
            ctypes.memmove(grown, self._toks, self._n * ctypes.sizeof(llama_cpp.llama_token))
            self._toks = grown
        for i, t in enumerate(tokens):
            self._toks[self._n + i] = int(t)
        self._n = need
        raw, self._buf = _detok_bytes(self._vocab, self._toks, self._n, self._buf)
        return raw.decode("utf-8", "replace")

    def _extend_pieces(self, tokens: Sequence[int]) -> str:
        if tokens:
            chunks = []
            for t in tokens:
                if self._n == 0:          # the first token: the whole-sequence rules (a leading space)
                    one = (llama_cpp.llama_token * 1)(int(t))
                    first, self._buf = _detok_bytes(self._vocab, one, 1, self._buf)
                    chunks.append(first)
                else:
                    chunks.append(_piece(self._vocab, t, self._piece))
                self._n += 1
            self._text += self._dec.decode(b"".join(chunks))
        tail = self._dec.getstate()[0]    # an incomplete character: U+FFFD, as a whole decode shows it
        return self._text + tail.decode("utf-8", "replace") if tail else self._text
