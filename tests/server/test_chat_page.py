"""The chat page of `moa-cpp serve` (GET /, issue 27) in a real headless browser: Debian's
Chromium through selenium (scripts/browser.sh installs it; without it these tests skip, saying
so). Against a real server with a key: the key prompt, a streamed greedy answer equal to the
API's answer for the same request, the drafted tokens it highlights counted equal to the API's
count, stop mid-stream. Against a scripted stream: model output that is markup stays text, and
an answer that ends with finish_reason "abort" says so."""
from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import threading
import time

import pytest

from moa_cpp.testing.server_proc import ServerProc, sse_events

KEY = "page-key-1"
PROMPT = "Repeat this sentence twice: The quick brown fox jumps over the lazy dog."
MAX_TOKENS = 32


def _browser_missing() -> str:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    for exe in ("chromium", "chromedriver"):
        if shutil.which(exe) is None:
            return f"{exe} is not installed (bash scripts/browser.sh: Debian's chromium + chromium-driver)"
    return ""


@pytest.fixture(scope="module")
def browser():
    why = _browser_missing()
    if why:
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,850"):
        opts.add_argument(a)
    opts.binary_location = shutil.which("chromium")
    d = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    d.set_page_load_timeout(60)
    yield d
    d.quit()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    keys = tmp_path_factory.mktemp("k") / "keys"
    keys.write_text(KEY + "\n")
    keys.chmod(0o600)
    srv = ServerProc("--api-key-file", str(keys), "--draft", "chain:3", "--spec-type", "moa,ngram")
    yield srv
    assert srv.terminate() == 0


def _wait(cond, timeout=180.0, what="condition"):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        v = cond()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _text(d, css):
    """The first match's text, "" while nothing matches (the page may still be rendering)."""
    found = _by(d, css)
    return found[0].text if found else ""


def _by(d, css):
    from selenium.webdriver.common.by import By
    return d.find_elements(By.CSS_SELECTOR, css)


def _answers(d):
    return _by(d, ".msg.assistant")


def _send(d, prompt):
    n = len(_answers(d))
    box = _by(d, "#prompt")[0]
    box.clear()
    box.send_keys(prompt)
    _by(d, "#send")[0].click()
    return _wait(lambda: _answers(d)[n] if len(_answers(d)) > n else None, 30, "the answer box")


def _set(d, field, value):
    el = _by(d, f"#{field}")[0]
    d.execute_script("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('change'));", el, value)


# ---------------------------------------------------------------------- raw HTTP


def test_page_is_public_and_locked_down(server):
    st, h, body = server.request("GET", "/")
    assert st == 200 and h["content-type"].startswith("text/html")
    csp = h["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert h["x-content-type-options"] == "nosniff"
    html = body.decode()
    # no inline script and no inline event handlers: the CSP would block them
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html) and not re.search(r"\son[a-z]+=", html)
    for path, kind in (("/ui/chat.js", "text/javascript"), ("/ui/chat.css", "text/css")):
        st, h, _ = server.request("GET", path)
        assert st == 200 and h["content-type"].startswith(kind)
    # the data behind the page asks for the key
    assert server.request("GET", "/props")[0] == 401
    st, _, props = server.request("GET", "/props", headers={"Authorization": f"Bearer {KEY}"})
    assert st == 200 and props["proposer"] == "moa,ngram" and props["draft"] == "chain:3"
    # the page's files are public on GET only, and the Host check still applies to them
    assert server.request("POST", "/", b"{}")[0] in (401, 405)
    assert server.request("GET", "/", headers={"Host": "attacker.example"})[0] == 400


def _sse_chunks(server, body):
    c = server.conn()
    try:
        c.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                  headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        r = c.getresponse()
        assert r.status == 200
        return [e for e in sse_events(r) if e != "[DONE]"]
    finally:
        c.close()


def test_stream_extension_moa_pieces(server):
    """``moa_pieces`` (the page's per-token colouring, an extension field): each chunk's pieces
    concatenate to its content; every token is listed, in order; the drafted ones are the
    answer's emitted_from count; the OpenAI fields are those of any chunk."""
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS, "temperature": 0,
            "stream": True, "moa": {"draft": "chain:3"}}
    chunks = _sse_chunks(server, body)
    text, toks, drafted = "", [], set()
    for ch in chunks:
        assert set(ch) <= {"id", "object", "created", "model", "choices", "moa", "moa_pieces"}
        content = (ch["choices"][0]["delta"].get("content") if ch["choices"] else None) or ""
        if content:
            pieces = ch["moa_pieces"]
            assert "".join(p[0] for p in pieces) == content
            for _, origin, idx in pieces:
                if not toks or toks[-1] != idx:
                    toks.append(idx)
                if origin != "target":
                    drafted.add(idx)
        text += content
    moa = chunks[-1]["moa"]
    assert toks == list(range(len(toks))) and len(toks) == sum(moa["emitted_from"].values())
    assert len(drafted) == sum(v for k, v in moa["emitted_from"].items() if k != "target") > 0
    assert set(moa["emitted_from"]) <= {"target", "moa", "ngram", "moa+ngram"}
    st, _, whole = server.post("/v1/chat/completions", {**body, "stream": False}, key=KEY)
    assert st == 200 and whole["choices"][0]["message"]["content"] == text
    assert whole["moa"]["emitted_from"] == moa["emitted_from"]


# ---------------------------------------------------------------------- real server in a browser


