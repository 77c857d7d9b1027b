"""Continue training an existing drafter (``moa-cpp train --init-from DRAFTER.gguf``).

Training runs here are CPU-hour sized and the learning curve was still rising at the end of
every one of them, so a run must be able to start where the last one stopped instead of from a
random init. This module reads what a run needs from a drafter GGUF:

- its weights, dequantized to F32 under the HF names the torch model uses
  (``gguf.quants.dequantize``; a Q8_0 file round-trips exactly: quantizing its dequantized values
  again gives the same blocks, so a 0-step continuation writes the same tensors);
- its sizes (SA/CA/LSA FFN and KV heads, TLI), its reduced draft vocabulary (``d2t``: the head
  rows belong to those ids, so a continuation keeps them);
- its training record (``moa.train.*``, docs/gguf-format.md): steps and token passes summed over
  every run, and one JSON record per run, oldest first. A continuation appends its own record and
  never rewrites the earlier ones.

The optimiser state is not in a GGUF: a continuation starts a fresh optimiser (with the LR
warm-up of ``--warmup``, A/B'd in docs/training.md).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from moa_cpp.errors import FormatError, MismatchError, MoaIOError
from moa_cpp.format.names import D2T, OPTIONAL_HF, Keys, tensor_map
from moa_cpp.train.data import file_sha256

__all__ = ["DrafterWeights", "read_drafter", "to_model", "check_compatible", "next_record", "SIZE_KEYS"]

# DrafterSpec field -> the GGUF key holding it (what a continuation must keep)
SIZE_KEYS = {"sa_kv": Keys.SA_HEAD_COUNT_KV, "sa_ffn": Keys.SA_FFN, "ca_kv": Keys.CA_HEAD_COUNT_KV,
             "ca_ffn": Keys.CA_FFN, "lsa_heads": Keys.LSA_HEAD_COUNT, "lsa_kv": Keys.LSA_HEAD_COUNT_KV,
             "lsa_ffn": Keys.LSA_FFN}
# ... and the target sizes it was made for (checked against the target being trained on)
_TARGET_KEYS = {"d": Keys.EMBEDDING_LENGTH, "n_head": Keys.HEAD_COUNT, "head_dim": Keys.KEY_LENGTH,
                "target_kv": Keys.TARGET_HEAD_COUNT_KV, "target_layers": Keys.TARGET_BLOCK_COUNT,
                "vocab_size": Keys.VOCAB_SIZE}


@dataclass
class DrafterWeights:
    """What ``--init-from`` takes from a drafter GGUF."""

    path: Path
    sha256: str
    tensors: dict[str, np.ndarray]          # HF names (``MoaDrafter.load_hf``); F32, ``d2t`` int64
    sizes: dict[str, int]                   # SIZE_KEYS fields
    target_sizes: dict[str, int]            # _TARGET_KEYS fields (0: unknown)
    tli: int
    tensor_types: dict[str, str]            # GGUF name -> ggml type name (F16, Q8_0, ...)
    steps: int = 0                          # moa.train.steps (0 when the file has no record)
    token_passes: int = 0
    runs: list[str] = field(default_factory=list)
    recorded: bool = False                  # the file carries a moa.train.* record

    @property
    def d2t(self) -> Optional[np.ndarray]:
        return self.tensors.get("d2t")


def _scalar(fields: dict, key: str, default: Any = None) -> Any:
    f = fields.get(key)
    return default if f is None else f.contents()


def read_drafter(path: str | os.PathLike[str]) -> DrafterWeights:
    """Read a drafter GGUF for a continuation. Raises MoaIOError (unreadable), FormatError (not a
    full MoA drafter: a target GGUF, a client bundle, missing tensors)."""
    import gguf

    p = Path(path)
    if not p.is_file():
        raise MoaIOError(f"--init-from {p}: no such file")
    try:
        r = gguf.GGUFReader(str(p))
    except Exception as e:  # gguf-py raises ValueError / struct.error / ... on bad bytes
        raise FormatError(f"--init-from {p}: not a readable GGUF file ({type(e).__name__}: {e})") from None
    arch = _scalar(r.fields, "general.architecture")
    if arch != "moa":
        raise FormatError(f"--init-from {p}: general.architecture is {arch!r}, not 'moa' (a target model? "
                          "--init-from takes a MoA drafter GGUF)")
    if _scalar(r.fields, Keys.ROLE, "full") != "full":
        raise FormatError(f"--init-from {p}: a client-role file (moa.role = {_scalar(r.fields, Keys.ROLE)!r}); "
                          "use the full drafter GGUF")
    to_hf = dict(tensor_map()) | {g: hf for hf, g in OPTIONAL_HF.items()}
    tensors: dict[str, np.ndarray] = {}
    types: dict[str, str] = {}
    for t in r.tensors:
        if t.name not in to_hf:
            continue   # bundled target tensors etc. are not the drafter's to train
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))   # ggml ne -> numpy/torch shape
        if t.name == D2T:
            tensors[to_hf[t.name]] = np.asarray(t.data, dtype=np.int64).reshape(shape)
        else:
            x = gguf.quants.dequantize(t.data, t.tensor_type)
            tensors[to_hf[t.name]] = np.asarray(x, dtype=np.float32).reshape(shape)
        types[t.name] = t.tensor_type.name
    missing = [g for g in tensor_map() if to_hf[g] not in tensors]
    if missing:
        raise FormatError(f"--init-from {p}: missing drafter tensors {', '.join(missing[:6])}"
                          + (f" ({len(missing)} in all)" if len(missing) > 6 else ""))
    sizes = {k: int(_scalar(r.fields, key, 0)) for k, key in SIZE_KEYS.items()}
    target_sizes = {k: int(_scalar(r.fields, key, 0)) for k, key in _TARGET_KEYS.items()}
    runs = _scalar(r.fields, Keys.TRAIN_RUNS, []) or []
    return DrafterWeights(
        path=p, sha256=file_sha256(p), tensors=tensors, sizes=sizes, target_sizes=target_sizes,
        tli=int(_scalar(r.fields, Keys.TLI, 0)), tensor_types=types,
        steps=int(_scalar(r.fields, Keys.TRAIN_STEPS, 0)), token_passes=int(_scalar(r.fields, Keys.TRAIN_TOKEN_PASSES, 0)),
        runs=[str(x) for x in runs], recorded=Keys.TRAIN_STEPS in r.fields)


def to_model(dw: DrafterWeights, target_path: str | os.PathLike[str], tt: Any) -> Any:
    """The drafter as a torch :class:`~moa_cpp.train.model.MoaDrafter` over ``tt``'s frozen
    embedding / LM head (``tt``: the :class:`TorchTarget` of ``target_path``; TLI not attached)."""
    from moa_cpp.format.drafter_spec import spec_from_target
    from moa_cpp.train.model import MoaDrafter

    m = MoaDrafter(spec_from_target(target_path, **dw.sizes), tt.embed.data,
                   None if tt.lm_head is tt.embed else tt.lm_head.data, d2t=dw.d2t)
    m.load_hf(dw.tensors)
    return m


def check_compatible(dw: DrafterWeights, spec: Any, tli: int, sizes: bool = True) -> None:
    """Raise MismatchError listing every way the drafter does not fit ``spec`` (a DrafterSpec made
    from the target being trained on) and ``tli``; ``sizes=False``: the target only (checked first,
    with a default-sized spec: the drafter's own sizes may not even make a valid spec for another
    target)."""
    problems = []
    for k, want in dw.target_sizes.items():
        have = getattr(spec, k)
        if want and want != have:
            problems.append(f"{k}: the drafter was made for {want}, the target has {have}")
    for k, want in (dw.sizes.items() if sizes else ()):
        if want != getattr(spec, k):
            problems.append(f"{k}: the drafter has {want}, this run asks for {getattr(spec, k)}")
    if sizes and dw.tli != tli:
        problems.append(f"tli: the drafter has {dw.tli}, this run asks for {tli}")
    if problems:
        raise MismatchError(f"--init-from {dw.path}: the drafter does not fit this run:\n  - " + "\n  - ".join(problems))


def next_record(dw: Optional[DrafterWeights], steps: int, token_passes: int, run: dict[str, Any]) -> dict[str, Any]:
    """The ``moa.train.*`` keys of a run's GGUF: the base's totals plus this run's, and its list of
    run records with this one appended (``run`` gets the base file's name and sha256)."""
    base_steps = dw.steps if dw else 0
    base_passes = dw.token_passes if dw else 0
    runs = list(dw.runs) if dw else []
    if dw is not None:
        run = {"init_from": {"file": dw.path.name, "sha256": dw.sha256, "recorded": dw.recorded}} | run
    runs.append(json.dumps(run, sort_keys=True, separators=(",", ":")))
    return {Keys.TRAIN_STEPS: base_steps + int(steps), Keys.TRAIN_TOKEN_PASSES: base_passes + int(token_passes),
            Keys.TRAIN_RUNS: runs}
