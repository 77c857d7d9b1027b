"""``logprobs`` in OpenAI's shapes, from the verification rows (``TokenLogprob``: every emitted
token has the row that chose it, so speculation gives them for free).

- chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
  "bytes"}, ...]}, ...], "refusal": null}`` (``logprobs: true``, ``top_logprobs: N``);
- completions: ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}, ...],
  "text_offset"}`` (``logprobs: N``; as llama-cpp-python, each top dict also holds the chosen
  token). ``text_offset`` counts characters from the start of the completion.

A token's text is its piece (``token_bytes``); a piece that is part of a multi-byte character is
shown with U+FFFD and its exact ``bytes`` (chat), as OpenAI does.
"""
from __future__ import annotations

from typing import Any


class LogprobWriter:
    """Turns the TokenLogprobs of one generation into response objects, piece by piece (the
    streamed chunks carry their own tokens' entries; offsets continue across chunks)."""

    def __init__(self, target: Any, chat: bool) -> None:
        self.target, self.chat = target, chat
        self._seen = b""                      # the bytes of the tokens written so far

    def _text(self, tok: int) -> tuple:
        b = self.target.token_bytes(tok)
        return b, b.decode("utf-8", "replace")

    def part(self, lps: list) -> Any:
        """The ``logprobs`` object of these tokens (chat: ``{"content": [...]}``)."""
        if self.chat:
            return {"content": [self._chat_entry(lp) for lp in lps], "refusal": None}
        out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for lp in lps:
            b, s = self._text(lp.token)
            out["text_offset"].append(len(self._seen.decode("utf-8", "ignore")))
            self._seen += b
            out["tokens"].append(s)
            out["token_logprobs"].append(lp.logprob)
            top = {self._text(i)[1]: v for i, v in lp.top}
            top[s] = lp.logprob
            out["top_logprobs"].append(top)
        return out

    def _chat_entry(self, lp: Any) -> dict:
        b, s = self._text(lp.token)
        self._seen += b
        top = []
        for i, v in lp.top:
            tb, ts = self._text(i)
            top.append({"token": ts, "logprob": v, "bytes": list(tb)})
        return {"token": s, "logprob": lp.logprob, "bytes": list(b), "top_logprobs": top}
