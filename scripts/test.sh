#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite. pytest's "no tests collected"
# (exit 5) fails like any other non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/browser.sh     # the chat page's browser test (skips with a reason where none)
. .venv/bin/activate
python -m pytest -q -ra "$@"
