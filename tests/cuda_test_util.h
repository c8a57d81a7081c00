#pragma once
// Helpers shared by the CUDA kernel tests (on a device, and the host-compiled bodies): random inputs, a config for
// attention shapes, the worst element difference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "model/config.h"

namespace kvgen::test {

inline std::vector<float> randn(size_t n, uint32_t seed, float sigma = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, sigma);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

inline float max_abs(const std::vector<float>& v) {
    float m = 0.0f;
    for (float x : v) m = std::max(m, std::fabs(x));
    return m;
}

// The largest |a - b| (infinity when either holds a NaN, so an unwritten output never passes).
inline float worst_diff(const std::vector<float>& a, const std::vector<float>& b) {
    float w = a.size() == b.size() ? 0.0f : INFINITY;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
        const float e = std::fabs(a[i] - b[i]);
        w = std::isnan(e) ? INFINITY : std::max(w, e);
    }
    return w;
}

// A one-layer config with the given attention shape (RoPE over the whole head).
inline Config attention_config(int n_heads, int n_kv_heads, int head_dim) {
    Config c;
    c.n_vocab = 16;
    c.n_embd = n_heads * head_dim;
    c.n_ff = 32;
    c.n_layers = 1;
    c.n_heads = n_heads;
    c.n_kv_heads = n_kv_heads;
    c.head_dim = head_dim;
    c.rope_dim = head_dim;
    c.n_ctx_train = 4096;
    return c;
}

}  // namespace kvgen::test
