// The drafter's state machine (ref: docs/drafter.md#state-machine):
//
//   commit(K/V of verified tokens, pos0)   target K/V -> LSA -> mean -> Ekv2E -> CA K/V, written
//                                          at CA slots pos0.. (CA slot == absolute position).
//   feed(tokens)                           tokens whose SA output is not needed (prompt, accepted
//                                          drafts) only get SA K/V, appended to the SA context
//                                          (slot == position).
//   draft_rows(rows)                       SA over the context + the row's ancestors + itself, CA
//                                          over every CA entry (no mask), LM head. Their SA K/V
//                                          live in scratch slots after the context until the next
//                                          clear_drafts / rollback / commit.
//   draft(feed tokens, rows)               both, as one graph (one scheduler pass).
//   rollback(pos)                          forget positions >= pos in both caches.
//
// The CA cache only ever holds verified tokens and is frozen while drafting; the SA cache of a
// token depends only on (token, position), so re-feeding accepted tokens is exact.
#include "moa-state.h"

#include "moa-graph.h"

#include "ggml-alloc.h"

#include <cmath>
#include <cstring>

static constexpr int MOA_GRAPH_MAX_NODES = 4096;

moa_state::moa_state(const moa_model & model, const moa_state_params & p) : m(model) {
    const moa_hparams & hp = m.hp;
    n_ctx = p.n_ctx;
    n_draft_max = p.n_draft_max;
    n_batch = p.n_batch;
    if (n_ctx <= 0 || n_draft_max <= 0 || n_batch <= 0) {
        moa_throw(MOA_ERR_INVALID_ARGUMENT, "moa_state_params: n_ctx, n_draft_max and n_batch must be > 0");
    }
    try {
        // Own backend instances: see moa_state in moa-state.h.
        backend = ggml_backend_dev_init(m.dev, nullptr);
        if (!backend) moa_throw(MOA_ERR_BACKEND, "cannot initialise device %s", m.device_name.c_str());
        if (ggml_backend_dev_type(m.dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            backend_cpu = backend;
        } else {
            ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
            backend_cpu = cpu ? ggml_backend_dev_init(cpu, nullptr) : nullptr;
            if (!backend_cpu) moa_throw(MOA_ERR_BACKEND, "cannot initialise the CPU backend");
        }
        moa_backend_set_threads(backend_cpu, m.n_threads);

        ggml_init_params ip = {ggml_tensor_overhead() * (8 + 2 * m.tli.size()), nullptr, true};
        ctx_cache = ggml_init(ip);
        if (!ctx_cache) moa_throw(MOA_ERR_OUT_OF_MEMORY, "ggml_init failed");
        const int64_t D = hp.head_dim, n_sa_slots = (int64_t) n_ctx + n_draft_max;
        ca_k = ggml_new_tensor_3d(ctx_cache, GGML_TYPE_F32, D, hp.ca_n_kv, n_ctx);
        ca_v = ggml_new_tensor_2d(ctx_cache, GGML_TYPE_F32, n_ctx, D * hp.ca_n_kv);
        sa_k = ggml_new_tensor_3d(ctx_cache, GGML_TYPE_F32, D, hp.sa_n_kv, n_sa_slots);
        sa_v = ggml_new_tensor_2d(ctx_cache, GGML_TYPE_F32, n_sa_slots, D * hp.sa_n_kv);
        ggml_set_name(ca_k, "cache_ca_k");
        ggml_set_name(ca_v, "cache_ca_v");
        ggml_set_name(sa_k, "cache_sa_k");
        ggml_set_name(sa_v, "cache_sa_v");
        for (size_t i = 0; i < m.tli.size(); ++i) {
            const int64_t Dt = hp.target_head_dim, Hkv = hp.target_n_kv;
            tli_k.push_back(ggml_new_tensor_3d(ctx_cache, GGML_TYPE_F32, Dt, Hkv, n_sa_slots));
            tli_v.push_back(ggml_new_tensor_2d(ctx_cache, GGML_TYPE_F32, n_sa_slots, Dt * Hkv));
        }
        buf_cache = ggml_backend_alloc_ctx_tensors(ctx_cache, backend);
        if (!buf_cache) moa_throw(MOA_ERR_OUT_OF_MEMORY, "cannot allocate the drafter caches (n_ctx %d) on %s", n_ctx, m.device_name.c_str());
        // Zero so that no view ever sees uninitialised (possibly NaN) memory.
        ggml_backend_buffer_clear(buf_cache, 0);

        ggml_backend_t backends[2] = {backend, backend_cpu};
        const int nb = backend == backend_cpu ? 1 : 2;
        sched = ggml_backend_sched_new(backends, nullptr, nb, MOA_GRAPH_MAX_NODES, false, true);
        if (!sched) moa_throw(MOA_ERR_BACKEND, "cannot create the ggml backend scheduler");
        graph_mem.resize(ggml_tensor_overhead() * MOA_GRAPH_MAX_NODES + ggml_graph_overhead_custom(MOA_GRAPH_MAX_NODES, false));
    } catch (...) {
        release();  // a throwing constructor runs no destructor
        throw;
    }
}

moa_state::~moa_state() { release(); }

void moa_state::release() {
    if (sched) ggml_backend_sched_free(sched);
    if (buf_cache) ggml_backend_buffer_free(buf_cache);
    if (ctx_cache) ggml_free(ctx_cache);
    if (backend_cpu && backend_cpu != backend) ggml_backend_free(backend_cpu);
    if (backend) ggml_backend_free(backend);
    sched = nullptr;
    buf_cache = nullptr;
    ctx_cache = nullptr;
    backend_cpu = backend = nullptr;
}

namespace {

struct graph_ctx {
    ggml_context * ctx = nullptr;
    ggml_cgraph * gf = nullptr;
    graph_ctx(std::vector<uint8_t> & mem) {
        ggml_init_params ip = {mem.size(), mem.data(), true};
        ctx = ggml_init(ip);
        if (!ctx) moa_throw(MOA_ERR_OUT_OF_MEMORY, "ggml_init failed");
        gf = ggml_new_graph_custom(ctx, MOA_GRAPH_MAX_NODES, false);
    }
    ~graph_ctx() { ggml_free(ctx); }
};

ggml_tensor * input(ggml_context * ctx, ggml_type type, int64_t ne0, int64_t ne1 = 1) {
    ggml_tensor * t = ne1 == 1 ? ggml_new_tensor_1d(ctx, type, ne0) : ggml_new_tensor_2d(ctx, type, ne0, ne1);
    ggml_set_input(t);
    return t;
}

void compute(ggml_backend_sched_t sched, ggml_cgraph * gf) {
    if (ggml_backend_sched_graph_compute(sched, gf) != GGML_STATUS_SUCCESS) {
        moa_throw(MOA_ERR_BACKEND, "ggml graph compute failed");
    }
}

void alloc(ggml_backend_sched_t sched, ggml_cgraph * gf) {
    ggml_backend_sched_reset(sched);
    if (!ggml_backend_sched_alloc_graph(sched, gf)) moa_throw(MOA_ERR_OUT_OF_MEMORY, "cannot allocate the drafter graph");
}

}  // namespace

// commit / compute_ca run LSA -> Ekv2E -> CA k/v, whose weights a client-role file lacks.
void moa_state::check_full_role(const char * who) const {
    if (m.hp.role == MOA_ROLE_CLIENT) {
        moa_throw(MOA_ERR_INVALID_ARGUMENT, "%s: this drafter is a client-role file (moa.role = client, from `moa-cpp bundle`): "
                  "it has no LSA / Ekv2E / CA k,v weights; append CA K/V computed by the server with moa_state_append_ca, "
                  "or load the full drafter", who);
    }
}

void moa_state::check_commit_range(const char * who, int32_t n_tokens, moa_pos pos0) const {
    if (n_tokens <= 0) moa_throw(MOA_ERR_INVALID_ARGUMENT, "%s: need n_tokens > 0", who);
    if (pos0 < 0 || pos0 > n_ca) {
        moa_throw(MOA_ERR_INVALID_ARGUMENT, "%s: pos0 %d must be in [0, n_ca = %d] (CA entries are contiguous positions)",
                  who, pos0, n_ca);
    }
    if ((int64_t) pos0 + n_tokens > n_ctx) {
        moa_throw(MOA_ERR_CACHE_FULL, "%s: positions up to %d exceed the state's n_ctx %d", who, pos0 + n_tokens, n_ctx);
    }
}

// ref: docs/drafter.md#lsa, #ekv2e, #ca-cache: LSA -> mean -> Ekv2E, then the CA K/V of that stream.
void moa_state::build_ca_kv(const moa_graph & g, ggml_tensor * x, ggml_tensor * lpos, ggml_tensor * pos,
                            ggml_tensor ** k, ggml_tensor ** v, ggml_tensor ** y, ggml_tensor ** mean,
                            ggml_tensor ** e) const {
    const moa_hparams & hp = m.hp;
    ggml_context * ctx = g.ctx;
    const int64_t T = x->ne[2], D = hp.head_dim;
    *e = moa_build_lsa_ekv2e(g, m, x, lpos, y, mean);                          // [d, T]
    // ref: docs/drafter.md#ca-cache - the CA input norm is shared by the query stream and this K/V stream.
    ggml_tensor * u = moa_build_norm(g, *e, m.ca.attn_norm);                   // [d, T]
    *k = moa_build_rope(g, ggml_reshape_3d(ctx, ggml_mul_mat(ctx, m.ca.wk, u), D, hp.ca_n_kv, T), pos);  // [D, h_ca, T]
    *v = ggml_mul_mat(ctx, m.ca.wv, u);                                        // [D*h_ca, T]
}

namespace {

// Layer index of every (token, layer) row and absolute position of every token of a chunk.
void set_commit_positions(ggml_tensor * lpos, ggml_tensor * pos, int64_t L, int64_t T, int32_t p0) {
    std::vector<int32_t> lp(L * T), p(T);
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t l = 0; l < L; ++l) lp[t * L + l] = (int32_t) l;
        p[t] = p0 + (int32_t) t;
    }
    ggml_backend_tensor_set(lpos, lp.data(), 0, ggml_nbytes(lpos));
    ggml_backend_tensor_set(pos, p.data(), 0, ggml_nbytes(pos));
}

}  // namespace

