"""Server parts without a model: request validation, keys, bind policy, the session queue, and
the streaming hold-back of stop strings / partial characters."""
from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("starlette")

from moa_cpp.errors import InvalidArgumentError  # noqa: E402
from moa_cpp.streaming import held_back as _held_back  # noqa: E402
from moa_cpp.server.auth import KeyChecker, check_bind, load_api_keys, offered_key  # noqa: E402
from moa_cpp.server.errors import APIError  # noqa: E402
from moa_cpp.server.schemas import ChatRequest, CompletionRequest, parse_body  # noqa: E402
from moa_cpp.server.sessions import SessionPool  # noqa: E402


def _err(body, model=CompletionRequest) -> APIError:
    with pytest.raises(APIError) as e:
        parse_body(body if isinstance(body, bytes) else json.dumps(body).encode(), model)
    assert e.value.status == 400
    return e.value


def test_valid_requests_and_defaults():
    r = parse_body(b'{"prompt": "hi"}', CompletionRequest)
    assert (r.max_tokens, r.temperature, r.top_p, r.top_k, r.stream) == (16, 0.8, 0.95, 40, False)
    assert parse_body(b'{"prompt": [1, 2, 3], "temperature": 0}', CompletionRequest).prompt_value() == [1, 2, 3]
    assert parse_body(b'{"prompt": ["one"]}', CompletionRequest).prompt_value() == "one"
    c = parse_body(json.dumps({"model": "m", "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        "max_completion_tokens": 5, "stop": "x", "seed": -1, "moa": {"draft": "tree:6,8,62"},
        "stream_options": {"include_usage": True}, "n": 1, "presence_penalty": 0}).encode(), ChatRequest)
    assert c.message_dicts() == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}]
    assert c.token_limit == 5 and c.stops == ["x"] and c.seed_or_none is None and c.max_tokens is None


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 10 ** 30}, "max_tokens"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_k": -1}, "top_k"),
    ({"prompt": "x", "seed": -5}, "seed"),
    ({"prompt": "x", "n": 2}, "n"),
    ({"prompt": "x", "logprobs": 6}, "logprobs"),
    ({"prompt": "x", "frequency_penalty": 2.5}, "frequency_penalty"),
    ({"prompt": "x", "stop": ["a"] * 17}, "stop"),
    ({"prompt": "x", "bogus": 1}, "bogus"),
    ({"prompt": "x", "moa": {"draft": "banana"}}, "moa.draft"),
    ({"prompt": "x", "moa": {"draft": 5}}, "moa.draft"),
    ({"prompt": "x", "moa": {"other": 1}}, "moa.other"),
    ({"prompt": [-1]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({}, "prompt"),
])
def test_bad_completion_fields_name_the_parameter(body, param):
    e = _err(body)
    assert e.param is not None and e.param.startswith(param.split(".")[0])
    assert set(e.body()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("body", [
    {"messages": []}, {"messages": [{"content": "x"}]}, {"messages": [{"role": "robot", "content": "x"}]},
    {"messages": [{"role": "user", "content": 5}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
    {"messages": "hi"}, {"messages": [{"role": "user", "content": "x"}], "tools": []},
])
def test_bad_chat_bodies(body):
    _err(body, ChatRequest)


@pytest.mark.parametrize("raw", [b"", b"{", b"[1, 2]", b"null", b'"s"', b"\xff\xfe", b'{"prompt": "\xff"}',
                                 b"[" * 100000, b'{"prompt": "x", "temperature": NaN}',
                                 b'{"prompt": "x", "temperature": 1e999}'])
def test_bad_json(raw):
    assert _err(raw).status == 400


def test_api_keys_from_file_and_env(tmp_path):
    f = tmp_path / "k"
    f.write_text("# comment\n\n  key-one  \nkey-two\n")
    assert load_api_keys(str(f), {}) == ["key-one", "key-two"]
    assert load_api_keys(None, {"MOA_API_KEY": "envkey"}) == ["envkey"]
    assert load_api_keys(None, {}) == []
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(InvalidArgumentError):
        load_api_keys(str(tmp_path / "empty"), {})
    with pytest.raises(InvalidArgumentError):
        load_api_keys(str(tmp_path / "missing"), {})


def test_api_keys_non_ascii_refused_world_readable_warned_inline_warned(tmp_path, caplog):
    """Issue 24 item 8: a non-ASCII key could never match (clients send latin-1 or UTF-8 bytes)
    and was accepted; a key file others can read, and a key on the command line, are warned about."""
    f = tmp_path / "k"
    f.write_text("clé-secrète\n", encoding="utf-8")
    with pytest.raises(InvalidArgumentError, match="ASCII"):
        load_api_keys(str(f), {})
    with pytest.raises(InvalidArgumentError, match="ASCII"):
        load_api_keys(None, {"MOA_API_KEY": "ключ"})
    f.write_text("good-key\n")
    f.chmod(0o644)
    with caplog.at_level("WARNING", logger="moa_cpp.server"):
        assert load_api_keys(str(f), {}) == ["good-key"]
    assert "readable by other users" in caplog.text and "chmod 600" in caplog.text
    caplog.clear()
    f.chmod(0o600)
    with caplog.at_level("WARNING", logger="moa_cpp.server"):
        assert load_api_keys(str(f), {}) == ["good-key"]
        assert caplog.text == ""
        assert load_api_keys(None, {"MOA_API_KEY": "env"}, inline="sk-inline") == ["sk-inline"]
    assert "process list" in caplog.text
    with pytest.raises(InvalidArgumentError, match="not both"):
        load_api_keys(str(f), {}, inline="x")


def test_no_abbreviated_flags_and_no_secret_in_errors(capsys):
    """`moa-cpp serve --api-key-f FILE` once meant --api-key-file; `--api-key sk-...` was read as
    it too and the error printed the key. Now no parser takes abbreviations."""
    from moa_cpp.cli.main import build_parser
    p = build_parser("serve")
    assert p.parse_args(["serve", "--api-key", "sk-secret-123"]).api_key == "sk-secret-123"
    with pytest.raises(SystemExit):
        p.parse_args(["serve", "--api-key-f", "keys.txt"])             # an abbreviation is unknown now
    assert "unrecognized arguments: --api-key-f" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        p.parse_args(["serve", "--api-key", "sk-secret-123", "--port", "x"])
    assert "sk-secret-123" not in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser("generate").parse_args(["generate", "--n-pred", "4"])
    capsys.readouterr()


def test_host_names_served():
    from moa_cpp.server.hosts import HostMiddleware, allowed_hosts, host_name
    assert [host_name(h) for h in ("LocalHost:8080", "[::1]:80", "::1", "a.example.", "127.0.0.1")] == \
        ["localhost", "::1", "::1", "a.example", "127.0.0.1"]

    def served(bind, listed, host):
        return HostMiddleware(None, allowed_hosts(bind, listed)).ok([(b"host", host.encode())])[0]

    for h in ("localhost", "localhost:1", "x.localhost", "127.0.0.1:5", "127.1.2.3", "[::1]:9", "::1"):
        assert served("127.0.0.1", (), h), h
    for h in ("attacker.example", "localhost.attacker.example", "127.0.0.1.nip.io", "[::2]", "0.0.0.0", ""):
        assert not served("127.0.0.1", (), h), h
    assert served("127.0.0.1", ("box.lan",), "BOX.lan:8765") and served("127.0.0.1", ("*",), "any.example")
    assert served("0.0.0.0", (), "any.example")                           # no list: every name
    assert served("0.0.0.0", ("api.example",), "api.example") and not served("0.0.0.0", ("api.example",), "localhost")
    assert HostMiddleware(None, allowed_hosts("127.0.0.1", ())).ok([])[0]   # HTTP/1.0 without Host


def test_key_checker_compares_every_key():
    k = KeyChecker(["alpha", "beta"])
    assert k.check("alpha") and k.check("beta")
    assert not k.check("alph") and not k.check("alphaa") and not k.check("") and not k.check(None)
    assert KeyChecker([]).check(None)                      # no keys configured: open
    assert offered_key([(b"authorization", b"Bearer  abc ")]) == "abc"
    assert offered_key([(b"x-api-key", b"xyz")]) == "xyz"
    assert offered_key([(b"authorization", b"Basic abc")]) is None


def test_bind_policy():
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        check_bind(host, has_keys=False)
    for host in ("0.0.0.0", "::", "192.168.1.10", "example.com"):
        with pytest.raises(InvalidArgumentError):
            check_bind(host, has_keys=False)
        check_bind(host, has_keys=True)
        check_bind(host, has_keys=False, insecure_no_auth=True)


def test_session_pool_fifo_queue_and_503():
    async def main():
        pool = SessionPool(["s0"], max_queue=2, retry_after_s=3)
        s = await pool.acquire()
        w1 = asyncio.ensure_future(pool.acquire())
        w2 = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0)
        with pytest.raises(APIError) as e:
            await pool.acquire()
        assert e.value.status == 503 and e.value.headers["Retry-After"] == "3"
        w1.cancel()                                     # a waiter that leaves loses its place
        await asyncio.sleep(0)
        pool.release(s)
        assert await w2 == "s0" and pool.busy == 1
        pool.release("s0")
        assert pool.busy == 0
        pool.close()
        with pytest.raises(APIError):
            await pool.acquire()
    asyncio.run(main())


def test_stream_hold_back():
    assert _held_back("hello wor", ["world"]) == 3
    assert _held_back("hello", ["world"]) == 0
    assert _held_back("abc\ufffd", []) == 1
    assert _held_back("ab", ["abc", "b"]) == 2


def test_import_moa_cpp_does_not_import_the_web_stack():
    import subprocess
    import sys
    code = ("import sys, moa_cpp, moa_cpp.cli.main; moa_cpp.cli.main.build_parser(); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn', 'openai')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_who_drafts_is_resolved_from_the_models_given(tmp_path):
    """-m alone drafts with prompt lookup; --spec-type names the proposers and must have their
    models; a model nobody drafts with is not loaded."""
    from moa_cpp.models import registry as models
    from moa_cpp.server.sessions import resolve_models
    from moa_cpp.server.settings import ServerSettings
    try:
        target = str(models.smollm2_path())
    except models.ModelNotInstalledError as e:
        pytest.skip(str(e))
    assert resolve_models(ServerSettings(model=target))[1:4] == (None, None, ("ngram",))
    assert resolve_models(ServerSettings(model=target, draft="none"))[3:] == ((), "none")
    _, drafter, _, kinds, draft = resolve_models(ServerSettings(spec_type="moa,ngram"))
    assert drafter is not None and kinds == ("moa", "ngram") and draft == "auto:8"
    assert resolve_models(ServerSettings(spec_type="ngram"))[1] is None      # the embedded drafter unused
    with pytest.raises(InvalidArgumentError, match="needs an MoA drafter"):
        resolve_models(ServerSettings(model=target, spec_type="moa"))
    with pytest.raises(InvalidArgumentError, match="must be <="):
        resolve_models(ServerSettings(model=target, ngram_n_min=4, ngram_n_max=2))
