"""Streamed text (moa_cpp/target/text_stream.py) equals llama.cpp's whole-sequence detokenize after every
step, on real vocabularies: SmolLM2 and Qwen2.5 (byte-level BPE whose pieces concatenate), Gemma-3
(SentencePiece with a leading-space rule) and a gpt-2 pre-tokenizer vocabulary, on which llama.cpp
cleans up tokenization spaces (" ?" -> "?"), so that the stream detokenizes the whole sequence."""
from __future__ import annotations

import numpy as np
import pytest

from moa_cpp.models import registry as models
from moa_cpp.target.target import Target
from moa_cpp.testing import tiny_archs

TEXT = ("Hi , there ! What ' s up ? Yes . 'quoted' caf\u00e9 na\u00efve \u4e2d\u6587\u5b57 \U0001f600\U0001f680 "
        "x = a.b(c, d) # done?\n\n  indented  ")


def _vocab_targets():
    out = [("smollm2", models.smollm2_path, True), ("qwen2.5-0.5b", models.qwen25_coder_05b_path, True),
           ("gemma3", models.gemma3_270m_path, True)]
    return out


def _check(tgt: Target, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ids = tgt.tokenize(TEXT, add_bos=False, special=False).tolist()
    # and random ids: byte tokens and pieces that split multi-byte characters, special tokens
    ids = ids + rng.integers(0, tgt.n_vocab, 40).tolist() + ids[::-1]
    ts = tgt.text_stream()
    i = 0
    while i < len(ids):
        k = int(rng.integers(0, 4))              # 0..3 tokens per step (0: the text as it stands)
        got = ts.extend(ids[i:i + k])
        i += k
        assert got == tgt.detokenize(ids[:i]), f"after {i} tokens"


@pytest.mark.parametrize("name,path,concat", _vocab_targets(), ids=[v[0] for v in _vocab_targets()])
def test_stream_equals_whole_detokenize(name, path, concat):
    tgt = Target.from_path(path(), n_ctx=256, install_callback=False)
    try:
        assert tgt.text_stream()._concat is concat     # the piece-by-piece path is the one checked
        for seed in range(3):
            _check(tgt, seed)
    finally:
        tgt.close()


def test_clean_spaces_vocabulary_detokenizes_whole():
    gguf = tiny_archs.build(["llama"])["llama"]["gguf"]
    tgt = Target.from_path(gguf, n_ctx=256, install_callback=False)
    try:
        ts = tgt.text_stream()
        assert ts._concat is False, "llama.cpp cleans up spaces for a gpt-2 pre-tokenizer: pieces do not concatenate"
        ids = tgt.tokenize("a ? b ! c ' d , e .", add_bos=False).tolist()
        assert tgt.detokenize(ids) != b"".join(tgt.token_bytes(t) for t in ids).decode()
        for seed in range(3):
            _check(tgt, seed)
    finally:
        tgt.close()