// One chunk of the LSA -> Ekv2E -> CA K/V graph (build_ca_kv): its input x [W, L, T], the CA
// K/V, the optional debug outputs, and where it lies in the caller's arrays.
struct moa_state::ca_chunk {
    ggml_context * ctx;
    ggml_cgraph * gf;
    ggml_tensor * x, * k, * v, * y, * mean, * e;
    int32_t off, T;  // first token of the chunk within the call, tokens in it
};

// The loop commit and compute_ca share: chunks of at most n_batch tokens at positions
// pos0 + off.., each its own graph. add_outputs marks / stores what the caller wants from the
// graph before it is allocated; read_outputs copies it out after compute.
void moa_state::run_ca_chunks(const float * lsa_in, int32_t n_tokens, moa_pos pos0,
                              const std::function<void(const ca_chunk &)> & add_outputs,
                              const std::function<void(const ca_chunk &)> & read_outputs) {
    const moa_hparams & hp = m.hp;
    const int64_t L = hp.n_target_layers, W = hp.lsa_width;
    for (int32_t off = 0; off < n_tokens; off += n_batch) {
        const int32_t T = std::min(n_batch, n_tokens - off);
        graph_ctx gc(graph_mem);
        moa_graph g{gc.ctx, hp};
        ca_chunk c{gc.ctx, gc.gf, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, off, T};
        c.x = ggml_new_tensor_3d(gc.ctx, GGML_TYPE_F32, W, L, T);  // [W, L, T]
        ggml_set_input(c.x);
        ggml_tensor * lpos = input(gc.ctx, GGML_TYPE_I32, L * T);
        ggml_tensor * pos = input(gc.ctx, GGML_TYPE_I32, T);
        build_ca_kv(g, c.x, lpos, pos, &c.k, &c.v, &c.y, &c.mean, &c.e);
        add_outputs(c);
        alloc(sched, gc.gf);
        ggml_backend_tensor_set(c.x, lsa_in + (size_t) off * L * W, 0, ggml_nbytes(c.x));
        set_commit_positions(lpos, pos, L, T, pos0 + off);
        compute(sched, gc.gf);
        read_outputs(c);
    }
}

