#pragma once
// Helpers shared by the CUDA kernel tests (on a device, and the host-compiled bodies) and the CPU attention tests:
// random inputs, a config for attention shapes, a random attention problem, the worst element difference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
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

// An attention shape and the types of its cache, as the attention tests sweep them.
struct AttentionShape {
    int n_heads, n_kv, hd;
    KvType kt, vt;
    std::string name() const {
        std::ostringstream o;
        o << kv_types_name(kt, vt) << " heads " << n_heads << "/" << n_kv << " hd " << hd;
        return o.str();
    }
};

// A random problem of that shape: queries (sigma 2) for n tokens, and keys and values (sigma 1) for pos0 + n positions
// written into a one-layer cache of n_ctx positions; seeds seed, seed + 1 and seed + 2.
struct AttentionProblem {
    AttentionProblem(const AttentionShape& sh, int n_ctx, int pos0, int n, uint32_t seed)
        : c(attention_config(sh.n_heads, sh.n_kv, sh.hd)), kv(c, n_ctx, sh.kt, sh.vt) {
        q = randn(size_t(n) * size_t(sh.n_heads) * size_t(sh.hd), seed, 2.0f);
        const std::vector<float> k = randn(size_t(pos0 + n) * size_t(sh.n_kv) * size_t(sh.hd), seed + 1, 1.0f);
        const std::vector<float> v = randn(size_t(pos0 + n) * size_t(sh.n_kv) * size_t(sh.hd), seed + 2, 1.0f);
        kv.write(0, 0, pos0 + n, k.data(), v.data());
    }
    Config c;
    KvCache kv;
    std::vector<float> q;
};

}  // namespace kvgen::test
