"""The README's client-server examples run as written (only the port differs: the test server
listens on a free one; the bundle download cache is a temporary folder)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from moa_cpp.testing.server_proc import REPO, ServerProc

pytestmark = pytest.mark.model
pytest.importorskip("msgpack")


def _blocks(lang: str) -> list:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Client-server"):text.index("## Converting a checkpoint")]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def test_readme_client_server_examples_run(tmp_path):
    bundle, serve, client = _blocks("bash")[0].strip().splitlines()
    env = dict(os.environ, MOA_CPP_CACHE=str(tmp_path / "cache"))
    env.pop("MOA_API_KEY", None)
    bundle_cmd = bundle.split("#")[0].replace(".venv/bin/", f"{REPO}/.venv/bin/")
    subprocess.run(["bash", "-c", bundle_cmd], cwd=tmp_path, env=env, check=True, timeout=300,
                   capture_output=True)
    assert "--bundle smollm2-bundle" in serve
    srv = ServerProc("--bundle", str(tmp_path / "smollm2-bundle"))
    try:
        url = "http://127.0.0.1:8765"
        assert url in client
        cmd = client.split("#")[0].replace(".venv/bin/", f"{REPO}/.venv/bin/").replace(url, srv.url)
        out = subprocess.run(["bash", "-c", cmd + " --json"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        r = json.loads(out.stdout.strip().splitlines()[-1])
        assert r["tokens"] and not r["unverified"] and r["stats"]["server_calls"] >= 2
        assert list((tmp_path / "cache" / "bundles").iterdir())        # downloaded from the server
        code = _blocks("python")[0].replace(url, srv.url)
        out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip()
    finally:
        assert srv.terminate() == 0