// ref: docs/drafter.md#lsa .. #ca-cache; prefill and update steps of docs/drafter.md#one-cycle.
void moa_state::commit(const float * lsa_in, int32_t n_tokens, moa_pos pos0, float * lsa_out, float * lsa_mean, float * ekv) {
    const moa_hparams & hp = m.hp;
    check_full_role("commit");
    if (!lsa_in) moa_throw(MOA_ERR_INVALID_ARGUMENT, "commit: need n_tokens > 0 and lsa_in");
    check_commit_range("commit", n_tokens, pos0);
    const int64_t L = hp.n_target_layers, W = hp.lsa_width, d = hp.n_embd;
    // A commit starts a new cycle: pending draft rows (whose TLI scratch slots follow n_ca)
    // are dropped.
    draft_parent.clear();
    // A smaller pos0 truncates first. n_ca advances after each complete chunk (n_ca == pos0 +
    // off at each chunk), so after a (backend) failure the cache holds exactly the entries that
    // were fully written.
    n_ca = pos0;
    auto add_outputs = [&](const ca_chunk & c) {
        if (lsa_out) { ggml_set_output(c.y); ggml_build_forward_expand(c.gf, c.y); }
        if (lsa_mean) { ggml_set_output(c.mean); ggml_build_forward_expand(c.gf, c.mean); }
        if (ekv) { ggml_set_output(c.e); ggml_build_forward_expand(c.gf, c.e); }
        moa_store_kv(c.ctx, c.gf, ca_k, ca_v, c.k, c.v, n_ca);
        // TLI: keep the target's own K/V of the reused layers (HF layout, like the weights'
        // un-permuted q/k rows) for the drafted rows' attention.
        const int64_t Dt = hp.target_head_dim, Hkv = hp.target_n_kv, n_tli = (int64_t) tli_k.size();
        ggml_tensor * x = c.x;
        for (int64_t i = 0; i < n_tli; ++i) {
            const int64_t l = L - n_tli + i;
            const size_t es = ggml_element_size(x);
            ggml_tensor * kl = ggml_view_3d(c.ctx, x, Dt, Hkv, c.T, 2 * Dt * es, x->nb[2], l * x->nb[1]);            // [Dt, Hkv, T]
            ggml_tensor * vl = ggml_view_3d(c.ctx, x, Dt, Hkv, c.T, 2 * Dt * es, x->nb[2], l * x->nb[1] + Dt * es);
            vl = ggml_reshape_2d(c.ctx, ggml_cont(c.ctx, vl), Dt * Hkv, c.T);                                         // [Dt*Hkv, T]
            moa_store_kv(c.ctx, c.gf, tli_k[i], tli_v[i], kl, vl, n_ca);
        }
    };
    auto read_outputs = [&](const ca_chunk & c) {
        if (lsa_out) ggml_backend_tensor_get(c.y, lsa_out + (size_t) c.off * L * W, 0, ggml_nbytes(c.y));
        if (lsa_mean) ggml_backend_tensor_get(c.mean, lsa_mean + (size_t) c.off * W, 0, ggml_nbytes(c.mean));
        if (ekv) ggml_backend_tensor_get(c.e, ekv + (size_t) c.off * d, 0, ggml_nbytes(c.e));
        n_ca += c.T;
    };
    run_ca_chunks(lsa_in, n_tokens, pos0, add_outputs, read_outputs);
}

