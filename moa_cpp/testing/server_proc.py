"""A real ``moa-cpp serve`` process on 127.0.0.1 for tests: started with ``--port 0``, its URL
read from the first stdout line, stopped with SIGTERM (its exit status checked by callers that
care). Raw HTTP helpers on ``http.client`` (no client library between the test and the wire)."""
from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[2]
LISTEN_PREFIX = "moa-cpp serve: listening on "


class ServerProc:
    def __init__(self, *args: str, env: Optional[dict] = None, timeout: float = 180.0) -> None:
        e = dict(os.environ)
        e.pop("MOA_API_KEY", None)
        e.update(env or {})
        self.proc = subprocess.Popen([sys.executable, "-m", "moa_cpp.cli.main", "serve", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e, cwd=REPO)
        self.stderr_lines: list = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.first_line = self._first_line(timeout)
        if not self.first_line.startswith(LISTEN_PREFIX):
            self.kill()
            raise RuntimeError(f"server did not start: {self.first_line!r}; stderr: {''.join(self.stderr_lines)}")
        self.url = self.first_line[len(LISTEN_PREFIX):].strip()
        u = urlparse(self.url)
        self.host, self.port = u.hostname, u.port

    def _drain_stderr(self) -> None:
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    def _first_line(self, timeout: float) -> str:
        box: list = []
        t = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        return box[0].rstrip("\n") if box else ""

    # ------------------------------------------------------------------ HTTP

    def conn(self, timeout: float = 120.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method: str, path: str, body: "bytes | dict | None" = None, headers: Optional[dict] = None,
                timeout: float = 120.0) -> tuple:
        """(status, headers dict, parsed JSON or raw bytes)."""
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        if isinstance(body, dict):
            body = json.dumps(body).encode()
        c = self.conn(timeout)
        try:
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
            try:
                parsed = json.loads(data)
            except ValueError:
                parsed = data
            return r.status, {k.lower(): v for k, v in r.getheaders()}, parsed
        finally:
            c.close()

    def post(self, path: str, body: "bytes | dict", key: Optional[str] = None, **kw) -> tuple:
        headers = dict(kw.pop("headers", None) or {})
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return self.request("POST", path, body, headers, **kw)

    def health(self) -> int:
        return self.request("GET", "/health", timeout=10)[0]

    # ------------------------------------------------------------------ lifetime

    def terminate(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def rss_kib(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0


def sse_events(resp: http.client.HTTPResponse) -> list:
    """The ``data:`` payloads of an SSE response, parsed (``[DONE]`` kept as the string)."""
    out = []
    for raw in resp.read().decode().split("\n\n"):
        raw = raw.strip()
        if raw.startswith("data: "):
            payload = raw[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def streamed_chat_text(srv: "ServerProc", body: dict, timeout: float = 300.0) -> str:
    """The text of a streamed ``/v1/chat/completions`` answer (the deltas' contents joined)."""
    c = srv.conn(timeout)
    try:
        c.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True}),
                  {"Content-Type": "application/json"})
        resp = c.getresponse()
        assert resp.status == 200
        return "".join(ch["delta"].get("content") or "" for ev in sse_events(resp) if ev != "[DONE]"
                       for ch in ev["choices"])
    finally:
        c.close()


def wait_until(pred, timeout: float = 30.0, every: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(every)
    return False
