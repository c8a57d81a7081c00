#include "engine/kv_cache.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "common/error.h"
#include "common/half.h"

namespace kvgen {

void KvCache::Free::operator()(void* p) const { std::free(p); }

namespace {
// MemAvailable from /proc/meminfo in bytes, or 0 when unknown.
uint64_t available_memory() {
    std::FILE* f = std::fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    uint64_t kib = 0;
    while (std::fgets(line, sizeof(line), f))
        if (std::sscanf(line, "MemAvailable: %" SCNu64 " kB", &kib) == 1) break;
    std::fclose(f);
    return kib * 1024;
}
}  // namespace

KvCache::KvCache(const Config& c, int n_ctx, KvType type) : layout_(KvLayout::of(c, n_ctx, type)) {
    const size_t bytes = layout_.bytes();
    const uint64_t available = available_memory();
    auto fail = [&](const std::string& why) {
        return Error(fmt::format("cannot allocate the KV cache: {} bytes needed for {} positions{} (lower --ctx-size)",
                                 bytes, n_ctx, why));
    };
    if (available != 0 && bytes > available) throw fail(fmt::format(", {} bytes available", available));
    k_.reset(std::calloc(bytes / 2, 1));
    v_.reset(std::calloc(bytes / 2, 1));
    if (!k_ || !v_) throw fail("");
    // note: touch every page now, so the cache is resident from the start: memory stays flat while positions fill,
    // and a cache that does not fit fails here rather than partway through a run.
    std::memset(k_.get(), 0, bytes / 2);
    std::memset(v_.get(), 0, bytes / 2);
}

void KvCache::write(int l, int pos0, int n, const float* k, const float* v) {
    const int n_kv_heads = layout_.n_kv_heads, head_dim = layout_.head_dim;
    for (int i = 0; i < n; ++i) {
        for (int h = 0; h < n_kv_heads; ++h) {
            const int64_t off = layout_.offset(l, h, pos0 + i);
            const float* ks = k + (int64_t(i) * n_kv_heads + h) * head_dim;
            const float* vs = v + (int64_t(i) * n_kv_heads + h) * head_dim;
            if (layout_.type == KvType::F16) {
                auto* kd = static_cast<uint16_t*>(k_.get()) + off;
                auto* vd = static_cast<uint16_t*>(v_.get()) + off;
                for (int j = 0; j < head_dim; ++j) {
                    kd[j] = fp32_to_fp16(ks[j]);
                    vd[j] = fp32_to_fp16(vs[j]);
                }
            } else {
                std::memcpy(static_cast<float*>(k_.get()) + off, ks, size_t(head_dim) * 4);
                std::memcpy(static_cast<float*>(v_.get()) + off, vs, size_t(head_dim) * 4);
            }
        }
    }
}

}  // namespace kvgen
