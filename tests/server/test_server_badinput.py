"""``moa-cpp serve`` under a barrage of malformed requests.

A deterministic generator (``random.Random(SEED)``) builds several hundred bad requests to
``/v1/completions`` and ``/v1/chat/completions``: random bytes, truncated and invalid JSON, JSON
that is not an object, wrong types for every field, out-of-range numbers (NaN / Infinity / 1e309
literals too), unknown fields, 100000-deep nesting, invalid UTF-8 inside strings, a 10 MB body,
wrong or missing Content-Type, bad messages, bad ``moa`` options, ``n: 2``, out-of-vocabulary token
ids and prompts longer than the context. Each must be answered 4xx with OpenAI's error shape. They
are sent from 4 threads while a valid greedy request runs (its text must equal plain greedy
decoding of its prompt, run in-process) and ``/health`` is polled (always 200). Raw-socket abuse
(bad request lines, bodies shorter than their Content-Length, clients leaving mid-generation) must
not hurt the server either. Afterwards the server is alive, still answers correctly, logged no
traceback, grew little, and exits 0 on SIGTERM.
"""
from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from moa_cpp.testing.server_proc import ServerProc

pytestmark = pytest.mark.model

SEED = 20240611
COMPL, CHAT = "/v1/completions", "/v1/chat/completions"
JSON_CT = {"Content-Type": "application/json"}
N_CTX = 4096                     # the server's default context (the fixture does not change it)
MAX_BODY = 1 << 20               # the server's default --max-body-bytes

GREEDY = {"prompt": "The three primary colors are", "max_tokens": 24, "temperature": 0}
BASE_COMPL = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
BASE_CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}


# ---------------------------------------------------------------------------------------- generator

def _j(obj) -> bytes:
    return json.dumps(obj).encode()


def _with(base: dict, **kw) -> bytes:
    d = json.loads(json.dumps(base))
    d.update(kw)
    return _j(d)


INT_BAD = ["5", 5.5, True, False, [], {}, [5], "ten"]
FLOAT_BAD = ["0.5", True, [], {}, [0.5], "NaN"]
STR_BAD = [5, 1.5, True, [], {}, ["a"]]
BOOL_BAD = ["true", 1, 0, 1.0, "yes", [], {}]
OBJ_BAD = ["x", 5, True, [], [1], 1.5]

# field -> values of a wrong type (None where the field is not Optional)
COMMON_BAD = {
    "model": STR_BAD,
    "max_tokens": INT_BAD,
    "temperature": FLOAT_BAD + [None],
    "top_p": FLOAT_BAD + [None],
    "top_k": INT_BAD + [None],
    "seed": INT_BAD,
    "stop": [5, 1.5, True, {}, [1], [None], [[]], [{"a": 1}]],
    "stream": BOOL_BAD + [None],
    "ignore_eos": BOOL_BAD + [None],
    "stream_options": OBJ_BAD + [{"include_usage": "yes"}, {"include_usage": 1}],
    "n": INT_BAD + [None],
    "presence_penalty": FLOAT_BAD + [None],
    "frequency_penalty": FLOAT_BAD + [None],
    "logit_bias": ["x", 5, [], True, {"1": "a"}],
    "user": STR_BAD,
    "moa": OBJ_BAD,
}
COMPL_BAD = {
    "prompt": [5, 1.5, True, {}, None, {"text": "x"}, [1.5], [True], [None], [{}], [[1, "a"]], [["a"]]],
    "echo": [v for v in BOOL_BAD if v != 0] + [None],      # echo: 0 == False is accepted (a no-op)
    "logprobs": ["1", 1.5, True, [], {}],
    "suffix": [5, True, [], {}],
    "best_of": INT_BAD + [None],
}
CHAT_BAD = {
    "messages": ["hi", 5, True, None, {}, {"role": "user", "content": "hi"}, {"0": {"role": "user", "content": "x"}},
                 ["hi"], [5], [None], [[]], [[{"role": "user", "content": "x"}]]],
    "max_completion_tokens": INT_BAD,
    "logprobs": [1, "false", [], {}],
    "top_logprobs": ["1", 1.5, True, [], {}],
}

