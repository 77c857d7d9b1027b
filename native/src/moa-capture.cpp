// Target K/V capture: an eval callback (cb_eval) that copies, while llama_decode runs, the K and
// V rows each attention layer writes into llama.cpp's KV cache: exactly what that layer's
// attention reads back (post-RoPE K, after any norm a graph applies), whatever the architecture.
//
// ref: docs/llama-cpp.md#capture (scheduler protocol, why the cache writes),
//      docs/drafter.md#target-kv (LSA row layout), docs/drafter.md#k-permutation (K permutation).
//
// Protocol of ggml_backend_sched (ggml-backend.cpp, sched compute loop): for each split, every
// node is first offered with ask = true; on true, the graph is computed up to that node, the
// backend synchronised, and the node handed back with ask = false. Returning false on ask =
// false aborts the rest of the graph, so this callback never does that.
//
// What is taken: llama_kv_cache::cpy_k / cpy_v (src/llama-kv-cache.cpp) store each layer's rows
// with a GGML_OP_SET_ROWS node (ggml_set_rows: src[0] the rows, src[1] their cache indices,
// src[2] the destination) that is a view of the layer's cache tensor, named "cache_k_l<il>" /
// "cache_v_l<il>" by the cache's constructor. The rows (src[0]):
//   K: a 2-D view [n_head_kv * head_dim, n_tokens] of k_cur ([head_dim, n_head_kv, n_tokens],
//      the view's src[0], which gives the head split);
//   V: the same view of v_cur, or (V cache transposed, flash attention off) v_cur reshaped to
//      [1, n_tokens * n_head_kv * head_dim] -- the same token-major values.
// At ask = false for that node src[0] is still intact (the set_rows reads it), in F32 before any
// rounding to the cache type. A quantized cache's rows were rotated first (llama.cpp's Hadamard
// rotation, Q alike): the capture undoes it (unrotate), so the drafter reads the same K/V
// whatever the cache type, and the target keeps llama.cpp's default (llama-server's -ctk q8_0). Layers without a KV cache (recurrent layers of hybrid models,
// layers that reuse another layer's cache) write nothing; the layers captured are those the first
// graph wrote, in layer order, and every later graph must write the same ones.
//
// Ubatches: llama_decode may split a batch into ubatches, one graph each; rows are appended in
// ubatch order, which is batch order when the KV cache is unified (split_simple). One graph's
// captures are buffered as "pending" and committed when the graph ends, i.e. at the first of:
//   - the ask for "result_output" (the logits node, after every layer),
//   - a cache write of a lower layer than the last one seen, or a second K (V) of one layer (a
//     new graph began without a result_output node),
//   - a read (moa_capture_n_rows / moa_capture_get).
// At commit every captured layer must have K and V with the same token count and the same shape
// as the others, else the capture is marked inconsistent (first reason kept) until the next reset.
#include "moa-impl.h"

#include "ggml-backend.h"
#include "ggml.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

enum class kv_kind { none, k, v };

// One layer's K or V rows of the current graph, gathered token-major: [n_tokens][width].
struct pending_tensor {
    bool               set = false;
    int64_t            head_dim = 0;  // K only (from k_cur's shape); 0 for V
    int64_t            n_head   = 0;  // K only
    int64_t            n_tokens = 0;  // K only; V: n_values / width of the layer's K
    int64_t            n_values = 0;
    std::vector<float> data;
};

// "cache_k_l12" -> 12 when prefix is "cache_k_l"; -1 otherwise.
int32_t parse_layer(const char * name, const char * prefix) {
    const size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0) {
        return -1;
    }
    const char * digits = name + n;
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

// The rotation the rows went through, if they descend (through views, reshapes, copies) from
// llama.cpp's Hadamard rotation of a quantized KV cache (llama-graph.cpp build_attn: k_cur =
// llama_mul_mat_hadamard(k_cur, "attn_inp_k_rot"), the same for V), else nullptr. The rotation is
// an orthonormal n x n matrix applied to every block of n consecutive values of a row.
const ggml_tensor * rotation_of(const ggml_tensor * t, int depth = 0) {
    if (t == nullptr || depth > 8) {
        return nullptr;
    }
    if (t->op == GGML_OP_MUL_MAT) {
        const ggml_tensor * s = t->src[0];
        if (s && strncmp(s->name, "attn_inp_", 9) == 0 && strstr(s->name, "_rot") != nullptr) {
            return s;
        }
    }
    switch (t->op) {
        case GGML_OP_VIEW: case GGML_OP_RESHAPE: case GGML_OP_CONT: case GGML_OP_CPY:
        case GGML_OP_PERMUTE: case GGML_OP_TRANSPOSE: case GGML_OP_MUL_MAT: case GGML_OP_PAD: {
            const ggml_tensor * r = rotation_of(t->src[0], depth + 1);
            return r ? r : (t->op == GGML_OP_MUL_MAT ? rotation_of(t->src[1], depth + 1) : nullptr);
        }
        default:
            return nullptr;
    }
}

}  // namespace

