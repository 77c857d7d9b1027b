/*
 * moa.h - the whole native API of moa_cpp (Mixture-of-Attentions drafter on ggml).
 *
 * Objects:
 *   moa_model   immutable drafter weights + the target tensors it borrows (token_embd,
 *               LM head, TLI layers). Read-only after load: any number of states may use it.
 *   moa_state   one sequence: SA cache, CA cache, graph scratch, and its own ggml backend
 *               instances and scheduler.
 *   moa_capture collects the target's post-RoPE K and V of every layer during llama_decode,
 *               through llama.cpp's eval callback (cb_eval). One per target context.
 *
 * Threads: a moa_model is shared read-only; its getters and moa_state_init may be called from
 * any thread at any time, and states of one model may compute concurrently on different
 * threads (nothing a computation writes is shared between states). A moa_state is used by
 * one thread at a time (callers serialise calls on the same state); the same holds for a
 * moa_capture. moa_model_free must not overlap any use of the model or of its states, and
 * every state of a model must be freed before the model. moa_log_set is process-wide: set it
 * before other threads use the library.
 *
 * Errors: fallible functions return an int32_t status (enum moa_status, 0 = OK, negative =
 * error); constructors return NULL. The reason is in moa_last_error() (thread-local).
 * Nothing in this library aborts the process on bad user input.
 *
 * Layouts are given in C row-major order ("[a][b][c]": c varies fastest).
 * This header is parsed by cffi: no macros in declarations, no C++ types.
 */
#ifndef MOA_H
#define MOA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef MOA_API
#  if defined(_WIN32)
#    define MOA_API __declspec(dllexport)
#  else
#    define MOA_API __attribute__((visibility("default")))
#  endif
#endif

#define MOA_ABI_VERSION 6  /* 2: moa_state_feed, moa_state_draft_rows; 3: compute_ca, append_ca; 4: moa_model_role;
                              5: moa_gguf_* (were moa_arch_*), moa_target_arch_*; 6: moa_model_acceptance */

enum moa_status {
    MOA_OK                    =  0,
    MOA_ERR_INVALID_ARGUMENT  = -1,
    MOA_ERR_IO                = -2,
    MOA_ERR_FORMAT            = -3,  /* not a (valid) MoA / target GGUF                 */
    MOA_ERR_MISMATCH          = -4,  /* drafter and target disagree (vocab, heads, ...) */
    MOA_ERR_OUT_OF_MEMORY     = -5,
    MOA_ERR_BACKEND           = -6,  /* ggml backend failure                            */
    MOA_ERR_INTERNAL          = -7,
    MOA_ERR_CACHE_FULL        = -8   /* state n_ctx exceeded; nothing was changed        */
};

/* What a drafter GGUF holds (metadata key moa.role). */
enum moa_role {
    MOA_ROLE_FULL   = 0,  /* every drafter tensor (moa.role absent or "full")                   */
    MOA_ROLE_CLIENT = 1   /* client bundle (moa.role "client"): no lsa.*, ekv2e.*, ca.attn_k/v;
                             CA K/V come from a server through moa_state_append_ca             */
};

/* What the library does differently for a target architecture (moa_target_arch_flags). */
enum moa_target_arch_flag {
    MOA_TARGET_ARCH_QK_PERMUTED     = 1,  /* NORM RoPE: llama.cpp's converter permuted Q/K rows per head */
    MOA_TARGET_ARCH_EMBD_SCALE_SQRT = 2,  /* layer-0 input = sqrt(n_embd) * token_embd row (Gemma)      */
    MOA_TARGET_ARCH_TLI             = 4,  /* TLI N > 0 can run its decoder layers                        */
    MOA_TARGET_ARCH_CAPTURE         = 8   /* the K/V capture is verified on its llama.cpp graph          */
};

typedef int32_t moa_token;
typedef int32_t moa_pos;

typedef struct moa_model   moa_model;
typedef struct moa_state   moa_state;
typedef struct moa_capture moa_capture;

/* ---------------------------------------------------------------- library */

/* MOA_ABI_VERSION of the compiled library; the Python binding refuses a mismatch. */
MOA_API int32_t      moa_abi_version(void);
/* Message of the last failed call on this thread ("" if none). Valid until the next call. */
MOA_API const char * moa_last_error(void);
/* Status of the last failed call on this thread (MOA_OK if none); lets NULL-returning
 * constructors report a code. */
