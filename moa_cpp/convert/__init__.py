"""HF MoA checkpoint -> MoA drafter GGUF (docs/drafter.md#checkpoint-formats; format in docs/gguf-format.md).

Modules: ``source`` (local dir or hub id), ``safetensors_io`` (F32/F16/BF16 -> float32),
``layouts`` (Format A / B detection, name map, sizes from shapes), ``target_gguf`` (target
cross-checks), ``writer`` (metadata types, quantization, GGUF output).
"""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import numpy as np
from tqdm import tqdm

from moa_cpp.format.arch import by_snapshot_model_type
from moa_cpp.atomic import write_atomic
from moa_cpp.errors import FormatError, InvalidArgumentError, MismatchError
from moa_cpp.format.names import D2T, DRAFT_OUTPUT, FORMAT_VERSION, Keys
from moa_cpp.convert.layouts import Hparams, detect_layout, derive_hparams
from moa_cpp.convert.safetensors_io import load_f32, load_ids
from moa_cpp.convert.source import resolve_source
from moa_cpp.convert.target_gguf import TargetInfo, check_target, read_target
from moa_cpp.convert.writer import OUTTYPES, Encoded, encode, encode_ids, write_gguf

__all__ = ["convert", "add_convert_arguments", "run_convert", "OUTTYPES"]

log = logging.getLogger(__name__)


def _block_count(hp: Hparams, tg: TargetInfo | None, cli: int | None) -> int:
    """Target layer count L: target GGUF > --target-layers > snapshot config > 0 (load time)."""
    if tg is not None:
        if cli is not None and cli != tg.block_count:
            raise MismatchError(f"--target-layers {cli} but target GGUF {tg.path.name} has {tg.block_count} layers")
        log.info("target.block_count = %d (from target GGUF %s.block_count)", tg.block_count, tg.arch)
        return tg.block_count
    if cli is not None:
        if cli <= 0:
            raise InvalidArgumentError(f"--target-layers {cli}: must be positive")
        if hp.config_block_count is not None and hp.config_block_count != cli:
            raise MismatchError(f"--target-layers {cli} but the snapshot config says "
                                f"num_hidden_layers {hp.config_block_count}")
        log.info("target.block_count = %d (from --target-layers)", cli)
        return cli
    if hp.config_block_count is not None:
        log.info("target.block_count = %d (from snapshot config num_hidden_layers)", hp.config_block_count)
        return int(hp.config_block_count)
    log.info("target.block_count = 0 (unknown: the runtime takes it from the target GGUF at load time)")
    return 0


def _embedding_scale(hp: Hparams, tg: TargetInfo | None) -> float:
    """SA input scale: config ``embedding_scale`` > the target GGUF's layer-0 scale > 1.0."""
    if hp.embedding_scale is not None:
        log.info("embedding_scale = %g (from config.json embedding_scale)", hp.embedding_scale)
        return hp.embedding_scale
    if tg is not None:
        log.info("embedding_scale = %g (layer-0 input scale of the %s target GGUF)", tg.embedding_scale, tg.arch)
        return tg.embedding_scale
    return 1.0  # the snapshot targets (llama / qwen2) feed the raw embedding row


def _snapshot_target_arch(hp: Hparams) -> str | None:
    """The target architecture a training snapshot's config names (its HF model_type, mapped by
    moa_cpp.format.arch's table); None for a Format A checkpoint."""
    if hp.config_arch is None:
        return None
    row = by_snapshot_model_type(hp.config_arch)
    return row.name if row is not None else hp.config_arch


def _draft_vocab(layout, hp: Hparams):
    """The checked draft -> target id map of a reduced-vocabulary snapshot (None without one)."""
    if D2T not in layout.tensors:
        return None
    head, ids_info = layout.tensors[DRAFT_OUTPUT], layout.tensors[D2T]
    problems: list[str] = []
    if len(head.shape) != 2 or head.shape[1] != hp.d:
        problems.append(f"draft_lm_head.weight has shape {list(head.shape)}, expected [V_draft, {hp.d}]")
    if len(ids_info.shape) != 1 or (len(head.shape) == 2 and ids_info.shape[0] != head.shape[0]):
        problems.append(f"d2t has shape {list(ids_info.shape)}, expected [{head.shape[0]}] (one id per head row)")
    if problems:
        raise FormatError("invalid reduced draft vocabulary:\n  - " + "\n  - ".join(problems))
    ids = load_ids(ids_info)
    if ids.size and (ids.min() < 0 or ids.max() >= hp.vocab_size):
        raise FormatError(f"d2t holds ids outside the target vocabulary [0, {hp.vocab_size})")
    if len(np.unique(ids)) != len(ids):
        raise FormatError("d2t maps two draft ids to the same target id")
    log.info("reduced draft vocabulary: %d of %d target tokens", len(ids), hp.vocab_size)
    return ids


