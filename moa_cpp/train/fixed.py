"""Teacher-forced training data: ShareGPT's own answers, labelled by the target (issue 12).

Self-distillation (:mod:`moa_cpp.train.data`) needs the target to *write* every response: ~91
tok/s for SmolLM2 answering ShareGPT prompts on two cores (llama.cpp, 16 sequences). Here the
responses are the dataset's own (ChatGPT's) answers and the target only *reads* them in the
feature pass (~350 tok/s, torch F32 on the same cores), where it supplies what the loss
needs anyway: its K/V rows, its hidden state and so its soft labels at every position. The drafter
thus learns the target's next-token distribution on text the target did not write (EAGLE-1
measured ~3.5 % lower acceptance than self-distilled data at equal size; here the size is what
differs).

The sequence is the chat template rendered for ``context + [answer]``; the prompt is the same
template rendered for ``context`` with the generation prompt, so the split matches the
self-distilled data (prompt ids end where generation would start). The answer stops after its
first end-of-generation token, and is cut at ``max_answer_tokens`` (as a capped generation is).

Storage: ``data.npz`` in the layout of :class:`~moa_cpp.train.data.Dataset` (``greedy`` all False:
these are not the target's outputs), ``prompts.jsonl`` and ``manifest.json`` (``"source":
"sharegpt-fixed"``). No torch here.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Union

import numpy as np

from moa_cpp.atomic import write_text_atomic
from moa_cpp.train import exclusion as ex
from moa_cpp.train import sharegpt as sg
from moa_cpp.train.data import Dataset, file_sha256, load_dataset, settings_match

__all__ = ["FixedSettings", "fixed_answer_dataset"]


@dataclass
class FixedSettings:
    """Knobs of :func:`fixed_answer_dataset` (recorded in the manifest)."""

    n_samples: int = 1000               # (context, answer) pairs to keep (upper bound)
    seed: int = 0
    turns: str = "first"                # first human turn's answer, or every answer with its context
    max_prompt_tokens: int = 256        # longer prompts are skipped (as the self-distilled data's KV share)
    max_answer_tokens: int = 256        # answers are cut here (as max_new_tokens)
    code_share: Optional[float] = None  # share of pairs whose answer holds a fenced code block (None: as drawn)
    exclude_sha256: Optional[str] = None  # of the sorted prompt keys never drawn (--exclude-prompts)


def _split(tg, ctx: list, answer: str) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(prompt ids, answer ids up to its first end-of-generation token) of one pair; None if the template does not render
    the prompt as a prefix of the whole conversation."""
    prompt = tg.apply_chat_template(ctx, add_generation_prompt=True)
    full = tg.apply_chat_template(list(ctx) + [{"role": "assistant", "content": answer}],
                                  add_generation_prompt=False)
    if not full.startswith(prompt):
        return None
    p_ids = tg.tokenize(prompt, add_bos=False, special=True)
    a_ids = tg.tokenize(full[len(prompt):], add_bos=False, special=True)
    eog = [k for k, t in enumerate(a_ids.tolist()) if tg.is_eog(int(t))]
    return p_ids, (a_ids[: eog[0] + 1] if eog else a_ids)