def test_key_prompt_answer_and_highlighted_drafts(server, browser):
    import openai

    d = browser
    d.get(server.url + "/")
    dialog = _wait(lambda: [e for e in _by(d, "#key-dialog") if e.is_displayed()], 30, "the key prompt")[0]
    key = _by(d, "#api-key")[0]
    key.send_keys(KEY)
    key.submit()
    _wait(lambda: not dialog.is_displayed(), 10, "the key prompt to close")
    _wait(lambda: "draft chain:3" in _text(d, "#server-info"), 30, "the server's props")
    assert d.execute_script("return sessionStorage.getItem('moa-cpp-api-key')") == KEY
    assert KEY not in d.current_url
    _set(d, "temperature", "0")
    _set(d, "max-tokens", str(MAX_TOKENS))
    _set(d, "draft-custom", "chain:3")
    box = _send(d, PROMPT)
    _wait(lambda: box.get_attribute("data-state") == "done", 240, "the streamed answer")
    shown = d.execute_script("return arguments[0].querySelector('.content').textContent", box)

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": PROMPT}], temperature=0,
                                       max_tokens=MAX_TOKENS, extra_body={"moa": {"draft": "chain:3"}})
    assert shown == r.choices[0].message.content and shown
    moa = r.model_extra["moa"]
    drafted_api = sum(v for k, v in moa["emitted_from"].items() if k != "target")
    drafted_page = {s.get_attribute("data-tok") for s in _by(d, ".msg.assistant .tok.from-draft")}
    assert len(drafted_page) == drafted_api > 0, (drafted_page, moa)
    assert box.get_attribute("data-drafted") == str(drafted_api)
    # every token is shown once, drafted or the target's own
    all_toks = {s.get_attribute("data-tok") for s in _by(d, ".msg.assistant .tok")}
    assert len(all_toks) == sum(moa["emitted_from"].values()) == r.usage.completion_tokens
    stats = _by(d, ".msg.assistant .stats")[0].text
    assert "tau" in stats and "target calls" in stats and "tok/s" in stats
    assert not _by(d, ".msg.assistant .notice")


def test_stop_mid_stream(server, browser):
    d = browser
    _by(d, "#new-chat")[0].click()
    assert not _answers(d)
    _set(d, "max-tokens", "400")
    _set(d, "draft-custom", "")
    box = _send(d, "Write a long story about a dragon who learns to bake bread.")
    _wait(lambda: len(d.execute_script("return arguments[0].querySelector('.content').textContent", box)) > 20,
          120, "some streamed text")
    _by(d, "#stop")[0].click()
    _wait(lambda: box.get_attribute("data-state") == "done", 30, "the stopped answer")
    assert box.get_attribute("data-finish") == "stopped"
    assert "Stopped by you" in _by(d, ".msg.assistant .notice")[0].text
    text = d.execute_script("return arguments[0].querySelector('.content').textContent", box)
    assert 20 < len(text)
    # the server lives on and answers the next request
    st, _, r = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
                           key=KEY)
    assert st == 200 and r["choices"][0]["finish_reason"] in ("stop", "length")


# ---------------------------------------------------------------------- scripted stream


HOSTILE = ["<script>window.__pwned = 1</script>", " <img src=x onerror=\"window.__pwned = 2\">", " & done"]


def _scripted_app():
    """The page's own files (moa_cpp.server.ui) with a scripted answer: markup as model output,
    split into drafted and target tokens, ending with finish_reason "abort"."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    from moa_cpp.server.ui import ChatPage

    async def props(request):
        return JSONResponse({"model": "scripted", "proposer": "moa", "draft": "chain:3"})

    async def chat(request):
        def chunk(**kw):
            return "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0,
                                          "model": "scripted", **kw}) + "\n\n"

        def events():
            yield chunk(choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
            for i, text in enumerate(HOSTILE):
                pieces = [[text[:5], "moa", 2 * i], [text[5:], "target", 2 * i + 1]]
                yield chunk(choices=[{"index": 0, "delta": {"content": text}, "finish_reason": None}],
                            moa_pieces=pieces)
            yield chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "abort"}])
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/props", props), Route("/v1/chat/completions", chat, methods=["POST"]),
                             *[r for r in ChatPage(None).routes() if r.path != "/props"]])


@pytest.fixture(scope="module")
def scripted():
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(_scripted_app(), host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()

    def up():
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/")
            return c.getresponse().status == 200
        except OSError:
            return False
    _wait(up, 30, "the scripted server")
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    t.join(10)


def test_model_markup_is_text_and_abort_is_said(scripted, browser):
    d = browser
    d.get(scripted + "/")
    _wait(lambda: "scripted" in _text(d, "#server-info"), 30, "the props")
    box = _send(d, "anything")
    _wait(lambda: box.get_attribute("data-state") == "done", 30, "the scripted answer")
    content = d.execute_script("return arguments[0].querySelector('.content').textContent", box)
    assert content == "".join(HOSTILE)
    assert d.execute_script("return window.__pwned === undefined")
    assert not _by(d, ".msg.assistant .content script") and not _by(d, ".msg.assistant .content img")
    assert len(_by(d, ".msg.assistant .tok.from-draft")) == 3
    assert box.get_attribute("data-finish") == "abort"
    assert "abort" in _by(d, ".msg.assistant .notice")[0].text
    assert not [e for e in d.get_log("browser") if "Content Security Policy" in e.get("message", "")]
