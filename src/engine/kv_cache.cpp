#include "engine/kv_cache.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "common/error.h"
#include "common/half.h"
#include "engine/kv_blocks.h"
#include "engine/kv_offset.h"
#include "engine/kv_rotation.h"
#include "model/dequant.h"
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

void kv_encode_row(KvType t, const float* x, void* dst, int head_dim, float* tmp, const float* offset) {
    switch (t) {
        case KvType::F16:
            fp32_to_fp16_row(x, static_cast<uint16_t*>(dst), head_dim);
            return;
        case KvType::F32:
            std::memcpy(dst, x, size_t(head_dim) * 4);
            return;
        case KvType::Q8_0:
        case KvType::Q4_0:
            // note: a quantized row is stored in the rotated basis of kv_rotation.h: H x per piece, then quantized.
            std::memcpy(tmp, x, size_t(head_dim) * 4);
            kv_rotate(tmp, head_dim);
            if (offset)
                for (int j = 0; j < head_dim; ++j) tmp[j] -= offset[j];
            if (t == KvType::Q8_0)
                quantize_row_q8_0(tmp, dst, head_dim);
            else
                for (int b = 0; b < head_dim / 32; ++b) {
                    auto* y = static_cast<uint8_t*>(dst) + 18 * b;
                    int8_t l[32];
                    const uint16_t d = fp32_to_fp16(kv_q4_0_levels(tmp + 32 * b, l));
                    std::memcpy(y, &d, 2);
                    kv_q4_0_pack(l, y + 2);
                }
            return;
    }
}

void kv_decode_row(KvType t, const void* src, float* out, int head_dim, const float* offset) {
    switch (t) {
        case KvType::F16:
            for (int j = 0; j < head_dim; ++j) out[j] = fp16_to_fp32(static_cast<const uint16_t*>(src)[j]);
            return;
        case KvType::F32:
            std::memcpy(out, src, size_t(head_dim) * 4);
            return;
        case KvType::Q8_0:
        case KvType::Q4_0:
            dequantize_row(t == KvType::Q8_0 ? GgmlType::Q8_0 : GgmlType::Q4_0, src, out, head_dim);
            if (offset)
                for (int j = 0; j < head_dim; ++j) out[j] += offset[j];
            kv_rotate_scaled(out, head_dim, head_dim);
            return;
    }
}

void kv_offset_of_rows(KvType t, const void* rows, int64_t row_bytes, int head_dim, int dim0, float* offset) {
    KVGEN_ASSERT(kv_type_quantized(t));
    std::vector<float> row(static_cast<size_t>(head_dim));
    for (int j = 0; j < head_dim; ++j) offset[j] = 0.0f;
    for (int p = 0; p < kKvOffsetPositions; ++p) {
        dequantize_row(t == KvType::Q8_0 ? GgmlType::Q8_0 : GgmlType::Q4_0,
                       static_cast<const char*>(rows) + p * row_bytes, row.data(), head_dim);
        for (int j = 0; j < head_dim; ++j) offset[j] += row[size_t(j)];
    }
    kv_offset_from_sum(offset, head_dim, dim0 < head_dim ? dim0 : head_dim);
}

KvCache::KvCache(const Config& c, int n_ctx, KvType k_type, KvType v_type, uint64_t resident_bytes)
    : layout_(KvLayout::of(c, n_ctx, k_type, v_type)) {
    if (layout_.quantized() && c.head_dim % 32 != 0)
        throw Error(fmt::format("--kv-type {}: quantized cache rows are blocks of 32 values, and this model's head_dim "
                                "is {} (use f16 or f32)",
                                layout_.types_name(), c.head_dim));
    const size_t bytes = layout_.bytes();
    const uint64_t available = available_memory();
    auto fail = [&](const std::string& why) {
        return Error(fmt::format("cannot allocate the KV cache: {} bytes needed for {} positions{} (lower --ctx-size)",
                                 bytes, n_ctx, why));
    };
    // note: the weights' pages count as available while they are cached; the cache must leave them room, or every
    // step reads the model from disk again, and a tenth for the rest (the run's buffers, the system)
    const uint64_t keep = resident_bytes + available / 10;
    const uint64_t room = available > keep ? available - keep : 0;
    if (available != 0 && bytes > room)
        throw fail(fmt::format(", {} bytes available ({} of them for the model, a tenth kept free): at most {} "
                               "positions fit at {} ({} bytes each; a quantized --kv-type holds more)",
                               available, resident_bytes, room / uint64_t(layout_.bytes_per_token()),
                               layout_.types_name(), layout_.bytes_per_token()));
    rotated_.resize(size_t(c.head_dim));
    if (layout_.k_offsets()) k_offset_.assign(size_t(int64_t(c.n_layers) * c.n_kv_heads * c.head_dim), 0.0f);
    k_.reset(std::calloc(layout_.k_bytes(), 1));
    v_.reset(std::calloc(layout_.v_bytes(), 1));
    if (!k_ || !v_) throw fail("");
    // note: touch every page now, so the cache is resident from the start: memory stays flat while positions fill,
    // and a cache that does not fit fails here rather than partway through a run.
    std::memset(k_.get(), 0, layout_.k_bytes());
    std::memset(v_.get(), 0, layout_.v_bytes());
}

