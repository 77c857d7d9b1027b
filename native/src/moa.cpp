// extern "C" shims: guard, validate arguments, forward. No logic lives here.
#include "moa-impl.h"
#include "moa-gguf-names.h"
#include "moa-model.h"
#include "moa-state.h"
#include "moa-target-arch.h"

#include <algorithm>
#include <cstring>

#define MOA_CHECK_ARG(cond, msg) \
    do { if (!(cond)) moa_throw(MOA_ERR_INVALID_ARGUMENT, "%s", msg); } while (0)

extern "C" {

int32_t moa_device_count(void) { return (int32_t) ggml_backend_dev_count(); }

const char * moa_device_name(int32_t i) {
    if (i < 0 || (size_t) i >= ggml_backend_dev_count()) return "";
    return ggml_backend_dev_name(ggml_backend_dev_get(i));
}

const char * moa_device_backend(int32_t i) {
    if (i < 0 || (size_t) i >= ggml_backend_dev_count()) return "";
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(ggml_backend_dev_get(i));
    return reg ? ggml_backend_reg_name(reg) : "";
}

int32_t moa_device_is_local_gpu(int32_t i) {
    if (i < 0 || (size_t) i >= ggml_backend_dev_count()) return 0;
    return is_local_gpu(ggml_backend_dev_get(i)) ? 1 : 0;
}

int32_t moa_gguf_n_tensors(void) { return (int32_t) moa_gguf_names::required_tensors().size(); }

const char * moa_gguf_tensor_name(int32_t i) {
    static const std::vector<std::string> names = moa_gguf_names::required_tensors();
    if (i < 0 || (size_t) i >= names.size()) return "";
    return names[i].c_str();
}

int32_t moa_target_arch_count(void) { return (int32_t) moa_target_arch::all().size(); }

const char * moa_target_arch_name(int32_t i) {
    if (i < 0 || i >= moa_target_arch_count()) return "";
    return moa_target_arch::all()[i].name;
}

int32_t moa_target_arch_flags(int32_t i) {
    if (i < 0 || i >= moa_target_arch_count()) return -1;
    const moa_target_arch::target_arch & a = moa_target_arch::all()[i];
    return (a.qk_permuted ? MOA_TARGET_ARCH_QK_PERMUTED : 0) |
           (a.scale == moa_target_arch::embd_scale::sqrt_n_embd ? MOA_TARGET_ARCH_EMBD_SCALE_SQRT : 0) |
           (a.tli ? MOA_TARGET_ARCH_TLI : 0) | (a.capture ? MOA_TARGET_ARCH_CAPTURE : 0);
}

void moa_model_params_init(struct moa_model_params * p) {
    if (!p) return;
    p->device = "auto";
    p->n_threads = 0;
    p->tli = -1;
    p->use_mmap = true;
}

moa_model * moa_model_load(const char * drafter_path, const char * target_path, const struct moa_model_params * params) {
    return moa_guard_ptr<moa_model>([&] {
        moa_model_params p;
        moa_model_params_init(&p);
        if (params) p = *params;
        return moa_model_load_impl(drafter_path, target_path, p);
    });
}

void moa_model_free(moa_model * model) { delete model; }

int32_t moa_model_n_vocab(const moa_model * m) { return m ? m->hp.n_vocab : 0; }
int32_t moa_model_n_target_vocab(const moa_model * m) { return m ? m->hp.n_vocab_target : 0; }
int32_t moa_model_n_embd(const moa_model * m) { return m ? m->hp.n_embd : 0; }
int32_t moa_model_n_target_layers(const moa_model * m) { return m ? m->hp.n_target_layers : 0; }
int32_t moa_model_lsa_width(const moa_model * m) { return m ? m->hp.lsa_width : 0; }
int32_t moa_model_tli(const moa_model * m) { return m ? m->hp.tli : 0; }
int32_t moa_model_ca_kv_heads(const moa_model * m) { return m ? m->hp.ca_n_kv : 0; }
int32_t moa_model_head_dim(const moa_model * m) { return m ? m->hp.head_dim : 0; }
int32_t moa_model_role(const moa_model * m) { return m ? m->hp.role : MOA_ROLE_FULL; }
const char * moa_model_device(const moa_model * m) { return m ? m->device_name.c_str() : ""; }

int32_t moa_model_acceptance(const moa_model * m, float * out, int32_t n_max) {
    return moa_guard_status([&] {
        MOA_CHECK_ARG(m && (out || n_max == 0) && n_max >= 0, "moa_model_acceptance: NULL or negative argument");
        const int32_t n = (int32_t) std::min<size_t>(m->acceptance.size(), (size_t) n_max);
        if (n) std::memcpy(out, m->acceptance.data(), n * sizeof(float));
        return (int32_t) m->acceptance.size();
    });
}

int32_t moa_model_get_d2t(const moa_model * m, int32_t * out) {
    return moa_guard_status([&] {
        MOA_CHECK_ARG(m && out, "moa_model_get_d2t: NULL argument");
        if (m->d2t.empty()) moa_throw(MOA_ERR_INVALID_ARGUMENT, "this drafter has no reduced vocabulary");
        std::memcpy(out, m->d2t.data(), m->d2t.size() * sizeof(int32_t));
        return (int32_t) MOA_OK;
    });
}

void moa_state_params_init(struct moa_state_params * p) {
    if (!p) return;
    p->n_ctx = 4096;
    p->n_draft_max = 128;
    p->n_batch = 512;
}

moa_state * moa_state_init(const moa_model * model, const struct moa_state_params * params) {
    return moa_guard_ptr<moa_state>([&] {
        MOA_CHECK_ARG(model, "moa_state_init: model is NULL");
        moa_state_params p;
        moa_state_params_init(&p);
        if (params) p = *params;
        return new moa_state(*model, p);
    });
}

void moa_state_free(moa_state * state) { delete state; }

int32_t moa_state_commit(moa_state * s, const float * lsa_in, int32_t n_tokens, moa_pos pos0, float * lsa_out,
                         float * lsa_mean, float * ekv) {
    return moa_guard_status([&] {
        MOA_CHECK_ARG(s, "moa_state_commit: state is NULL");
        s->commit(lsa_in, n_tokens, pos0, lsa_out, lsa_mean, ekv);
        return (int32_t) MOA_OK;
    });
}

int32_t moa_state_compute_ca(moa_state * s, const float * lsa_in, int32_t n_tokens, moa_pos pos0, float * k_out,
                             float * v_out) {
    return moa_guard_status([&] {
        MOA_CHECK_ARG(s, "moa_state_compute_ca: state is NULL");
        s->compute_ca(lsa_in, n_tokens, pos0, k_out, v_out);
        return (int32_t) MOA_OK;
    });
}

int32_t moa_state_append_ca(moa_state * s, const float * k, const float * v, int32_t n_tokens, moa_pos pos0) {
    return moa_guard_status([&] {
        MOA_CHECK_ARG(s, "moa_state_append_ca: state is NULL");
        s->append_ca(k, v, n_tokens, pos0);
        return (int32_t) MOA_OK;
    });
}

int32_t moa_state_feed(moa_state * s, int32_t n_feed, const moa_token * feed_tokens) {
    return moa_guard_status([&] {
        MOA_CHECK_ARG(s, "moa_state_feed: state is NULL");
        MOA_CHECK_ARG(n_feed >= 0, "moa_state_feed: n_feed must be >= 0");
        s->feed(n_feed, feed_tokens);
        return (int32_t) MOA_OK;
    });
}

int32_t moa_state_draft_rows(moa_state * s, int32_t n_draft, const moa_token * tokens, const moa_pos * pos,
                             const int32_t * parents, float * logits, float * hidden) {
    return moa_guard_status([&] {
        MOA_CHECK_ARG(s, "moa_state_draft_rows: state is NULL");
        MOA_CHECK_ARG(n_draft >= 0, "moa_state_draft_rows: n_draft must be >= 0");
        s->draft_rows(n_draft, tokens, pos, parents, logits, hidden);
        return (int32_t) MOA_OK;
    });
}

int32_t moa_state_draft(moa_state * s, int32_t n_feed, const moa_token * feed_tokens, int32_t n_draft,
                        const moa_token * tokens, const moa_pos * pos, const int32_t * parents, float * logits,
                        float * hidden) {
    return moa_guard_status([&] {
        MOA_CHECK_ARG(s, "moa_state_draft: state is NULL");
        s->draft(n_feed, feed_tokens, n_draft, tokens, pos, parents, logits, hidden);
        return (int32_t) MOA_OK;
    });
}

int32_t moa_state_clear_drafts(moa_state * s) {
    return moa_guard_status([&] {
        MOA_CHECK_ARG(s, "moa_state_clear_drafts: state is NULL");
        s->clear_drafts();
        return (int32_t) MOA_OK;
    });
}

int32_t moa_state_rollback(moa_state * s, moa_pos pos) {
    return moa_guard_status([&] {
        MOA_CHECK_ARG(s, "moa_state_rollback: state is NULL");
        s->rollback(pos);
        return (int32_t) MOA_OK;
    });
}

int32_t moa_state_n_ca(const moa_state * s) { return s ? s->n_ca : 0; }
int32_t moa_state_n_sa(const moa_state * s) { return s ? s->n_sa : 0; }
int32_t moa_state_n_drafts(const moa_state * s) { return s ? (int32_t) s->draft_parent.size() : 0; }

int32_t moa_state_get_ca_cache(const moa_state * s, float * k, float * v, int32_t * n_heads, int32_t * head_dim) {
    return moa_guard_status([&] {
        MOA_CHECK_ARG(s, "moa_state_get_ca_cache: state is NULL");
        const int64_t D = s->m.hp.head_dim, H = s->m.hp.ca_n_kv, n = s->n_ca;
        if (n_heads) *n_heads = (int32_t) H;
        if (head_dim) *head_dim = (int32_t) D;
        if (k) {
            // cache [D, H, n_ctx] (position-major) -> [H][n][D]
            std::vector<float> buf((size_t) D * H * n);
            if (n) ggml_backend_tensor_get(s->ca_k, buf.data(), 0, buf.size() * sizeof(float));
            for (int64_t p = 0; p < n; ++p)
                for (int64_t h = 0; h < H; ++h)
                    std::memcpy(k + (h * n + p) * D, buf.data() + (p * H + h) * D, D * sizeof(float));
        }
        if (v) {
            // cache [n_ctx, D*H] transposed -> [H][n][D]
            const int64_t nc = s->ca_v->ne[0];
            std::vector<float> buf((size_t) nc * D * H);
            ggml_backend_tensor_get(s->ca_v, buf.data(), 0, buf.size() * sizeof(float));
            for (int64_t h = 0; h < H; ++h)
                for (int64_t p = 0; p < n; ++p)
                    for (int64_t i = 0; i < D; ++i) v[(h * n + p) * D + i] = buf[(h * D + i) * nc + p];
        }
        return (int32_t) MOA_OK;
    });
}

}  // extern "C"
