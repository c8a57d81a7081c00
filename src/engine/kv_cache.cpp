#include "engine/kv_cache.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "common/error.h"
#include "common/half.h"

namespace kvgen {

void KvCache::Free::operator()(void* p) const { std::free(p); }

KvCache::KvCache(const Config& c, int n_ctx, KvType type)
    : type_(type), n_layers_(c.n_layers), n_kv_heads_(c.n_kv_heads), head_dim_(c.head_dim), n_ctx_(n_ctx) {
    bytes_ = bytes_needed(c, n_ctx, type);
    // note: calloc maps zero pages lazily, so an oversized cache fails here (or costs nothing until used) rather
    // than touching every page up front.
    k_.reset(std::calloc(bytes_ / 2, 1));
    v_.reset(std::calloc(bytes_ / 2, 1));
    if (!k_ || !v_)
        throw Error(fmt::format("cannot allocate the KV cache: {} bytes needed for {} positions (lower --ctx-size)",
                                bytes_, n_ctx));
}

void KvCache::write(int l, int pos0, int n, const float* k, const float* v) {
    const int kv_dim = n_kv_heads_ * head_dim_;
    for (int i = 0; i < n; ++i) {
        for (int h = 0; h < n_kv_heads_; ++h) {
            const int64_t off = offset(l, h, pos0 + i);
            const float* ks = k + int64_t(i) * kv_dim + int64_t(h) * head_dim_;
            const float* vs = v + int64_t(i) * kv_dim + int64_t(h) * head_dim_;
            if (type_ == KvType::F16) {
                auto* kd = static_cast<uint16_t*>(k_.get()) + off;
                auto* vd = static_cast<uint16_t*>(v_.get()) + off;
                for (int j = 0; j < head_dim_; ++j) {
                    kd[j] = fp32_to_fp16(ks[j]);
                    vd[j] = fp32_to_fp16(vs[j]);
                }
            } else {
                std::memcpy(static_cast<float*>(k_.get()) + off, ks, size_t(head_dim_) * 4);
                std::memcpy(static_cast<float*>(v_.get()) + off, vs, size_t(head_dim_) * 4);
            }
        }
    }
}

}  // namespace kvgen
