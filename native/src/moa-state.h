// moa_state: one sequence's drafter caches and the commit / draft / rollback state machine.
#pragma once

#include "moa-model.h"

#include <vector>

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

    ggml_backend_sched_t sched = nullptr;
    std::vector<uint8_t> graph_mem;

    moa_state(const moa_model & model, const moa_state_params & p);
    ~moa_state();

    void commit(const float * lsa_in, int32_t n_tokens, moa_pos pos0, float * lsa_out, float * lsa_mean, float * ekv);
    void draft(int32_t n_feed, const moa_token * feed, int32_t n_draft, const moa_token * tokens, const moa_pos * pos,
               const int32_t * parents, float * logits, float * hidden);
    void rollback(moa_pos pos);
    void clear_drafts() { draft_parent.clear(); }
};