// Server side of a split commit: the same graph as commit, its K/V copied out instead of stored.
void moa_state::compute_ca(const float * lsa_in, int32_t n_tokens, moa_pos pos0, float * k_out, float * v_out) {
    const moa_hparams & hp = m.hp;
    check_full_role("compute_ca");
    if (!lsa_in || !k_out || !v_out) moa_throw(MOA_ERR_INVALID_ARGUMENT, "compute_ca: lsa_in, k_out and v_out are required");
    if (!tli_k.empty()) moa_throw(MOA_ERR_INVALID_ARGUMENT, "compute_ca: split mode needs TLI N == 0 (this drafter has %d)", (int) tli_k.size());
    if (n_tokens <= 0 || pos0 < 0) moa_throw(MOA_ERR_INVALID_ARGUMENT, "compute_ca: need n_tokens > 0 and pos0 >= 0");
    const int64_t kv = (int64_t) hp.head_dim * hp.ca_n_kv;
    auto add_outputs = [&](const ca_chunk & c) {
        ggml_set_output(c.k);
        ggml_set_output(c.v);
        ggml_build_forward_expand(c.gf, c.k);
        ggml_build_forward_expand(c.gf, c.v);
    };
    auto read_outputs = [&](const ca_chunk & c) {
        ggml_backend_tensor_get(c.k, k_out + (size_t) c.off * kv, 0, ggml_nbytes(c.k));  // [T][h_ca][D]
        ggml_backend_tensor_get(c.v, v_out + (size_t) c.off * kv, 0, ggml_nbytes(c.v));
    };
    run_ca_chunks(lsa_in, n_tokens, pos0, add_outputs, read_outputs);
}