def code_first(pool: list, n: int, share: float) -> list:
    """Reorder ``pool`` so its first ``n`` pairs hold ``round(n * share)`` code answers (fewer if the pool has
    fewer) and the rest prose, each kind in its drawn order; the remainder follows (pairs skipped later are
    replaced from it). For a code target (Qwen2.5-Coder): ~1/5 of ShareGPT's answers hold code."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"code share {share}: use a fraction in [0, 1]")
    code = [i for i, p in enumerate(pool) if sg.has_code(p[1])]
    prose = [i for i, p in enumerate(pool) if not sg.has_code(p[1])]
    k = min(len(code), round(n * share))
    head = sorted(code[:k] + prose[: max(0, n - k)])       # the two kinds mixed in drawn order
    return [pool[i] for i in head + code[k:] + prose[max(0, n - k):]]


def fixed_answer_dataset(target_path: Union[str, os.PathLike], out_dir: Union[str, os.PathLike],
                         settings: FixedSettings, *, eval_dir: Union[str, os.PathLike, None] = None,
                         filter_eval: bool = True, source: Union[str, os.PathLike, None] = None,
                         exclude: frozenset[str] = frozenset(),
                         log: Callable[[str], None] = print) -> Dataset:
    """Build (or reuse, when ``out_dir`` holds one made with the same settings) the teacher-forced
    dataset: ``n_samples`` (context, answer) pairs of ShareGPT, seeded order, eval repeats removed,
    pairs whose first user message is in ``exclude`` (:func:`exclusion.prompt_key`) skipped."""
    st = settings
    if exclude:
        st = replace(st, exclude_sha256=ex.exclusion_sha256(exclude))
    out = Path(out_dir)
    man_path = out / "manifest.json"
    if man_path.is_file():
        man = json.loads(man_path.read_text())
        if settings_match(man.get("settings", {}), st) and man.get("eval_filter") == filter_eval:
            log(f"data (fixed answers): reusing {out} ({man['n_samples']} samples, {man['n_tokens']} tokens)")
            return load_dataset(out)
    t0 = time.time()
    stats = sg.ReadStats()
    index = ex.EvalIndex.from_dir(eval_dir) if filter_eval else None
    convs = ex.filter_eval_overlap(sg.iter_conversations(source, stats=stats), index, stats=stats)
    pool = sg.deterministic_sample(list(sg.fixed_answers(convs, turns=st.turns, stats=stats)), None, st.seed)
    pool = ex.drop_prompts(pool, set(exclude), key=lambda pair: pair[0], stats=stats)
    if st.code_share is not None:
        pool = code_first(pool, st.n_samples, st.code_share)
    log(f"data (fixed answers): ShareGPT {stats.conversations} conversations ({stats.eval_overlap} repeating an "
        f"eval prompt dropped), {len(pool)} answers"
        + (f" ({stats.excluded} excluded prompts dropped)" if exclude else "") + f", read in {time.time() - t0:.1f}s")
    seqs, plens, kept, counts = _tokenized_pairs(target_path, pool, st)
    if not seqs:
        raise ValueError("no ShareGPT answer fits the prompt/answer limits")
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    ds = Dataset(tokens=np.concatenate(seqs), offsets=offsets,
                 prompt_len=np.asarray(plens, np.int32), greedy=np.zeros(len(seqs), bool))
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "data.npz", tokens=ds.tokens, offsets=ds.offsets, prompt_len=ds.prompt_len, greedy=ds.greedy)
    (out / "prompts.jsonl").write_text("".join(json.dumps(k) + "\n" for k in kept))
    p = Path(target_path)
    man = {"model": {"path": str(p), "size": p.stat().st_size, "sha256": file_sha256(p)},
           "source": "sharegpt-fixed", "settings": asdict(st), "eval_filter": filter_eval,
           "eval_dir": str(eval_dir or ex.default_eval_dir()) if filter_eval else None,
           "sharegpt": stats.as_dict(), "skipped": counts,
           "n_samples": len(ds), "n_tokens": int(len(ds.tokens)), "n_response_tokens": ds.n_response_tokens,
           "n_greedy": 0, "seconds": time.time() - t0}
    write_text_atomic(man_path, json.dumps(man, indent=2) + "\n")   # the manifest last: a directory without it is not a dataset
    log(f"data (fixed answers): {len(ds)} samples, {len(ds.tokens)} tokens ({ds.n_response_tokens} response; "
        f"{counts['cut']} answers cut at {st.max_answer_tokens}, {counts['long_prompt']} long prompts skipped) "
        f"in {man['seconds']:.0f}s -> {out}")
    return ds


def _tokenized_pairs(target_path: Union[str, os.PathLike], pool: list, st: FixedSettings) -> tuple:
    """Token ids of the (context, answer) pairs in ``pool``, in order, until ``n_samples`` fit the
    limits: (sequences, prompt lengths, prompts.jsonl records, counts of what was skipped or cut)."""
    from tqdm import tqdm

    from moa_cpp.target.target import Target

    tg = Target.from_path(target_path, n_ctx=512, n_threads=1, install_callback=False)
    seqs, plens, kept = [], [], []
    counts = {"long_prompt": 0, "template_mismatch": 0, "cut": 0, "empty": 0}
    try:
        with tqdm(total=min(st.n_samples, len(pool)), desc="fixed answers", unit="pair", mininterval=2) as bar:
            for ctx, answer in pool:
                if len(seqs) >= st.n_samples:
                    break
                got = _split(tg, ctx, answer)
                if got is None:
                    counts["template_mismatch"] += 1
                    continue
                p_ids, a_ids = got
                if len(p_ids) > st.max_prompt_tokens:
                    counts["long_prompt"] += 1
                    continue
                if len(a_ids) < 2:
                    counts["empty"] += 1
                    continue
                if len(a_ids) > st.max_answer_tokens:
                    a_ids = a_ids[: st.max_answer_tokens]
                    counts["cut"] += 1
                seqs.append(np.concatenate([p_ids, a_ids]).astype(np.int32))
                plens.append(len(p_ids))
                kept.append({"messages": list(ctx) + [{"role": "assistant", "content": answer}]})
                bar.update(1)
    finally:
        tg.close()
    return seqs, plens, kept, counts
