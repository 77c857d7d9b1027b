"""What a generation hands out: :class:`Piece` per verified cycle, held back where the text may
still change (:func:`held_back`: an incomplete UTF-8 character or the start of a stop string) and
with the logprobs of exactly the tokens whose text it shows (:class:`PendingLogprobs`); and the
whole :class:`GenerationResult`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from moa_cpp.speculative.types import SpecStats

__all__ = ["GenerationResult", "PendingLogprobs", "Piece", "held_back"]


def held_back(text: str, stops: Sequence[str]) -> int:
    """Characters at the end of ``text`` not to stream yet: an incomplete UTF-8 character
    (rendered as U+FFFD until its last byte arrives) or the start of a stop string."""
    n = 0
    while n < len(text) and text[len(text) - 1 - n] == "\ufffd" and n < 3:
        n += 1
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), n, -1):
            if text.endswith(s[:k]):
                n = k
                break
    return n


class PendingLogprobs:
    """Token logprobs waiting for their text: released once the text handed out covers the
    token (positions in UTF-8 bytes of the generated text)."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.pending: list = []          # (TokenLogprob, start byte, end byte)
        self.pos = 0

    def add(self, lps: list) -> None:
        for lp in lps:
            n = len(self.target.token_bytes(lp.token))
            self.pending.append((lp, self.pos, self.pos + n))
            self.pos += n

    def _take(self, keep) -> list:
        out = [lp for lp, s, e in self.pending if keep(s, e)]
        self.pending = [x for x in self.pending if not keep(x[1], x[2])]
        return out

    def ending_within(self, shown: str) -> list:
        if not self.pending:             # logprobs off: no encoding of the text on every step
            return []
        n = len(shown.encode())
        return self._take(lambda s, e: e <= n)

    def starting_before(self, cut: str) -> list:
        if not self.pending:
            return []
        n = len(cut.encode())
        out = self._take(lambda s, e: s < n)
        self.pending = []
        return out

    def rest(self) -> list:
        out, self.pending = [lp for lp, _, _ in self.pending], []
        return out


@dataclass
class Piece:
    """What one cycle of :meth:`SpeculativeGenerator.stream_steps` adds."""
    tokens: list
    text: str
    logprobs: list            # TokenLogprob per token (empty unless asked for)
    # ``text`` split at token boundaries (only when asked: stream_steps(token_spans=True)):
    # [[text, origin, index], ...] (moa_cpp.token_spans: who
    # chose each token, "target" or the proposer whose draft was accepted)
    spans: list = field(default_factory=list)
    # set on a generation's last piece only (which may carry no text): the whole generation's
    # statistics, finish_reason included -- how they leave a stream, typed, with the stream
    stats: Optional[SpecStats] = None


@dataclass
class GenerationResult:
    """A whole generation (:meth:`SpeculativeGenerator.generate`): text, token ids, statistics,
    why it ended, and the prompt's token ids."""
    text: str
    tokens: list
    stats: SpecStats
    finish_reason: str
    prompt_tokens: list = field(default_factory=list)
