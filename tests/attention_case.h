#pragma once
// A random attention problem and cpu::attention's answer to it: the twin every CUDA attention kernel is held to, on a
// device ([cuda]) and with its body run on the host.
#include <cstdint>
#include <vector>

#include "cpu/ops.h"
#include "cpu/thread_pool.h"
#include "cuda_test_util.h"
#include "engine/kv_cache.h"

namespace kvgen::test {

struct AttentionCase {
    std::vector<float> q, k, v;  // q [n][n_heads][head_dim]; k, v [pos0 + n][n_kv_heads][head_dim]
    std::vector<float> want;     // cpu::attention over a cache of the case's types
};

// n queries (sigma 2) at positions pos0 .. over K and V (sigma 1) of pos0 + n positions, from seeds seed .. seed + 2;
// k_outlier, when not 0, is put in channel 5 of the first key (keys carry a few large channels). The answer is
// cpu::attention over a one-layer cache of n_ctx positions in types kt / vt.
inline AttentionCase attention_case(const Config& c, int n_ctx, int pos0, int n, uint32_t seed, cpu::ThreadPool& pool,
                                    KvType kt = KvType::F16, KvType vt = KvType::F16, float k_outlier = 0.0f) {
    AttentionCase a;
    const size_t kv_elems = size_t(pos0 + n) * size_t(c.n_kv_heads) * size_t(c.head_dim);
    a.k = randn(kv_elems, seed);
    a.v = randn(kv_elems, seed + 1);
    a.q = randn(size_t(n) * size_t(c.n_heads) * size_t(c.head_dim), seed + 2, 2.0f);
    if (k_outlier != 0.0f) a.k[5] = k_outlier;
    KvCache kv(c, n_ctx, kt, vt);
    kv.write(0, 0, pos0 + n, a.k.data(), a.v.data());
    a.want.resize(a.q.size());
    std::vector<float> scratch(size_t(2 * cpu::attention_scratch(c, n_ctx)));
    cpu::attention(a.want.data(), a.q.data(), kv, 0, pos0, n, c, scratch.data(), pool);
    return a;
}

}  // namespace kvgen::test
