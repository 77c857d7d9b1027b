// The C++ table of target architectures: what the native code does differently per llama.cpp
// architecture (general.architecture of the target GGUF). Twin of the table in moa_cpp/arch.py;
// tests/test_arch_tables.py checks that both know the same architectures with the same facts,
// through moa_target_arch_count() / moa_target_arch_name() / moa_target_arch_flags() (moa.h).
//
// Read by the loader (layer-0 embedding scale, which targets TLI can run, whether their Q/K
// rows were permuted). The capture needs no row: it takes what every architecture writes into
// llama.cpp's KV cache (moa-capture.cpp). An architecture not in the table gets the defaults of
// lookup(): embedding scale 1, no TLI, Q/K rows taken as not permuted.
// Adding an architecture: one row here, one in moa_cpp/arch.py.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moa_target_arch {

// Factor the target applies to a token_embd row before layer 0 (the SA input uses the same).
enum class embd_scale { one, sqrt_n_embd };

struct target_arch {
    const char * name;        // general.architecture, as llama.cpp spells it
    bool         qk_permuted; // NORM RoPE: Q/K rows permuted per head (docs/drafter.md#k-permutation)
    embd_scale   scale;       // Gemma graphs: ggml_scale(inpL, sqrtf(n_embd)) (src/models/gemma*.cpp)
    bool         tli;         // TLI N > 0 can run its decoder layers (a plain llama block, ref docs/drafter.md#tli)
    bool         capture;     // the K/V capture is checked against transformers on its graph (tests)
};

// What a bundled drafter (target tensors inside the drafter file) that does not record
// moa.target.architecture is taken to be for: the reference target family.
constexpr const char * UNRECORDED = "llama";

// Every architecture the table knows, in table order.
const std::vector<target_arch> & all();
// The row of `name`, or nullptr for an architecture the table does not know.
const target_arch * find(const std::string & name);
// The row of `name`, or the defaults above (with name "") for one the table does not know.
target_arch lookup(const std::string & name);

// Layer-0 embedding scale of a target of this architecture and width.
double embedding_scale(const std::string & name, int64_t n_embd);
// Names of the rows with tli set, joined with "/" (for error messages).
std::string tli_names();

}  // namespace moa_target_arch
