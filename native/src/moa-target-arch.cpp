#include "moa-target-arch.h"

#include <cmath>

namespace moa_target_arch {

namespace {

// llama.cpp names K / V "Kcur-<il>" / "Vcur-<il>" in every graph (llama-context.cpp
// graph_get_cb); gemma3 names its K-norm output "Kcur_normed" and then its ROPE "Kcur".
constexpr const char * K = "Kcur";
constexpr const char * V = "Vcur";
constexpr embd_scale ONE = embd_scale::one, SQRT = embd_scale::sqrt_n_embd;

// name              qk_permuted scale  tli    capture k  v
const std::vector<target_arch> TABLE = {
    {"llama",            true,  ONE,  true,  true,  K, V},
    {"mistral",          true,  ONE,  false, false, K, V},
    {"granite",          true,  ONE,  false, false, K, V},
    {"deci",             true,  ONE,  false, false, K, V},
    {"qwen2",            false, ONE,  false, true,  K, V},
    {"gemma",            false, SQRT, false, false, K, V},
    {"gemma2",           false, SQRT, false, false, K, V},
    {"gemma3",           false, SQRT, false, true,  K, V},
    {"gemma3n",          false, SQRT, false, false, K, V},
    {"gemma-embedding",  false, SQRT, false, false, K, V},
    {"gemma4",           false, SQRT, false, false, K, V},
    {"gemma4-assistant", false, SQRT, false, false, K, V},
};

std::string join_names(bool target_arch::*flag) {
    std::string out;
    for (const target_arch & a : TABLE) {
        if (a.*flag) out += std::string(out.empty() ? "" : "/") + a.name;
    }
    return out;
}

std::vector<std::string> distinct(const char * target_arch::*field) {
    std::vector<std::string> out;
    for (const target_arch & a : TABLE) {
        bool seen = false;
        for (const std::string & s : out) seen = seen || s == a.*field;
        if (!seen) out.push_back(a.*field);
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
    return a ? *a : target_arch{"", false, ONE, false, false, K, V};
}

double embedding_scale(const std::string & name, int64_t n_embd) {
    return lookup(name).scale == SQRT ? std::sqrt((double) n_embd) : 1.0;
}

std::string tli_names() { return join_names(&target_arch::tli); }
std::string capture_names() { return join_names(&target_arch::capture); }

const std::vector<std::string> & k_nodes() {
    static const std::vector<std::string> names = distinct(&target_arch::k_node);
    return names;
}

const std::vector<std::string> & v_nodes() {
    static const std::vector<std::string> names = distinct(&target_arch::v_node);
    return names;
}

}  // namespace moa_target_arch