struct moa_capture {
    int32_t n_layer_model;  // layer indices accepted: [0, n_layer_model)
    bool    unpermute_k;
    bool    enabled = true;

    // Layers captured, in order (empty before the first committed graph); kept across resets.
    std::vector<int32_t> layer_ids;
    // Shapes seen (0 before the first committed graph); kept across resets.
    int32_t n_head_kv = 0;
    int32_t head_dim  = 0;

    // Committed rows since the last reset: per captured layer [n_rows][n_head_kv * head_dim].
    std::vector<std::vector<float>> k, v;
    int64_t n_rows = 0;

    // Current graph (ubatch), indexed by model layer.
    std::vector<pending_tensor> k_pend, v_pend;
    int32_t last_layer = -1;  // layer of the last cache write seen in this graph
    bool    any_pending = false;

    // First inconsistency since the last reset ("" = none).
    int32_t     err_code = MOA_OK;
    std::string err_msg;

    std::vector<uint8_t> scratch;  // raw bytes of a non-contiguous or F16 tensor
    std::vector<float> rot_m, rot_tmp;  // a quantized cache's rotation matrix, one unrotated block

    moa_capture(int32_t n_layer_, bool unpermute_k_)
        : n_layer_model(n_layer_), unpermute_k(unpermute_k_), k_pend(n_layer_), v_pend(n_layer_) {}

    int32_t n_layer() const { return (int32_t) layer_ids.size(); }

    void fail(int32_t code, const std::string & msg) {
        if (err_code == MOA_OK) {
            err_code = code;
            err_msg  = msg;
        }
    }

    void clear_pending() {
        for (int32_t il = 0; il < n_layer_model; ++il) {
            k_pend[il].set = false;
            v_pend[il].set = false;
        }
        last_layer  = -1;
        any_pending = false;
    }

    void reset() {
        for (auto & x : k) x.clear();  // keeps capacity: no reallocation in steady state
        for (auto & x : v) x.clear();
        n_rows   = 0;
        err_code = MOA_OK;
        err_msg.clear();
        clear_pending();
    }

    // A SET_ROWS node writing a layer's K or V cache tensor?
    kv_kind classify(const ggml_tensor * t, int32_t * il) const {
        if (t->op != GGML_OP_SET_ROWS || t->src[0] == nullptr || t->view_src == nullptr) {
            return kv_kind::none;
        }
        const ggml_tensor * dst = t->view_src;  // the cache tensor itself (a view's view_src is its base)
        int32_t l = parse_layer(dst->name, "cache_k_l");
        if (l >= 0 && l < n_layer_model) {
            *il = l;
            return kv_kind::k;
        }
        l = parse_layer(dst->name, "cache_v_l");
        if (l >= 0 && l < n_layer_model) {
            *il = l;
            return kv_kind::v;
        }
        return kv_kind::none;
    }

    // Does a cache write of layer il (kind) start a new graph while one is pending?
    bool starts_new_graph(kv_kind kind, int32_t il) const {
        if (!any_pending) {
            return false;
        }
        return il < last_layer || (kind == kv_kind::k ? k_pend[il].set : v_pend[il].set);
    }

