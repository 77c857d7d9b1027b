#include "moa-target-arch.h"

#include <cmath>

namespace moa_target_arch {

namespace {

constexpr embd_scale ONE = embd_scale::one, SQRT = embd_scale::sqrt_n_embd;

// name              qk_permuted scale  tli    capture
const std::vector<target_arch> TABLE = {
    {"llama", true,  ONE,  true,  true},
    {"mistral3", true,  ONE,  false, true},
    {"granite", true,  ONE,  false, true},
    {"deci", true,  ONE,  false, false},
    {"qwen2", false, ONE,  false, true},
    {"gemma", false, SQRT, false, true},
    {"gemma2", false, SQRT, false, true},
    {"gemma3", false, SQRT, false, true},
    {"gemma3n", false, SQRT, false, false},
    {"gemma-embedding", false, SQRT, false, false},
    {"gemma4", false, SQRT, false, false},
    {"gemma4-assistant", false, SQRT, false, false},
    // K/V capture checked against transformers on tiny checkpoints (tests/test_archs.py)
    {"qwen3", false, ONE,  false, true},
    {"qwen3moe", false, ONE,  false, true},
    {"qwen2moe", false, ONE,  false, true},
    {"phi3", false, ONE,  false, true},
    {"gpt-oss", false, ONE,  false, true},
    {"olmo2", false, ONE,  false, true},
    {"olmo", true,  ONE,  false, true},
    {"granitemoe", true,  ONE,  false, true},
    {"smollm3", true,  ONE,  false, true},
    {"glm4", false, ONE,  false, true},
    {"stablelm", false, ONE,  false, true},
    {"starcoder2", false, ONE,  false, true},
    {"seed_oss", false, ONE,  false, true},
    {"command-r", false, ONE,  false, true},
    {"arcee", true,  ONE,  false, true},
    {"ernie4_5", false, ONE,  false, true},
    {"gpt2", false, ONE,  false, true},
    {"gptneox", false, ONE,  false, true},
    {"bloom", false, ONE,  false, true},
    {"lfm2", false, ONE,  false, true},
    {"qwen3next", false, ONE,  false, true},
};

std::string join_names(bool target_arch::*flag) {
    std::string out;
    for (const target_arch & a : TABLE) {
        if (a.*flag) out += std::string(out.empty() ? "" : "/") + a.name;
    }
    return out;
}

}  // namespace

const std::vector<target_arch> & all() { return TABLE; }

const target_arch * find(const std::string & name) {
    for (const target_arch & a : TABLE) {
        if (name == a.name) return &a;
    }
    return nullptr;
}

target_arch lookup(const std::string & name) {
    const target_arch * a = find(name);
    return a ? *a : target_arch{"", false, ONE, false, false};
}

double embedding_scale(const std::string & name, int64_t n_embd) {
    return lookup(name).scale == SQRT ? std::sqrt((double) n_embd) : 1.0;
}

std::string tli_names() { return join_names(&target_arch::tli); }

}  // namespace moa_target_arch
