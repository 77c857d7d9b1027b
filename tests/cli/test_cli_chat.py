"""`moa-cpp chat` / `generate -cnv` (issue 25 item 8): an interactive conversation over a real
process's stdin: history, -sys, -p as the first message, /exit and end of input, a stats line per
turn showing the earlier turns reused from the KV cache; the answers are the Python API's for
the same history from a fresh context (greedy)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from moa_cpp import SpeculativeGenerator
from moa_cpp.models import defaults

pytestmark = pytest.mark.model

SYS = "Be brief."
TURNS = ["What is 2+2?", "And times 3?", "Name a prime number."]
# ubatch 32: every decode <= 63 rows, which SmolLM2 computes batch-invariantly here, so a turn that
# reuses the earlier turns' K/V answers as a fresh context does (tests/speculative/test_prompt_cache.py)
FLAGS = ["-n", "24", "-t", "2", "-c", "1024", "-ub", "32"]


def _chat(args, stdin):
    cmd = [sys.executable, "-m", "moa_cpp.cli.main", *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def expected():
    gen = SpeculativeGenerator.from_paths(defaults.default_target(), None, draft="none", n_ctx=1024, n_threads=2,
                                          target_options=dict(n_ubatch=32))
    msgs, out = [{"role": "system", "content": SYS}], []
    try:
        for t in TURNS:
            msgs.append({"role": "user", "content": t})
            r = gen.generate(msgs, chat=True, max_tokens=24, cache_prompt=False)
            msgs.append({"role": "assistant", "content": r.text})
            out.append(r.text)
    finally:
        gen.close()
    return out


def test_chat_transcript(expected):
    p = _chat(["chat", "-sys", SYS, *FLAGS], "\n".join(TURNS) + "\n/exit\nnever read\n")
    assert p.returncode == 0, p.stderr
    want = "".join(f"> {u}\n{a}\n" for u, a in zip(TURNS, expected)) + "> /exit\n"
    assert p.stdout == want
    stats = [ln for ln in p.stderr.splitlines() if ln.startswith("[") and "tokens, prompt" in ln]
    assert len(stats) == 3
    reused = [re.search(r"prompt (\d+) \((\d+) cached\)", s) for s in stats]
    assert reused[0] is None and all(reused[1:])                       # the earlier turns were reused


def test_generate_cnv_first_message_and_end_of_input(expected):
    """-cnv is the same chat; -p is the first user message; end of input ends it (exit 0)."""
    p = _chat(["generate", "-cnv", "-sys", SYS, "-p", TURNS[0], *FLAGS], TURNS[1] + "\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"> {TURNS[0]}\n{expected[0]}\n> {TURNS[1]}\n{expected[1]}\n"


def test_chat_refuses_json():
    p = _chat(["chat", "--json", *FLAGS], "")
    assert p.returncode == 2 and "--json" in p.stderr
