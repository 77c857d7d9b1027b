"""Load on a real `moa-cpp serve`: 8 concurrent clients x 10 requests each, mixed streaming /
non-streaming / sampling / chat / completion, through the official `openai` package, against a
server with 2 sessions and a queue that holds the rest. Every request completes, every greedy
answer equals plain greedy decoding of the same prompt (in-process, no drafter: what
`moa-cpp generate --no-draft` runs), and the server's RSS stays bounded."""
from __future__ import annotations

import threading

import pytest

from moa_cpp.testing.server_proc import ServerProc

pytestmark = [pytest.mark.model, pytest.mark.slow]

CLIENTS, PER_CLIENT = 8, 10
MAX_TOKENS = 12
PROMPTS = ["The capital of Italy is", "def is_prime(n):", "Water boils at", "A haiku about autumn:",
           "The largest planet is", "import numpy as np\n"]
QUESTIONS = ["What is the color of the sky?", "Give me a synonym of happy.", "How many legs does a cat have?"]


@pytest.fixture(scope="module")
def plain():
    """The reference: plain greedy decoding, what `moa-cpp generate --no-draft` runs."""
    from moa_cpp import SpeculativeGenerator
    from moa_cpp.models import defaults
    gen = SpeculativeGenerator.from_paths(defaults.default_target(), None, draft="none", n_threads=1)
    yield gen
    gen.close()


def _plain_text(plain, kind: str, text: str) -> str:
    return plain.generate(text, max_tokens=MAX_TOKENS, chat=kind == "chat").text


def _request(client, i: int):
    """Request number i of the mix: (kind, greedy, callable returning the text)."""
    greedy = i % 3 != 2
    temp = 0 if greedy else 0.9
    extra = {} if greedy else {"seed": i, "top_p": 0.9}
    stream = i % 2 == 1
    if i % 4 < 2:
        p = PROMPTS[i % len(PROMPTS)]

        def run():
            r = client.completions.create(model="m", prompt=p, max_tokens=MAX_TOKENS, temperature=temp, stream=stream,
                                          **extra)
            return "".join(c.choices[0].text for c in r if c.choices) if stream else r.choices[0].text
        return ("cmpl", p, temp, stream), greedy, run
    q = QUESTIONS[i % len(QUESTIONS)]

    def run():
        msgs = [{"role": "user", "content": q}]
        r = client.chat.completions.create(model="m", messages=msgs, max_tokens=MAX_TOKENS, temperature=temp,
                                           stream=stream, **extra)
        return "".join(c.choices[0].delta.content or "" for c in r if c.choices) if stream \
            else r.choices[0].message.content
    return ("chat", q, temp, stream), greedy, run


def test_eight_clients_ten_requests_each(plain):
    openai = pytest.importorskip("openai")
    srv = ServerProc("--parallel", "2", "--queue", "16", "--draft", "chain:3")
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
        # the reference: plain greedy decoding of every greedy request's prompt / question
        ref = {}
        for i in range(CLIENTS * PER_CLIENT):
            key, greedy, _ = _request(client, i)
            if greedy and (key[0], key[1]) not in ref:
                ref[(key[0], key[1])] = _plain_text(plain, key[0], key[1])
        assert {k for k, _ in ref} == {"cmpl", "chat"} and all(ref.values()), ref
        rss0 = srv.rss_kib()
        results: dict = {}
        errors: list = []

        def worker(c: int):
            for j in range(PER_CLIENT):
                i = c * PER_CLIENT + j
                key, greedy, run = _request(client, i)
                try:
                    results[i] = (key, greedy, run())
                except Exception as e:              # reported below, with the request
                    errors.append((i, key, repr(e)))

        threads = [threading.Thread(target=worker, args=(c,)) for c in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        assert not errors, errors[:5]
        assert len(results) == CLIENTS * PER_CLIENT
        mismatched = [(i, k) for i, (k, greedy, text) in results.items() if greedy and text != ref[(k[0], k[1])]]
        assert not mismatched, [(i, k, results[i][2], ref[(k[0], k[1])]) for i, k in mismatched][:5]
        assert all(text for _, _, text in results.values())
        grown = srv.rss_kib() - rss0
        assert grown < 150 * 1024, f"server RSS grew by {grown / 1024:.0f} MiB under load"
        assert srv.health() == 200
    finally:
        assert srv.terminate() == 0
