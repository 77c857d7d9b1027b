#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite, one worker per core. pytest's "no tests collected"
# (exit 5) fails like any other non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/browser.sh     # the chat page's browser test (skips with a reason where none)
. .venv/bin/activate
# one pytest-xdist worker per core (at most 4), each pinned to its share of the cores; a module
# runs on one worker (its models and servers built once), the longest modules first (tests/conftest.py)
workers=$(python -c "import os; print(min(4, len(os.sched_getaffinity(0))))")
python -m pytest -q -ra -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
