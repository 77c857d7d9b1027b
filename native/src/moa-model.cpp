// Drafter GGUF loading and validation against the target GGUF.
//
// Every check on user input (file, architecture, metadata, tensor types/shapes, data range,
// drafter/target agreement) happens here, before any ggml call that could assert.
// moa_model_load_impl runs four steps, each a section below: read the drafter's
// hyper-parameters, validate them and the drafter's tensors, match them against the target
// (GGUF or bundled tensors; TLI layers), load the tensors. The sections before them are the
// helpers they share (GGUF access, device choice, tensor storage); the functions moa-model.h
// declares close the file. Per-target-architecture facts come from moa-target-arch.h.
#include "moa-model.h"

#include "moa-gguf-names.h"
#include "moa-target-arch.h"

#include "gguf.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

namespace {

namespace K = moa_gguf_names::key;
using tensor_list = std::vector<std::pair<std::string, ggml_tensor **>>;

// ---------------------------------------------------------------- GGUF access

struct gguf_file {
    std::string path;
    gguf_context * gctx = nullptr;
    ggml_context * meta = nullptr;
    size_t file_size = 0;

    gguf_file(const char * p, const char * what) : path(p) {
        struct stat st;
        if (stat(p, &st) != 0) {
            moa_throw(MOA_ERR_IO, "%s '%s': file not found", what, p);
        }
        file_size = (size_t) st.st_size;
        gguf_init_params ip = {/*no_alloc =*/ true, /*ctx =*/ &meta};
        gctx = gguf_init_from_file(p, ip);
        if (!gctx) {
            moa_throw(MOA_ERR_FORMAT, "%s '%s' is not a valid GGUF file (truncated or corrupted?)", what, p);
        }
        // gguf_init_from_file with no_alloc does not read tensor data: check its extent here.
        const size_t data_off = gguf_get_data_offset(gctx);
        for (int64_t i = 0; i < gguf_get_n_tensors(gctx); ++i) {
            const char * name = gguf_get_tensor_name(gctx, i);
            ggml_tensor * t = ggml_get_tensor(meta, name);
            const size_t end = data_off + gguf_get_tensor_offset(gctx, i) + ggml_nbytes(t);
            if (end > file_size) {
                moa_throw(MOA_ERR_FORMAT, "%s '%s' is truncated: tensor '%s' ends at byte %zu but the file has %zu bytes",
                          what, p, name, end, file_size);
            }
        }
    }
    ~gguf_file() {
        if (gctx) gguf_free(gctx);
        if (meta) ggml_free(meta);
    }
    gguf_file(const gguf_file &) = delete;
    gguf_file & operator=(const gguf_file &) = delete;

    int64_t key(const char * k) const { return gguf_find_key(gctx, k); }

    std::string str(const char * k, const char * def = nullptr) const {
        const int64_t id = key(k);
        if (id < 0) {
            if (def) return def;
            moa_throw(MOA_ERR_FORMAT, "'%s': missing metadata key '%s'", path.c_str(), k);
        }
        if (gguf_get_kv_type(gctx, id) != GGUF_TYPE_STRING) {
            moa_throw(MOA_ERR_FORMAT, "'%s': metadata key '%s' is not a string", path.c_str(), k);
        }
        return gguf_get_val_str(gctx, id);
    }

    // Integer key of any integer type; arrays allowed when every element is equal (some archs
    // store per-layer head counts), zeros left out with skip_zero (hybrid models list 0 KV heads
    // for their recurrent layers).
    int64_t integer(const char * k, int64_t def = INT64_MIN, bool skip_zero = false) const {
        const int64_t id = key(k);
        if (id < 0) {
            if (def != INT64_MIN) return def;
            moa_throw(MOA_ERR_FORMAT, "'%s': missing metadata key '%s'", path.c_str(), k);
        }
        const gguf_type t = gguf_get_kv_type(gctx, id);
        if (t == GGUF_TYPE_ARRAY) {
            const gguf_type at = gguf_get_arr_type(gctx, id);
            const size_t n = gguf_get_arr_n(gctx, id);
            if (n == 0 || (at != GGUF_TYPE_UINT32 && at != GGUF_TYPE_INT32)) {
                moa_throw(MOA_ERR_FORMAT, "'%s': metadata key '%s' has an unsupported array type", path.c_str(), k);
            }
            const int32_t * v = (const int32_t *) gguf_get_arr_data(gctx, id);
            int64_t first = INT64_MIN;
            for (size_t i = 0; i < n; ++i) {
                if (skip_zero && v[i] == 0) continue;
                if (first == INT64_MIN) {
                    first = v[i];
                } else if (v[i] != first) {
                    moa_throw(MOA_ERR_MISMATCH, "'%s': '%s' differs between layers; per-layer sizes are not supported",
                              path.c_str(), k);
                }
            }
            return first == INT64_MIN ? 0 : first;
        }
        switch (t) {
            case GGUF_TYPE_UINT8:  return gguf_get_val_u8(gctx, id);
            case GGUF_TYPE_INT8:   return gguf_get_val_i8(gctx, id);
            case GGUF_TYPE_UINT16: return gguf_get_val_u16(gctx, id);
            case GGUF_TYPE_INT16:  return gguf_get_val_i16(gctx, id);
            case GGUF_TYPE_UINT32: return gguf_get_val_u32(gctx, id);
            case GGUF_TYPE_INT32:  return gguf_get_val_i32(gctx, id);
            case GGUF_TYPE_UINT64: return (int64_t) gguf_get_val_u64(gctx, id);
            case GGUF_TYPE_INT64:  return gguf_get_val_i64(gctx, id);
            default:
                moa_throw(MOA_ERR_FORMAT, "'%s': metadata key '%s' is not an integer", path.c_str(), k);
        }
    }

