// Shared graph blocks (RMS norm, SwiGLU FFN, RoPE, attention) and the per-module builders.
// Builders are pure functions over a no_alloc ggml context; shapes are in ggml ne order.
// ref: docs/drafter.md (#lsa to #lm-head, #numerics).
#pragma once

#include "moa-model.h"

struct moa_graph {
    ggml_context * ctx;
    const moa_hparams & hp;
};

// w * x / sqrt(mean(x^2) + eps) over ne0.
ggml_tensor * moa_build_norm(const moa_graph & g, ggml_tensor * x, ggml_tensor * w);
ggml_tensor * moa_build_norm_eps(const moa_graph & g, ggml_tensor * x, ggml_tensor * w, float eps);
// down(SiLU(gate(x)) * up(x)); x: [n_in, n]
ggml_tensor * moa_build_ffn(const moa_graph & g, const moa_layer & L, ggml_tensor * x);
// HF rotate-half RoPE == ggml NEOX mode; x: [head_dim, n_head, n], pos: I32 [n]
ggml_tensor * moa_build_rope(const moa_graph & g, ggml_tensor * x, ggml_tensor * pos);
ggml_tensor * moa_build_rope_ext(const moa_graph & g, ggml_tensor * x, ggml_tensor * pos, int n_dims, float base);
// softmax(q k^T * scale + mask) v with grouped-query heads (query head j uses kv head j / (H / H_kv)).
// q: [D, n_q, H, B]; k: [D, n_kv, H_kv, B]; v_t: [n_kv, D, H_kv, B] (keys along ne0);
// mask: [n_kv, n_q] F32 or nullptr. Returns [D * H, n_q * B] (heads concatenated per row).
ggml_tensor * moa_build_attn(const moa_graph & g, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v_t,
                             ggml_tensor * mask, float scale);

// One target decoder layer (TLI) for draft rows: attention over the layer's K/V cache views
// (verified tokens + this cycle's rows, masked to ancestors), llama-style pre-norm block.
// x: [d, nd]; writes the rows' K/V into the caches at slot s0. Returns [d, nd].
ggml_tensor * moa_build_tli_layer(const moa_graph & g, ggml_cgraph * gf, const moa_layer & L, ggml_tensor * x,
                                  ggml_tensor * pos, ggml_tensor * kc, ggml_tensor * vc, int64_t s0, int64_t n_kv,
                                  ggml_tensor * mask);

// Write n new entries (k: [D, h, n], v: [D*h, n]) at slots s0.. of a (K [D, h, slots],
// transposed V [slots, D*h]) cache, ordered before later readers of the cache.
void moa_store_kv(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * kc, ggml_tensor * vc, ggml_tensor * k,
                  ggml_tensor * v, int64_t s0);
// Attention views of the first n slots: K [D, n, h], V [n, D, h].
ggml_tensor * moa_view_k(ggml_context * ctx, ggml_tensor * kc, int64_t n);
ggml_tensor * moa_view_v(ggml_context * ctx, ggml_tensor * vc, int64_t n, int64_t D);

// LSA over the target-layer axis, then mean over layers and Ekv2E.
// x: [W, L, T] -> writes lsa_out [W, L, T] and lsa_mean [W, T] to *out_lsa / *out_mean; returns ekv [d, T].
ggml_tensor * moa_build_lsa_ekv2e(const moa_graph & g, const moa_model & m, ggml_tensor * x, ggml_tensor * layer_pos,
                                  ggml_tensor ** out_lsa, ggml_tensor ** out_mean);