// Client side of a split commit: store K/V computed by compute_ca (no LSA weights needed).
void moa_state::append_ca(const float * k_in, const float * v_in, int32_t n_tokens, moa_pos pos0) {
    const moa_hparams & hp = m.hp;
    if (!k_in || !v_in) moa_throw(MOA_ERR_INVALID_ARGUMENT, "append_ca: k and v are required");
    if (!tli_k.empty()) moa_throw(MOA_ERR_INVALID_ARGUMENT, "append_ca: split mode needs TLI N == 0 (this drafter has %d)", (int) tli_k.size());
    check_commit_range("append_ca", n_tokens, pos0);
    const int64_t D = hp.head_dim, H = hp.ca_n_kv;
    draft_parent.clear();
    n_ca = pos0;
    for (int32_t off = 0; off < n_tokens; off += n_batch) {
        const int32_t T = std::min(n_batch, n_tokens - off);
        graph_ctx gc(graph_mem);
        ggml_tensor * k = ggml_new_tensor_3d(gc.ctx, GGML_TYPE_F32, D, H, T);
        ggml_tensor * v = ggml_new_tensor_2d(gc.ctx, GGML_TYPE_F32, D * H, T);
        ggml_set_input(k);
        ggml_set_input(v);
        moa_store_kv(gc.ctx, gc.gf, ca_k, ca_v, k, v, n_ca);
        alloc(sched, gc.gf);
        ggml_backend_tensor_set(k, k_in + (size_t) off * D * H, 0, ggml_nbytes(k));
        ggml_backend_tensor_set(v, v_in + (size_t) off * D * H, 0, ggml_nbytes(v));
        compute(sched, gc.gf);
        n_ca += T;
    }
}

void moa_state::feed(int32_t n_feed, const moa_token * tokens) {
    if (n_feed == 0) return;
    validate("feed", n_feed, tokens, 0, nullptr, nullptr, nullptr, nullptr);
    run(n_feed, tokens, 0, nullptr, nullptr, nullptr, nullptr, nullptr);
}

void moa_state::draft_rows(int32_t n_draft, const moa_token * tokens, const moa_pos * pos, const int32_t * parents,
                           float * logits, float * hidden) {
    validate("draft", 0, nullptr, n_draft, tokens, pos, parents, logits);
    run(0, nullptr, n_draft, tokens, pos, parents, logits, hidden);
}

void moa_state::draft(int32_t n_feed, const moa_token * feed, int32_t n_draft, const moa_token * tokens,
                      const moa_pos * pos, const int32_t * parents, float * logits, float * hidden) {
    validate("draft", n_feed, feed, n_draft, tokens, pos, parents, logits);
    run(n_feed, feed, n_draft, tokens, pos, parents, logits, hidden);
}