    // How many layers a per-layer integer array `k` gives a value other than 0 (a hybrid model's
    // attention layers, for its head_count_kv), or -1 when `k` is absent or a single value.
    int64_t nonzero_layers(const char * k) const {
        const int64_t id = key(k);
        if (id < 0 || gguf_get_kv_type(gctx, id) != GGUF_TYPE_ARRAY) return -1;
        const gguf_type at = gguf_get_arr_type(gctx, id);
        if (at != GGUF_TYPE_UINT32 && at != GGUF_TYPE_INT32) return -1;
        const int32_t * v = (const int32_t *) gguf_get_arr_data(gctx, id);
        int64_t count = 0;
        for (size_t i = 0; i < gguf_get_arr_n(gctx, id); ++i) count += v[i] != 0;
        return count;
    }

    double real(const char * k, double def = NAN) const {
        const int64_t id = key(k);
        if (id < 0) {
            if (!std::isnan(def)) return def;
            moa_throw(MOA_ERR_FORMAT, "'%s': missing metadata key '%s'", path.c_str(), k);
        }
        switch (gguf_get_kv_type(gctx, id)) {
            case GGUF_TYPE_FLOAT32: return gguf_get_val_f32(gctx, id);
            case GGUF_TYPE_FLOAT64: return gguf_get_val_f64(gctx, id);
            default: return (double) integer(k);
        }
    }

    ggml_tensor * tensor(const std::string & name) const { return ggml_get_tensor(meta, name.c_str()); }

    size_t offset_of(const std::string & name) const {
        const int64_t id = gguf_find_tensor(gctx, name.c_str());
        return gguf_get_data_offset(gctx) + gguf_get_tensor_offset(gctx, id);
    }
};

bool supported_weight_type(ggml_type t) {
    switch (t) {
        case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16:
        case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1:
        case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K:
        case GGML_TYPE_Q8_K:
            return true;
        default:
            return false;
    }
}

std::string shape_str(const ggml_tensor * t) {
    char buf[96];
    snprintf(buf, sizeof(buf), "[%lld, %lld]", (long long) t->ne[0], (long long) t->ne[1]);
    return buf;
}

// Check a drafter tensor exists with ggml shape [ne0, ne1] (ne1 = 1 for vectors).
void expect_shape(const gguf_file & f, const std::string & name, int64_t ne0, int64_t ne1, bool vector_f32,
                  std::vector<std::string> & problems) {
    const ggml_tensor * t = f.tensor(name);
    if (!t) {
        problems.push_back("missing tensor '" + name + "'");
        return;
    }
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1) {
        char buf[256];
        snprintf(buf, sizeof(buf), "tensor '%s' has shape %s, expected [%lld, %lld]", name.c_str(),
                 shape_str(t).c_str(), (long long) ne0, (long long) ne1);
        problems.push_back(buf);
    }
    if (vector_f32 ? (t->type != GGML_TYPE_F32) : !supported_weight_type(t->type)) {
        problems.push_back("tensor '" + name + "' has unsupported type " + ggml_type_name(t->type) +
                           (vector_f32 ? " (norms and biases must be F32)" : ""));
    }
}

// Throw `code` with every collected problem in one message: whoever fixes a file sees all of
// them at once instead of one per attempt.
void report_problems(int32_t code, const std::string & header, const std::vector<std::string> & problems) {
    if (problems.empty()) return;
    std::string msg = header;
    for (auto & p : problems) msg += "\n  - " + p;
    moa_throw(code, "%s", msg.c_str());
}

// ---------------------------------------------------------------- device

std::string lower(std::string s) {
    for (char & c : s) c = (char) std::tolower((unsigned char) c);
    return s;
}

std::string device_names() {
    std::string names;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        names += std::string(i ? ", " : "") + ggml_backend_dev_name(ggml_backend_dev_get(i));
    }
    return names;
}

// "auto": first local GPU, else CPU. "gpu" / a backend name ("cuda", "metal", "vulkan", ...): the
// first local GPU (of that backend): an error naming the devices this build has if there is none.
// Otherwise a device name ("CUDA0"), case-insensitive.
ggml_backend_dev_t pick_device(const char * want) {
    const std::string w = lower(want ? want : "auto");
    if (w == "cpu") return ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        if (lower(ggml_backend_dev_name(d)) == w) return d;
    }
    const bool any_gpu = (w == "auto" || w == "gpu");
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(d);
        if (is_local_gpu(d) && (any_gpu || (reg && lower(ggml_backend_reg_name(reg)) == w))) return d;
    }
    if (w == "auto") return ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (w == "gpu" || w == "cuda" || w == "metal" || w == "vulkan" || w == "sycl" || w == "hip") {
        moa_throw(MOA_ERR_INVALID_ARGUMENT, "device '%s': no such GPU in this build of llama.cpp (devices: %s); "
                  "llama-cpp-python must be built with that backend, e.g. MOA_CUDA=1 bash scripts/setup.sh",
                  want, device_names().c_str());
    }
    moa_throw(MOA_ERR_INVALID_ARGUMENT, "unknown device '%s' (available: auto, cpu, gpu, %s)", want,
              device_names().c_str());
}

// ---------------------------------------------------------------- tensor storage

struct mapped_file {
    void * addr = nullptr;
    size_t size = 0;
};

mapped_file map_file(const std::string & path, size_t size) {
    int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) moa_throw(MOA_ERR_IO, "cannot open '%s'", path.c_str());
    void * addr = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (addr == MAP_FAILED) moa_throw(MOA_ERR_IO, "cannot mmap '%s'", path.c_str());
    return {addr, size};
}

