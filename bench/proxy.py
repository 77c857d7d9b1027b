"""The GPU-speed proxy target: a small llama with random weights and a real tokenizer, whose decode
takes about a millisecond on a 2-core CPU -- the order of a 1-3B model's decode on a GPU. Next to
it, the milliseconds our loop spends outside ``llama_decode`` show as they would next to a fast
GPU decode (issue 59).

:func:`proxy_target` writes it once per size into ``<cache>/bench/`` (``MOA_CPP_CACHE``): SmolLM2's
metadata (its 49,152-token vocabulary, merges and chat template: detokenising and streaming cost
what they cost on SmolLM2), ``n_layer`` llama blocks of width ``n_embd`` with N(0, std) weights
(F32, written with gguf-py; std 0.2: at smaller ones a random model repeats one token), then quantized with llama.cpp (Q8_0 by default). Random weights give
arbitrary text; what is measured is time per token, and the text is compared only between the
methods that decode this same file.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

# the proxy's default shape: decode ~1 ms with 2 threads on the 2-core EPYC (bench/costs/loop.py
# prints the measured llama-bench tg); the LM head (49,152 x 256) is most of it, as on a GPU model
PROXY_SHAPE = dict(n_layer=4, n_embd=256, n_ff=768, n_head=4, n_head_kv=2)


def proxy_target(n_layer: int = PROXY_SHAPE["n_layer"], n_embd: int = PROXY_SHAPE["n_embd"],
                 n_ff: int = PROXY_SHAPE["n_ff"], n_head: int = PROXY_SHAPE["n_head"],
                 n_head_kv: int = PROXY_SHAPE["n_head_kv"], qtype: str = "q8_0", seed: int = 0,
                 std: float = 0.2) -> Path:
    """Path of the proxy GGUF of this shape (made on first use, atomically)."""
    from moa_cpp.models.registry import cache_dir, requantize, smollm2_path
    out = cache_dir() / "bench" / f"proxy-l{n_layer}-e{n_embd}-f{n_ff}-h{n_head}-{n_head_kv}-s{seed}-std{std:g}-{qtype}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    f32 = out.with_name(f"{out.stem}.f32.{os.getpid()}.tmp.gguf")
    try:
        _write_f32(f32, smollm2_path(), n_layer, n_embd, n_ff, n_head, n_head_kv, seed, std)
        requantize(f32, out, qtype)
    finally:
        f32.unlink(missing_ok=True)
    return out


def _write_f32(path: Path, vocab_src: Path, n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int,
               seed: int, std: float) -> None:
    import gguf
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError(f"n_embd {n_embd} / n_head {n_head} / n_head_kv {n_head_kv} do not divide")
    r = gguf.GGUFReader(str(vocab_src))
    w = gguf.GGUFWriter(str(path), "llama")
    for f in r.fields.values():    # the tokenizer and the chat template; the shape is this proxy's
        if f.name.startswith("GGUF.") or f.name.startswith("llama.") or f.name in (
                "general.architecture", "general.file_type", "general.quantization_version", "general.name"):
            continue
        if not f.name.startswith(("tokenizer.", "general.")):
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        w.add_key_value(f.name, f.contents(), vtype, sub)
    w.add_name("moa_cpp loop-cost proxy (random weights)")
    n_vocab = int(r.fields["llama.vocab_size"].contents())
    head_dim = n_embd // n_head
    w.add_block_count(n_layer)
    w.add_context_length(8192)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    rng = np.random.default_rng(seed)

    def t(name: str, *shape: int, scale: float = std) -> None:     # numpy shape: [rows, cols]
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    t("token_embd.weight", n_vocab, n_embd, scale=1.0)       # tied: also the LM head
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    for i in range(n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(b + "ffn_norm.weight", np.ones(n_embd, np.float32))
        t(b + "attn_q.weight", n_embd, n_embd)
        t(b + "attn_k.weight", n_head_kv * head_dim, n_embd)
        t(b + "attn_v.weight", n_head_kv * head_dim, n_embd)
        t(b + "attn_output.weight", n_embd, n_embd)
        t(b + "ffn_gate.weight", n_ff, n_embd)
        t(b + "ffn_up.weight", n_ff, n_embd)
        t(b + "ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
