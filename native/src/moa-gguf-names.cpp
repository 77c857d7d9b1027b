#include "moa-gguf-names.h"

#include <cstdint>

namespace moa_gguf_names {

std::vector<std::string> required_tensors() {
    std::vector<std::string> out;
    for (const char * m : MODULES) {
        for (const char * s : LAYER_SUFFIXES) {
            out.push_back(std::string(m) + "." + s);
        }
    }
    out.push_back(EKV2E_WEIGHT);
    out.push_back(EKV2E_BIAS);
    return out;
}

}  // namespace moa_gguf_names