void read_at(const std::string & path, size_t off, void * dst, size_t n) {
    FILE * fp = fopen(path.c_str(), "rb");
    if (!fp) moa_throw(MOA_ERR_IO, "cannot open '%s'", path.c_str());
    std::unique_ptr<FILE, int (*)(FILE *)> guard(fp, fclose);
    if (fseek(fp, (long) off, SEEK_SET) != 0 || fread(dst, 1, n, fp) != n) {
        moa_throw(MOA_ERR_IO, "read error in '%s' at offset %zu", path.c_str(), off);
    }
}

// (name, slot) pairs of one decoder layer's tensors under ``prefix``, in
// moa_gguf_names::LAYER_SUFFIXES order: shared by the drafter's SA/CA/LSA and the target layers reused at TLI N > 0.
void add_layer_tensors(tensor_list & out, const std::string & prefix, moa_layer & L) {
    ggml_tensor ** slots[] = {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_norm, &L.ffn_gate, &L.ffn_up, &L.ffn_down};
    static_assert(sizeof(slots) / sizeof(slots[0]) == sizeof(moa_gguf_names::LAYER_SUFFIXES) / sizeof(moa_gguf_names::LAYER_SUFFIXES[0]),
                  "one slot per layer tensor suffix");
    for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); ++i) {
        out.push_back({prefix + moa_gguf_names::LAYER_SUFFIXES[i], slots[i]});
    }
}

// Rows of a llama-arch attn_q / attn_k weight are permuted per head by llama.cpp's converter
// (GGUF row 2i+j holds HF row j*D/2+i, ref docs/drafter.md#k-permutation); undo it so the reused layers can run NEOX
// RoPE on HF-ordered q/k, consistent with the HF-layout K the capture delivers.
void unpermute_rows(std::vector<uint8_t> & data, const ggml_tensor * t, int64_t head_dim) {
    const size_t row = ggml_row_size(t->type, t->ne[0]);
    const int64_t n_rows = t->ne[1];
    std::vector<uint8_t> out(data.size());
    for (int64_t h = 0; h < n_rows / head_dim; ++h) {
        for (int64_t i = 0; i < head_dim / 2; ++i) {
            for (int64_t j = 0; j < 2; ++j) {
                const int64_t src = h * head_dim + 2 * i + j, dst = h * head_dim + j * (head_dim / 2) + i;
                std::memcpy(out.data() + dst * row, data.data() + src * row, row);
            }
        }
    }
    data.swap(out);
}

using made_tensors = std::vector<std::pair<ggml_tensor *, std::string>>;  // (tensor, name in the file)

// Place tensors as views into a read-only mapping of the file.
void map_tensors(moa_model & m, const gguf_file & f, const made_tensors & made) {
    mapped_file mf = map_file(f.path, f.file_size);
    m.mmaps.emplace_back(mf.addr, mf.size);
    size_t lo = SIZE_MAX, hi = 0, max_t = 0;
    for (auto & [t, name] : made) {
        const size_t off = f.offset_of(name);
        lo = std::min(lo, off);
        hi = std::max(hi, off + ggml_nbytes(t));
        max_t = std::max(max_t, ggml_nbytes(t));
    }
    ggml_backend_buffer_t buf = ggml_backend_dev_buffer_from_host_ptr(m.dev, (char *) mf.addr + lo, hi - lo, max_t);
    if (!buf) moa_throw(MOA_ERR_BACKEND, "cannot wrap the mapping of '%s' in a backend buffer", f.path.c_str());
    ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    m.bufs.push_back(buf);
    for (auto & [t, name] : made) {
        if (ggml_backend_tensor_alloc(buf, t, (char *) mf.addr + f.offset_of(name)) != GGML_STATUS_SUCCESS) {
            moa_throw(MOA_ERR_BACKEND, "cannot place tensor '%s' in the mapped buffer", name.c_str());
        }
    }
}

// Allocate ctx's tensors in a buffer of the model's device and copy their data from the file.
void copy_tensors(moa_model & m, const gguf_file & f, ggml_context * ctx, const made_tensors & made,
                         const std::string & name_prefix, int64_t unpermute_head_dim) {
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_dev_buffer_type(m.dev));
    if (!buf) moa_throw(MOA_ERR_OUT_OF_MEMORY, "cannot allocate %s weights on device %s", name_prefix.c_str(), m.device_name.c_str());
    ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    m.bufs.push_back(buf);
    std::vector<uint8_t> tmp;
    for (auto & [t, name] : made) {
        tmp.resize(ggml_nbytes(t));
        read_at(f.path, f.offset_of(name), tmp.data(), tmp.size());
        const bool is_qk = name.find(".attn_q.weight") != std::string::npos ||
                           name.find(".attn_k.weight") != std::string::npos;
        if (unpermute_head_dim > 0 && is_qk) unpermute_rows(tmp, t, unpermute_head_dim);
        ggml_backend_tensor_set(t, tmp.data(), 0, tmp.size());
    }
}

