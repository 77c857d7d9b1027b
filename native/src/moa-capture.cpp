// Target K/V capture: an eval callback (cb_eval) that copies the target's post-RoPE K and its
// V of every layer out of the llama.cpp graph while llama_decode runs.
//
// ref: docs/llama-cpp.md#capture (node names, scheduler protocol, why the eval callback);
//      docs/drafter.md#target-kv (LSA row layout), docs/drafter.md#k-permutation (K permutation).
//
// Protocol of ggml_backend_sched (ggml-backend.cpp, sched compute loop): for each split, every
// node is first offered with ask = true; on true, the graph is computed up to that node, the
// backend synchronised, and the node handed back with ask = false. Returning false on ask =
// false aborts the rest of the graph, so this callback never does that.
//
// What is taken, per layer il (names are "<name>-<il>", llama-context.cpp graph_get_cb; the
// names come from the target-architecture table, moa-target-arch.h: "Kcur" / "Vcur" for every
// architecture it knows; the capture takes a node of any row's names):
//   K: the node "Kcur-<il>" whose op is GGML_OP_ROPE (the MUL_MAT and RESHAPE share the name).
//      F32 [head_dim, n_head_kv, n_tokens], not rounded to the cache type.
//   V: every "Vcur-<il>" node (MUL_MAT, optional bias ADD, RESHAPE or a VIEW of a fused QKV);
//      the last one of the layer wins, since it is the one that feeds the cache.
//
// Ubatches: llama_decode may split a batch into ubatches, one graph each; rows are appended in
// ubatch order, which is batch order when the KV cache is unified (split_simple). One graph's
// captures are buffered as "pending" and committed when the graph ends, i.e. at the first of:
//   - the ask for "result_output" (the logits node, after every layer),
//   - a K/V node of a lower layer than the last one seen, or a second K of one layer (a new
//     graph began without a result_output node),
//   - a read (moa_capture_n_rows / moa_capture_get).
// At commit every layer must have K and V with the same token count and the same shape as the
// others, else the capture is marked inconsistent (first reason kept) until the next reset.
#include "moa-impl.h"
#include "moa-target-arch.h"

#include "ggml-backend.h"
#include "ggml.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

enum class kv_kind { none, k, v };

// One layer's K or V of the current graph, gathered contiguous: [n_tokens][n_head][head_dim].
struct pending_tensor {
    bool               set = false;
    int64_t            head_dim = 0;
    int64_t            n_head   = 0;
    int64_t            n_tokens = 0;
    std::vector<float> data;
};

// "Kcur-12" -> 12 when node is "Kcur"; -1 otherwise.
int32_t parse_layer(const char * name, const std::string & node) {
    if (strncmp(name, node.c_str(), node.size()) != 0 || name[node.size()] != '-') {
        return -1;
    }
    const char * digits = name + node.size() + 1;
    if (*digits < '0' || *digits > '9') {
        return -1;
    }
    char * end = nullptr;
    const long il = strtol(digits, &end, 10);
    if (*end != '\0' || il < 0 || il > INT32_MAX) {
        return -1;
    }
    return (int32_t) il;
}

}  // namespace

struct moa_capture {
    int32_t n_layer;
    bool    unpermute_k;
    bool    enabled = true;

    // Shapes seen (0 before the first committed graph); kept across resets.
    int32_t n_head_kv = 0;
    int32_t head_dim  = 0;

    // Committed rows since the last reset: per layer [n_rows][n_head_kv * head_dim].
    std::vector<std::vector<float>> k, v;
    int64_t n_rows = 0;

    // Current graph (ubatch).
    std::vector<pending_tensor> k_pend, v_pend;
    int32_t last_layer = -1;  // layer of the last K/V node seen in this graph
    bool    any_pending = false;

    // First inconsistency since the last reset ("" = none).
    int32_t     err_code = MOA_OK;
    std::string err_msg;

    std::vector<uint8_t> scratch;  // raw bytes of a non-contiguous or F16 tensor

    moa_capture(int32_t n_layer_, bool unpermute_k_)
        : n_layer(n_layer_), unpermute_k(unpermute_k_),
          k(n_layer_), v(n_layer_), k_pend(n_layer_), v_pend(n_layer_) {}