MOA_API int32_t      moa_last_status(void);
/* Route library logs (and ggml's) to cb; NULL restores stderr. level: ggml_log_level values. */
MOA_API void         moa_log_set(void (*cb)(int32_t level, const char * text, void * user_data), void * user_data);
/* The required drafter tensor names (GGUF), for checking the Python name table. */
MOA_API int32_t      moa_gguf_n_tensors(void);
MOA_API const char * moa_gguf_tensor_name(int32_t i);
/* The target architectures (general.architecture of a target GGUF) the library treats
 * specially, for checking the Python table (moa_cpp/arch.py). Any other architecture gets the
 * defaults: embedding scale 1, no TLI, Q/K rows not permuted. name: "" out of range; flags:
 * enum moa_target_arch_flag bits, -1 out of range. */
MOA_API int32_t      moa_target_arch_count(void);
MOA_API const char * moa_target_arch_name(int32_t i);
MOA_API int32_t      moa_target_arch_flags(int32_t i);
/* Number of ggml backend devices and their names ("CPU", "CUDA0", ...). */
MOA_API int32_t      moa_device_count(void);
MOA_API const char * moa_device_name(int32_t i);
/* Its backend ("CPU", "CUDA", "Metal", "RPC", ...; "" out of range) and whether it is a GPU on
 * this machine (1; RPC devices are remote: 0), for device listings and -ngl checks. */
MOA_API const char * moa_device_backend(int32_t i);
MOA_API int32_t      moa_device_is_local_gpu(int32_t i);

/* ---------------------------------------------------------------- model */

struct moa_model_params {
    const char * device;     /* "auto" (first GPU, else CPU; default), "cpu", or a device name */
    int32_t      n_threads;  /* CPU threads; <= 0: all cores                                    */
    int32_t      tli;        /* target layer inference N; -1 = value stored in the drafter GGUF */
    bool         use_mmap;   /* map target tensors from the target GGUF on CPU (default true)   */
};

/* Fill p with defaults. */
MOA_API void        moa_model_params_init(struct moa_model_params * p);

/* Load a drafter GGUF (general.architecture "moa") and borrow token_embd / LM head (and the
 * last N layers + output_norm when TLI N > 0) from the target GGUF. target_path may be NULL
 * when the drafter file bundles those tensors (a client-role file, moa.role = "client", made by
 * `moa-cpp bundle`, always does; it holds no LSA / Ekv2E / CA k,v weights). Checks
 * drafter/target agreement (vocab, width, layer count, KV heads, head dim). Returns NULL on
 * failure (see moa_last_error). */
MOA_API moa_model * moa_model_load(const char * drafter_path, const char * target_path,
                                   const struct moa_model_params * params);
MOA_API void        moa_model_free(moa_model * model);

/* Hyper-parameters. */
MOA_API int32_t     moa_model_n_vocab(const moa_model * model);         /* rows of the logits the drafter returns */
MOA_API int32_t     moa_model_n_target_vocab(const moa_model * model);  /* target vocabulary size                 */
MOA_API int32_t     moa_model_n_embd(const moa_model * model);
MOA_API int32_t     moa_model_n_target_layers(const moa_model * model); /* LSA sequence length L                  */
MOA_API int32_t     moa_model_lsa_width(const moa_model * model);       /* W = 2 * target_kv_heads * key_length   */
MOA_API int32_t     moa_model_tli(const moa_model * model);
MOA_API int32_t     moa_model_ca_kv_heads(const moa_model * model);     /* CA K/V heads (split mode payload)      */
MOA_API int32_t     moa_model_head_dim(const moa_model * model);        /* drafter head dim                       */
/* Reduced draft vocabulary: if moa_model_n_vocab < moa_model_n_target_vocab, copy the
 * draft->target id map (n_vocab entries) to out and return MOA_OK; else MOA_ERR_INVALID_ARGUMENT. */
MOA_API int32_t     moa_model_get_d2t(const moa_model * model, int32_t * out);
/* enum moa_role of the loaded drafter. A MOA_ROLE_CLIENT model cannot commit or compute_ca
 * (MOA_ERR_INVALID_ARGUMENT); append_ca, feed, draft and rollback work as for a full model. */
MOA_API int32_t     moa_model_role(const moa_model * model);
/* Name of the backend device the drafter runs on. */
MOA_API const char * moa_model_device(const moa_model * model);
/* The held-out conditional acceptance per draft depth the trainer recorded (moa.eval.acceptance):
 * copies up to n_max values to out and returns how many the drafter holds (0: none recorded). */
