"""The per-architecture K/V check: what the native capture takes from llama.cpp's decode of a
prompt against ``transformers``' KV cache for the same tokens, on the tiny checkpoints of
:mod:`moa_cpp.testing.tiny_archs` (``tests/format/test_archs.py`` asserts it; ``python -m
moa_cpp.testing.arch_check`` prints the table of errors reached, docs/architectures.md).
Needs the ``test`` extra (torch, transformers).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from moa_cpp.format.arch import unpermute_last_axis
from moa_cpp.testing import tiny_archs

PROMPT_LEN = 20          # longer than the sliding windows of the specs (8): their masks matter
# F32 on both sides: llama.cpp's and torch's kernels sum in other orders (seen: <= 2e-5 on
# values up to ~9). Architectures with a GELU MLP: ggml's CPU GELU looks its value up in an fp16
# table (ggml-cpu/vec.h, GGML_GELU_FP16), so every layer after the first MLP is within
# GELU_RTOL of the values' scale; their first layer is still held to KV_ATOL.
KV_ATOL = 1e-4
GELU_RTOL = 2e-3


def prompt(n: int = PROMPT_LEN) -> list[int]:
    rng = np.random.default_rng(7)
    return [int(t) for t in rng.integers(3, tiny_archs.VOCAB, size=n)]


def tolerance(arch: str, err: dict) -> float:
    """The bound every layer's K and V of ``arch`` are held to (``err``: :func:`kv_errors`)."""
    return GELU_RTOL * err["scale"] if tiny_archs.BY_ARCH[arch].gelu else KV_ATOL


def hf_kv(hf_dir: Path, ids: list[int], model_class: str = "AutoModelForCausalLM") -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """transformers' KV cache after one forward over ids: layer -> (K, V) [H, T, D] (attention
    layers only; a sliding-window layer's cache may hold only the last positions)."""
    import torch
    import transformers

    model = getattr(transformers, model_class).from_pretrained(hf_dir, torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
    cache = out.past_key_values
    res = {}
    text = model.config.get_text_config()
    n_layer = text.num_hidden_layers if hasattr(text, "num_hidden_layers") else text.n_layer
    for il in range(n_layer):
        k = v = None
        if hasattr(cache, "layers"):
            if il < len(cache.layers) and getattr(cache.layers[il], "keys", None) is not None:
                k, v = cache.layers[il].keys, cache.layers[il].values
        elif hasattr(cache, "key_cache"):
            k, v = cache.key_cache[il], cache.value_cache[il]
        else:
            k, v = cache[il]
        if k is None or k.numel() == 0 or k.dim() != 4:
            continue
        res[il] = (k[0].float().numpy(), v[0].float().numpy())
    return res


def captured(gguf: Path, ids: list[int]):
    """(K, V [L, H, T, D], captured layer ids, rope type) of one decode of ``ids`` by llama.cpp."""
    from moa_cpp.target.target import Target

    with Target.from_path(gguf, n_ctx=128, cache_type="f32", flash_attn=False) as tgt:
        tgt.decode(ids)
        k, v = tgt.captured_kv()            # [L, H, T, D]
        layers = tgt.captured_layer_ids()
        assert tgt.arch == Path(gguf).parent.name.rsplit("-", 1)[0], tgt.arch   # the row names llama.cpp's arch
        return k, v, layers, tgt.rope_type


def kv_errors(entry: dict) -> dict:
    """Largest |captured - transformers| of K and V over every attention layer (``entry``: one
    architecture's :func:`tiny_archs.build` result)."""
    ids = prompt()
    k, v, layers, rope = captured(entry["gguf"], ids)
    ref = hf_kv(entry["hf"], ids, entry["meta"].get("model_class", "AutoModelForCausalLM"))
    assert sorted(ref) == list(layers), f"attention layers: llama.cpp {layers}, transformers {sorted(ref)}"
    # llama.cpp's NORM rope rotates adjacent pairs; where the converter did not permute the Q/K
    # rows for it (the HF model itself rotates pairs), the drafter's rotate-half order is the
    # same un-permutation applied to the HF K
    permute_hf = rope == "norm" and not entry["meta"]["qk_permuted"]
    ek = ev = 0.0
    scale = 0.0
    first = None
    for i, il in enumerate(layers):
        hk, hv = ref[il]
        if permute_hf:
            hk = unpermute_last_axis(hk)
        t = hk.shape[1]                      # the tokens the HF cache kept (sliding layers: the last)
        ek = max(ek, float(np.abs(k[i][:, -t:] - hk).max()))
        ev = max(ev, float(np.abs(v[i][:, -t:] - hv).max()))
        scale = max(scale, float(np.abs(hk).max()), float(np.abs(hv).max()))
        if first is None:
            first = max(ek, ev)
    return {"k": ek, "v": ev, "first_layer": first, "scale": scale, "layers": list(layers),
            "permute_hf": permute_hf}


def main() -> int:
    """Print the K/V errors of every checked architecture as a markdown table."""
    archs = [s.arch for s in tiny_archs.SPECS if not s.refused]
    built = tiny_archs.build(archs)
    print("| architecture | attention layers | max abs(K diff) | max abs(V diff) | layer 0 | values' scale | bound |")
    print("|---|---|---|---|---|---|---|")
    for a in archs:
        e = built[a]
        if "error" in e:
            print(f"| `{a}` | conversion failed: {e['error']} |||||")
            continue
        err = kv_errors(e)
        print(f"| `{a}` | {len(err['layers'])} | {err['k']:.1e} | {err['v']:.1e} | {err['first_layer']:.1e} | "
              f"{err['scale']:.1f} | {tolerance(a, err):.0e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