# out-of-range / semantically bad values (both endpoints unless noted)
RANGE_BAD = [
    ("max_tokens", -1), ("max_tokens", 0), ("max_tokens", 10 ** 30), ("max_tokens", 2 ** 31),
    ("max_tokens", -(10 ** 30)), ("max_tokens", N_CTX + 1), ("max_tokens", 2 ** 31 - 1),
    ("temperature", -1), ("temperature", -1e-9), ("temperature", 101), ("temperature", 1e300),
    ("top_p", 0), ("top_p", 2), ("top_p", -0.5), ("top_p", 1.0000001), ("top_p", 0.0),
    ("seed", -5), ("seed", -2), ("seed", 2 ** 64), ("seed", -(10 ** 30)), ("seed", 10 ** 40),
    ("top_k", -1), ("top_k", 2 ** 31), ("top_k", 10 ** 30),
    ("n", 2), ("n", 0), ("n", -1), ("n", 10 ** 6),
    ("presence_penalty", 2.5), ("presence_penalty", -2.01), ("frequency_penalty", 3), ("frequency_penalty", -9),
    ("logit_bias", {"1": 101}), ("logit_bias", {"50256": -100}), ("logit_bias", {"x": 1}), ("logit_bias", {"-1": 1}),
    ("min_p", 1.5), ("min_p", -0.1), ("repeat_penalty", 0), ("repeat_penalty", -1), ("repeat_last_n", -2),
    ("stop", ["a"] * 17), ("stop", "x" * 257), ("stop", ["ok", "y" * 1000]),
    ("model", "m" * 257), ("user", "u" * 257),
]
COMPL_RANGE_BAD = [("best_of", 2), ("best_of", 0), ("echo", True), ("logprobs", 6), ("logprobs", -1),
                   ("n_probs", 21), ("suffix", "tail")]
CHAT_RANGE_BAD = [("max_completion_tokens", 0), ("max_completion_tokens", -1), ("max_completion_tokens", 10 ** 30),
                  ("max_completion_tokens", N_CTX + 1), ("top_logprobs", 21), ("top_logprobs", -1),
                  ("top_logprobs", 3)]     # top_logprobs without logprobs: true

# literals json.dumps cannot write: spliced in as raw text
RAW_NUMBER_LITERALS = ["1e309", "-1e309", "NaN", "Infinity", "-Infinity", "nan", "inf", "1e99999", "0x10", "+1",
                       "01", "1.", ".5", "1e", "--1"]

MOA_BAD = [{"draft": "banana"}, {"draft": "tree:100,100,10000"}, {"draft": 5}, {"draft": "chain:0"},
           {"draft": "chain:-5"}, {"draft": "chain:17"}, {"draft": "chain:100000"}, {"draft": "auto:-1"},
           {"draft": "auto:abc"}, {"draft": "auto:999999999999999999999"}, {"draft": "tree:0,1,1"},
           {"draft": "tree:1,2"}, {"draft": "tree:17,2,10"}, {"draft": "tree:2,17,10"}, {"draft": "tree:4,4,63"},
           {"draft": "tree:a,b,c"}, {"draft": ""}, {"draft": " "}, {"draft": "x" * 65}, {"draft": ["chain:3"]},
           {"draft": {"mode": "chain"}}, {"draft": True}, {"draft": "chain:3", "extra": 1}, {"kmax": 8},
           "chain:3", 5, [], True]

BAD_MESSAGES = [
    [], [{"content": "hi"}], [{"role": "robot", "content": "hi"}], [{"role": "tool", "content": "hi"}],
    [{"role": "function", "content": "hi"}], [{"role": "USER", "content": "hi"}], [{"role": 5, "content": "hi"}],
    [{"role": None, "content": "hi"}], [{"role": "user", "content": 5}], [{"role": "user", "content": 1.5}],
    [{"role": "user", "content": True}], [{"role": "user", "content": {"text": "hi"}}],
    [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}]}],
    [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                  {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}],
    [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}],
    [{"role": "user", "content": [{"type": "text"}]}], [{"role": "user", "content": [{"type": "text", "text": 5}]}],
    [{"role": "user", "content": [{"text": "hi"}]}], [{"role": "user", "content": ["hi"]}],
    [{"role": "user", "content": [{"type": "text", "text": "hi", "cache": True}]}],
    [{"role": "user", "content": "hi", "tool_calls": []}], [{"role": "user", "content": "hi", "name": 5}],
    [{"role": "user", "content": "hi", "name": "n" * 257}], [{"role": "user", "content": "hi", "extra": 1}],
    [{"role": "user", "content": [{"type": "text", "text": "x"}] * 257}],
    [{"role": "user", "content": "x"}] * 1025,
    [{"role": "user", "content": "hi"}, "second"], [{"role": "user", "content": "hi"}, None],
]

