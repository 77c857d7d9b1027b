"""The README's serving examples (curl + the openai client) run as written against a real
server (only the port differs: the test server listens on a free one)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from moa_cpp.testing.server_proc import REPO, ServerProc

pytestmark = pytest.mark.model


def _blocks(lang: str) -> list:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Serving (OpenAI-compatible)"):text.index("### Targets beyond one machine")]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def test_readme_serving_examples_run():
    pytest.importorskip("openai")
    srv = ServerProc()
    try:
        curl = [b for b in _blocks("bash") if "curl" in b][0].replace("http://127.0.0.1:8765", srv.url)
        out = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=120, check=True)
        assert '"chat.completion"' in out.stdout and '"moa"' in out.stdout
        code = _blocks("python")[0].replace("http://127.0.0.1:8765", srv.url)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert "tau" in out.stdout and "target_calls" in out.stdout
    finally:
        assert srv.terminate() == 0
