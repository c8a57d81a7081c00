#include "engine/kv_layout.h"

#include <fmt/format.h>

#include "common/error.h"
#include "engine/rope.h"
#include "model/config.h"

namespace kvgen {

const char* kv_type_name(KvType t) {
    switch (t) {
        case KvType::F16: return "f16";
        case KvType::F32: return "f32";
        case KvType::Q8_0: return "q8_0";
        case KvType::Q4_0: return "q4_0";
    }
    return "?";
}

const char* kv_type_names() { return "f16, f32, q8_0, q4_0"; }

KvType kv_type_from_name(const std::string& name, const char* option) {
    for (KvType t : {KvType::F16, KvType::F32, KvType::Q8_0, KvType::Q4_0})
        if (name == kv_type_name(t)) return t;
    throw Error(fmt::format("{} '{}': expected one of {}", option, name, kv_type_names()));
}

std::string kv_types_name(KvType k, KvType v) {
    return k == v ? std::string(kv_type_name(k)) : fmt::format("{}/{}", kv_type_name(k), kv_type_name(v));
}

void kv_types_from_name(const std::string& name, const char* option, KvType* k, KvType* v) {
    const size_t slash = name.find('/');
    if (slash == std::string::npos) {
        *k = *v = kv_type_from_name(name, option);
        return;
    }
    try {
        *k = kv_type_from_name(name.substr(0, slash), option);
        *v = kv_type_from_name(name.substr(slash + 1), option);
    } catch (const Error&) {
        throw Error(fmt::format("{} '{}': expected a type or K/V types, each one of {}", option, name,
                                kv_type_names()));
    }
}

KvLayout KvLayout::of(const Config& c, int n_ctx, KvType k_type, KvType v_type) {
    KvLayout kv{c.n_layers, c.n_kv_heads, n_ctx, c.head_dim, k_type, v_type, c.head_dim};
    if (!kv_type_quantized(k_type)) return kv;
    // note: inv_freq falls with j, so the pairs that turn slowly enough are the last ones; dimensions past rope_dim
    // do not turn at all.
    const RopeFreqs r = RopeFreqs::of(c, {});
    int j = c.rope_dim / 2;
    while (j > 0 && rope_theta(n_ctx, j - 1, r.inv_freq.data(), nullptr, r.pos_div) <= 1.0) --j;
    kv.k_offset_dim0 = 2 * j;
    return kv;
}

}  // namespace kvgen
