"""The one Python table of MoA GGUF names (architecture, metadata keys, tensor names).

The C++ twin is ``native/src/moa-gguf-names.h``; ``tests/drafter/test_native_api.py`` keeps them in sync.
(Facts about *target* architectures are in :mod:`moa_cpp.format.arch`.)
Format documentation: ``docs/gguf-format.md``.
"""
from __future__ import annotations

ARCH = "moa"
FORMAT_VERSION = 1


class Keys:
    """Metadata keys (all under ``moa.``). u32 unless noted."""

    FORMAT_VERSION = "moa.format_version"
    EMBEDDING_LENGTH = "moa.embedding_length"            # d: SA/CA width (= target n_embd)
    HEAD_COUNT = "moa.attention.head_count"              # H: SA/CA query heads
    KEY_LENGTH = "moa.attention.key_length"              # D: SA/CA head dim
    RMS_EPS = "moa.attention.layer_norm_rms_epsilon"     # f32
    ROPE_FREQ_BASE = "moa.rope.freq_base"                # f32, SA/CA/LSA RoPE theta
    ROPE_QK_LAYOUT = "moa.rope.qk_layout"                # string: "neox" (HF rows, rotate-half)
    VOCAB_SIZE = "moa.vocab_size"                        # target vocabulary size
    EMBEDDING_SCALE = "moa.embedding_scale"              # f32, optional: SA input = scale * token_embd row
    TLI = "moa.target_layer_inference"                   # N
    TARGET_BLOCK_COUNT = "moa.target.block_count"        # L; 0 = take it from the target GGUF
    TARGET_HEAD_COUNT_KV = "moa.target.head_count_kv"
    TARGET_KEY_LENGTH = "moa.target.key_length"
    TARGET_ARCH = "moa.target.architecture"              # string, optional (informational)
    SA_HEAD_COUNT_KV = "moa.sa.head_count_kv"
    SA_FFN = "moa.sa.feed_forward_length"
    CA_HEAD_COUNT_KV = "moa.ca.head_count_kv"
    CA_FFN = "moa.ca.feed_forward_length"
    LSA_WIDTH = "moa.lsa.embedding_length"               # W = 2 * target_kv_heads * target_key_length
    LSA_HEAD_COUNT = "moa.lsa.head_count"
    LSA_HEAD_COUNT_KV = "moa.lsa.head_count_kv"
    LSA_KEY_LENGTH = "moa.lsa.key_length"                # W / lsa_head_count
    LSA_FFN = "moa.lsa.feed_forward_length"
    LSA_INPUT_LAYOUT = "moa.lsa.input_layout"            # string: "hf"
    SA_ROPE_SCALING = "moa.sa.rope_scaling.type"         # string, optional; only "none" supported
    SOURCE_FORMAT = "moa.source.format"                  # string: "moa_spec" | "snapshot" | "moa_cpp_train"
    DRAFT_VOCAB_SIZE = "moa.draft_vocab_size"            # optional: reduced draft vocabulary size
    TARGET_BUNDLED = "moa.target.bundled"                # bool, optional: target tensors in this file
    ROLE = "moa.role"                                    # string, optional: "full" (default) | "client" (bundle)
    EVAL_ACCEPTANCE = "moa.eval.acceptance"              # f32 array, optional: held-out acceptance per depth
    # The training record (`moa-cpp train`; a continuation with --init-from adds to its base's):
    TRAIN_STEPS = "moa.train.steps"                      # optional: optimisation steps, all runs together
    TRAIN_TOKEN_PASSES = "moa.train.token_passes"        # u64, optional: response tokens seen, all runs together
    TRAIN_RUNS = "moa.train.runs"                        # string array, optional: one JSON record per run, oldest first


# Module prefixes (paper names) and the HF source prefixes, mapped by prefix (never substring:
# every "layer_self_attention.*" name also contains "self_attention").
MODULES = {"sa": "self_attention.", "ca": "cross_attention.", "lsa": "layer_self_attention."}

# llama.cpp-style suffix -> HF suffix, per decoder-layer module.
LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

EKV2E = {"ekv2e.weight": "Ekv2E.weight", "ekv2e.bias": "Ekv2E.bias"}


def tensor_map() -> dict[str, str]:
    """GGUF tensor name -> HF checkpoint name, for the 29 drafter tensors."""
    out: dict[str, str] = {}
    for mod, hf_prefix in MODULES.items():
        for gguf_suffix, hf_suffix in LAYER_TENSORS.items():
            out[f"{mod}.{gguf_suffix}"] = hf_prefix + hf_suffix
    out.update(EKV2E)
    return out


# Optional tensors.
DRAFT_OUTPUT = "draft_output.weight"   # reduced-vocabulary LM head [d, V_draft] (ggml ne)
D2T = "d2t"                            # I32 [V_draft]: draft id -> target id
TARGET_PREFIX = "target."              # bundled target tensors: "target.token_embd.weight", ...

# Their names in an HF snapshot written by ``moa-cpp train`` (not in the released checkpoints):
# the head in PyTorch shape [V_draft, d] and the draft -> target map as absolute target ids
# (EAGLE-3 stores offsets ``target - draft``; absolute ids need no convention to read).
HF_DRAFT_OUTPUT = "draft_lm_head.weight"
HF_D2T = "d2t"
OPTIONAL_HF = {HF_DRAFT_OUTPUT: DRAFT_OUTPUT, HF_D2T: D2T}