    void fail(int32_t code, const std::string & msg) {
        if (err_code == MOA_OK) {
            err_code = code;
            err_msg  = msg;
        }
    }

    void clear_pending() {
        for (int32_t il = 0; il < n_layer; ++il) {
            k_pend[il].set = false;
            v_pend[il].set = false;
        }
        last_layer  = -1;
        any_pending = false;
    }

    void reset() {
        for (int32_t il = 0; il < n_layer; ++il) {
            k[il].clear();  // keeps capacity: no reallocation in steady state
            v[il].clear();
        }
        n_rows   = 0;
        err_code = MOA_OK;
        err_msg.clear();
        clear_pending();
    }

    kv_kind classify(const ggml_tensor * t, int32_t * il) const {
        for (const std::string & node : moa_target_arch::k_nodes()) {
            const int32_t l = parse_layer(t->name, node);
            if (l >= 0) {
                *il = l;
                return t->op == GGML_OP_ROPE && l < n_layer ? kv_kind::k : kv_kind::none;
            }
        }
        for (const std::string & node : moa_target_arch::v_nodes()) {
            const int32_t l = parse_layer(t->name, node);
            if (l >= 0 && l < n_layer) {
                *il = l;
                return kv_kind::v;
            }
        }
        return kv_kind::none;
    }

    // Does a K/V node of layer il (kind) start a new graph while one is pending?
    bool starts_new_graph(kv_kind kind, int32_t il) const {
        if (!any_pending) {
            return false;
        }
        return il < last_layer || (kind == kv_kind::k && k_pend[il].set);
    }

    // Copy t (F32 or F16, [head_dim, n_head, n_tokens], any strides, any backend) into p.
    void read_tensor(const ggml_tensor * t, pending_tensor & p) {
        if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16) {
            fail(MOA_ERR_MISMATCH, std::string(t->name) + ": unsupported type " + ggml_type_name(t->type) +
                                       " (expected F32 or F16)");
            return;
        }
        if (t->ne[3] != 1) {
            fail(MOA_ERR_MISMATCH, std::string(t->name) + ": expected a 3-D [head_dim, n_head, n_tokens] tensor");
            return;
        }
        const ggml_backend_buffer * buf = t->view_src ? t->view_src->buffer : t->buffer;
        if (buf == nullptr || t->data == nullptr) {
            fail(MOA_ERR_BACKEND, std::string(t->name) + ": tensor has no data");
            return;
        }
        const int64_t D = t->ne[0], H = t->ne[1], T = t->ne[2];
        p.head_dim = D;
        p.n_head   = H;
        p.n_tokens = T;
        p.data.resize((size_t) (D * H * T));

