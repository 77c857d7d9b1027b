#include "moa-graph.h"

#include <cmath>

ggml_tensor * moa_build_norm(const moa_graph & g, ggml_tensor * x, ggml_tensor * w) {
    return ggml_mul(g.ctx, ggml_rms_norm(g.ctx, x, g.hp.rms_eps), w);
}

ggml_tensor * moa_build_ffn(const moa_graph & g, const moa_layer & L, ggml_tensor * x) {
    ggml_tensor * gate = ggml_mul_mat(g.ctx, L.ffn_gate, x);           // [ff, n]
    ggml_tensor * up   = ggml_mul_mat(g.ctx, L.ffn_up, x);             // [ff, n]
    ggml_tensor * act  = ggml_mul(g.ctx, ggml_silu(g.ctx, gate), up);  // [ff, n]
    return ggml_mul_mat(g.ctx, L.ffn_down, act);                        // [n_in, n]
}

ggml_tensor * moa_build_rope(const moa_graph & g, ggml_tensor * x, ggml_tensor * pos) {
    // freq_scale 1, no YaRN extension: plain theta^(-2i/D) frequencies (§16).
    return ggml_rope_ext(g.ctx, x, pos, nullptr, (int) x->ne[0], GGML_ROPE_TYPE_NEOX, 0, g.hp.rope_base, 1.0f,
                         0.0f, 1.0f, 0.0f, 0.0f);
}

ggml_tensor * moa_build_attn(const moa_graph & g, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v_t,
                             ggml_tensor * mask, float scale) {
    ggml_context * ctx = g.ctx;
    ggml_tensor * kq = ggml_mul_mat(ctx, k, q);                         // [n_kv, n_q, H, B]
    // F32 accumulation regardless of backend defaults (parity with the F32 reference).
    ggml_mul_mat_set_prec(kq, GGML_PREC_F32);
    kq = ggml_soft_max_ext(ctx, kq, mask, scale, 0.0f);                 // [n_kv, n_q, H, B]
    ggml_tensor * kqv = ggml_mul_mat(ctx, v_t, kq);                     // [D, n_q, H, B]
    kqv = ggml_permute(ctx, kqv, 0, 2, 1, 3);                           // [D, H, n_q, B]
    kqv = ggml_cont(ctx, kqv);
    return ggml_reshape_2d(ctx, kqv, kqv->ne[0] * kqv->ne[1], kqv->ne[2] * kqv->ne[3]);  // [D*H, n_q*B]
}

// ref: §4 (LSA), §5 (mean, Ekv2E)
ggml_tensor * moa_build_lsa_ekv2e(const moa_graph & g, const moa_model & m, ggml_tensor * x, ggml_tensor * layer_pos,
                                  ggml_tensor ** out_lsa, ggml_tensor ** out_mean) {
    ggml_context * ctx = g.ctx;
    const moa_hparams & hp = g.hp;
    const moa_layer & L = m.lsa;
    const int64_t W = x->ne[0], NL = x->ne[1], T = x->ne[2];
    const int64_t Dl = hp.lsa_head_dim, Hl = hp.lsa_n_head, Hkv = hp.lsa_n_kv;

    ggml_tensor * x2 = ggml_reshape_2d(ctx, x, W, NL * T);               // [W, L*T]
    ggml_tensor * a  = moa_build_norm(g, x2, L.attn_norm);               // [W, L*T]
    ggml_tensor * q  = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, L.wq, a), Dl, Hl, NL * T);   // [Dl, Hl, L*T]
    ggml_tensor * k  = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, L.wk, a), Dl, Hkv, NL * T);  // [Dl, Hkv, L*T]
    ggml_tensor * v  = ggml_reshape_4d(ctx, ggml_mul_mat(ctx, L.wv, a), Dl, Hkv, NL, T);   // [Dl, Hkv, L, T]
    // RoPE position of a row = its target layer index (same for every token).
    q = moa_build_rope(g, q, layer_pos);
    k = moa_build_rope(g, k, layer_pos);
    q = ggml_permute(ctx, ggml_reshape_4d(ctx, q, Dl, Hl, NL, T), 0, 2, 1, 3);    // [Dl, L, Hl, T]
    k = ggml_permute(ctx, ggml_reshape_4d(ctx, k, Dl, Hkv, NL, T), 0, 2, 1, 3);   // [Dl, L, Hkv, T]
    ggml_tensor * vt = ggml_cont(ctx, ggml_permute(ctx, v, 1, 2, 0, 3));         // [L, Dl, Hkv, T]
    // No mask: every layer row attends to every other row of the same token.
    ggml_tensor * o = moa_build_attn(g, q, k, vt, nullptr, 1.0f / std::sqrt((float) Dl));  // [W, L*T]
    ggml_tensor * r = ggml_add(ctx, x2, ggml_mul_mat(ctx, L.wo, o));                       // [W, L*T]
    ggml_tensor * y = ggml_add(ctx, r, moa_build_ffn(g, L, moa_build_norm(g, r, L.ffn_norm)));  // [W, L*T]
    ggml_tensor * y3 = ggml_reshape_3d(ctx, y, W, NL, T);                                   // [W, L, T]
    *out_lsa = y3;
    // Mean over the layer rows, residual included.
    ggml_tensor * yt = ggml_cont(ctx, ggml_permute(ctx, y3, 1, 0, 2, 3));                  // [L, W, T]
    ggml_tensor * mean = ggml_reshape_2d(ctx, ggml_mean(ctx, yt), W, T);                   // [W, T]
    *out_mean = mean;
    return ggml_add(ctx, ggml_mul_mat(ctx, m.ekv2e_w, mean), m.ekv2e_b);                   // [d, T]
}