def _metadata(hp: Hparams, source_format: str, n_layers: int, tli: int,
              target_arch: str | None, embedding_scale: float) -> dict[str, int | float | str | bool]:
    md: dict[str, int | float | str | bool] = {
        Keys.FORMAT_VERSION: FORMAT_VERSION,
        Keys.EMBEDDING_LENGTH: hp.d,
        Keys.HEAD_COUNT: hp.head_count,
        Keys.KEY_LENGTH: hp.key_length,
        Keys.RMS_EPS: hp.rms_eps,
        Keys.ROPE_FREQ_BASE: hp.rope_theta,
        Keys.ROPE_QK_LAYOUT: "neox",        # HF q/k rows kept; runtime uses rotate-half RoPE
        Keys.VOCAB_SIZE: hp.vocab_size,
        Keys.EMBEDDING_SCALE: embedding_scale,
        Keys.TLI: tli,
        Keys.TARGET_BLOCK_COUNT: n_layers,
        Keys.TARGET_HEAD_COUNT_KV: hp.target_kv,
        Keys.TARGET_KEY_LENGTH: hp.key_length,
        Keys.SA_HEAD_COUNT_KV: hp.sa_kv,
        Keys.SA_FFN: hp.sa_ffn,
        Keys.CA_HEAD_COUNT_KV: hp.ca_kv,
        Keys.CA_FFN: hp.ca_ffn,
        Keys.LSA_WIDTH: hp.lsa_width,
        Keys.LSA_HEAD_COUNT: hp.lsa_head_count,
        Keys.LSA_HEAD_COUNT_KV: hp.lsa_kv,
        Keys.LSA_KEY_LENGTH: hp.lsa_key_length,
        Keys.LSA_FFN: hp.lsa_ffn,
        Keys.LSA_INPUT_LAYOUT: "hf",        # LSA expects HF-ordered K (no weight fold: docs/gguf-format.md#conventions)
        Keys.SA_ROPE_SCALING: "none",       # scaled checkpoints are rejected
        Keys.SOURCE_FORMAT: source_format,
    }
    if target_arch:
        md[Keys.TARGET_ARCH] = target_arch
    return md


def convert(src: str | os.PathLike[str], out_path: str | os.PathLike[str], outtype: str = "f16",
            target_gguf: str | os.PathLike[str] | None = None, target_block_count: int | None = None,
            tli: int = 0, revision: str | None = None, progress: bool = True,
            eval_acceptance: list[float] | None = None, train_record: dict | None = None) -> Path:
    """Convert an HF MoA checkpoint (local dir or hub repo id) to a MoA drafter GGUF.

    ``eval_acceptance``: the drafter's held-out conditional acceptance per draft depth (the
    trainer's estimate), recorded as ``moa.eval.acceptance``: the cost-aware draft policy starts
    from it instead of guessing.

    All validation happens before anything is written; the output appears atomically.
    Raises FormatError (bad checkpoint), MismatchError (drafter vs target), MoaIOError,
    InvalidArgumentError. Returns the output path.
    """
    if outtype not in OUTTYPES:
        raise InvalidArgumentError(f"outtype {outtype!r}: expected one of {sorted(OUTTYPES)}")
    if tli < 0:
        raise InvalidArgumentError(f"tli {tli}: must be >= 0")
    out = Path(out_path)
    source = resolve_source(src, revision)
    layout = detect_layout(source.path)
    tg = read_target(target_gguf) if target_gguf is not None else None
    hp = derive_hparams(layout, tg.as_fallback() if tg else None)
    if tg is not None:
        check_target(hp, tg)
    n_layers = _block_count(hp, tg, target_block_count)
    if n_layers and tli >= n_layers:
        raise InvalidArgumentError(f"tli {tli}: must be below the target layer count {n_layers}")
    target_arch = tg.arch if tg else _snapshot_target_arch(hp)
    md = _metadata(hp, layout.source_format, n_layers, tli, target_arch, _embedding_scale(hp, tg))
    if eval_acceptance:
        if not all(0.0 <= float(a) <= 1.0 for a in eval_acceptance):
            raise InvalidArgumentError(f"eval_acceptance {eval_acceptance}: rates must be in [0, 1]")
        md[Keys.EVAL_ACCEPTANCE] = [float(a) for a in eval_acceptance]
    if train_record:
        unknown = set(train_record) - {Keys.TRAIN_STEPS, Keys.TRAIN_TOKEN_PASSES, Keys.TRAIN_RUNS}
        if unknown:
            raise InvalidArgumentError(f"train_record: unknown keys {sorted(unknown)}")
        md.update(train_record)
    d2t = _draft_vocab(layout, hp)
    if d2t is not None:
        md[Keys.DRAFT_VOCAB_SIZE] = len(d2t)

    encoded: list[Encoded] = []
    for g, info in tqdm(sorted(layout.tensors.items()), desc="convert", unit="tensor", disable=not progress):
        encoded.append(encode_ids(g, d2t) if g == D2T else encode(g, load_f32(info), outtype))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, lambda tmp: write_gguf(tmp, source.repo_id or source.name, outtype, md, encoded))
    log.info("wrote %s (%s, %d tensors, %.2f MiB)", out, outtype, len(encoded), out.stat().st_size / 2**20)
    return out


def add_convert_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``moa-cpp convert`` arguments to ``parser``."""
    parser.add_argument("src", help="checkpoint directory, or a Hugging Face repo id (org/name)")
    parser.add_argument("-o", "--output", "--outfile", dest="output", required=True, help="output GGUF path")
    parser.add_argument("--outtype", choices=sorted(OUTTYPES), default="f16",
                        help="matrix storage type (norms and Ekv2E bias stay F32); default f16")
    parser.add_argument("--target-gguf", default=None,
                        help="target GGUF to cross-check against and take the layer count from")
    parser.add_argument("--target-layers", type=int, default=None,
                        help="target layer count L, when no --target-gguf is given")
    parser.add_argument("--tli", type=int, default=0, help="target layer inference N (default 0)")
    parser.add_argument("--revision", default=None, help="hub revision (branch, tag or commit)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_convert(args: argparse.Namespace) -> int:
    """Run a conversion from parsed arguments. Errors (:class:`MoaError`) propagate: the caller
    prints them the CLI's way (``moa-cpp convert: error: ...``, exit 2)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    convert(args.src, args.output, outtype=args.outtype, target_gguf=args.target_gguf,
            target_block_count=args.target_layers, tli=args.tli, revision=args.revision,
            progress=not getattr(args, "no_progress", False))
    return 0
