#include "cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/cpu_features.h"
#include "engine/kv_rotation.h"

namespace kvgen::cpu {

namespace {
struct AttentionKernels {
    decltype(&kernels::attention_items_generic) items;
    decltype(&kernels::attention_scores_generic) scores;
    decltype(&kernels::attention_values_generic) values;
    decltype(&kernels::attention_softmax_generic) softmax;
};
const AttentionKernels kAttention =
    has_avx512_vnni() ? AttentionKernels{kernels::attention_items_avx512, kernels::attention_scores_avx512,
                                         kernels::attention_values_avx512, kernels::attention_softmax_avx512}
    : has_avx2()      ? AttentionKernels{kernels::attention_items_avx2, kernels::attention_scores_avx2,
                                         kernels::attention_values_avx2, kernels::attention_softmax_avx2}
                      : AttentionKernels{kernels::attention_items_generic, kernels::attention_scores_generic,
                                         kernels::attention_values_generic, kernels::attention_softmax_generic};
// Positions per work item of a split item's scores (a multiple of the kernels' tiles).
constexpr int kSplitPositions = 256;
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
    // a tile's decoded K or V rows; the scores and the rotated queries of a tile of tokens (or of two split items)
    static_assert(kAttentionTokenTile >= 2, "the split items' two slots fit in a tile's");
    return kAttentionRowTile * int64_t(c.head_dim) +
           kAttentionTokenTile * (int64_t(c.n_rep()) * n_ctx + int64_t(c.n_rep()) * c.head_dim);
}

namespace kernels {

const float* attention_query(float* q_rot, const float* q, const KvCache& kv, int i, int g, const Config& c) {
    const int hd = c.head_dim, n_rep = c.n_rep();
    const float* qg = q + (int64_t(i) * c.n_heads + int64_t(g) * n_rep) * hd;
    if (!kv_type_quantized(kv.k_type())) return qg;
    for (int j = 0; j < n_rep * hd; ++j) q_rot[j] = qg[j];
    kv_rotate_scaled(q_rot, n_rep * hd, hd);
    return q_rot;
}

void attention_output(float* og, const KvCache& kv, const Config& c) {
    if (kv_type_quantized(kv.v_type())) kv_rotate_scaled(og, c.n_rep() * c.head_dim, c.head_dim);
}

}  // namespace kernels

void attention(float* out, const float* q, const KvCache& kv, int l, int pos0, int n, const Config& c,
               float* scratch, ThreadPool& pool) {
    const int64_t per_thread = attention_scratch(c, kv.n_ctx());
    const int64_t n_items = int64_t(n) * c.n_kv_heads;
    const int threads = pool.size(), hd = c.head_dim, n_rep = c.n_rep();
    // note: an item is one (token, KV head) pair. With fewer than two per thread and a long context (one generated
    // token of a model with few KV heads), the threads would idle while one finishes, so each item is split: its
    // scores by ranges of positions, its softmax by query head, its values by ranges of 32 columns. Every element
    // is computed by the same kernels in the same order either way, so the results do not depend on the split.
    if (threads == 1 || n_items >= 2 * threads || pos0 + n < 2 * kSplitPositions) {
        // note: the tokens of a prompt go in tiles of up to kAttentionTokenTile that decode each K and V row once
        // (a deep cache is read once per tile instead of once per token), as large as leaves four items a thread
        const auto items_of = [&](int tile) { return int64_t((n + tile - 1) / tile) * c.n_kv_heads; };
        int tile = kAttentionTokenTile;
        while (tile > 1 && items_of(tile) < 4 * threads) tile /= 2;
        pool.parallel_for(items_of(tile), [&](int64_t w0, int64_t w1, int t) {
            kAttention.items(out, q, kv, l, pos0, c, n, tile, w0, w1, scratch + per_thread * t);
        });
        return;
    }
    const int64_t stride = kv.n_ctx();
    const int64_t rows_size = kAttentionRowTile * int64_t(hd), scores_size = int64_t(n_rep) * stride;
    // item w's scores and rotated query: slot w % 2 of thread w / 2's scratch (n_items < 2 * threads)
    auto item_scores = [&](int64_t w) { return scratch + per_thread * (w / 2) + rows_size + (w % 2) * scores_size; };
    auto item_query = [&](int64_t w) {
        return scratch + per_thread * (w / 2) + rows_size + 2 * scores_size + (w % 2) * int64_t(n_rep) * hd;
    };
    auto item_pos = [&](int64_t w) { return pos0 + int(w / c.n_kv_heads) + 1; };
    std::vector<const float*> qg(static_cast<size_t>(n_items));
    for (int64_t w = 0; w < n_items; ++w)
        qg[size_t(w)] = kernels::attention_query(item_query(w), q, kv, int(w / c.n_kv_heads),
                                                 int(w % c.n_kv_heads), c);
    const int64_t chunks = (pos0 + n + kSplitPositions - 1) / kSplitPositions;
    pool.parallel_for(n_items * chunks, [&](int64_t u0, int64_t u1, int t) {
        for (int64_t u = u0; u < u1; ++u) {
            const int64_t w = u / chunks;
            const int t0 = int(u % chunks) * kSplitPositions, t1 = std::min(item_pos(w), t0 + kSplitPositions);
            if (t0 < t1)
                kAttention.scores(item_scores(w), stride, qg[size_t(w)], kv, l, int(w % c.n_kv_heads), t0, t1,
                                  item_pos(w), c, scratch + per_thread * t);
        }
    });
    auto item_out = [&](int64_t w) {
        return out + (int64_t(w / c.n_kv_heads) * c.n_heads + int64_t(w % c.n_kv_heads) * n_rep) * hd;
    };
    pool.parallel_for(n_items * n_rep, [&](int64_t u0, int64_t u1, int) {
        for (int64_t u = u0; u < u1; ++u) {
            const int64_t w = u / n_rep;
            const int r = int(u % n_rep);
            kAttention.softmax(item_scores(w) + r * stride, item_pos(w), item_out(w) + r * hd, hd);
        }
    });
    const int col = hd % 32 == 0 ? 32 : hd, cols = hd / col;
    pool.parallel_for(n_items * cols, [&](int64_t u0, int64_t u1, int t) {
        for (int64_t u = u0; u < u1; ++u) {
            const int64_t w = u / cols;
            kAttention.values(item_out(w), item_scores(w), stride, kv, l, int(w % c.n_kv_heads), item_pos(w),
                              int(u % cols) * col, col, c, scratch + per_thread * t);
        }
    });
    for (int64_t w = 0; w < n_items; ++w) kernels::attention_output(item_out(w), kv, c);
}

}  // namespace kvgen::cpu
