"""python -m bench.serve COMMAND: moa-cpp serve measured and shown."""
from bench.common import dispatch

COMMANDS = {
    "load": ("bench.serve.load", "requests/s and tokens/s under 1-4 clients vs llama-cpp-python's server"),
    "prompt-cache": ("bench.serve.prompt_cache", "time to first token over multi-turn chats: prompt reuse on and off, vs llama-cpp-python"),
    "examples": ("bench.serve.examples", "request/response examples from real servers (writes docs/server-examples.md)"),
    "page-shot": ("bench.serve.page_shot", "the chat page's screenshot in headless Chromium (docs/chat-page.png)"),
}

if __name__ == "__main__":
    raise SystemExit(dispatch("serve", COMMANDS, __doc__))
