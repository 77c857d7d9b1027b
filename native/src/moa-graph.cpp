#include "moa-graph.h"

#include <cmath>

ggml_tensor * moa_build_norm(const moa_graph & g, ggml_tensor * x, ggml_tensor * w) {
    return moa_build_norm_eps(g, x, w, g.hp.rms_eps);
}

ggml_tensor * moa_build_norm_eps(const moa_graph & g, ggml_tensor * x, ggml_tensor * w, float eps) {
    return ggml_mul(g.ctx, ggml_rms_norm(g.ctx, x, eps), w);
}

ggml_tensor * moa_build_ffn(const moa_graph & g, const moa_layer & L, ggml_tensor * x) {
    ggml_tensor * gate = ggml_mul_mat(g.ctx, L.ffn_gate, x);           // [ff, n]
    ggml_tensor * up   = ggml_mul_mat(g.ctx, L.ffn_up, x);             // [ff, n]
    ggml_tensor * act  = ggml_mul(g.ctx, ggml_silu(g.ctx, gate), up);  // [ff, n]
    return ggml_mul_mat(g.ctx, L.ffn_down, act);                        // [n_in, n]
}

ggml_tensor * moa_build_rope(const moa_graph & g, ggml_tensor * x, ggml_tensor * pos) {
    return moa_build_rope_ext(g, x, pos, (int) x->ne[0], g.hp.rope_base);
}

ggml_tensor * moa_build_rope_ext(const moa_graph & g, ggml_tensor * x, ggml_tensor * pos, int n_dims, float base) {
    // freq_scale 1, no YaRN extension: plain theta^(-2i/D) frequencies (docs/drafter.md#numerics).
    return ggml_rope_ext(g.ctx, x, pos, nullptr, n_dims, GGML_ROPE_TYPE_NEOX, 0, base, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
}

void moa_store_kv(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * kc, ggml_tensor * vc, ggml_tensor * k,
                  ggml_tensor * v, int64_t s0) {
    const int64_t n = k->ne[2];
    ggml_tensor * kdst = ggml_view_3d(ctx, kc, kc->ne[0], kc->ne[1], n, kc->nb[1], kc->nb[2], s0 * kc->nb[2]);
    ggml_tensor * vdst = ggml_view_2d(ctx, vc, n, vc->ne[1], vc->nb[1], s0 * ggml_element_size(vc));
    // Expanding the copies first orders them before any attention that reads the cache.
    ggml_build_forward_expand(gf, ggml_cpy(ctx, k, kdst));
    ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_transpose(ctx, v), vdst));
}

ggml_tensor * moa_view_k(ggml_context * ctx, ggml_tensor * kc, int64_t n) {
    return ggml_view_3d(ctx, kc, kc->ne[0], n, kc->ne[1], kc->nb[2], kc->nb[1], 0);
}

ggml_tensor * moa_view_v(ggml_context * ctx, ggml_tensor * vc, int64_t n, int64_t D) {
    return ggml_view_3d(ctx, vc, n, D, vc->ne[1] / D, vc->nb[1], vc->nb[1] * D, 0);
}

// ref: docs/drafter.md#tli (train-consistent TLI): the reused target layer attends to the target's own K/V
// of verified tokens plus the k/v of the drafted rows on this row's path.
ggml_tensor * moa_build_tli_layer(const moa_graph & g, ggml_cgraph * gf, const moa_layer & L, ggml_tensor * x,
                                  ggml_tensor * pos, ggml_tensor * kc, ggml_tensor * vc, int64_t s0, int64_t n_kv,
                                  ggml_tensor * mask) {
    ggml_context * ctx = g.ctx;
    const moa_hparams & hp = g.hp;
    const int64_t D = kc->ne[0], Hkv = kc->ne[1], nd = x->ne[1];
    ggml_tensor * a = moa_build_norm_eps(g, x, L.attn_norm, hp.t_rms_eps);                    // [d, nd]
    ggml_tensor * q = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, L.wq, a), D, hp.t_n_head, nd);   // [D, H_t, nd]
    ggml_tensor * k = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, L.wk, a), D, Hkv, nd);           // [D, H_kv, nd]
    q = moa_build_rope_ext(g, q, pos, hp.t_rope_dims, hp.t_rope_base);
    k = moa_build_rope_ext(g, k, pos, hp.t_rope_dims, hp.t_rope_base);
    ggml_tensor * v = ggml_mul_mat(ctx, L.wv, a);                                             // [D*H_kv, nd]
    moa_store_kv(ctx, gf, kc, vc, k, v, s0);
    q = ggml_permute(ctx, q, 0, 2, 1, 3);                                                     // [D, nd, H_t]
    ggml_tensor * o = moa_build_attn(g, q, moa_view_k(ctx, kc, n_kv), moa_view_v(ctx, vc, n_kv, D), mask,
                                     1.0f / std::sqrt((float) D));                            // [D*H_t, nd]
    ggml_tensor * h = ggml_add(ctx, x, ggml_mul_mat(ctx, L.wo, o));                           // [d, nd]
    return ggml_add(ctx, h, moa_build_ffn(g, L, moa_build_norm_eps(g, h, L.ffn_norm, hp.t_rms_eps)));
}

ggml_tensor * moa_build_attn(const moa_graph & g, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v_t,
                             ggml_tensor * mask, float scale) {
    ggml_context * ctx = g.ctx;
    ggml_tensor * kq = ggml_mul_mat(ctx, k, q);                         // [n_kv, n_q, H, B]
    // F32 accumulation regardless of backend defaults (parity with the F32 reference).
    ggml_prec_set_acc(kq, GGML_PREC_F32);
    kq = ggml_soft_max_ext(ctx, kq, mask, scale, 0.0f);                 // [n_kv, n_q, H, B]
    ggml_tensor * kqv = ggml_mul_mat(ctx, v_t, kq);                     // [D, n_q, H, B]
    kqv = ggml_permute(ctx, kqv, 0, 2, 1, 3);                           // [D, H, n_q, B]
    kqv = ggml_cont(ctx, kqv);
    return ggml_reshape_2d(ctx, kqv, kqv->ne[0] * kqv->ne[1], kqv->ne[2] * kqv->ne[3]);  // [D*H, n_q*B]
}

// ref: docs/drafter.md#lsa, docs/drafter.md#ekv2e (mean, Ekv2E)
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