    // Copy the rows of a cache write (node t's src[0]: F32 or F16, 2-D, any strides, any
    // backend) into p, token-major.
    void read_rows(const ggml_tensor * t, kv_kind kind, pending_tensor & p) {
        const ggml_tensor * s = t->src[0];
        if (s->type != GGML_TYPE_F32 && s->type != GGML_TYPE_F16) {
            fail(MOA_ERR_MISMATCH, std::string(t->view_src->name) + ": rows of unsupported type " +
                                       ggml_type_name(s->type) + " (expected F32 or F16)");
            return;
        }
        if (s->ne[2] != 1 || s->ne[3] != 1) {
            fail(MOA_ERR_MISMATCH, std::string(t->view_src->name) + ": expected 2-D rows");
            return;
        }
        const ggml_backend_buffer * buf = s->view_src ? s->view_src->buffer : s->buffer;
        if (buf == nullptr || s->data == nullptr) {
            fail(MOA_ERR_BACKEND, std::string(t->view_src->name) + ": rows have no data");
            return;
        }
        const ggml_tensor * rot = rotation_of(s);
        const int64_t C = s->ne[0], R = s->ne[1];
        p.n_values = C * R;
        if (kind == kv_kind::k) {
            // The head split comes from k_cur, the 3-D tensor cpy_k viewed as 2-D.
            const ggml_tensor * kc = s->src[0];
            if (s->op != GGML_OP_VIEW || kc == nullptr || kc->ne[0] * kc->ne[1] != C || kc->ne[2] != R) {
                fail(MOA_ERR_MISMATCH, std::string(t->view_src->name) +
                                           ": cannot tell the K heads (the cache write is not a view of a "
                                           "[head_dim, n_head_kv, n_tokens] tensor)");
                return;
            }
            p.head_dim = kc->ne[0];
            p.n_head   = kc->ne[1];
            p.n_tokens = R;
        }
        p.data.resize((size_t) p.n_values);
        if (s->type == GGML_TYPE_F32 && ggml_is_contiguous(s)) {
            ggml_backend_tensor_get(s, p.data.data(), 0, ggml_nbytes(s));
        } else {
            // One read of the rows' whole byte extent, then a strided gather on the host: covers
            // views into a fused QKV and F16, on CPU or GPU buffers.
            const size_t nbytes = ggml_nbytes(s);
            scratch.resize(nbytes);
            ggml_backend_tensor_get(s, scratch.data(), 0, nbytes);
            float * dst = p.data.data();
            for (int64_t r = 0; r < R; ++r) {
                const uint8_t * row = scratch.data() + r * s->nb[1];
                for (int64_t c = 0; c < C; ++c) {
                    const uint8_t * src = row + c * s->nb[0];
                    float x;
                    if (s->type == GGML_TYPE_F32) {
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
        if (rot != nullptr && !unrotate(rot, p.data, t->view_src->name)) {
            return;
        }
        p.set = true;
    }

    // Undo llama.cpp's rotation of a quantized cache's rows: ggml_mul_mat(rot, x) gave y = R x per
    // block of n values (R row-major in rot's data), R orthonormal, so x = R^T y. The drafter reads
    // what the model computed; the target's own attention is unchanged (Q is rotated alike).
    bool unrotate(const ggml_tensor * rot, std::vector<float> & values, const char * name) {
        const int64_t n = rot->ne[0];
        if (rot->type != GGML_TYPE_F32 || rot->ne[1] != n || n <= 0 || values.size() % (size_t) n != 0 ||
            rot->data == nullptr || (rot->buffer == nullptr && (rot->view_src == nullptr || rot->view_src->buffer == nullptr))) {
            fail(MOA_ERR_MISMATCH, std::string(name) + ": llama.cpp rotated these K/V rows (quantized KV cache) in a "
                                       "way the capture cannot undo; use an f16/f32 cache");
            return false;
        }
        rot_m.resize((size_t) (n * n));
        ggml_backend_tensor_get(rot, rot_m.data(), 0, (size_t) (n * n) * sizeof(float));
        rot_tmp.resize((size_t) n);
        for (size_t b = 0; b < values.size(); b += (size_t) n) {
            float * y = values.data() + b;
            for (int64_t k = 0; k < n; ++k) {
                double acc = 0.0;
                for (int64_t i = 0; i < n; ++i) {
                    acc += (double) rot_m[(size_t) (i * n + k)] * y[i];
                }
                rot_tmp[(size_t) k] = (float) acc;
            }
            std::copy(rot_tmp.begin(), rot_tmp.end(), y);
        }
        return true;
    }

    // Append the pending graph's rows to the committed rows (or record why it cannot).
    void commit_pending() {
        if (!any_pending) {
            return;
        }
        const bool ok = err_code == MOA_OK && check_pending();
        if (ok) {
            const pending_tensor & k0 = k_pend[layer_ids[0]];
            n_head_kv = (int32_t) k0.n_head;
            head_dim  = (int32_t) k0.head_dim;
            for (size_t i = 0; i < layer_ids.size(); ++i) {
                const int32_t il = layer_ids[i];
                k[i].insert(k[i].end(), k_pend[il].data.begin(), k_pend[il].data.end());
                v[i].insert(v[i].end(), v_pend[il].data.begin(), v_pend[il].data.end());
            }
            n_rows += k0.n_tokens;
        }
        clear_pending();
    }

    bool check_pending() {
        std::vector<int32_t> seen;
        for (int32_t il = 0; il < n_layer_model; ++il) {
            if (!k_pend[il].set && !v_pend[il].set) {
                continue;
            }
            if (!k_pend[il].set || !v_pend[il].set) {
                fail(MOA_ERR_MISMATCH, "capture: layer " + std::to_string(il) + " wrote its " +
                                           (k_pend[il].set ? "K" : "V") + " cache but not its " +
                                           (k_pend[il].set ? "V" : "K") + " cache in this graph");
                return false;
            }
            seen.push_back(il);
        }
        if (layer_ids.empty()) {
            // The first graph decides which layers have a KV cache.
            layer_ids = seen;
            k.assign(seen.size(), {});
            v.assign(seen.size(), {});
        } else if (seen != layer_ids) {
            fail(MOA_ERR_MISMATCH, "capture: this graph wrote the KV cache of " + std::to_string(seen.size()) +
                                       " layers, the first one of " + std::to_string(layer_ids.size()));
            return false;
        }
        const pending_tensor & k0 = k_pend[layer_ids[0]];
        if (n_rows > 0 && (k0.n_head != n_head_kv || k0.head_dim != head_dim)) {
            fail(MOA_ERR_MISMATCH, "capture: K shape changed between ubatches");
            return false;
        }
        if (k0.head_dim % 2 != 0 && unpermute_k) {
            fail(MOA_ERR_MISMATCH, "capture: odd head_dim " + std::to_string(k0.head_dim) + " cannot be un-permuted");
            return false;
        }
        const int64_t width = k0.n_head * k0.head_dim;
        for (const int32_t il : layer_ids) {
            const pending_tensor & kp = k_pend[il];
            const pending_tensor & vp = v_pend[il];
            if (kp.n_head != k0.n_head || kp.head_dim != k0.head_dim || kp.n_tokens != k0.n_tokens) {
                fail(MOA_ERR_MISMATCH,
                     "capture: layer " + std::to_string(il) + " K has shape [" + std::to_string(kp.head_dim) + ", " +
                         std::to_string(kp.n_head) + ", " + std::to_string(kp.n_tokens) + "], layer " +
                         std::to_string(layer_ids[0]) + " K has [" + std::to_string(k0.head_dim) + ", " +
                         std::to_string(k0.n_head) + ", " + std::to_string(k0.n_tokens) +
                         "] (per-layer KV widths are not supported)");
                return false;
            }
            if (vp.n_values != width * k0.n_tokens) {
                fail(MOA_ERR_MISMATCH, "capture: layer " + std::to_string(il) + " V holds " +
                                           std::to_string(vp.n_values) + " values for " + std::to_string(k0.n_tokens) +
                                           " tokens, K " + std::to_string(width * k0.n_tokens) +
                                           " (V head size differs from K's: not supported)");
                return false;
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
            read_rows(t, kind, kind == kv_kind::k ? k_pend[il] : v_pend[il]);
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

int32_t moa_capture_n_layer(const moa_capture * cap) { return cap ? cap->n_layer() : 0; }

int32_t moa_capture_layer_ids(const moa_capture * cap, int32_t * out, int32_t n) {
    return moa_guard_status([&]() -> int32_t {
        if (cap == nullptr || (n > 0 && out == nullptr) || n < 0) {
            moa_throw(MOA_ERR_INVALID_ARGUMENT, "moa_capture_layer_ids: bad arguments");
        }
        const int32_t m = cap->n_layer();
        for (int32_t i = 0; i < m && i < n; ++i) out[i] = cap->layer_ids[i];
        return m;
    });
}

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
            const int32_t L = cap->n_layer();
            for (int32_t il = 0; il < L; ++il) {
                const float * k   = cap->k[il].data() + (int64_t) rows[i] * HD;
                const float * v   = cap->v[il].data() + (int64_t) rows[i] * HD;
                float *       out = lsa_in + ((int64_t) i * L + il) * W;
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