INVALID_JSON = [
    b"{prompt: \"x\"}", b"{'prompt': 'x'}", b'{"prompt": "x",}', b'{"prompt": "x"} trailing', b'{"prompt" "x"}',
    b'{"prompt": undefined}', b'{"prompt": "x\\u12"}', b'{"prompt": "x\\q"}', b'/* c */ {"prompt": "x"}',
    b'{"prompt": "x" // c\n}', b'{"prompt": "x"', b'{"prompt": x}', b'{"prompt": "x"}}', b'{{"prompt": "x"}',
    b'{"prompt": "x\x01y"}', b'{"prompt": "line\nbreak"}', b'{,}', b'{"a" : }', b'{"prompt": True}',
    b'{"prompt": None}', b"", b" ", b"\x00", b"{", b"}", b"[", b'"', b'{"prompt": "\\ud800"}',
    b'{"prompt": "\\udc00x"}', b'{"prompt": "x"}\x00', b'\xef\xbb\xbf{"prompt": "x"}',
    '{"prompt": "x"}'.encode("utf-16"), '{"prompt": "x"}'.encode("utf-32"), b'{"prompt": [1, 2,]}',
    b'{"messages": [{"role": "user", "content": "x"},]}', b"\t\n\r ", b"tru", b"nul", b"{\"prompt\": 'x'}",
]

NOT_OBJECTS = [b"[]", b"[1, 2]", b"5", b"-3.25", b'"a string"', b"null", b"true", b"false", b"0",
               b'[{"prompt": "x"}]', b'[{"messages": [{"role": "user", "content": "x"}]}]', b'"{\\"prompt\\": 1}"']

INVALID_UTF8 = [b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x82", b"\xf8\x88\x80\x80\x80", b"\x80",
                b"\xf4\x90\x80\x80", b"ok\xffok"]

WRONG_CT = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=xyz", "application/xml",
            "application/jsonx", "json", "application/json-patch+json", "text/json", "", "*/*", "application/*",
            "application/ json"]

UNKNOWN_FIELDS = ["foo", "functions", "tools", "tool_choice", "response_format", "Prompt", "max-tokens", "",
                  "\u0000", "temperature ", "logit-bias", "parallel_tool_calls", "stream_option", "modalities"]


