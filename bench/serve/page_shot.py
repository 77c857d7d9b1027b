#!/usr/bin/env python
"""The screenshot of the chat page in docs/ and the README: a real `moa-cpp serve` (the embedded
SmolLM2 target + drafter, MoA and prompt lookup merged), a real greedy answer in headless
Chromium, drafted tokens highlighted.

    python -m bench.serve page-shot [--out docs/chat-page.png] [--prompt TEXT]

Needs Chromium + chromedriver (bash scripts/browser.sh) and selenium (the `test` extra).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path


from moa_cpp.testing.server_proc import ServerProc

from bench.common import REPO_ROOT

ROOT = REPO_ROOT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "chat-page.png"))
    ap.add_argument("--prompt", default="Rewrite this sentence in the past tense: The team ships a new "
                                        "release every week and the users read the notes.")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--draft", default="chain:3")
    a = ap.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    srv = ServerProc("--draft", a.draft, "--spec-type", "moa,ngram")
    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1000,560"):
        opts.add_argument(arg)
    opts.binary_location = shutil.which("chromium")
    d = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        d.get(srv.url + "/")
        time.sleep(1)
        for field, value in (("temperature", "0"), ("max-tokens", str(a.max_tokens))):
            d.execute_script("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('change'));",
                             d.find_element(By.ID, field), value)
        d.find_element(By.ID, "prompt").send_keys(a.prompt)
        d.find_element(By.ID, "send").click()
        t0 = time.monotonic()
        while not d.find_elements(By.CSS_SELECTOR, ".msg.assistant[data-state=done]"):
            if time.monotonic() - t0 > 300:
                raise SystemExit("no answer within 300 s")
            time.sleep(0.3)
        d.save_screenshot(a.out)
        print(d.find_element(By.CSS_SELECTOR, ".msg.assistant").text)
        print("wrote", a.out)
    finally:
        d.quit()
        srv.terminate()


if __name__ == "__main__":
    main()
