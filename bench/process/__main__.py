"""python -m bench.process COMMAND: whole moa-cpp generate processes, spawn to exit."""
from bench.common import dispatch

COMMANDS = {
    "startup": ("bench.process.startup", "one-shot generation with a warm cache vs a llama-cpp-python script"),
    "first-run": ("bench.process.first_run", "the first generation in a fresh process (empty cache) vs llama-cpp-python"),
}

if __name__ == "__main__":
    raise SystemExit(dispatch("process", COMMANDS, __doc__))