def _mutations(rng: random.Random) -> list:
    """[(label, path, body bytes, headers)] of malformed requests, in a seeded random order."""
    out: list = []

    def add(label: str, path: str, body: bytes, headers: "dict | None" = None) -> None:
        out.append((label, path, body, JSON_CT if headers is None else headers))

    bases = ((COMPL, BASE_COMPL), (CHAT, BASE_CHAT))

    # random bytes
    for i in range(30):
        n = rng.choice([0, 1, 2, 7, 64, 500, 4000, 60000])
        add(f"random-bytes-{i}-len{n}", rng.choice((COMPL, CHAT)), bytes(rng.getrandbits(8) for _ in range(n)))
    # truncated JSON of a valid request (always loses the closing brace, at least)
    for i in range(30):
        path, base = rng.choice(bases)
        full = _j({**base, "stop": ["\n\n"], "top_p": 0.9, "seed": 7})
        cut = rng.randrange(1, len(full))
        add(f"truncated-{i}-at{cut}", path, full[:cut])
    # invalid JSON, non-objects
    for i, b in enumerate(INVALID_JSON):
        add(f"invalid-json-{i}", rng.choice((COMPL, CHAT)), b)
    for i, b in enumerate(NOT_OBJECTS):
        add(f"not-object-{i}", COMPL if i % 2 else CHAT, b)
    # wrong types for every field
    for path, base, table in ((COMPL, BASE_COMPL, {**COMMON_BAD, **COMPL_BAD}), (CHAT, BASE_CHAT, {**COMMON_BAD, **CHAT_BAD})):
        for field, values in table.items():
            for v in values:
                add(f"wrong-type-{path}-{field}={json.dumps(v)[:30]}", path, _with(base, **{field: v}))
    # out-of-range numbers and unsupported values
    for path, base, extra in ((COMPL, BASE_COMPL, COMPL_RANGE_BAD), (CHAT, BASE_CHAT, CHAT_RANGE_BAD)):
        for field, v in RANGE_BAD + extra:
            add(f"range-{path}-{field}={json.dumps(v)[:30]}", path, _with(base, **{field: v}))
        for lit in RAW_NUMBER_LITERALS:
            field = rng.choice(["temperature", "top_p", "max_tokens", "seed", "top_k"])
            body = _with(base, **{field: "@@"}).replace(b'"@@"', lit.encode())
            add(f"literal-{path}-{field}={lit}", path, body)
    # unknown fields (top level and nested), endpoint mix-ups, missing required fields
    for path, base in bases:
        for name in UNKNOWN_FIELDS:
            add(f"unknown-{path}-{name!r}", path, _with(base, **{name: 1}))
        for _ in range(6):
            name = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(1, 12))) + "_x"
            add(f"unknown-{path}-{name}", path, _with(base, **{name: rng.choice([1, "a", None, [], {}])}))
        add(f"unknown-{path}-moa.extra", path, _with(base, moa={"draft": "chain:3", "speed": "max"}))
        add(f"unknown-{path}-stream_options.extra", path, _with(base, stream_options={"include_usage": True, "x": 1}))
        for v in (None, {}, []):
            add(f"missing-required-{path}-{v!r}", path, _j(v) if v is not None else b"{}")
    add("chat-body-on-completions", COMPL, _j(BASE_CHAT))
    add("completions-body-on-chat", CHAT, _j(BASE_COMPL))
    add("both-bodies-on-chat", CHAT, _j({**BASE_CHAT, "prompt": "x"}))
    add("missing-prompt", COMPL, _j({"max_tokens": 4}))
    add("missing-messages", CHAT, _j({"max_tokens": 4}))
    add("unknown-in-message", CHAT, _with(BASE_CHAT, messages=[{"role": "user", "content": "x", "foo": 1}]))
    # deeply nested JSON
    depth = 100_000
    add("nested-array-100k", COMPL, b"[" * depth)
    add("nested-array-100k-closed", CHAT, b"[" * depth + b"]" * depth)
    add("nested-object-50k", COMPL, b'{"a":' * 50_000 + b"1" + b"}" * 50_000)
    add("nested-in-prompt", COMPL, b'{"prompt": ' + b"[" * depth + b"]" * depth + b', "max_tokens": 4}')
    add("nested-in-moa", CHAT, b'{"messages": [{"role": "user", "content": "x"}], "moa": ' + b'{"draft": ' * 20_000
        + b'"none"' + b"}" * 20_000 + b"}")
    add("nested-in-content", CHAT, b'{"messages": [{"role": "user", "content": ' + b"[" * depth + b"]" * depth + b"}]}")
    add("nested-shallow-prompt", COMPL, _with(BASE_COMPL, prompt=[[[1]]]))
    # invalid UTF-8 inside strings (raw bytes in the JSON text)
    for i, bad in enumerate(INVALID_UTF8):
        add(f"utf8-prompt-{i}", COMPL, b'{"prompt": "a' + bad + b'b", "max_tokens": 4}')
        add(f"utf8-content-{i}", CHAT, b'{"messages": [{"role": "user", "content": "a' + bad + b'"}], "max_tokens": 4}')
    add("utf8-in-key", COMPL, b'{"prompt": "a", "\xff\xfe": 1}')
    add("utf8-in-model", CHAT, b'{"messages": [{"role": "user", "content": "a"}], "model": "\xff"}')
    add("utf8-in-role", CHAT, b'{"messages": [{"role": "us\xffer", "content": "a"}]}')
    add("utf8-in-draft", COMPL, b'{"prompt": "a", "moa": {"draft": "chain:\xff"}}')
    # bodies over the limit
    big = b'{"prompt": "' + b"a" * (10 << 20) + b'", "max_tokens": 4}'
    add("body-10MB", COMPL, big)
    add("body-10MB-chat", CHAT, b'{"messages": [{"role": "user", "content": "' + b"a" * (10 << 20) + b'"}]}')
    add("body-limit+1", COMPL, b'{"prompt": "' + b"b" * (MAX_BODY - 12) + b'"}')
    add("body-random-2MB", CHAT, rng.randbytes(2 << 20))
    # wrong / missing Content-Type (the body itself is valid)
    for path, base in bases:
        for ct in WRONG_CT:
            add(f"content-type-{path}-{ct!r}", path, _j(base), {"Content-Type": ct})
        add(f"content-type-{path}-missing", path, _j(base), {})
        add(f"content-type-{path}-form", path, b"prompt=hello&max_tokens=4",
            {"Content-Type": "application/x-www-form-urlencoded"})
    # bad messages
    for i, msgs in enumerate(BAD_MESSAGES):
        add(f"messages-{i}", CHAT, _with(BASE_CHAT, messages=msgs))
    # bad moa
    for path, base in bases:
        for m in MOA_BAD:
            add(f"moa-{path}-{json.dumps(m)[:40]}", path, _with(base, moa=m))
    # out-of-vocabulary token ids and bad prompt shapes
    for p in ([-1], [10 ** 9], [2 ** 31 - 1], [2 ** 31], [10 ** 30], [1, 2, -3], [[-1]], [[10 ** 9]], [],
              [[]], ["a", "b"], [[1], [2]], [1, "a"], [1.0], "", [""], [[0.5]]):
        add(f"prompt-{json.dumps(p)[:30]}", COMPL, _with(BASE_COMPL, prompt=p))
    # prompts longer than the context (well under the body limit)
    add("long-prompt-text", COMPL, _with(BASE_COMPL, prompt="hello " * 20000))
    add("long-prompt-text-batch", COMPL, _with(BASE_COMPL, prompt=["hello " * 20000]))
    add("long-prompt-ids", COMPL, _with(BASE_COMPL, prompt=[1] * (N_CTX + 10)))
    add("long-prompt-chat", CHAT, _with(BASE_CHAT, messages=[{"role": "user", "content": "hello " * 20000}]))
    add("long-prompt-chat-many", CHAT,
        _with(BASE_CHAT, messages=[{"role": "user", "content": "hello " * 40}] * 1000))
    # random field mutations to top the count up (deterministic too)
    pool = [(COMPL, BASE_COMPL, f, v) for f, vs in {**COMMON_BAD, **COMPL_BAD}.items() for v in vs] + \
           [(CHAT, BASE_CHAT, f, v) for f, vs in {**COMMON_BAD, **CHAT_BAD}.items() for v in vs]
    for i in range(40):
        path, base, f, v = rng.choice(pool)
        f2, v2 = rng.choice(RANGE_BAD)
        add(f"combo-{i}-{f}+{f2}", path, _with(base, **{f: v, f2: v2}))
    rng.shuffle(out)
    return out


