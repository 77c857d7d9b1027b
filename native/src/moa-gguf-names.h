// The C++ table of MoA GGUF names: the drafter file's architecture string, metadata keys and
// tensor names (twin of moa_cpp/gguf_names.py; tests/test_native_api.py checks that both agree
// through moa_gguf_n_tensors() / moa_gguf_tensor_name()). Facts about *target* architectures
// (llama, gemma3, ...) are in moa-target-arch.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moa_gguf_names {

constexpr const char * ARCH = "moa";
constexpr uint32_t FORMAT_VERSION = 1;

namespace key {
constexpr const char * FORMAT_VERSION     = "moa.format_version";
constexpr const char * EMBEDDING_LENGTH   = "moa.embedding_length";
constexpr const char * HEAD_COUNT         = "moa.attention.head_count";
constexpr const char * KEY_LENGTH         = "moa.attention.key_length";
constexpr const char * RMS_EPS            = "moa.attention.layer_norm_rms_epsilon";
constexpr const char * ROPE_FREQ_BASE     = "moa.rope.freq_base";
constexpr const char * ROPE_QK_LAYOUT     = "moa.rope.qk_layout";
constexpr const char * VOCAB_SIZE         = "moa.vocab_size";
constexpr const char * EMBEDDING_SCALE    = "moa.embedding_scale";
constexpr const char * TLI                = "moa.target_layer_inference";
constexpr const char * TARGET_BLOCK_COUNT = "moa.target.block_count";
constexpr const char * TARGET_HEAD_KV     = "moa.target.head_count_kv";
constexpr const char * TARGET_KEY_LENGTH  = "moa.target.key_length";
constexpr const char * TARGET_ARCH        = "moa.target.architecture";
constexpr const char * SA_HEAD_KV         = "moa.sa.head_count_kv";
constexpr const char * SA_FFN             = "moa.sa.feed_forward_length";
constexpr const char * CA_HEAD_KV         = "moa.ca.head_count_kv";
constexpr const char * CA_FFN             = "moa.ca.feed_forward_length";
constexpr const char * LSA_WIDTH          = "moa.lsa.embedding_length";
constexpr const char * LSA_HEAD_COUNT     = "moa.lsa.head_count";
constexpr const char * LSA_HEAD_KV        = "moa.lsa.head_count_kv";
constexpr const char * LSA_KEY_LENGTH     = "moa.lsa.key_length";
constexpr const char * LSA_FFN            = "moa.lsa.feed_forward_length";
constexpr const char * LSA_INPUT_LAYOUT   = "moa.lsa.input_layout";
constexpr const char * SA_ROPE_SCALING    = "moa.sa.rope_scaling.type";
constexpr const char * DRAFT_VOCAB_SIZE   = "moa.draft_vocab_size";
constexpr const char * ROLE               = "moa.role";  // string, optional: "full" (default) | "client"
// float32 array, optional: held-out conditional acceptance per draft depth (the trainer writes it;
// the cost-aware policy's prior)
constexpr const char * EVAL_ACCEPTANCE    = "moa.eval.acceptance";
}  // namespace key

// Decoder-layer tensor suffixes shared by the sa / ca / lsa modules.
constexpr const char * LAYER_SUFFIXES[] = {
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
    "ffn_norm.weight",  "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
};
constexpr const char * MODULES[] = {"sa", "ca", "lsa"};

constexpr const char * EKV2E_WEIGHT = "ekv2e.weight";
constexpr const char * EKV2E_BIAS   = "ekv2e.bias";
constexpr const char * DRAFT_OUTPUT = "draft_output.weight";
constexpr const char * D2T          = "d2t";
constexpr const char * TARGET_PREFIX = "target.";

// The 29 required drafter tensor names.
std::vector<std::string> required_tensors();

}  // namespace moa_gguf_names
