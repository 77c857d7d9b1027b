#!/usr/bin/env bash
# A headless browser for the chat page's test (tests/server/test_chat_page.py): Debian's chromium and
# chromium-driver (selenium comes from the project's `test` extra). Installed with apt-get where
# this runs as root (or with password-less sudo); elsewhere it says so and the browser test
# skips with the same reason. Never fails the caller: the suite decides what a missing browser means.
set -uo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "browser: no apt-get here; install Chromium + its chromedriver to run tests/server/test_chat_page.py" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "browser: not root and no password-less sudo: run 'apt-get install chromium chromium-driver' to run the browser test" >&2
    exit 0
  fi
fi
echo "installing chromium + chromium-driver (Debian packages) for the chat page's browser test"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver >/tmp/moa-browser-apt.log 2>&1 \
  || { $SUDO apt-get update -q >>/tmp/moa-browser-apt.log 2>&1 && \
       $SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver >>/tmp/moa-browser-apt.log 2>&1; } \
  || echo "browser: apt-get could not install chromium (see /tmp/moa-browser-apt.log); the browser test will skip" >&2
exit 0