def _send(host: str, port: int, path: str, body: bytes, headers: dict, timeout: float = 60.0) -> tuple:
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request("POST", path, body=body, headers=headers)
        r = c.getresponse()
        return r.status, r.getheader("Content-Type", ""), r.read()
    finally:
        c.close()


def _problem(status: int, ctype: str, data: bytes) -> "str | None":
    """Why this answer is not a 4xx OpenAI error (None if it is)."""
    if not 400 <= status < 500:
        return f"status {status}: {data[:200]!r}"
    if not ctype.startswith("application/json"):
        return f"status {status} with Content-Type {ctype!r}: {data[:200]!r}"
    try:
        body = json.loads(data)
    except ValueError:
        return f"status {status}, body not JSON: {data[:200]!r}"
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or set(err) != {"message", "type", "param", "code"}:
        return f"status {status}, not the OpenAI error shape: {body!r:.300}"
    if not isinstance(err["message"], str) or not err["message"] or not isinstance(err["type"], str):
        return f"status {status}, message/type not strings: {body!r:.300}"
    return None


# ---------------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def server():
    s = ServerProc("--parallel", "2", "--queue", "8", "--body-timeout", "2")
    try:
        yield s
    finally:
        rc = s.terminate()
        assert rc == 0, f"SIGTERM exit status {rc}; stderr:\n{''.join(s.stderr_lines)[-4000:]}"


def _greedy_text(server: ServerProc) -> str:
    status, _, body = server.post(COMPL, GREEDY, timeout=60)
    assert status == 200, body
    return body["choices"][0]["text"]


