"""python -m bench.costs COMMAND: what each piece of speculative decoding costs."""
from bench.common import dispatch

COMMANDS = {
    "loop": ("bench.costs.loop", "the loop's own cost per token outside llama_decode (GPU-speed proxy, SmolLM2), engine vs llama-batched-bench"),
    "curves": ("bench.costs.curves", "T(k), capture/commit/draft costs and the real loop at controlled acceptance on bigger targets"),
    "draft-step": ("bench.costs.draft_step", "one drafter step vs the target's single-token decode"),
    "capture": ("bench.costs.capture", "the K/V capture's cost on target decodes"),
    "calibration": ("bench.costs.calibration", "where the first run's T(k) calibration spends its time"),
    "batch-invariance": ("bench.costs.batch_invariance", "are a target's rows the same in batches of any size?"),
    "gguf-read": ("bench.costs.gguf_read", "reading a GGUF's metadata with gguf-py"),
    "features": ("bench.costs.features", "training features: the PyTorch target vs llama.cpp (speed, agreement)"),
}

if __name__ == "__main__":
    raise SystemExit(dispatch("costs", COMMANDS, __doc__))