// Every argument and capacity check, before anything changes (so a failed call leaves the
// state as it was). `who` names the entry point in the messages.
void moa_state::validate(const char * who, int32_t n_feed, const moa_token * feed, int32_t n_draft,
                         const moa_token * tokens, const moa_pos * pos, const int32_t * parents,
                         const float * logits) const {
    const moa_hparams & hp = m.hp;
    if (n_feed < 0 || n_draft < 0 || n_feed + n_draft == 0) moa_throw(MOA_ERR_INVALID_ARGUMENT, "%s: nothing to do", who);
    if (n_feed > 0 && !feed) moa_throw(MOA_ERR_INVALID_ARGUMENT, "%s: feed_tokens is NULL", who);
    if (n_draft > 0 && (!tokens || !pos || !parents || !logits)) {
        moa_throw(MOA_ERR_INVALID_ARGUMENT, "%s: tokens, pos, parents and logits are required for draft rows", who);
    }
    const int32_t n_pending = (int32_t) draft_parent.size();
    if (n_feed > 0 && n_pending > 0) {
        moa_throw(MOA_ERR_INVALID_ARGUMENT, "%s: cannot feed context tokens while %d draft rows are pending "
                  "(clear_drafts or rollback first)", who, n_pending);
    }
    if (n_sa + n_feed > n_ctx) moa_throw(MOA_ERR_CACHE_FULL, "%s: SA context would exceed n_ctx %d", who, n_ctx);
    if (n_pending + n_draft > n_draft_max) {
        moa_throw(MOA_ERR_CACHE_FULL, "%s: %d draft rows exceed n_draft_max %d", who, n_pending + n_draft, n_draft_max);
    }
    if (n_draft > 0 && n_ca == 0) moa_throw(MOA_ERR_INVALID_ARGUMENT, "%s: commit at least one verified token first", who);
    if (n_feed + n_draft > n_batch + n_draft_max) moa_throw(MOA_ERR_INVALID_ARGUMENT, "%s: too many rows in one call", who);
    for (int32_t i = 0; i < n_feed; ++i) {
        if (feed[i] < 0 || feed[i] >= hp.n_vocab_target) moa_throw(MOA_ERR_INVALID_ARGUMENT, "%s: feed token %d out of range", who, feed[i]);
    }
    for (int32_t i = 0; i < n_draft; ++i) {
        if (tokens[i] < 0 || tokens[i] >= hp.n_vocab_target) moa_throw(MOA_ERR_INVALID_ARGUMENT, "%s: token %d out of range", who, tokens[i]);
        if (pos[i] < 0) moa_throw(MOA_ERR_INVALID_ARGUMENT, "%s: negative position", who);
        if (parents[i] < -1 || parents[i] >= n_pending + i) {
            moa_throw(MOA_ERR_INVALID_ARGUMENT, "%s: parent %d of row %d must be -1 or an earlier draft row", who, parents[i], i);
        }
    }
}

namespace {

// The SA input and K/V of every row of a call (feed tokens first, then draft rows).
struct sa_graph {
    ggml_tensor * tok = nullptr, * pos = nullptr;  // inputs, I32 [N]
    ggml_tensor * x = nullptr;                     // scaled token embedding [d, N]
    ggml_tensor * a = nullptr;                     // SA-normed x [d, N]
};

// The draft rows' path from SA to logits.
struct draft_graph {
    ggml_tensor * pos = nullptr;     // input, I32 [nd]
    ggml_tensor * mask = nullptr;    // input, SA ancestor mask [n_kv, nd]
    ggml_tensor * mask_t = nullptr;  // input, TLI ancestor mask [n_kv_t, nd] (TLI N > 0 only)
    ggml_tensor * z = nullptr;       // output, CA output [d, nd]
    ggml_tensor * logits = nullptr;  // output [n_vocab, nd]
};

// Embed N rows and write their SA K/V at slots s0..s0+N-1.
sa_graph build_sa_kv(const moa_state & s, const moa_graph & g, ggml_cgraph * gf, int32_t N, int64_t s0) {
    const moa_model & m = s.m;
    const moa_hparams & hp = m.hp;
    ggml_context * ctx = g.ctx;
    sa_graph sg;
    sg.tok = input(ctx, GGML_TYPE_I32, N);
    sg.pos = input(ctx, GGML_TYPE_I32, N);
    sg.x = ggml_get_rows(ctx, m.tok_embd, sg.tok);                             // [d, N]
    if (hp.embd_scale != 1.0f) sg.x = ggml_scale(ctx, sg.x, hp.embd_scale);
    sg.a = moa_build_norm(g, sg.x, m.sa.attn_norm);                            // [d, N]
    ggml_tensor * k = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, m.sa.wk, sg.a), hp.head_dim, hp.sa_n_kv, N);  // [D, h_sa, N]
    k = moa_build_rope(g, k, sg.pos);
    ggml_tensor * v = ggml_mul_mat(ctx, m.sa.wv, sg.a);                        // [D*h_sa, N]
    moa_store_kv(ctx, gf, s.sa_k, s.sa_v, k, v, s0);
    return sg;
}