MOA_API int32_t     moa_model_acceptance(const moa_model * model, float * out, int32_t n_max);

/* ---------------------------------------------------------------- state */

struct moa_state_params {
    int32_t n_ctx;        /* max positions in the CA / SA caches (default 4096)               */
    int32_t n_draft_max;  /* max draft rows (scratch slots) per cycle, all calls (default 128) */
    int32_t n_batch;      /* max tokens per commit / feed call (default 512)                  */
};

MOA_API void        moa_state_params_init(struct moa_state_params * p);
MOA_API moa_state * moa_state_init(const moa_model * model, const struct moa_state_params * params);
MOA_API void        moa_state_free(moa_state * state);

/* Verified tokens -> LSA -> mean -> Ekv2E -> CA K/V, appended at positions pos0 .. pos0+n-1.
 * lsa_in: [n_tokens][L][W], one row per target layer, head-interleaved [K_h | V_h] in HF
 * layout (what moa_capture_get returns). pos0 must be <= moa_state_n_ca (a smaller pos0
 * first truncates the CA cache). With TLI N > 0 the last N layers' K/V are also kept for
 * the TLI attention. A commit starts a new cycle: pending draft rows are dropped.
 * lsa_out [n][L][W], lsa_mean [n][W], ekv [n][n_embd] are optional
 * (NULL) debug outputs. Validation errors leave the caches unchanged; after a backend
 * failure the CA cache holds the entries written before it. */
MOA_API int32_t     moa_state_commit(moa_state * state, const float * lsa_in, int32_t n_tokens, moa_pos pos0,
                                     float * lsa_out, float * lsa_mean, float * ekv);

/* Split drafter (client-server mode): the server, which has the target's K/V, computes the CA
 * K/V of verified tokens; the client, which has no LSA weights, appends them to its CA cache.
 * moa_state_compute_ca + moa_state_append_ca leave the same CA cache as moa_state_commit (bit
 * for bit in f32: the same graph computes them).
 * compute_ca: lsa_in [n_tokens][L][W] (as for commit) at positions pos0 .. pos0+n-1 -> k_out,
 * v_out [n_tokens][ca_kv_heads][head_dim] (K post-RoPE at its absolute position). The state's
 * caches are untouched: any state of the model serves as scratch. Needs TLI N == 0.
 * append_ca: k, v as compute_ca returns them, written at CA positions pos0 .. pos0+n-1; pos0
 * must be <= moa_state_n_ca (a smaller pos0 first truncates). Drops pending draft rows, as a
 * commit does. Needs TLI N == 0 (the TLI layers' K/V would have to be sent too). */
MOA_API int32_t     moa_state_compute_ca(moa_state * state, const float * lsa_in, int32_t n_tokens, moa_pos pos0,
                                         float * k_out, float * v_out);
MOA_API int32_t     moa_state_append_ca(moa_state * state, const float * k, const float * v, int32_t n_tokens,
                                        moa_pos pos0);

/* Feeding and drafting. Feed tokens are tokens whose SA output is not needed (prompt tokens,
 * accepted drafts): they only get SA K/V, appended to the SA context. Draft rows get logits.
 * A failed call leaves the state as it was (the counters advance only after the graph ran). */

/* Append n_feed tokens to the SA context at positions moa_state_n_sa .. +n_feed-1 (K/V only).
 * Requires that no draft rows are pending. At most n_batch + n_draft_max tokens per call.
 * n_feed == 0 is a no-op. */
MOA_API int32_t     moa_state_feed(moa_state * state, int32_t n_feed, const moa_token * feed_tokens);

/* Run n_draft draft rows: token tokens[i] at position pos[i], SA over the context + its
 * ancestors + itself, CA over all CA entries, LM head.
 * parents[i] is the index of the row's parent among this cycle's draft rows (0 = first draft
 * row of the cycle, counted across calls), or -1 if the row attaches directly to the
 * context. A parent must come from an earlier call or an earlier row of this call.
 * With TLI N > 0 the CA output then runs through the target's last N layers (attending to
 * the target's K/V of verified tokens plus the rows on the path) and output_norm.
 * logits: [n_draft][moa_model_n_vocab].
 * hidden: optional [n_draft][n_embd] output, the CA output z of each row (the state the
 * drafter was trained to regress; at TLI 0 the LM head input). n_draft must be > 0
 * (0: MOA_ERR_INVALID_ARGUMENT "nothing to do", as for moa_state_draft). */
