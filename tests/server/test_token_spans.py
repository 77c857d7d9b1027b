"""moa_cpp/token_spans.py: streamed text split at token boundaries (the chat page's highlighting),
whatever the pieces hold back."""
from __future__ import annotations

import random

from moa_cpp.token_spans import TokenSpans


class _Vocab:
    def __init__(self, pieces):
        self.pieces = pieces

    def token_bytes(self, tok):
        return self.pieces[tok]


def _check(pieces_bytes, origins, cuts):
    """Hand out the text in pieces ending at the character offsets ``cuts``; the fragments must
    concatenate to each piece, list every token in order, and give each character to its token."""
    vocab = _Vocab(pieces_bytes)
    spans = TokenSpans(vocab)
    toks = list(range(len(pieces_bytes)))
    spans.add(toks, origins)
    text = b"".join(pieces_bytes).decode()
    owner = []                      # the token of each character (the one holding its last byte)
    pos = 0
    for t, b in enumerate(pieces_bytes):
        pos += len(b)
        while len(text[:len(owner) + 1].encode()) <= pos and len(owner) < len(text):
            owner.append(t)
    seen, shown = [], 0
    for c in cuts + [len(text)]:
        frags = spans.split(text[shown:c])
        assert "".join(f[0] for f in frags) == text[shown:c]
        k = shown
        for f_text, origin, idx in frags:
            assert origin == origins[idx]
            assert all(owner[j] == idx for j in range(k, k + len(f_text)))
            k += len(f_text)
            if not seen or seen[-1] != idx:
                seen.append(idx)
        shown = c
    assert seen == sorted(set(seen)) and set(seen) == set(toks)


def test_ascii_and_multibyte_tokens_in_any_pieces():
    pieces = [b"Hel", b"lo", b" w\xc3", b"\xa9", b"rld", b"", b" \xf0\x9f", b"\x8c\x8d!"]
    origins = ["target", "moa", "moa", "target", "ngram", "target", "moa+ngram", "target"]
    text = b"".join(pieces).decode()
    rnd = random.Random(0)
    for _ in range(300):
        cuts = sorted(rnd.sample(range(len(text) + 1), rnd.randint(0, 5)))
        _check(pieces, origins, cuts)


def test_text_beyond_the_tokens_goes_to_the_last_token():
    spans = TokenSpans(_Vocab([b"ab"]))
    spans.add([0], ["moa"])
    assert spans.split("abc") == [["abc", "moa", 0]]