// Rows n_feed.. of sg are draft rows: SA over the first n_kv slots (masked), CA, then the LM head
// (TLI N > 0: through the target's last N layers first). n_pending rows precede them this cycle.
draft_graph build_draft_rows(const moa_state & s, const moa_graph & g, ggml_cgraph * gf, const sa_graph & sg,
                             int32_t n_feed, int32_t n_draft, int32_t n_pending, int64_t n_kv) {
    const moa_model & m = s.m;
    const moa_hparams & hp = m.hp;
    ggml_context * ctx = g.ctx;
    const int64_t D = hp.head_dim, d = hp.n_embd;
    draft_graph dg;
    dg.pos = input(ctx, GGML_TYPE_I32, n_draft);
    dg.mask = input(ctx, GGML_TYPE_F32, n_kv, n_draft);                                    // [n_kv, n_draft]
    ggml_tensor * xd = ggml_view_2d(ctx, sg.x, d, n_draft, sg.x->nb[1], (size_t) n_feed * sg.x->nb[1]);  // [d, nd]
    ggml_tensor * ad = ggml_view_2d(ctx, sg.a, d, n_draft, sg.a->nb[1], (size_t) n_feed * sg.a->nb[1]);  // [d, nd]
    const float scale = 1.0f / std::sqrt((float) D);
    // SA (ref docs/drafter.md#sa)
    ggml_tensor * q = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, m.sa.wq, ggml_cont(ctx, ad)), D, hp.n_head, n_draft);
    q = ggml_permute(ctx, moa_build_rope(g, q, dg.pos), 0, 2, 1, 3);        // [D, nd, H]
    ggml_tensor * o = moa_build_attn(g, q, moa_view_k(ctx, s.sa_k, n_kv), moa_view_v(ctx, s.sa_v, n_kv, D), dg.mask, scale);  // [H*D, nd]
    ggml_tensor * h = ggml_add(ctx, xd, ggml_mul_mat(ctx, m.sa.wo, o));     // [d, nd]
    h = ggml_add(ctx, h, moa_build_ffn(g, m.sa, moa_build_norm(g, h, m.sa.ffn_norm)));
    // CA (ref docs/drafter.md#ca): query from the SA output at the row's own position; no mask.
    ggml_tensor * c = moa_build_norm(g, h, m.ca.attn_norm);
    ggml_tensor * qc = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, m.ca.wq, c), D, hp.n_head, n_draft);
    qc = ggml_permute(ctx, moa_build_rope(g, qc, dg.pos), 0, 2, 1, 3);      // [D, nd, H]
    ggml_tensor * oc = moa_build_attn(g, qc, moa_view_k(ctx, s.ca_k, s.n_ca), moa_view_v(ctx, s.ca_v, s.n_ca, D), nullptr, scale);
    ggml_tensor * z = ggml_add(ctx, h, ggml_mul_mat(ctx, m.ca.wo, oc));     // [d, nd]
    z = ggml_add(ctx, z, moa_build_ffn(g, m.ca, moa_build_norm(g, z, m.ca.ffn_norm)));
    dg.z = z;
    ggml_set_output(z);
    if (m.tli.empty()) {
        // LM head on the CA output, no final norm at TLI 0 (ref docs/drafter.md#lm-head).
        dg.logits = ggml_mul_mat(ctx, m.output, z);                          // [n_vocab, nd]
    } else {
        // TLI N: z enters the target's residual stream at layer L-N (ref docs/drafter.md#tli).
        const int64_t n_kv_t = (int64_t) s.n_ca + n_pending + n_draft;    // TLI keys: verified + draft rows
        dg.mask_t = input(ctx, GGML_TYPE_F32, n_kv_t, n_draft);              // [n_kv_t, nd]
        ggml_tensor * hcur = z;
        for (size_t i = 0; i < m.tli.size(); ++i) {
            hcur = moa_build_tli_layer(g, gf, m.tli[i], hcur, dg.pos, s.tli_k[i], s.tli_v[i],
                                       (int64_t) s.n_ca + n_pending, n_kv_t, dg.mask_t);
        }
        dg.logits = ggml_mul_mat(ctx, m.output, moa_build_norm_eps(g, hcur, m.output_norm, hp.t_rms_eps));
    }
    ggml_set_output(dg.logits);
    ggml_build_forward_expand(gf, dg.logits);
    return dg;
}

