"""Read the few hyper-parameters of a target GGUF and cross-check a drafter against them."""
from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moa_cpp.format.arch import drafter_refusal, embedding_scale, lookup, names_where
from moa_cpp.errors import FormatError, MismatchError, MoaIOError
from moa_cpp.convert.layouts import Hparams

log = logging.getLogger(__name__)

# llama.cpp architectures whose K rows are permuted by convert_hf_to_gguf (NORM RoPE, docs/drafter.md#k-permutation):
# the rows of moa_cpp.format.arch's table with qk_permuted.
NORM_ROPE_ARCHS = names_where("qk_permuted")


@dataclass(frozen=True)
class TargetInfo:
    """Hyper-parameters of a target GGUF (``None`` where the file does not say)."""

    path: Path
    arch: str
    n_embd: int
    head_count: int
    head_count_kv: int
    key_length: int
    block_count: int
    rms_eps: float | None
    rope_theta: float | None
    vocab_size: int | None
    rope_scaling: str | None
    has_rope_freqs: bool

    @property
    def embedding_scale(self) -> float:
        """Factor the target applies to token_embd rows before layer 0: sqrt(n_embd) for Gemma
        architectures (llama.cpp src/models/gemma*.cpp), else 1 (moa_cpp.format.arch's table; its native
        twin gives the loader's default for a drafter without ``moa.embedding_scale``)."""
        return embedding_scale(self.arch, self.n_embd)

    def as_fallback(self) -> dict[str, Any]:
        """Values the drafter config may lack (see layouts.derive_hparams)."""
        return {"head_count": self.head_count, "rms_eps": self.rms_eps,
                "rope_theta": self.rope_theta, "vocab_size": self.vocab_size}