// Load tensors (by name) from a GGUF file into the model: on a CPU device with use_mmap as views
// into a read-only mapping (no second copy of e.g. a 262K-row embedding), else copied.
// unpermute_head_dim > 0: rewrite attn_q / attn_k rows to HF order (see unpermute_rows).
void load_tensors(moa_model & m, const gguf_file & f, const tensor_list & list,
                         const std::string & name_prefix, bool use_mmap, int64_t unpermute_head_dim = 0) {
    if (list.empty()) return;
    ggml_init_params ip = {ggml_tensor_overhead() * (list.size() + 1), nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    if (!ctx) moa_throw(MOA_ERR_OUT_OF_MEMORY, "ggml_init failed");
    m.ctxs.push_back(ctx);
    made_tensors made;
    for (auto & [name, slot] : list) {
        ggml_tensor * t = ggml_dup_tensor(ctx, f.tensor(name));
        ggml_set_name(t, (name_prefix + name).c_str());
        *slot = t;
        made.emplace_back(t, name);
    }
    ggml_backend_dev_props props;
    ggml_backend_dev_get_props(m.dev, &props);
    if (use_mmap && ggml_backend_dev_type(m.dev) == GGML_BACKEND_DEVICE_TYPE_CPU && props.caps.buffer_from_host_ptr) {
        map_tensors(m, f, made);
    } else {
        copy_tensors(m, f, ctx, made, name_prefix, unpermute_head_dim);
    }
}

// ---------------------------------------------------------------- read

// Identity first, and fatal at once: on a foreign file every later check would only add a
// list of meaningless missing keys.
void check_drafter_identity(const gguf_file & df) {
    const std::string arch = df.str("general.architecture", "");
    if (arch != moa_gguf_names::ARCH) {
        moa_throw(MOA_ERR_FORMAT, "'%s' has general.architecture '%s', expected an MoA drafter ('%s'); "
                  "convert a checkpoint with `moa-cpp convert`", df.path.c_str(), arch.c_str(), moa_gguf_names::ARCH);
    }
    const int64_t fmt = df.integer(K::FORMAT_VERSION, 1);
    if (fmt != (int64_t) moa_gguf_names::FORMAT_VERSION) {
        moa_throw(MOA_ERR_FORMAT, "'%s': drafter format version %lld is not supported (expected %u)", df.path.c_str(),
                  (long long) fmt, moa_gguf_names::FORMAT_VERSION);
    }
}

// The drafter's metadata. A missing required key throws here; values are checked by
// validate_drafter. n_target_layers may stay 0 (then the target GGUF supplies it).
moa_hparams read_drafter_hparams(const gguf_file & df, const moa_model_params & params) {
    moa_hparams hp;
    hp.n_embd   = (int32_t) df.integer(K::EMBEDDING_LENGTH);
    hp.n_head   = (int32_t) df.integer(K::HEAD_COUNT);
    hp.head_dim = (int32_t) df.integer(K::KEY_LENGTH);
    hp.sa_n_kv  = (int32_t) df.integer(K::SA_HEAD_KV);
    hp.sa_n_ff  = (int32_t) df.integer(K::SA_FFN);
    hp.ca_n_kv  = (int32_t) df.integer(K::CA_HEAD_KV);
    hp.ca_n_ff  = (int32_t) df.integer(K::CA_FFN);
    hp.n_target_layers = (int32_t) df.integer(K::TARGET_BLOCK_COUNT, 0);
    hp.target_n_kv     = (int32_t) df.integer(K::TARGET_HEAD_KV);
    hp.target_head_dim = (int32_t) df.integer(K::TARGET_KEY_LENGTH);
    hp.lsa_width    = (int32_t) df.integer(K::LSA_WIDTH);
    hp.lsa_n_head   = (int32_t) df.integer(K::LSA_HEAD_COUNT);
    hp.lsa_n_kv     = (int32_t) df.integer(K::LSA_HEAD_KV);
    hp.lsa_head_dim = (int32_t) df.integer(K::LSA_KEY_LENGTH);
    hp.lsa_n_ff     = (int32_t) df.integer(K::LSA_FFN);
    hp.rms_eps      = (float) df.real(K::RMS_EPS);
    hp.rope_base    = (float) df.real(K::ROPE_FREQ_BASE);
    hp.n_vocab_target = (int32_t) df.integer(K::VOCAB_SIZE);
    hp.tli          = params.tli >= 0 ? params.tli : (int32_t) df.integer(K::TLI, 0);
    const std::string role = df.str(K::ROLE, "full");
    if (role == "client") {
        hp.role = MOA_ROLE_CLIENT;
    } else if (role != "full") {
        moa_throw(MOA_ERR_FORMAT, "'%s': moa.role '%s' is not supported (expected 'full' or 'client')", df.path.c_str(),
                  role.c_str());
    }
    return hp;
}

// ---------------------------------------------------------------- validate

std::vector<std::string> nonpositive_sizes(const moa_hparams & hp) {
    std::vector<std::string> problems;
    auto positive = [&](const char * what, int64_t v) {
        if (v <= 0) problems.push_back(std::string(what) + " must be > 0");
    };
    positive(K::EMBEDDING_LENGTH, hp.n_embd);   positive(K::HEAD_COUNT, hp.n_head);
    positive(K::KEY_LENGTH, hp.head_dim);       positive(K::SA_HEAD_KV, hp.sa_n_kv);
    positive(K::CA_HEAD_KV, hp.ca_n_kv);        positive(K::SA_FFN, hp.sa_n_ff);
    positive(K::CA_FFN, hp.ca_n_ff);            positive(K::LSA_WIDTH, hp.lsa_width);
    positive(K::LSA_HEAD_COUNT, hp.lsa_n_head); positive(K::LSA_HEAD_KV, hp.lsa_n_kv);
    positive(K::LSA_KEY_LENGTH, hp.lsa_head_dim); positive(K::LSA_FFN, hp.lsa_n_ff);
    positive(K::TARGET_HEAD_KV, hp.target_n_kv); positive(K::TARGET_KEY_LENGTH, hp.target_head_dim);
    positive(K::VOCAB_SIZE, hp.n_vocab_target);
    return problems;
}

// Relations between sizes, and the layouts / RoPE variants the graphs implement.
void check_hparam_consistency(const gguf_file & df, const moa_hparams & hp, std::vector<std::string> & problems) {
    if (hp.n_head % hp.sa_n_kv || hp.n_head % hp.ca_n_kv) problems.push_back("SA/CA query heads must be a multiple of their KV heads");
    if (hp.lsa_n_head % hp.lsa_n_kv) problems.push_back("LSA query heads must be a multiple of its KV heads");
    if (hp.head_dim % 2 || hp.lsa_head_dim % 2) problems.push_back("head dims must be even (RoPE)");
    if (hp.lsa_width != 2 * hp.target_n_kv * hp.target_head_dim) {
        problems.push_back("moa.lsa.embedding_length must equal 2 * moa.target.head_count_kv * moa.target.key_length");
    }
    if (hp.tli < 0) problems.push_back("target layer inference N must be >= 0");
    if (hp.role == MOA_ROLE_CLIENT && hp.tli != 0) {
        problems.push_back("a client-role drafter (moa.role = client) needs TLI N == 0 (split mode does not send the TLI layers' K/V)");
    }
    const std::string layout = df.str(K::ROPE_QK_LAYOUT, "neox");
    if (layout != "neox") problems.push_back("moa.rope.qk_layout '" + layout + "' is not supported (expected 'neox')");
    const std::string in_layout = df.str(K::LSA_INPUT_LAYOUT, "hf");
    if (in_layout != "hf") problems.push_back("moa.lsa.input_layout '" + in_layout + "' is not supported (expected 'hf')");
    const std::string scaling = df.str(K::SA_ROPE_SCALING, "none");
    if (scaling != "none") problems.push_back("RoPE scaling '" + scaling + "' is not supported yet");
}

// The 29 trainable tensors: present, of the shape the hyper-parameters imply, of a usable type.
// A client-role file holds only the 16 the client runs: no LSA, no Ekv2E, no CA k/v (the
// server computes the CA K/V).
void check_drafter_shapes(const gguf_file & df, const moa_hparams & hp, std::vector<std::string> & problems) {
    const int64_t d = hp.n_embd, hd = (int64_t) hp.n_head * hp.head_dim, W = hp.lsa_width;
    const bool client = hp.role == MOA_ROLE_CLIENT;
    struct mod { const char * name; int64_t width, q, kv, ff; bool kv_weights; };
    const mod mods[] = {
        {"sa", d, hd, (int64_t) hp.sa_n_kv * hp.head_dim, hp.sa_n_ff, true},
        {"ca", d, hd, (int64_t) hp.ca_n_kv * hp.head_dim, hp.ca_n_ff, !client},
        {"lsa", W, (int64_t) hp.lsa_n_head * hp.lsa_head_dim, (int64_t) hp.lsa_n_kv * hp.lsa_head_dim, hp.lsa_n_ff, true},
    };
    for (const mod & md : mods) {
        if (client && std::strcmp(md.name, "lsa") == 0) continue;
        const std::string p = std::string(md.name) + ".";
        expect_shape(df, p + "attn_norm.weight", md.width, 1, true, problems);
        expect_shape(df, p + "attn_q.weight", md.width, md.q, false, problems);
        if (md.kv_weights) {
            expect_shape(df, p + "attn_k.weight", md.width, md.kv, false, problems);
            expect_shape(df, p + "attn_v.weight", md.width, md.kv, false, problems);
        }
        expect_shape(df, p + "attn_output.weight", md.q, md.width, false, problems);
        expect_shape(df, p + "ffn_norm.weight", md.width, 1, true, problems);
        expect_shape(df, p + "ffn_gate.weight", md.width, md.ff, false, problems);
        expect_shape(df, p + "ffn_up.weight", md.width, md.ff, false, problems);
        expect_shape(df, p + "ffn_down.weight", md.ff, md.width, false, problems);
    }
    if (client) return;
    expect_shape(df, moa_gguf_names::EKV2E_WEIGHT, W, d, false, problems);
    expect_shape(df, moa_gguf_names::EKV2E_BIAS, d, 1, true, problems);
}

// Optional reduced draft vocabulary: its own head + the draft->target id map, both or neither.
// (The map's values are checked once read, in load_drafter_weights.)
void check_reduced_vocab(const gguf_file & df, const moa_hparams & hp, std::vector<std::string> & problems) {
    const ggml_tensor * head = df.tensor(moa_gguf_names::DRAFT_OUTPUT);
    const ggml_tensor * map = df.tensor(moa_gguf_names::D2T);
    if (!head && !map) return;
    if (!head || !map) {
        problems.push_back("a reduced draft vocabulary needs both 'draft_output.weight' and 'd2t'");
    } else if (map->type != GGML_TYPE_I32 || ggml_n_dims(map) != 1 || head->ne[1] != map->ne[0]) {
        problems.push_back("'d2t' must be an I32 vector with one entry per draft_output.weight row");
    } else {
        expect_shape(df, moa_gguf_names::DRAFT_OUTPUT, hp.n_embd, head->ne[1], false, problems);
    }
}

void validate_drafter(const gguf_file & df, const moa_hparams & hp) {
    std::vector<std::string> problems = nonpositive_sizes(hp);
    // The other checks divide by these sizes and derive shapes from them: with a zero size they
    // would only bury the real problem under consequential ones.
    if (problems.empty()) {
        check_hparam_consistency(df, hp, problems);
        check_drafter_shapes(df, hp, problems);
        check_reduced_vocab(df, hp, problems);
    }
    report_problems(MOA_ERR_FORMAT, "invalid MoA drafter '" + df.path + "':", problems);
}

// ---------------------------------------------------------------- match target

// Where the tensors the drafter borrows (token embedding, LM head, TLI layers) come from: the
// target GGUF, or the drafter file itself when it bundles them under "target.".
struct target_source {
    std::unique_ptr<gguf_file> owned;  // the target GGUF, when one is given
    const gguf_file * file = nullptr;
    std::string prefix;                // of the borrowed tensors' names inside `file`
    std::string embd = "token_embd.weight";
    std::string out = "output.weight"; // == embd when the LM head is tied
};

// What the drafter was built for vs. what the target GGUF says. Adopts the target's layer count
// when the drafter records none.
std::vector<std::string> target_mismatches(const gguf_file & tf, const std::string & tarch, moa_hparams & hp) {
    std::vector<std::string> mism;
    auto tkey = [&](const char * suffix) { return tarch + "." + suffix; };
    const int64_t t_embd_n = tf.integer(tkey("embedding_length").c_str());
    const int64_t t_head   = tf.integer(tkey("attention.head_count").c_str(), INT64_MIN, true);
    const int64_t t_kv     = tf.integer(tkey("attention.head_count_kv").c_str(), t_head, true);
    // the layers the drafter follows: those with a KV cache (a hybrid's attention layers, where
    // head_count_kv is listed per layer with 0 on the recurrent ones), as the capture finds them
    const int64_t kv_layers = tf.nonzero_layers(tkey("attention.head_count_kv").c_str());
    const int64_t t_layers  = kv_layers > 0 ? kv_layers : tf.integer(tkey("block_count").c_str());
    const int64_t t_hd     = tf.integer(tkey("attention.key_length").c_str(), t_head > 0 ? t_embd_n / t_head : 0);
    char buf[256];
    if (hp.n_target_layers == 0) {
        hp.n_target_layers = (int32_t) t_layers;
    } else if (hp.n_target_layers != t_layers) {
        snprintf(buf, sizeof(buf), "layer count: drafter expects %d target layers, target has %lld", hp.n_target_layers, (long long) t_layers);
        mism.push_back(buf);
    }
    if (t_embd_n != hp.n_embd) {
        snprintf(buf, sizeof(buf), "width: drafter n_embd %d, target n_embd %lld", hp.n_embd, (long long) t_embd_n);
        mism.push_back(buf);
    }
    if (t_kv != hp.target_n_kv) {
        snprintf(buf, sizeof(buf), "KV heads: drafter expects %d, target has %lld", hp.target_n_kv, (long long) t_kv);
        mism.push_back(buf);
    }
    if (t_hd != hp.target_head_dim) {
        snprintf(buf, sizeof(buf), "head dim: drafter expects %d, target has %lld", hp.target_head_dim, (long long) t_hd);
        mism.push_back(buf);
    }
    const ggml_tensor * te = tf.tensor("token_embd.weight");
    if (!te) {
        mism.push_back("target has no 'token_embd.weight'");
    } else if (te->ne[1] != hp.n_vocab_target) {
        snprintf(buf, sizeof(buf), "vocabulary: drafter %d tokens, target %lld", hp.n_vocab_target, (long long) te->ne[1]);
        mism.push_back(buf);
    }
    return mism;
}

void match_target_gguf(const gguf_file & df, const gguf_file & tf, moa_hparams & hp) {
    const std::string tarch = tf.str("general.architecture", "");
    if (tarch.empty() || tarch == moa_gguf_names::ARCH) {
        moa_throw(MOA_ERR_FORMAT, "'%s' is not a target model GGUF (general.architecture '%s')", tf.path.c_str(), tarch.c_str());
    }
    report_problems(MOA_ERR_MISMATCH, "drafter '" + df.path + "' does not match target '" + tf.path + "':",
                    target_mismatches(tf, tarch, hp));
    // The SA was trained on the target's layer-0 input: Gemma-style targets feed
    // sqrt(n_embd) * embedding to layer 0 (moa-target-arch.h).
    hp.embd_scale = (float) df.real(K::EMBEDDING_SCALE, moa_target_arch::embedding_scale(tarch, hp.n_embd));
}

target_source open_target(const gguf_file & df, const char * target_path, moa_hparams & hp) {
    target_source src;
    const std::string tp = moa_gguf_names::TARGET_PREFIX;
    if (target_path) {
        src.owned = std::make_unique<gguf_file>(target_path, "target");
        src.file = src.owned.get();
        match_target_gguf(df, *src.file, hp);
        if (!src.file->tensor(src.out)) src.out = src.embd;
    } else if (df.tensor(tp + "token_embd.weight")) {
        src.file = &df;
        src.prefix = tp;
        src.embd = tp + "token_embd.weight";
        src.out = df.tensor(tp + "output.weight") ? tp + "output.weight" : src.embd;
        hp.embd_scale = (float) df.real(K::EMBEDDING_SCALE, 1.0);
        if (hp.n_target_layers == 0) moa_throw(MOA_ERR_FORMAT, "'%s' does not record the target layer count", df.path.c_str());
    } else {
        moa_throw(MOA_ERR_INVALID_ARGUMENT, "a target GGUF is required: '%s' does not bundle the target's tensors", df.path.c_str());
    }
    const ggml_tensor * te = src.file->tensor(src.embd), * to = src.file->tensor(src.out);
    if (!te || te->ne[0] != hp.n_embd || !supported_weight_type(te->type) ||
        !to || to->ne[0] != hp.n_embd || to->ne[1] != hp.n_vocab_target || !supported_weight_type(to->type)) {
        moa_throw(MOA_ERR_FORMAT, "target token embedding / LM head missing, of unsupported type or of the wrong shape");
    }
    return src;
}

// The target hyper-parameters the reused layers need.
void read_tli_hparams(const gguf_file & tsf, const std::string & tarch, moa_hparams & hp) {
    const std::string ak = tarch + ".";
    hp.t_n_head    = (int32_t) tsf.integer((ak + "attention.head_count").c_str(), 0);
    hp.t_rms_eps   = (float) tsf.real((ak + "attention.layer_norm_rms_epsilon").c_str(), 1e-5);
    hp.t_rope_base = (float) tsf.real((ak + "rope.freq_base").c_str(), 10000.0);
    hp.t_rope_dims = (int32_t) tsf.integer((ak + "rope.dimension_count").c_str(), hp.target_head_dim);
}

// The last N target layers + output_norm: shapes of a plain llama block, no biases, no RoPE
// scaling (moa_build_tli_layer implements exactly that).
void check_tli_layers(const target_source & src, const std::string & tarch, const moa_hparams & hp,
                      std::vector<std::string> & bad) {
    const gguf_file & tsf = *src.file;
    const std::string scaling = tsf.str((tarch + ".rope.scaling.type").c_str(), "none");
    if (scaling != "none" || tsf.tensor(src.prefix + "rope_freqs.weight")) {
        bad.push_back("TLI with RoPE scaling / rope_freqs (Llama-3.1 style) is not supported yet");
    }
    if (hp.t_n_head <= 0 || hp.t_n_head % hp.target_n_kv) bad.push_back("target head counts are inconsistent");
    const int64_t d = hp.n_embd, D = hp.target_head_dim;
    for (int32_t l = hp.n_target_layers - hp.tli; l < hp.n_target_layers; ++l) {
        const std::string b = src.prefix + "blk." + std::to_string(l) + ".";
        const int64_t ff = tsf.tensor(b + "ffn_up.weight") ? tsf.tensor(b + "ffn_up.weight")->ne[1] : 0;
        expect_shape(tsf, b + "attn_norm.weight", d, 1, true, bad);
        expect_shape(tsf, b + "attn_q.weight", d, hp.t_n_head * D, false, bad);
        expect_shape(tsf, b + "attn_k.weight", d, hp.target_n_kv * D, false, bad);
        expect_shape(tsf, b + "attn_v.weight", d, hp.target_n_kv * D, false, bad);
        expect_shape(tsf, b + "attn_output.weight", hp.t_n_head * D, d, false, bad);
        expect_shape(tsf, b + "ffn_norm.weight", d, 1, true, bad);
        expect_shape(tsf, b + "ffn_gate.weight", d, ff, false, bad);
        expect_shape(tsf, b + "ffn_up.weight", d, ff, false, bad);
        expect_shape(tsf, b + "ffn_down.weight", ff, d, false, bad);
        for (const char * bias : {"attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias"}) {
            if (tsf.tensor(b + bias)) bad.push_back("target layer biases are not supported for TLI");
        }
    }
    expect_shape(tsf, src.prefix + "output_norm.weight", d, 1, true, bad);
}

// TLI N > 0 runs the target's last N decoder layers: the architectures the target-arch table
// marks tli (a plain llama block, ref docs/drafter.md#tli).
void match_tli(const target_source & src, moa_hparams & hp) {
    if (hp.tli <= 0) return;
    const std::string tarch = src.file->str(src.prefix.empty() ? "general.architecture" : K::TARGET_ARCH,
                                            moa_target_arch::UNRECORDED);
    const moa_target_arch::target_arch arch = moa_target_arch::lookup(tarch);
    std::vector<std::string> bad;
    if (!arch.tli) {
        bad.push_back("TLI N > 0 needs a " + moa_target_arch::tli_names() + "-architecture target (got '" + tarch + "')");
    }
    if (hp.tli >= hp.n_target_layers) bad.push_back("TLI N must be below the target layer count");
    hp.t_qk_permuted = arch.qk_permuted;
    // Layer checks only make sense for a supported target that has the layers.
    if (bad.empty()) {
        read_tli_hparams(*src.file, tarch, hp);
        check_tli_layers(src, tarch, hp, bad);
    }
    report_problems(MOA_ERR_MISMATCH, "cannot run target layer inference N=" + std::to_string(hp.tli) + ":", bad);
}

// ---------------------------------------------------------------- load

// Only the device is chosen here: each moa_state creates its own backend instances on it
// (backends keep per-compute scratch memory, so states sharing one could not run concurrently).
void pick_model_device(moa_model & m, const moa_model_params & params) {
    m.dev = pick_device(params.device);
    if (!m.dev) moa_throw(MOA_ERR_BACKEND, "no ggml backend device available");
    m.device_name = ggml_backend_dev_name(m.dev);
    m.n_threads = params.n_threads > 0 ? params.n_threads : (int32_t) std::max(1u, std::thread::hardware_concurrency());
}

// Drafter weights are always copied (small, and may be converted per device).
void load_drafter_weights(moa_model & m, const gguf_file & df) {
    tensor_list dl;
    add_layer_tensors(dl, "sa.", m.sa);
    add_layer_tensors(dl, "ca.", m.ca);
    if (m.hp.role == MOA_ROLE_CLIENT) {
        // No CA k/v, LSA, Ekv2E in a client file: those slots stay NULL (commit / compute_ca
        // refuse a client-role model before building a graph).
        dl.erase(std::remove_if(dl.begin(), dl.end(), [](const auto & e) {
            return e.first == "ca.attn_k.weight" || e.first == "ca.attn_v.weight";
        }), dl.end());
    } else {
        add_layer_tensors(dl, "lsa.", m.lsa);
        dl.push_back({moa_gguf_names::EKV2E_WEIGHT, &m.ekv2e_w});
        dl.push_back({moa_gguf_names::EKV2E_BIAS, &m.ekv2e_b});
    }
    ggml_tensor * draft_head = nullptr;
    if (df.tensor(moa_gguf_names::DRAFT_OUTPUT)) dl.push_back({moa_gguf_names::DRAFT_OUTPUT, &draft_head});
    load_tensors(m, df, dl, "", false);
    if (!draft_head) return;

    const ggml_tensor * map = df.tensor(moa_gguf_names::D2T);
    m.d2t.resize(map->ne[0]);
    read_at(df.path, df.offset_of(moa_gguf_names::D2T), m.d2t.data(), m.d2t.size() * sizeof(int32_t));
    for (int32_t id : m.d2t) {
        if (id < 0 || id >= m.hp.n_vocab_target) moa_throw(MOA_ERR_FORMAT, "'d2t' holds an id outside the target vocabulary");
    }
    m.output = draft_head;
    m.hp.n_vocab = (int32_t) m.d2t.size();
}

// Token embedding, and the LM head unless the drafter has its own reduced one. Mapped on CPU
// when allowed: the embedding can be the largest tensor of the target.
void load_target_tensors(moa_model & m, const target_source & src, bool use_mmap) {
    const bool own_head = m.output != nullptr;
    tensor_list tl;
    tl.push_back({src.embd, &m.tok_embd});
    ggml_tensor * target_out = nullptr;
    if (!own_head && src.out != src.embd) tl.push_back({src.out, &target_out});
    load_tensors(m, *src.file, tl, "target.", use_mmap);
    if (!own_head) {
        m.output = target_out ? target_out : m.tok_embd;
        m.hp.n_vocab = m.hp.n_vocab_target;
    }
}

// TLI layers are copied, not mapped: q/k rows permuted by llama.cpp's converter are rewritten
// to HF order.
void load_tli_layers(moa_model & m, const target_source & src) {
    const moa_hparams & hp = m.hp;
    if (hp.tli <= 0) return;
    m.tli.resize(hp.tli);
    tensor_list ll;
    for (int32_t i = 0; i < hp.tli; ++i) {
        add_layer_tensors(ll, src.prefix + "blk." + std::to_string(hp.n_target_layers - hp.tli + i) + ".", m.tli[i]);
    }
    ll.push_back({src.prefix + "output_norm.weight", &m.output_norm});
    load_tensors(m, *src.file, ll, "target.", false, hp.t_qk_permuted ? hp.target_head_dim : 0);
}

// The trainer's held-out acceptance per depth: only a prior for the cost-aware policy, so a
// missing, mistyped or out-of-range array is dropped (empty), never an error.
std::vector<float> read_acceptance(const gguf_file & df) {
    const int64_t id = df.key(K::EVAL_ACCEPTANCE);
    if (id < 0 || gguf_get_kv_type(df.gctx, id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(df.gctx, id) != GGUF_TYPE_FLOAT32) {
        return {};
    }
    const float * v = (const float *) gguf_get_arr_data(df.gctx, id);
    std::vector<float> out(v, v + gguf_get_arr_n(df.gctx, id));
    for (float a : out) {
        if (!(a >= 0.0f && a <= 1.0f)) return {};
    }
    return out;
}

}  // namespace

// ---------------------------------------------------------------- public (moa-model.h)

// A local GPU: GPU-type devices of llama.cpp's RPC backend live on other machines (they hold a
// target's offloaded layers with --rpc); the drafter stays on this one.
bool is_local_gpu(ggml_backend_dev_t d) {
    if (ggml_backend_dev_type(d) != GGML_BACKEND_DEVICE_TYPE_GPU) return false;
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(d);
    return !(reg && lower(ggml_backend_reg_name(reg)) == "rpc");
}

void moa_backend_set_threads(ggml_backend_t backend, int32_t n_threads) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    if (!dev || ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU) return;
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto fn = (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
    if (fn) fn(backend, n_threads);
}

moa_model::~moa_model() {
    for (auto b : bufs) ggml_backend_buffer_free(b);
    for (auto c : ctxs) ggml_free(c);
    for (auto & m : mmaps) munmap(m.first, m.second);
}

// Everything that can be wrong with the user's files is found before the first allocation;
// every tensor access after validate_drafter / open_target / match_tli is to a checked tensor.
moa_model * moa_model_load_impl(const char * drafter_path, const char * target_path, const moa_model_params & params) {
    if (!drafter_path) moa_throw(MOA_ERR_INVALID_ARGUMENT, "drafter path is NULL");
    gguf_file df(drafter_path, "drafter");
    check_drafter_identity(df);

    auto m = std::make_unique<moa_model>();
    m->hp = read_drafter_hparams(df, params);
    validate_drafter(df, m->hp);
    const target_source src = open_target(df, target_path, m->hp);
    match_tli(src, m->hp);

    m->acceptance = read_acceptance(df);
    pick_model_device(*m, params);
    load_drafter_weights(*m, df);
    load_target_tensors(*m, src, params.use_mmap);
    load_tli_layers(*m, src);

    const moa_hparams & hp = m->hp;
    MOA_LOG_INFO("moa: loaded drafter '%s' on %s: d=%d H=%d D=%d L=%d W=%d vocab=%d tli=%d%s",
                 drafter_path, m->device_name.c_str(), hp.n_embd, hp.n_head, hp.head_dim, hp.n_target_layers,
                 hp.lsa_width, hp.n_vocab, hp.tli, hp.role == MOA_ROLE_CLIENT ? " role=client" : "");
    return m.release();
}
