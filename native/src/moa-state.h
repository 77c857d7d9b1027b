// moa_state: one sequence's drafter caches and the commit / feed / draft / rollback state machine.
#pragma once

#include "moa-model.h"

#include <functional>
#include <vector>

// Thread safety: a state is used by one thread at a time; different states (of one model or
// not) may run concurrently. Everything a computation writes belongs to the state: caches,
// graph memory, scheduler and its compute buffers, and the backend instances themselves
// (a ggml CPU backend reuses one work buffer for every graph it computes).
struct moa_state {
    const moa_model & m;
    int32_t n_ctx = 0, n_draft_max = 0, n_batch = 0;

    ggml_context * ctx_cache = nullptr;
    ggml_backend_buffer_t buf_cache = nullptr;
    // CA cache: K [D, h_ca, n_ctx] (one entry per verified position), V transposed [n_ctx, D*h_ca]
    // so that attention can read it with keys along ne0 without a copy.
    ggml_tensor * ca_k = nullptr, * ca_v = nullptr;
    // SA cache: the context slots 0..n_sa-1 (slot == position), then this cycle's draft rows.
    ggml_tensor * sa_k = nullptr, * sa_v = nullptr;
    // TLI N > 0: per reused target layer, K [D_t, H_kv, n_ctx + n_draft_max] and transposed V:
    // verified positions at slot == position (from commit), this cycle's draft rows at
    // slots n_ca + row.
    std::vector<ggml_tensor *> tli_k, tli_v;

    int32_t n_ca = 0;
    int32_t n_sa = 0;
    std::vector<int32_t> draft_parent;  // per pending draft row: parent draft row or -1

    ggml_backend_t backend = nullptr;      // on m.dev, owned by this state
    ggml_backend_t backend_cpu = nullptr;  // CPU fallback for the scheduler (== backend on CPU)
    ggml_backend_sched_t sched = nullptr;
    std::vector<uint8_t> graph_mem;

    moa_state(const moa_model & model, const moa_state_params & p);
    ~moa_state();
    moa_state(const moa_state &) = delete;
    moa_state & operator=(const moa_state &) = delete;

    void commit(const float * lsa_in, int32_t n_tokens, moa_pos pos0, float * lsa_out, float * lsa_mean, float * ekv);
    // Split commit: the CA K/V of verified tokens out (caches untouched) / in (appended).
    void compute_ca(const float * lsa_in, int32_t n_tokens, moa_pos pos0, float * k_out, float * v_out);
    void append_ca(const float * k, const float * v, int32_t n_tokens, moa_pos pos0);
    // Context tokens only (SA K/V at positions n_sa..); n_feed == 0 is a no-op.
    void feed(int32_t n_feed, const moa_token * tokens);
    // Draft rows only (n_draft > 0).
    void draft_rows(int32_t n_draft, const moa_token * tokens, const moa_pos * pos, const int32_t * parents,
                    float * logits, float * hidden);
    // feed then draft_rows as one graph, validated as a whole before anything changes.
    void draft(int32_t n_feed, const moa_token * feed, int32_t n_draft, const moa_token * tokens, const moa_pos * pos,
               const int32_t * parents, float * logits, float * hidden);
    void rollback(moa_pos pos);
    void clear_drafts() { draft_parent.clear(); }

private:
    void release();
    void check_commit_range(const char * who, int32_t n_tokens, moa_pos pos0) const;
    void check_full_role(const char * who) const;
    // LSA -> mean -> Ekv2E -> CA norm -> CA K (RoPE at pos) / V of one chunk [W, L, T].
    void build_ca_kv(const struct moa_graph & g, ggml_tensor * x, ggml_tensor * lpos, ggml_tensor * pos,
                     ggml_tensor ** k, ggml_tensor ** v, ggml_tensor ** y, ggml_tensor ** mean, ggml_tensor ** e) const;
    // The chunk loop of commit and compute_ca around build_ca_kv (see moa-state.cpp).
    struct ca_chunk;
    void run_ca_chunks(const float * lsa_in, int32_t n_tokens, moa_pos pos0,
                       const std::function<void(const ca_chunk &)> & add_outputs,
                       const std::function<void(const ca_chunk &)> & read_outputs);
    void validate(const char * who, int32_t n_feed, const moa_token * feed, int32_t n_draft, const moa_token * tokens,
                  const moa_pos * pos, const int32_t * parents, const float * logits) const;
    void run(int32_t n_feed, const moa_token * feed, int32_t n_draft, const moa_token * tokens, const moa_pos * pos,
             const int32_t * parents, float * logits, float * hidden);
};
