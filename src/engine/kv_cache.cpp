#include "engine/kv_cache.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "common/error.h"
#include "common/half.h"
#include "engine/kv_rotation.h"
#include "model/quantize.h"

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
    if (kv_type_quantized(type) && c.head_dim % 32 != 0)
        throw Error(fmt::format("--kv-type {}: quantized cache rows are blocks of 32 values, and this model's head_dim "
                                "is {} (use f16 or f32)",
                                kv_type_name(type), c.head_dim));
    const size_t bytes = layout_.bytes();
    const uint64_t available = available_memory();
    auto fail = [&](const std::string& why) {
        return Error(fmt::format("cannot allocate the KV cache: {} bytes needed for {} positions{} (lower --ctx-size)",
                                 bytes, n_ctx, why));
    };
    if (available != 0 && bytes > available)
        throw fail(fmt::format(", {} bytes available: at most {} positions fit at {} ({} bytes each; a quantized "
                               "--kv-type holds more)",
                               available, available / uint64_t(layout_.bytes_per_token()), kv_type_name(type),
                               layout_.bytes_per_token()));
    rotated_.resize(size_t(2 * c.head_dim));
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
    const int64_t rb = layout_.row_bytes();
    // note: a quantized row is stored in the rotated basis of kv_rotation.h: H x per piece, then quantized.
    float* kr = rotated_.data();
    float* vr = kr + head_dim;
    auto rotate = [&](float* dst, const float* src) {
        for (int j = 0; j < head_dim; ++j) dst[j] = src[j];
        kv_rotate(dst, head_dim);
    };
    for (int i = 0; i < n; ++i) {
        for (int h = 0; h < n_kv_heads; ++h) {
            const int64_t off = layout_.row_index(l, h, pos0 + i) * rb;
            char* kd = static_cast<char*>(k_.get()) + off;
            char* vd = static_cast<char*>(v_.get()) + off;
            const float* ks = k + (int64_t(i) * n_kv_heads + h) * head_dim;
            const float* vs = v + (int64_t(i) * n_kv_heads + h) * head_dim;
            switch (layout_.type) {
                case KvType::F16:
                    for (int j = 0; j < head_dim; ++j) {
                        reinterpret_cast<uint16_t*>(kd)[j] = fp32_to_fp16(ks[j]);
                        reinterpret_cast<uint16_t*>(vd)[j] = fp32_to_fp16(vs[j]);
                    }
                    break;
                case KvType::F32:
                    std::memcpy(kd, ks, size_t(head_dim) * 4);
                    std::memcpy(vd, vs, size_t(head_dim) * 4);
                    break;
                case KvType::Q8_0:
                    rotate(kr, ks);
                    rotate(vr, vs);
                    quantize_row_q8_0(kr, kd, head_dim);
                    quantize_row_q8_0(vr, vd, head_dim);
                    break;
                case KvType::Q4_0:
                    rotate(kr, ks);
                    rotate(vr, vs);
                    quantize_row_q4_0(kr, kd, head_dim);
                    quantize_row_q4_0(vr, vd, head_dim);
                    break;
            }
        }
    }
}

}  // namespace kvgen