        if (t->type == GGML_TYPE_F32 && ggml_is_contiguous(t)) {
            ggml_backend_tensor_get(t, p.data.data(), 0, ggml_nbytes(t));
        } else {
            // One read of the tensor's whole byte extent, then a strided gather on the host:
            // covers views into a fused QKV, permuted views and F16, on CPU or GPU buffers.
            const size_t nbytes = ggml_nbytes(t);
            scratch.resize(nbytes);
            ggml_backend_tensor_get(t, scratch.data(), 0, nbytes);
            float * dst = p.data.data();
            for (int64_t i2 = 0; i2 < T; ++i2) {
                for (int64_t i1 = 0; i1 < H; ++i1) {
                    const uint8_t * row = scratch.data() + i2 * t->nb[2] + i1 * t->nb[1];
                    for (int64_t i0 = 0; i0 < D; ++i0) {
                        const uint8_t * src = row + i0 * t->nb[0];
                        float x;
                        if (t->type == GGML_TYPE_F32) {
                            memcpy(&x, src, sizeof(float));
                        } else {
                            ggml_fp16_t h;
                            memcpy(&h, src, sizeof(h));
                            x = ggml_fp16_to_fp32(h);
                        }
                        *dst++ = x;
                    }
                }
            }
        }
        p.set = true;
    }

    // Append the pending graph's rows to the committed rows (or record why it cannot).
    void commit_pending() {
        if (!any_pending) {
            return;
        }
        const bool ok = err_code == MOA_OK && check_pending();
        if (ok) {
            const pending_tensor & k0 = k_pend[0];
            n_head_kv = (int32_t) k0.n_head;
            head_dim  = (int32_t) k0.head_dim;
            for (int32_t il = 0; il < n_layer; ++il) {
                k[il].insert(k[il].end(), k_pend[il].data.begin(), k_pend[il].data.end());
                v[il].insert(v[il].end(), v_pend[il].data.begin(), v_pend[il].data.end());
            }
            n_rows += k0.n_tokens;
        }
        clear_pending();
    }

    bool check_pending() {
        for (int32_t il = 0; il < n_layer; ++il) {
            const char * missing = !k_pend[il].set ? "K (Kcur-<il>, op ROPE)" : !v_pend[il].set ? "V (Vcur-<il>)" : nullptr;
            if (missing) {
                fail(MOA_ERR_MISMATCH, "capture: layer " + std::to_string(il) + " of " + std::to_string(n_layer) +
                                           ": no " + missing + " node seen in this graph; the target architecture "
                                           "does not name its K/V as llama.cpp's " + moa_target_arch::capture_names() +
                                           " graphs do, or n_layer is wrong");
                return false;
            }
        }
        const pending_tensor & k0 = k_pend[0];
        if (n_rows > 0 && (k0.n_head != n_head_kv || k0.head_dim != head_dim)) {
            fail(MOA_ERR_MISMATCH, "capture: K shape changed between ubatches");
            return false;
        }
        if (k0.head_dim % 2 != 0 && unpermute_k) {
            fail(MOA_ERR_MISMATCH, "capture: odd head_dim " + std::to_string(k0.head_dim) + " cannot be un-permuted");
            return false;
        }
        for (int32_t il = 0; il < n_layer; ++il) {
            for (const pending_tensor * p : { &k_pend[il], &v_pend[il] }) {
                if (p->n_head != k0.n_head || p->head_dim != k0.head_dim || p->n_tokens != k0.n_tokens) {
                    fail(MOA_ERR_MISMATCH,
                         "capture: layer " + std::to_string(il) + " " + (p == &k_pend[il] ? "K" : "V") + " has shape [" +
                             std::to_string(p->head_dim) + ", " + std::to_string(p->n_head) + ", " +
                             std::to_string(p->n_tokens) + "], layer 0 K has [" + std::to_string(k0.head_dim) + ", " +
                             std::to_string(k0.n_head) + ", " + std::to_string(k0.n_tokens) +
                             "] (per-layer KV widths are not supported)");
                    return false;
                }
            }
        }
        return true;
    }

    bool eval(ggml_tensor * t, bool ask) {
        if (ask) {
            if (any_pending && strcmp(t->name, "result_output") == 0) {
                commit_pending();
                return false;
            }
            int32_t il = -1;
            return classify(t, &il) != kv_kind::none;
        }
        int32_t       il   = -1;
        const kv_kind kind = classify(t, &il);
        if (kind == kv_kind::none) {
            return true;
        }
        if (starts_new_graph(kind, il)) {
            commit_pending();
        }
        if (err_code == MOA_OK) {
            read_tensor(t, kind == kv_kind::k ? k_pend[il] : v_pend[il]);
        }
        last_layer  = il;
        any_pending = true;
        return true;
    }
};