// Mask [n_draft][n_keys]: row i (draft row j = n_pending + i) sees the first n_prefix keys, its
// ancestors and itself, whose keys follow the prefix in draft-row order. par: every row's parent.
std::vector<float> ancestor_mask(int64_t n_keys, int64_t n_prefix, int32_t n_pending, int32_t n_draft,
                                 const std::vector<int32_t> & par) {
    std::vector<float> mk((size_t) n_keys * n_draft, -INFINITY);
    for (int32_t i = 0; i < n_draft; ++i) {
        float * row = mk.data() + (size_t) i * n_keys;
        std::fill(row, row + n_prefix, 0.0f);
        for (int32_t j = n_pending + i; j >= 0; j = par[j]) row[n_prefix + j] = 0.0f;
    }
    return mk;
}

}  // namespace

// ref: docs/drafter.md#sa, #ca, #lm-head; docs/drafter.md#tree (tree levels as one call with an ancestor mask).
// One graph for the call's feed tokens and draft rows: their SA K/V are computed together.
void moa_state::run(int32_t n_feed, const moa_token * feed, int32_t n_draft, const moa_token * tokens,
                    const moa_pos * pos, const int32_t * parents, float * logits, float * hidden) {
    const int32_t n_pending = (int32_t) draft_parent.size();
    const int32_t N = n_feed + n_draft;
    const int32_t n_ctx_rows = n_sa + n_feed;           // context slots after this call's feed
    const int64_t s0 = n_sa + n_pending;                 // first slot written by this call
    const int64_t n_kv = s0 + N;

    graph_ctx gc(graph_mem);
    moa_graph g{gc.ctx, m.hp};
    const sa_graph sg = build_sa_kv(*this, g, gc.gf, N, s0);
    draft_graph dg;
    if (n_draft > 0) dg = build_draft_rows(*this, g, gc.gf, sg, n_feed, n_draft, n_pending, n_kv);

    alloc(sched, gc.gf);
    std::vector<int32_t> tk(N), ps(N);
    for (int32_t i = 0; i < n_feed; ++i) { tk[i] = feed[i]; ps[i] = n_sa + i; }
    for (int32_t i = 0; i < n_draft; ++i) { tk[n_feed + i] = tokens[i]; ps[n_feed + i] = pos[i]; }
    ggml_backend_tensor_set(sg.tok, tk.data(), 0, ggml_nbytes(sg.tok));
    ggml_backend_tensor_set(sg.pos, ps.data(), 0, ggml_nbytes(sg.pos));
    if (n_draft > 0) {
        ggml_backend_tensor_set(dg.pos, pos, 0, ggml_nbytes(dg.pos));
        std::vector<int32_t> par(draft_parent);
        par.insert(par.end(), parents, parents + n_draft);
        const std::vector<float> mk = ancestor_mask(n_kv, n_ctx_rows, n_pending, n_draft, par);
        ggml_backend_tensor_set(dg.mask, mk.data(), 0, ggml_nbytes(dg.mask));
        if (dg.mask_t) {
            const std::vector<float> mt = ancestor_mask(dg.mask_t->ne[0], n_ca, n_pending, n_draft, par);
            ggml_backend_tensor_set(dg.mask_t, mt.data(), 0, ggml_nbytes(dg.mask_t));
        }
    }
    compute(sched, gc.gf);
    if (n_draft > 0) ggml_backend_tensor_get(dg.logits, logits, 0, ggml_nbytes(dg.logits));
    if (n_draft > 0 && hidden) ggml_backend_tensor_get(dg.z, hidden, 0, ggml_nbytes(dg.z));
    n_sa += n_feed;
    draft_parent.insert(draft_parent.end(), parents, parents + n_draft);
}

void moa_state::rollback(moa_pos pos) {
    if (pos < 0) moa_throw(MOA_ERR_INVALID_ARGUMENT, "rollback: negative position");
    n_ca = std::min(n_ca, (int32_t) pos);
    n_sa = std::min(n_sa, (int32_t) pos);
    draft_parent.clear();
}
