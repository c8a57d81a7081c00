#pragma once
// A KV cache as the CUDA kernels left it (cuda::testing::KvBytes, on a device or from their bodies on the host) against
// the CPU's KvCache, for the tests of both.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "engine/kv_cache.h"
#include "testing.h"

namespace kvgen::test {

// Rows [0, n) of layer l, K and V, that differ between a KvCache and the device's cache; the key offsets of the
// layer's heads that are not the CPU's bit for bit.
inline int kv_rows_differing(const KvCache& cpu_kv, const cuda::testing::KvBytes& gpu, int l, int n) {
    const KvLayout& kv = cpu_kv.layout();
    const size_t krb = size_t(kv.k_row_bytes()), vrb = size_t(kv.v_row_bytes());
    int bad = 0;
    for (int h = 0; h < kv.n_kv_heads; ++h)
        for (int t = 0; t < n; ++t) {
            const auto* ck = static_cast<const uint8_t*>(cpu_kv.k(l, h)) + size_t(t) * krb;
            const auto* cv = static_cast<const uint8_t*>(cpu_kv.v(l, h)) + size_t(t) * vrb;
            const size_t row = size_t(kv.row_index(l, h, t));
            if (!std::equal(ck, ck + krb, gpu.k.begin() + std::ptrdiff_t(row * krb))) ++bad;
            if (!std::equal(cv, cv + vrb, gpu.v.begin() + std::ptrdiff_t(row * vrb))) ++bad;
        }
    return bad;
}
inline int offsets_differing(const KvCache& cpu_kv, const cuda::testing::KvBytes& gpu, int l) {
    const KvLayout& kv = cpu_kv.layout();
    if (!kv.k_offsets()) return gpu.k_offsets.empty() ? 0 : 1;
    int bad = 0;
    for (int h = 0; h < kv.n_kv_heads; ++h) {
        const float* want = cpu_kv.k_offset(l, h);
        const float* got = gpu.k_offsets.data() + (size_t(l) * size_t(kv.n_kv_heads) + size_t(h)) * size_t(kv.head_dim);
        if (std::memcmp(want, got, size_t(kv.head_dim) * 4) != 0) ++bad;
    }
    return bad;
}

}  // namespace kvgen::test
