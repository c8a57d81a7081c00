#include "cpu/ops.h"

#include <cmath>

#include "cpu/cpu_features.h"

namespace kvgen::cpu {

namespace {
using ItemsFn = void (*)(float*, const float*, const KvCache&, int, int, const Config&, int64_t, int64_t, int64_t,
                        float*);
const ItemsFn kItems = has_avx2() ? kernels::attention_items_avx2 : kernels::attention_items_generic;
}  // namespace

void rmsnorm(float* out, const float* x, const float* w, int n, int dim, float eps) {
    for (int i = 0; i < n; ++i) {
        const float* xi = x + int64_t(i) * dim;
        float* oi = out + int64_t(i) * dim;
        double ss = 0.0;
        for (int j = 0; j < dim; ++j) ss += double(xi[j]) * xi[j];
        const float inv = float(1.0 / std::sqrt(ss / dim + double(eps)));
        for (int j = 0; j < dim; ++j) oi[j] = xi[j] * inv * w[j];
    }
}

void rope_tables(float* cos_t, float* sin_t, int pos0, int n, const RopeFreqs& r) {
    const int half = int(r.inv_freq.size());
    const double* factors = r.factors.empty() ? nullptr : r.factors.data();
    for (int i = 0; i < n; ++i) {
        for (int j = 0; j < half; ++j) {
            const double theta = rope_theta(pos0 + i, j, r.inv_freq.data(), factors, r.pos_div);
            cos_t[int64_t(i) * half + j] = float(std::cos(theta));
            sin_t[int64_t(i) * half + j] = float(std::sin(theta));
        }
    }
}

void rope(float* x, const float* cos_t, const float* sin_t, int n, int n_heads, const Config& c) {
    const int half = c.rope_dim / 2;
    for (int i = 0; i < n; ++i) {
        const float* ct = cos_t + int64_t(i) * half;
        const float* st = sin_t + int64_t(i) * half;
        for (int h = 0; h < n_heads; ++h) {
            float* v = x + (int64_t(i) * n_heads + h) * c.head_dim;
            for (int j = 0; j < half; ++j) {
                const float a = v[2 * j], b = v[2 * j + 1];
                v[2 * j] = a * ct[j] - b * st[j];
                v[2 * j + 1] = a * st[j] + b * ct[j];
            }
        }
    }
}

void swiglu(float* gate, const float* up, int64_t count) {
    for (int64_t j = 0; j < count; ++j) gate[j] = gate[j] / (1.0f + std::exp(-gate[j])) * up[j];
}

void add(float* x, const float* y, int64_t count) {
    for (int64_t j = 0; j < count; ++j) x[j] += y[j];
}

int64_t attention_scratch(const Config& c, int n_ctx) {
    // a tile's decoded K or V rows, the scores, the rotated query
    return kAttentionRowTile * int64_t(c.head_dim) + int64_t(c.n_rep()) * n_ctx + int64_t(c.n_rep()) * c.head_dim;
}

void attention(float* out, const float* q, const KvCache& kv, int l, int pos0, int n, const Config& c,
               float* scratch, ThreadPool& pool) {
    const int64_t per_thread = attention_scratch(c, kv.n_ctx());
    const int64_t n_items = int64_t(n) * c.n_kv_heads;
    pool.parallel_for(n_items, [&](int64_t w0, int64_t w1, int t) {
        kItems(out, q, kv, l, pos0, c, n_items, w0, w1, scratch + per_thread * t);
    });
}

}  // namespace kvgen::cpu