@pytest.fixture(scope="module")
def baseline() -> str:
    """The reference for GREEDY: plain greedy decoding in-process (no drafter), what
    `moa-cpp generate --no-draft` runs; not the server's own earlier answer."""
    from moa_cpp import SpeculativeGenerator
    from moa_cpp.models import defaults
    plain = SpeculativeGenerator.from_paths(defaults.default_target(), None, draft="none", n_threads=1)
    try:
        text = plain.generate(GREEDY["prompt"], max_tokens=GREEDY["max_tokens"]).text
    finally:
        plain.close()
    assert text, "the greedy request generated nothing"
    return text


# ---------------------------------------------------------------------------------------- tests

def test_generator_is_deterministic_and_large():
    a, b = _mutations(random.Random(SEED)), _mutations(random.Random(SEED))
    assert [(x[0], x[2]) for x in a] == [(x[0], x[2]) for x in b]
    assert len(a) >= 300, len(a)


def test_malformed_barrage(server, baseline):
    cases = _mutations(random.Random(SEED))
    assert len(cases) >= 300
    rss0 = server.rss_kib()
    stop = threading.Event()
    health: list = []
    greedy: list = []

    def poll_health() -> None:
        while not stop.is_set():
            try:
                health.append(server.health())
            except Exception as e:           # a timeout or reset is a failure too
                health.append(repr(e))
            stop.wait(0.05)

    def repeat_greedy() -> None:
        while not stop.is_set() or not greedy:
            try:
                greedy.append(_greedy_text(server))
            except BaseException as e:
                greedy.append(repr(e))

    def one(case: tuple) -> "str | None":
        label, path, body, headers = case
        try:
            why = _problem(*_send(server.host, server.port, path, body, headers))
        except Exception as e:
            why = f"no answer: {e!r}"
        return None if why is None else f"{label} -> {why}"

    side = [threading.Thread(target=poll_health, daemon=True), threading.Thread(target=repeat_greedy, daemon=True)]
    for t in side:
        t.start()
    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=4) as ex:
            failures = [f for f in ex.map(one, cases) if f]
    finally:
        stop.set()
        for t in side:
            t.join(90)
    elapsed = time.monotonic() - t0
    rss1 = server.rss_kib()

    assert server.proc.poll() is None, "the server died during the barrage"
    assert not failures, f"{len(failures)} of {len(cases)} malformed requests not answered 4xx + OpenAI error:\n" + \
        "\n".join(failures[:40])
    assert health and all(h == 200 for h in health), f"/health during the barrage: {health}"
    assert greedy and all(g == baseline for g in greedy), \
        f"greedy text under the barrage is not plain decoding's {baseline!r}: {greedy}"
    growth_mib = (rss1 - rss0) / 1024
    assert growth_mib < 200, f"server RSS grew {growth_mib:.1f} MiB over the barrage ({rss0} -> {rss1} KiB)"
    print(f"\n{len(cases)} malformed requests in {elapsed:.1f}s; {len(health)} health polls; "
          f"{len(greedy)} concurrent greedy runs; RSS {rss0 / 1024:.0f} -> {rss1 / 1024:.0f} MiB "
          f"({growth_mib:+.1f} MiB)")


def _raw(host: str, port: int, data: bytes, *, half_close: bool = True, read: bool = True,
         timeout: float = 15.0, linger: float = 0.0) -> bytes:
    """Send bytes on a fresh socket; read whatever comes back until the server closes."""
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        if data:
            s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        time.sleep(linger)
        got = b""
        if read:
            while True:
                try:
                    chunk = s.recv(65536)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                got += chunk
        return got
    finally:
        s.close()


def _post_head(path: str, extra: str = "", length: "int | None" = None) -> bytes:
    cl = "" if length is None else f"Content-Length: {length}\r\n"
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{cl}{extra}\r\n").encode()


