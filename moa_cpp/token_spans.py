"""Which token, and who chose it, each character of a streamed answer came from.

The chat page (``moa_cpp/server/ui``) highlights the tokens a drafter guessed and the target
accepted. Streamed text does not follow token boundaries: a piece may hold back the start of a
stop string or an incomplete UTF-8 character and hand it out a cycle later. So every token's
place in the generated text is kept in UTF-8 bytes (as :class:`moa_cpp.streaming.PendingLogprobs`
keeps logprobs), and each piece of text handed out is split at the token boundaries inside it:
``[[text, origin, index], ...]``, where ``origin`` is "target" or the proposer source whose draft
was accepted (:attr:`moa_cpp.speculative.types.StepResult.origins`) and ``index`` the token's
position in the answer. The fragments of a piece concatenate to the piece exactly; a token whose
bytes straddle two pieces has a fragment in each (same index), and a token without text (a
special token) an empty fragment, so every emitted token is listed at least once.
"""
from __future__ import annotations

from typing import Any, Sequence


class TokenSpans:
    def __init__(self, target: Any) -> None:
        self.target = target
        self.tokens: list = []        # (origin, start byte, end byte) per emitted token
        self.pos = 0                  # bytes of all tokens so far
        self.shown = 0                # bytes of the text handed out so far
        self.next_tok = 0             # first token not wholly handed out

    def add(self, tokens: Sequence[int], origins: Sequence[str]) -> None:
        for i, tok in enumerate(tokens):
            n = len(self.target.token_bytes(int(tok)))
            self.tokens.append((origins[i] if i < len(origins) else "target", self.pos, self.pos + n))
            self.pos += n

    def split(self, piece: str) -> list:
        """``piece`` (the next text handed out) as ``[[text, origin, index], ...]``."""
        raw = piece.encode()
        a, b = self.shown, self.shown + len(raw)
        out: list = []
        cut = 0                                       # characters of ``piece`` assigned so far
        i = self.next_tok
        while i < len(self.tokens):
            origin, s, e = self.tokens[i]
            if s > b or (s == b and e > s):
                break
            end_byte = min(e, b) - a
            end = len(raw[:max(0, end_byte)].decode("utf-8", "ignore")) if e < b else len(piece)
            out.append([piece[cut:max(cut, end)], origin, i])
            cut = max(cut, end)
            if e <= b:
                i += 1
            else:
                break
        if cut < len(piece):                          # text beyond the tokens' bytes (detokenizer rules)
            if out:
                out[-1][0] += piece[cut:]
            else:
                out.append([piece[cut:], self.tokens[-1][0] if self.tokens else "target", max(0, len(self.tokens) - 1)])
        self.next_tok = i
        self.shown = b
        return out
