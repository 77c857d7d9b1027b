"""Target features from llama.cpp itself (``moa-cpp train --feature-source llama``, issue 43).

The drafter trains on three things of the frozen target, per token: its per-layer K/V (the LSA
input), its post-norm last hidden state (the regression target, and through the LM head its
soft labels). The PyTorch re-run (:mod:`moa_cpp.train.target_torch`) needs a copy of each
architecture; llama.cpp runs every GGUF it loads, on every backend it has. Here the GGUF target
prefills each sample once:

- the K/V rows come from the native capture (``Target.decode(capture=True)``): the very rows the
  drafter reads at inference, from the quantized weights the verifier uses;
- the hidden state comes from llama.cpp's embeddings output (``llama_set_embeddings``): for a
  causal LM without pooling that is ``t_embd``, the ``result_norm`` node right before the LM head;
- the soft labels are recomputed in the loss from that hidden state and the GGUF's LM head,
  dequantized by gguf-py (:class:`GgufHead`), as on the PyTorch path.

Measured (bench/costs/features.py, docs/training.md#features): on a 2-core AVX-512 CPU the
PyTorch path is 1.3-3x faster for the architectures it has; this path is the only one for the
others (gemma3), and the one whose K/V and labels are the verifier's own.

The cache in ``OUT/features`` has the layout of :func:`moa_cpp.train.features.compute_features`
(``lsa.npy`` F16, ``hidden.npy`` F32); ``done.json`` records ``"source": "llama"`` so neither path
reuses the other's cache.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from moa_cpp.train.data import Dataset
from moa_cpp.train.features import FeatureStore, cache_matches

__all__ = ["GgufHead", "compute_features_llama", "feature_batch_rows"]

# logits rows llama.cpp keeps per decode: with embeddings on it outputs every row, and the LM
# head runs on each (a 262,144-token vocabulary makes that 1 MiB of logits a row)
_LOGITS_BYTES = 256 << 20


class GgufHead:
    """The frozen parts of the target the trainer needs besides its features: the token
    embedding and LM head (dequantized by gguf-py; ``lm_head is embed`` when tied), the layer
    count and the LSA width. Stands in for :class:`~moa_cpp.train.target_torch.TorchTarget` on
    the llama.cpp feature path, for any architecture."""

    def __init__(self, embed: torch.Tensor, lm_head: torch.Tensor, n_layer: int, lsa_width: int, arch: str) -> None:
        self.embed, self.lm_head, self.n_layer, self.lsa_width, self.arch = embed, lm_head, n_layer, lsa_width, arch

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> "GgufHead":
        import gguf

        from moa_cpp.convert.target_gguf import read_target

        info = read_target(path)        # sizes read and checked once (memoised: the CLI read it already)
        d = info.n_embd
        r = gguf.GGUFReader(str(path))
        tensors = {t.name: t for t in r.tensors if t.name in ("token_embd.weight", "output.weight")}
        if "token_embd.weight" not in tensors:
            from moa_cpp.errors import FormatError
            raise FormatError(f"{path}: no token_embd.weight tensor")

        def load(name: str) -> torch.Tensor:
            t = tensors[name]
            w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
            return torch.from_numpy(np.array(w.reshape(-1, d), dtype=np.float32))   # a writable copy

        embed = load("token_embd.weight")
        lm_head = load("output.weight") if "output.weight" in tensors else embed
        return cls(embed, lm_head, info.block_count, 2 * info.head_count_kv * info.key_length, info.arch)

    def to(self, device) -> "GgufHead":
        self.embed = self.embed.to(device)
        self.lm_head = self.embed if self.lm_head is self.embed else self.lm_head.to(device)
        return self


def feature_batch_rows(n_vocab: int, longest: int) -> int:
    """Tokens per decode: the longest sample (one decode per sample when it fits), at most 512,
    fewer where a row's logits are large (llama.cpp computes them for every row here)."""
    cap = max(32, min(512, _LOGITS_BYTES // (4 * n_vocab)))
    return int(min(cap, max(32, longest)))


def compute_features_llama(target_path: str, ds: Dataset, cache_dir: Optional[Path] = None,
                           log: Callable[[str], None] = print, threads: Optional[int] = None,
                           n_gpu_layers: int = 0) -> FeatureStore:
    """Prefill every sample once in llama.cpp and keep its K/V rows and post-norm hidden states
    (cached in ``cache_dir`` when given; a finished cache of this source is reused).

    ``n_gpu_layers``: layers llama.cpp offloads (-1: all), as ``-ngl``; the features come back
    to the host either way.
    """
    import llama_cpp
    from tqdm import tqdm

    from moa_cpp.convert.target_gguf import read_target
    from moa_cpp.target.target import Target

    n_tok = len(ds.tokens)
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        if cache_matches(cache_dir, n_tok, "llama"):
            return FeatureStore(np.load(cache_dir / "lsa.npy", mmap_mode="r"), np.load(cache_dir / "hidden.npy"))
    lens = np.diff(ds.offsets)
    longest = int(lens.max()) if len(lens) else 1
    # the vocabulary sizes the logits buffer: read from the GGUF's metadata (the architecture key,
    # else the token list, else token_embd's rows) instead of loading the whole model to ask it;
    # a GGUF with none of the three is one llama.cpp cannot load either
    n_vocab = read_target(target_path).vocab_size
    if n_vocab is None:
        raise FormatError(f"{target_path}: no vocabulary (no vocab_size key, token list or token_embd.weight)")
    rows = feature_batch_rows(n_vocab, longest)
    tgt = Target.from_path(target_path, n_ctx=longest + 8, n_batch=rows, n_threads=threads,
                           n_gpu_layers=n_gpu_layers, n_seq_max=1)
    try:
        llama_cpp.llama_set_embeddings(tgt.context, True)
        L, W, d = tgt.n_layer, tgt.lsa_width, tgt.n_embd
        if cache_dir is not None:
            (cache_dir / "done.json").unlink(missing_ok=True)   # a cache being rewritten is never reused
            lsa = np.lib.format.open_memmap(cache_dir / "lsa.npy", mode="w+", dtype=np.float16, shape=(n_tok, L, W))
        else:
            lsa = np.empty((n_tok, L, W), dtype=np.float16)
        hidden = np.empty((n_tok, d), dtype=np.float32)
        t0 = time.time()
        with tqdm(total=n_tok, desc="target features (llama.cpp)", unit="tok", mininterval=5) as bar:
            for j in range(len(ds)):
                a, b = int(ds.offsets[j]), int(ds.offsets[j + 1])
                _prefill(tgt, ds.tokens[a:b], lsa[a:b], hidden[a:b], rows)
                bar.update(b - a)
        secs = time.time() - t0
    finally:
        tgt.close()
    log(f"features (llama.cpp): {n_tok} tokens in {secs:.0f}s ({n_tok / max(secs, 1e-9):.0f} tok/s)")
    if cache_dir is not None:
        lsa.flush()
        np.save(cache_dir / "hidden.npy", hidden)
        (cache_dir / "done.json").write_text(json.dumps({"n_tokens": n_tok, "source": "llama",
                                                         "target": Path(target_path).name}))
    return FeatureStore(lsa, hidden)


def _prefill(tgt, toks: np.ndarray, lsa_out: np.ndarray, hid_out: np.ndarray, rows: int) -> None:
    """One sample from an empty cache, ``rows`` tokens per decode; K/V rows and hidden states
    written into the given slices."""
    import llama_cpp

    tgt.clear()
    d = hid_out.shape[1]
    for c0 in range(0, len(toks), rows):
        chunk = np.asarray(toks[c0:c0 + rows], dtype=np.int32)
        n = len(chunk)
        tgt.decode(chunk, np.arange(c0, c0 + n, dtype=np.int32), capture=True, logits=None)
        lsa_out[c0:c0 + n] = tgt.captured_lsa_in()
        ptr = llama_cpp.llama_get_embeddings(tgt.context)
        hid_out[c0:c0 + n] = np.ctypeslib.as_array(ptr, shape=(n * d,)).reshape(n, d)
