"""``moa-cpp chat`` (and ``generate -cnv``): an interactive conversation, as llama.cpp's
``llama-cli -cnv``.

Each turn renders the whole history with the target's chat template and generates with
speculation; the KV caches (target and drafter) keep the earlier turns, so a turn decodes only
its new message (``cache_prompt``). ``-sys`` is the system message, ``-p`` / ``-f`` the first user
message. ``/exit`` (or end of input, Ctrl-D) ends it; Ctrl-C stops an answer (what was said is
kept) or, at the prompt, ends it. After each answer a stats line goes to stderr. When the history
no longer fits the context with room for an answer, the oldest turns are dropped (the system
message stays), and the line says so.
"""
from __future__ import annotations

import argparse
import sys

from moa_cpp.cli.generate import (_grammar, add_generate_arguments, build_generator, calibrate_after, check_sampling_args,
                           sampling_kwargs, stats_line)
from moa_cpp.errors import InvalidArgumentError

EXIT = ("/exit", "/quit", "/bye")
PROMPT = "> "


def add_chat_arguments(p: argparse.ArgumentParser) -> None:
    add_generate_arguments(p)


def _first_message(args: argparse.Namespace):
    if args.prompt is not None and args.file:
        raise InvalidArgumentError("give -p/--prompt or -f/--file, not both")
    if args.file:
        try:
            return open(args.file, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidArgumentError(f"-f/--file {args.file}: {getattr(e, 'strerror', None) or e}") from None
    return args.prompt


def _fit(gen, msgs: list, max_tokens: int) -> int:
    """Drop the oldest user/assistant turns until the prompt leaves ``max_tokens`` of room (at
    least one token); returns how many messages were dropped."""
    head = 1 if msgs and msgs[0]["role"] == "system" else 0
    dropped = 0
    while True:
        n = len(gen.encode(msgs, True))
        if n + min(max_tokens, 64) <= gen.target.n_ctx or len(msgs) - head <= 1:
            if n >= gen.target.n_ctx:
                raise InvalidArgumentError(f"the message ({n} tokens) does not fit the context "
                                           f"({gen.target.n_ctx}): raise -c/--ctx-size")
            return dropped
        del msgs[head: head + 2]
        dropped += 2


def _read(first: list, interactive: bool) -> str:
    """The next user message (EOFError at the end of input); piped input is echoed after the
    prompt, so that the transcript reads as the conversation."""
    if first:
        text = first.pop()
    elif interactive:
        return input(PROMPT)
    else:
        text = sys.stdin.readline()
        if not text:
            raise EOFError
        text = text.rstrip("\n")
    print(PROMPT + text, flush=True)
    return text


def run_chat(args: argparse.Namespace) -> int:
    from moa_cpp.target.llama_log import set_llama_log

    check_sampling_args(args)
    set_llama_log(bool(args.llama_verbose or getattr(args, "verbose", False)))
    if args.json:
        raise InvalidArgumentError("--json: not with an interactive chat (use `moa-cpp generate --chat --json`)")
    first = [m for m in [_first_message(args)] if m is not None]
    grammar = _grammar(args)
    gen, _ = build_generator(args, grammar)
    kw = sampling_kwargs(args, grammar)
    msgs: list = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
    interactive = sys.stdin.isatty()
    if interactive:
        print("[chat: /exit or Ctrl-D ends it; Ctrl-C stops an answer]", file=sys.stderr, flush=True)
    try:
        while True:
            try:
                user = _read(first, interactive)
            except (EOFError, KeyboardInterrupt):
                print(file=sys.stderr)
                break
            if user.strip() in EXIT:
                break
            if not user.strip():
                continue
            msgs.append({"role": "user", "content": user})
            dropped = _fit(gen, msgs, args.max_tokens)
            pieces: list = []
            stats = None                   # the last piece's (none when interrupted)
            try:
                for piece in gen.stream_steps(msgs, chat=True, **kw):
                    pieces.append(piece.text)
                    sys.stdout.write(piece.text)
                    sys.stdout.flush()
                    stats = piece.stats or stats
            except KeyboardInterrupt:
                pass                       # the answer so far stays in the history
            sys.stdout.write("\n")
            sys.stdout.flush()
            msgs.append({"role": "assistant", "content": "".join(pieces)})
            note = f" [dropped the {dropped} oldest messages: the context is full]" if dropped else ""
            if stats is not None:
                print(stats_line(stats) + note, file=sys.stderr, flush=True)
            gen.loop.settle()          # while the user reads: the next turn reuses this one whole
        calibrate_after(gen)
    finally:
        gen.close()
    return 0