extern "C" {

moa_capture * moa_capture_init(int32_t n_layer, bool unpermute_k) {
    return moa_guard_ptr<moa_capture>([&]() {
        if (n_layer <= 0) {
            moa_throw(MOA_ERR_INVALID_ARGUMENT, "moa_capture_init: n_layer must be > 0, got %d", n_layer);
        }
        return new moa_capture(n_layer, unpermute_k);
    });
}

void moa_capture_free(moa_capture * cap) { delete cap; }

bool moa_capture_eval_cb(void * t, bool ask, void * user_data) {
    auto * cap = static_cast<moa_capture *>(user_data);
    if (cap == nullptr || t == nullptr || !cap->enabled) {
        // ask: want nothing. !ask (never expected here): true, since false aborts the graph.
        return !ask;
    }
    try {
        return cap->eval(static_cast<ggml_tensor *>(t), ask);
    } catch (const std::bad_alloc &) {
        cap->fail(MOA_ERR_OUT_OF_MEMORY, "capture: out of memory");
    } catch (const std::exception & e) {
        cap->fail(MOA_ERR_INTERNAL, std::string("capture: ") + e.what());
    }
    return !ask;  // no exception may cross into ggml; keep the graph running
}

void moa_capture_reset(moa_capture * cap) {
    if (cap) {
        cap->reset();
    }
}

void moa_capture_set_enabled(moa_capture * cap, bool enabled) {
    if (cap) {
        cap->enabled = enabled;
    }
}

int32_t moa_capture_n_rows(const moa_capture * cap) {
    return moa_guard_status([&]() -> int32_t {
        if (cap == nullptr) {
            moa_throw(MOA_ERR_INVALID_ARGUMENT, "moa_capture_n_rows: cap is NULL");
        }
        // The last graph of a decode is complete once llama_decode has returned: commit it.
        auto * c = const_cast<moa_capture *>(cap);
        c->commit_pending();
        if (c->err_code != MOA_OK) {
            moa_throw(c->err_code, "%s", c->err_msg.c_str());
        }
        if (c->n_rows > INT32_MAX) {
            moa_throw(MOA_ERR_INTERNAL, "moa_capture_n_rows: too many rows");
        }
        return (int32_t) c->n_rows;
    });
}

int32_t moa_capture_n_head_kv(const moa_capture * cap) { return cap ? cap->n_head_kv : 0; }

int32_t moa_capture_head_dim(const moa_capture * cap) { return cap ? cap->head_dim : 0; }

int32_t moa_capture_get(const moa_capture * cap, const int32_t * rows, int32_t n_rows, float * lsa_in) {
    return moa_guard_status([&]() -> int32_t {
        const int32_t n_avail = moa_capture_n_rows(cap);
        if (n_avail < 0) {
            moa_throw(n_avail, "%s", moa_last_error());
        }
        if (n_rows < 0 || (n_rows > 0 && (rows == nullptr || lsa_in == nullptr))) {
            moa_throw(MOA_ERR_INVALID_ARGUMENT, "moa_capture_get: bad arguments (n_rows %d, rows %p, lsa_in %p)", n_rows,
                      (const void *) rows, (void *) lsa_in);
        }
        for (int32_t i = 0; i < n_rows; ++i) {
            if (rows[i] < 0 || rows[i] >= n_avail) {
                moa_throw(MOA_ERR_INVALID_ARGUMENT, "moa_capture_get: rows[%d] = %d out of range [0, %d)", i, rows[i],
                          n_avail);
            }
        }
        const int64_t H = cap->n_head_kv, D = cap->head_dim, HD = H * D, W = 2 * HD;
        const int64_t half = D / 2;
        // lsa_in [n_rows][n_layer][W]; per KV head h: [K_h (D) | V_h (D)] (docs/drafter.md#target-kv).
        for (int32_t i = 0; i < n_rows; ++i) {
            for (int32_t il = 0; il < cap->n_layer; ++il) {
                const float * k   = cap->k[il].data() + (int64_t) rows[i] * HD;
                const float * v   = cap->v[il].data() + (int64_t) rows[i] * HD;
                float *       out = lsa_in + ((int64_t) i * cap->n_layer + il) * W;
                for (int64_t h = 0; h < H; ++h) {
                    const float * kh = k + h * D;
                    float *       ok = out + h * 2 * D;
                    if (cap->unpermute_k) {
                        // llama.cpp index 2i+j holds HF dim j*D/2+i (docs/drafter.md#k-permutation).
                        for (int64_t ii = 0; ii < half; ++ii) {
                            ok[ii]        = kh[2 * ii];
                            ok[half + ii] = kh[2 * ii + 1];
                        }
                    } else {
                        memcpy(ok, kh, (size_t) D * sizeof(float));
                    }
                    memcpy(ok + D, v + h * D, (size_t) D * sizeof(float));
                }
            }
        }
        return MOA_OK;
    });
}

}  // extern "C"
