// moa_model: drafter hyper-parameters and weights, plus the target tensors it borrows.
// Immutable after load; shared read-only by any number of moa_state objects, on any threads.
#pragma once

#include "moa-impl.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <string>
#include <vector>

struct moa_hparams {
    // SA / CA (width = target n_embd)
    int32_t n_embd    = 0;  // d
    int32_t n_head    = 0;  // H
    int32_t head_dim  = 0;  // D
    int32_t sa_n_kv   = 0;
    int32_t sa_n_ff   = 0;
    int32_t ca_n_kv   = 0;
    int32_t ca_n_ff   = 0;
    // LSA over the target's layers
    int32_t n_target_layers = 0;  // L
    int32_t target_n_kv     = 0;
    int32_t target_head_dim = 0;
    int32_t lsa_width    = 0;     // W = 2 * target_n_kv * target_head_dim
    int32_t lsa_n_head   = 0;
    int32_t lsa_n_kv     = 0;
    int32_t lsa_head_dim = 0;
    int32_t lsa_n_ff     = 0;
    // shared
    float   rms_eps     = 1e-5f;
    float   rope_base   = 10000.0f;
    float   embd_scale  = 1.0f;   // SA input = embd_scale * token_embd[tok] (the target's layer-0 input)
    int32_t n_vocab_target = 0;
    int32_t n_vocab        = 0;   // rows of the drafter's logits (< target vocab with a reduced head)
    int32_t tli            = 0;
    int32_t role           = 0;   // MOA_ROLE_FULL, or MOA_ROLE_CLIENT: no LSA / Ekv2E / CA k,v weights
    // target decoder layers reused at TLI N > 0 (llama family; ref docs/drafter.md#tli)
    int32_t t_n_head     = 0;
    int32_t t_rope_dims  = 0;
    float   t_rms_eps    = 1e-5f;
    float   t_rope_base  = 10000.0f;
    bool    t_qk_permuted = false;  // its q/k rows are NORM-permuted (moa-target-arch.h): un-permute at load
};

// One pre-norm Llama-style decoder layer (SA, CA or LSA).
struct moa_layer {
    ggml_tensor * attn_norm = nullptr;
    ggml_tensor * wq = nullptr, * wk = nullptr, * wv = nullptr, * wo = nullptr;
    ggml_tensor * ffn_norm = nullptr;
    ggml_tensor * ffn_gate = nullptr, * ffn_up = nullptr, * ffn_down = nullptr;
};

struct moa_model {
    moa_hparams hp;
    moa_layer sa, ca, lsa;
    ggml_tensor * ekv2e_w = nullptr;  // [W, d]
    ggml_tensor * ekv2e_b = nullptr;  // [d]
    ggml_tensor * tok_embd = nullptr; // [d, V_target]  (target's, possibly quantized)
    ggml_tensor * output   = nullptr; // [d, n_vocab]   (target LM head, or the reduced draft head)
    std::vector<int32_t> d2t;         // reduced vocabulary: draft id -> target id
    std::vector<float> acceptance;    // moa.eval.acceptance (empty: not recorded or not usable)
    // TLI N > 0: the target's last N layers (q/k rows un-permuted to HF order, so K uses NEOX
    // RoPE like the captured HF-layout K) and its output_norm.
    std::vector<moa_layer> tli;
    ggml_tensor * output_norm = nullptr;

    // Device the weights live on and the drafter runs on. The model holds no ggml_backend:
    // backends carry per-compute scratch (the CPU backend's work buffer, a GPU stream), so each
    // moa_state creates its own and states of one model can compute concurrently.
    ggml_backend_dev_t dev = nullptr;
    int32_t n_threads = 0;                  // CPU threads of each state's CPU backend
    std::string device_name;

    // storage
    std::vector<ggml_context *> ctxs;
    std::vector<ggml_backend_buffer_t> bufs;
    std::vector<std::pair<void *, size_t>> mmaps;

    ~moa_model();
};

moa_model * moa_model_load_impl(const char * drafter_path, const char * target_path,
                                const moa_model_params & params);

// Set the CPU thread count on a backend (no-op for non-CPU backends).
void moa_backend_set_threads(ggml_backend_t backend, int32_t n_threads);

// A GPU on this machine (not a remote RPC device): what --device auto / gpu may pick.
bool is_local_gpu(ggml_backend_dev_t d);
