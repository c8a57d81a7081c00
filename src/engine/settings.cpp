#include "engine/settings.h"

#include <algorithm>

#include "model/config.h"

namespace kvgen {

int Settings::context_size(const Config& c) const { return n_ctx > 0 ? n_ctx : std::min(c.n_ctx_train, kDefaultCtx); }

int Settings::batch_size(int ctx) const { return std::max(1, std::min(n_batch, ctx)); }

const char* math_mode_name(MathMode m) {
    switch (m) {
        case MathMode::Fast: return "fast";
        case MathMode::F32: return "f32";
        default: return "exact";
    }
}

bool math_mode_from_name(const std::string& s, MathMode* m) {
    for (MathMode v : {MathMode::Exact, MathMode::Fast, MathMode::F32})
        if (s == math_mode_name(v)) {
            *m = v;
            return true;
        }
    return false;
}

int cuda_device_index(const std::string& device) {
    return device.rfind("cuda", 0) == 0 && device.size() > 4 ? std::stoi(device.substr(4)) : 0;
}

}  // namespace kvgen