def _scalar(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def read_target(path: str | Path) -> TargetInfo:
    """Read a target GGUF's architecture, sizes, eps, theta, vocabulary and RoPE scaling.

    Memoised per (path, size, mtime): GGUFReader parses every tokenizer array eagerly (about
    12 s for Gemma-3's 262k tokens), and e.g. the random drafter reads the same target twice.
    """
    p = Path(path)
    if not p.is_file():
        raise MoaIOError(f"target GGUF {p}: no such file")
    st = p.stat()
    return _read_target(p.resolve(), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_target(p: Path, size: int, mtime_ns: int) -> TargetInfo:
    import gguf  # lazy: only needed with --target-gguf

    try:
        r = gguf.GGUFReader(p)
    except Exception as e:  # GGUFReader raises ValueError/struct errors on foreign files
        raise FormatError(f"target GGUF {p}: not a readable GGUF ({e})") from e
    arch = _scalar(r, "general.architecture")
    if not arch:
        raise FormatError(f"target GGUF {p}: no general.architecture")
    why = drafter_refusal(str(arch))
    if why:
        raise MismatchError(f"target GGUF {p.name}: the MoA drafter cannot follow {why}")

    def req(key: str) -> int:
        v = _scalar(r, f"{arch}.{key}")
        if v is None:
            raise FormatError(f"target GGUF {p}: missing {arch}.{key}")
        return int(v)

    n_embd, n_head = req("embedding_length"), req("attention.head_count")
    kv = _scalar(r, f"{arch}.attention.head_count_kv")
    key_len = _scalar(r, f"{arch}.attention.key_length")
    # Vocabulary: the explicit key, else the tokenizer list, else token_embd's row count.
    vocab = _scalar(r, f"{arch}.vocab_size")
    if vocab is None and "tokenizer.ggml.tokens" in r.fields:
        vocab = len(r.fields["tokenizer.ggml.tokens"].data)
    names = {t.name: t for t in r.tensors}
    if vocab is None and "token_embd.weight" in names:
        vocab = int(names["token_embd.weight"].shape[1])
    info = TargetInfo(
        path=p, arch=str(arch), n_embd=n_embd, head_count=n_head,
        # GGUF convention: absent = MHA; hybrid models list it per layer (0: a recurrent layer)
        head_count_kv=(max(int(x) for x in kv) if isinstance(kv, (list, tuple)) else int(kv)) if kv is not None
        else n_head,
        key_length=int(key_len) if key_len is not None else n_embd // n_head,
        # the layers the drafter follows: those with a KV cache (a hybrid's attention layers: the
        # ones with KV heads, where they are listed per layer), as the capture finds them
        block_count=(sum(1 for x in kv if int(x)) if isinstance(kv, (list, tuple)) and any(int(x) for x in kv)
                     else req("block_count")),
        rms_eps=_scalar(r, f"{arch}.attention.layer_norm_rms_epsilon"),
        rope_theta=_scalar(r, f"{arch}.rope.freq_base"),
        vocab_size=int(vocab) if vocab is not None else None,
        rope_scaling=_scalar(r, f"{arch}.rope.scaling.type"),
        has_rope_freqs="rope_freqs.weight" in names,
    )
    log.info("target GGUF %s: arch %s, n_embd %d, heads %d/%d kv, key_length %d, %d layers, vocab %s",
             p.name, info.arch, n_embd, n_head, info.head_count_kv, info.key_length, info.block_count,
             info.vocab_size)
    return info


def _f32_equal(a: float, b: float) -> bool:
    # GGUF stores f32; configs hold the decimal (1e-05 vs 9.99999974e-06 are the same value).
    return bool(np.float32(a) == np.float32(b))


def check_target(hp: Hparams, tg: TargetInfo) -> None:
    """Raise MismatchError listing every disagreement between drafter and target."""
    bad: list[str] = []

    def cmp(what: str, mine: Any, theirs: Any) -> None:
        if theirs is not None and mine != theirs:
            bad.append(f"{what}: drafter {mine}, target {theirs}")

    cmp("embedding_length d", hp.d, tg.n_embd)
    cmp("attention.head_count H", hp.head_count, tg.head_count)
    cmp("key_length D", hp.key_length, tg.key_length)
    cmp("LSA width W vs 2 * head_count_kv * key_length", hp.lsa_width, 2 * tg.head_count_kv * tg.key_length)
    cmp("vocab_size", hp.vocab_size, tg.vocab_size)
    if tg.rms_eps is not None and not _f32_equal(hp.rms_eps, tg.rms_eps):
        bad.append(f"rms eps: drafter {hp.rms_eps}, target {tg.rms_eps}")
    if tg.rope_theta is not None and not _f32_equal(hp.rope_theta, tg.rope_theta):
        bad.append(f"rope theta: drafter {hp.rope_theta}, target {tg.rope_theta}")
    if tg.rope_scaling not in (None, "none") or tg.has_rope_freqs:
        bad.append(f"target uses RoPE scaling ({tg.rope_scaling or 'rope_freqs.weight'}): not supported yet")
    if hp.embedding_scale is not None and not math.isclose(hp.embedding_scale, tg.embedding_scale, rel_tol=1e-6):
        # Not an error: a trainer may deliberately feed another scale; the file records it.
        log.warning("config embedding_scale %g differs from the target's layer-0 embedding scale %g (%s)",
                    hp.embedding_scale, tg.embedding_scale, tg.arch)
    if hp.config_block_count is not None and hp.config_block_count != tg.block_count:
        bad.append(f"block_count: snapshot config num_hidden_layers {hp.config_block_count}, "
                   f"target {tg.block_count}")
    if bad:
        raise MismatchError(f"drafter does not match target {tg.path}:\n  - " + "\n  - ".join(bad))
    rope = ("NORM (K rows permuted; runtime un-permutes, docs/drafter.md#k-permutation)" if lookup(tg.arch).qk_permuted
            else "not NORM-permuted")
    log.info("target GGUF matches the drafter; target arch %s: %s", tg.arch, rope)