RAW_CASES = [
    ("garbage-line", b"GARBAGE\r\n\r\n"),
    ("bad-version", b"GET /health HTTP/9.9\r\n\r\n"),
    ("no-version", b"GET /health\r\n\r\n"),
    ("lowercase-method-space", b"post  /v1/completions  HTTP/1.1\r\n\r\n"),
    ("header-no-colon", b"GET /health HTTP/1.1\r\nHost x\r\n\r\n"),
    ("nul-in-header", b"GET /health HTTP/1.1\r\nHost: a\x00b\r\n\r\n"),
    ("nul-in-path", b"GET /he\x00alth HTTP/1.1\r\nHost: a\r\n\r\n"),
    ("utf8-in-path", b"GET /\xff\xfe HTTP/1.1\r\nHost: a\r\n\r\n"),
    ("huge-header", b"GET /health HTTP/1.1\r\nHost: a\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n"),
    ("many-headers", b"GET /health HTTP/1.1\r\nHost: a\r\n" + b"X-H: 1\r\n" * 5000 + b"\r\n"),
    ("tls-hello", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)) * 2),
    ("random-bytes", bytes(random.Random(SEED).getrandbits(8) for _ in range(3000))),
    ("bare-newlines", b"\n\n\n\n"),
    ("short-body", _post_head(COMPL, length=100) + b'{"prom'),
    ("short-body-chat", _post_head(CHAT, length=5000) + b'{"messages": [{"role": "user", '),
    ("no-body", _post_head(COMPL, length=10)),
    ("negative-length", _post_head(COMPL, length=-1) + b"{}"),
    ("non-numeric-length", _post_head(COMPL, extra="Content-Length: abc\r\n") + b"{}"),
    ("conflicting-lengths", _post_head(COMPL, extra="Content-Length: 5\r\nContent-Length: 7\r\n") + b"{}"),
    ("huge-length", _post_head(COMPL, length=10 ** 15) + b'{"prompt": "x"'),
    ("bad-chunk-size", _post_head(COMPL, extra="Transfer-Encoding: chunked\r\n") + b"zz\r\n{}\r\n"),
    ("chunked-then-close", _post_head(COMPL, extra="Transfer-Encoding: chunked\r\n") + b"5\r\n{\"pro\r\n"),
    ("chunked-and-length", _post_head(COMPL, extra="Transfer-Encoding: chunked\r\n", length=4) + b"0\r\n\r\n"),
    ("pipelined-bad-then-good", _post_head(COMPL, length=3) + b"{x}" + b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n"),
    ("expect-100-then-close", _post_head(COMPL, extra="Expect: 100-continue\r\n", length=50)),
    ("connect-and-close", b""),
]


def test_raw_socket_abuse(server):
    body = json.dumps({"prompt": "Write a long story about a dragon.", "max_tokens": 400, "temperature": 0}).encode()
    chat = json.dumps({"messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 400,
                       "stream": True, "temperature": 0}).encode()
    hung = []
    for label, data in RAW_CASES:
        try:
            _raw(server.host, server.port, data)
        except socket.timeout:
            hung.append(label)
        except OSError:
            pass                               # a reset is fine: the server may drop a bad connection
    # clients that leave at once or mid-generation (plain and streaming), without reading anything
    for linger in (0.0, 0.0, 0.3, 0.3):
        for req in (_post_head(COMPL, length=len(body)) + body, _post_head(CHAT, length=len(chat)) + chat):
            _raw(server.host, server.port, req, half_close=False, read=False, linger=linger)
    assert not hung, f"the server neither answered nor closed after the client's end of input: {hung}"
    assert server.proc.poll() is None
    assert server.health() == 200
    print(f"\n{len(RAW_CASES) + 8} raw-socket cases")


def test_alive_and_correct_after(server, baseline):
    assert server.proc.poll() is None
    assert server.health() == 200
    assert _greedy_text(server) == baseline          # sessions were all given back (no leak from the abuse)
    status, _, body = server.post(CHAT, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert status == 200 and body["choices"][0]["message"]["role"] == "assistant", body
    # parallel 2: both sessions free again (clients that left mid-generation stopped their jobs)
    with ThreadPoolExecutor(max_workers=2) as ex:
        assert list(ex.map(lambda _: _greedy_text(server), range(2))) == [baseline, baseline]
    log = "".join(server.stderr_lines)
    assert "Traceback" not in log and "ERROR" not in log, f"the server logged errors:\n{log[-4000:]}"


def test_a_body_that_never_arrives_times_out_with_408(server):
    """Slowloris: headers promise 100 bytes, 10 arrive; the server answers 408 after
    --body-timeout (2 s here) instead of holding the connection forever."""
    import socket as _socket
    import time as _time
    with _socket.create_connection((server.host, server.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\":")
        t = _time.monotonic()
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        assert data.startswith(b"HTTP/1.1 408"), data[:100]
        assert _time.monotonic() - t < 15
    assert server.health() == 200