MOA_API int32_t     moa_state_draft_rows(moa_state * state, int32_t n_draft, const moa_token * tokens,
                                         const moa_pos * pos, const int32_t * parents, float * logits,
                                         float * hidden);

/* moa_state_feed(n_feed, feed_tokens) then moa_state_draft_rows(n_draft, ...) as one graph:
 * one scheduler pass instead of two (the usual cycle: feed the tokens verified since the last
 * cycle, draft the root), and all arguments are validated before either part runs. Either
 * count may be 0, not both (MOA_ERR_INVALID_ARGUMENT "nothing to do"); at most
 * n_batch + n_draft_max rows in all. logits may be NULL when n_draft == 0.
 * The feed tokens' and draft rows' SA K/V are computed in one batch, so results may differ from
 * the two separate calls by float rounding (ggml kernels may depend on the batch size). */
MOA_API int32_t     moa_state_draft(moa_state * state,
                                    int32_t n_feed, const moa_token * feed_tokens,
                                    int32_t n_draft, const moa_token * tokens, const moa_pos * pos,
                                    const int32_t * parents, float * logits, float * hidden);

/* Drop this cycle's draft rows (SA scratch slots). */
MOA_API int32_t     moa_state_clear_drafts(moa_state * state);
/* Keep only positions < pos in the SA context and the CA cache; drops draft rows. */
MOA_API int32_t     moa_state_rollback(moa_state * state, moa_pos pos);

MOA_API int32_t     moa_state_n_ca(const moa_state * state);      /* CA entries (= verified positions) */
MOA_API int32_t     moa_state_n_sa(const moa_state * state);      /* SA context positions              */
MOA_API int32_t     moa_state_n_drafts(const moa_state * state);  /* pending draft rows                */
/* Copy the CA cache: k, v: [ca_kv_heads][n_ca][head_dim] (HF layout). n_heads/head_dim out. */
MOA_API int32_t     moa_state_get_ca_cache(const moa_state * state, float * k, float * v,
                                           int32_t * n_heads, int32_t * head_dim);

/* ---------------------------------------------------------------- target capture */

/* A capture collects, during each llama_decode of a target context whose cb_eval is
 * moa_capture_eval_cb and cb_eval_user_data the capture, the K and V rows every attention layer
 * writes into llama.cpp's KV cache (post-RoPE K; every batch row, all ubatches, in order).
 * n_layer: the model's layer count (llama_model_n_layer). The layers captured are those with a
 * KV cache, found by the first decode (all of them but in hybrid models, whose recurrent layers
 * have none): moa_capture_n_layer / moa_capture_layer_ids.
 * unpermute_k: undo llama.cpp's per-head Q/K row permutation (NORM-rope targets) so K is in
 * HF layout. Returns NULL on bad arguments. */
MOA_API moa_capture * moa_capture_init(int32_t n_layer, bool unpermute_k);
MOA_API void          moa_capture_free(moa_capture * cap);
/* The ggml_backend_sched_eval_callback; t is a struct ggml_tensor *. */
MOA_API bool          moa_capture_eval_cb(void * t, bool ask, void * user_data);
/* Forget rows captured so far (call before each llama_decode). */
MOA_API void          moa_capture_reset(moa_capture * cap);
/* While disabled, the callback asks for no tensor (near-zero overhead). */
MOA_API void          moa_capture_set_enabled(moa_capture * cap, bool enabled);
/* Rows captured since reset, or a negative status if the capture is inconsistent (a layer
 * missing, shapes differing between layers). */
MOA_API int32_t       moa_capture_n_rows(const moa_capture * cap);
/* Shapes seen: KV heads and head dim (0 before the first capture). */
MOA_API int32_t       moa_capture_n_head_kv(const moa_capture * cap);
MOA_API int32_t       moa_capture_head_dim(const moa_capture * cap);
/* Layers captured (0 before the first decode), and their model layer indices: writes up to n
 * of them to out and returns how many there are (or a negative status). */
MOA_API int32_t       moa_capture_n_layer(const moa_capture * cap);
MOA_API int32_t       moa_capture_layer_ids(const moa_capture * cap, int32_t * out, int32_t n);
/* Gather rows (indices into the captured rows) as LSA input [n_rows][n_layer][W] (n_layer:
 * moa_capture_n_layer),
 * W = 2 * n_head_kv * head_dim, head-interleaved [K_h | V_h]. */
MOA_API int32_t       moa_capture_get(const moa_capture * cap, const int32_t * rows, int32_t n_rows, float * lsa_in);

#ifdef __cplusplus
}
#endif

#endif /* MOA_H */
