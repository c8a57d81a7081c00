#include "engine/kv_layout.h"

#include <fmt/format.h>

#include "common/error.h"
#include "model/config.h"

namespace kvgen {

const char* kv_type_name(KvType t) { return t == KvType::F16 ? "f16" : "f32"; }

const char* kv_type_names() { return "f16, f32"; }

KvType kv_type_from_name(const std::string& name, const char* option) {
    for (KvType t : {KvType::F16, KvType::F32})
        if (name == kv_type_name(t)) return t;
    throw Error(fmt::format("{} '{}': expected one of {}", option, name, kv_type_names()));
}

KvLayout KvLayout::of(const Config& c, int n_ctx, KvType type) {
    return KvLayout{c.n_layers, c.n_kv_heads, n_ctx, c.head_dim, type};
}

}  // namespace kvgen