void KvCache::write(int l, int pos0, int n, const float* k, const float* v) {
    const int n_kv_heads = layout_.n_kv_heads, head_dim = layout_.head_dim;
    const int64_t k_rb = layout_.k_row_bytes(), v_rb = layout_.v_row_bytes();
    const bool offsets = layout_.k_offsets();
    for (int i = 0; i < n; ++i) {
        const bool offset = offsets && pos0 + i >= kKvOffsetPositions;
        for (int h = 0; h < n_kv_heads; ++h) {
            const int64_t row = layout_.row_index(l, h, pos0 + i), at = (int64_t(i) * n_kv_heads + h) * head_dim;
            kv_encode_row(layout_.k_type, k + at, static_cast<char*>(k_.get()) + row * k_rb, head_dim, rotated_.data(),
                          offset ? k_offset(l, h) : nullptr);
            kv_encode_row(layout_.v_type, v + at, static_cast<char*>(v_.get()) + row * v_rb, head_dim, rotated_.data());
        }
        // note: the offsets follow from the first rows as stored, so they are set the moment the last of those is
        // written, whatever batch it came in.
        if (offsets && pos0 + i == kKvOffsetPositions - 1) set_k_offsets(l);
    }
}

void KvCache::set_k_offsets(int l) {
    for (int h = 0; h < layout_.n_kv_heads; ++h)
        kv_offset_of_rows(layout_.k_type, k(l, h), layout_.k_row_bytes(), layout_.head_dim, layout_.k_offset_dim0,
                          k_offset_.data() + (int64_t(l) * layout_.n_kv_heads + h) * layout_.head_dim);
}

void KvCache::read(void* k, void* v, int n) const {
    const int64_t heads = int64_t(layout_.n_layers) * layout_.n_kv_heads;
    const int64_t k_rb = layout_.k_row_bytes(), v_rb = layout_.v_row_bytes();
    for (int64_t lh = 0; lh < heads; ++lh) {
        std::memcpy(static_cast<char*>(k) + lh * n * k_rb,
                    static_cast<const char*>(k_.get()) + lh * layout_.n_ctx * k_rb, size_t(n * k_rb));
        std::memcpy(static_cast<char*>(v) + lh * n * v_rb,
                    static_cast<const char*>(v_.get()) + lh * layout_.n_ctx * v_rb, size_t(n * v_rb));
    }
}

void KvCache::write_rows(const void* k, const void* v, int n) {
    const int64_t heads = int64_t(layout_.n_layers) * layout_.n_kv_heads;
    const int64_t k_rb = layout_.k_row_bytes(), v_rb = layout_.v_row_bytes();
    for (int64_t lh = 0; lh < heads; ++lh) {
        std::memcpy(static_cast<char*>(k_.get()) + lh * layout_.n_ctx * k_rb,
                    static_cast<const char*>(k) + lh * n * k_rb, size_t(n * k_rb));
        std::memcpy(static_cast<char*>(v_.get()) + lh * layout_.n_ctx * v_rb,
                    static_cast<const char*>(v) + lh * n * v_rb, size_t(n * v_rb));
    }
    if (layout_.k_offsets() && n >= kKvOffsetPositions)
        for (int l = 0; l < layout_.n_layers; ++l) set_k_offsets(l);
}

}  // namespace kvgen
