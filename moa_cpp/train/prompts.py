"""Where the prompts of the data stage come from: user files (``.jsonl`` / ``.txt``:
:func:`load_prompt_files`), ShareGPT (``sharegpt[:N]`` among them: :func:`load_prompts`, via
:mod:`moa_cpp.train.sharegpt`), or, when none are given, the instruct model itself after its chat
template's user prefix (:func:`user_prefix`; :mod:`moa_cpp.train.data` samples the turn).

This module imports no torch.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, Union

__all__ = ["Prompt", "load_prompt_files", "load_prompt_starts", "load_prompts", "user_prefix"]

_PLACEHOLDER = "\u2063MOA_USER_PLACEHOLDER\u2063"
_PROMPT_KEYS = ("prompt", "instruction", "question", "text", "input", "query")


def _prompt_of(obj: object) -> Optional[str]:
    if isinstance(obj, str):
        return obj
    if not isinstance(obj, dict):
        return None
    for k in _PROMPT_KEYS:
        if isinstance(obj.get(k), str) and obj[k].strip():
            return obj[k]
    turns = obj.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        return turns[0]
    msgs = obj.get("messages") or obj.get("conversations")
    if isinstance(msgs, list):
        for m in msgs:
            if isinstance(m, dict) and m.get("role", m.get("from")) in ("user", "human"):
                return str(m.get("content", m.get("value", "")))
    return None


def load_prompt_files(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """User prompts from ``.jsonl`` (first of the keys prompt/instruction/question/text/input/query,
    ``turns[0]`` or the first user message) or text files (one prompt per non-empty line)."""
    out: list[str] = []
    for p in paths:
        p = Path(p)
        if "shared/data/eval" in str(p.resolve()):
            raise ValueError(f"{p}: evaluation prompts must never be used for training")
        for line in p.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            if p.suffix in (".jsonl", ".json"):
                s = _prompt_of(json.loads(line))
            else:
                s = line
            if s and s.strip():
                out.append(s.strip())
    return out


Prompt = Union[str, list]   # a user message, or chat messages ending with one (ShareGPT "all" turns)


def load_prompts(specs: Sequence[str | os.PathLike[str]], *, seed: int = 0, sharegpt_turns: str = "first",
                 eval_dir: Union[str, os.PathLike[str], None] = None,
                 log: Callable[[str], None] = print,
                 exclude: frozenset[str] = frozenset(),
                 code_share: Optional[float] = None) -> tuple[list[Prompt], dict]:
    """Prompts of ``specs``: files (:func:`load_prompt_files`) and ``sharegpt[:N]`` (N ShareGPT
    prompts, a sample fixed by ``seed``; :func:`moa_cpp.train.sharegpt.load_sharegpt_prompts`, eval
    repeats filtered with the prompts in ``eval_dir``, "none" disables the filter), without those
    whose :func:`moa_cpp.train.sharegpt.prompt_key` is in ``exclude``; ``code_share`` steers the
    ShareGPT order (see there). Returns (prompts, info for the manifest)."""
    from moa_cpp.train import exclusion as ex
    from moa_cpp.train import sharegpt as sg

    out: list[Prompt] = []
    info: dict = {}
    for spec in specs:
        if sg.is_prompt_spec(str(spec)):
            n = sg.parse_prompt_spec(str(spec))
            st = sg.ReadStats()
            no_filter = eval_dir is not None and str(eval_dir).lower() == "none"
            got = sg.load_sharegpt_prompts(n, seed=seed, turns=sharegpt_turns, stats=st, filter_eval=not no_filter,
                                           eval_dir=None if no_filter else eval_dir, exclude=exclude,
                                           code_share=code_share)
            if sharegpt_turns == "first":
                got = [m[-1]["content"] for m in got]       # a lone user message: plain text, as file prompts
            info = {"spec": str(spec), "turns": sharegpt_turns, "eval_filter": not no_filter,
                    "eval_dir": None if no_filter else str(eval_dir or ex.default_eval_dir()), **st.as_dict()}
            log(f"data: ShareGPT {st.conversations} conversations ({st.eval_overlap} repeating an eval prompt "
                f"dropped), {st.prompts} prompts, {len(got)} taken"
                + (f" ({st.excluded} excluded prompts skipped)" if exclude else "") + f", read in {st.seconds:.1f}s")
            out += got
        else:
            out += ex.drop_prompts(load_prompt_files([spec]), set(exclude))
    return out, info


_STARTS_DIR = Path(__file__).parent / "starts"


def load_prompt_starts(spec: str | os.PathLike[str]) -> list[str]:
    """Openings of self-written user turns (``--prompt-starts``): a name shipped in
    ``moa_cpp/train/starts/`` (``tasks``: code, arithmetic, documents to summarise, questions,
    writing; written for this project, none taken from an evaluation set) or a ``.jsonl`` file whose
    lines are JSON strings or objects with a ``start`` key. Each self-written turn begins with one
    drawn uniformly (repeat a line to weight it; ``""`` leaves the turn wholly to the model)."""
    path = _STARTS_DIR / f"{spec}.jsonl" if (_STARTS_DIR / f"{spec}.jsonl").is_file() else Path(spec)
    if not path.is_file():
        shipped = ", ".join(sorted(q.stem for q in _STARTS_DIR.glob("*.jsonl")))
        raise ValueError(f"{spec}: no such file, nor a shipped list ({shipped})")
    starts = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
        start = obj.get("start") if isinstance(obj, dict) else obj
        if not isinstance(start, str):
            raise ValueError(f"{path}:{n}: a JSON string or an object with a string 'start'")
        starts.append(start)
    if not starts:
        raise ValueError(f"{path}: no prompt starts")
    return starts


def user_prefix(target) -> str:
    """The chat template rendered up to where the user's message would start."""
    full = target.apply_chat_template([{"role": "user", "content": _PLACEHOLDER}], add_generation_prompt=False)
    cut = full.find(_PLACEHOLDER)
    if cut < 0:
        raise ValueError("chat template does not echo the user message")
    return full[:cut]
