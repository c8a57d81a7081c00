#pragma once
// The per-lane body of the decode matrix-vector kernel, compiled for the host too so that the CPU-only CI runs the
// kernel's own indexing (tests/test_cuda_host.cpp emulates the 32 lanes of a warp and its reduction).
#include <cuda_fp16.h>

#include "engine/kv_layout.h"
#include "quant.cuh"

namespace kvgen::cuda {

// A warp owns kMvRows rows; each lane walks the row's 32-weight chunks with a stride of 32 chunks, so one load
// instruction of the warp covers 32 consecutive chunks (contiguous blocks) of each row. The 32 activations of a
// chunk are loaded once (eight 16-byte loads) and used for every row of the warp.
constexpr int kMvWarps = 4, kMvRows = 2;

// Where row r of a product is written: rows [0, end[0]) to y[0], [end[0], end[1]) to y[1], the rest to y[2], each
// buffer from its own first element. One product can so fill q, k and v (Q|K|V uploaded as one matrix). For several
// tokens each buffer holds its rows token after token: token i's row r of a `rows`-row product is at(r, i, rows).
struct RowSplit {
    float* y[3] = {nullptr, nullptr, nullptr};
    int64_t end[2] = {0, 0};

    static RowSplit one(float* y, int64_t rows) { return RowSplit{{y, y, y}, {rows, rows}}; }
    KVGEN_HD float* at(int64_t r) const { return at(r, 0, 0); }
    KVGEN_HD float* at(int64_t r, int64_t i, int64_t rows) const {
        if (r < end[0]) return y[0] + i * end[0] + r;
        if (r < end[1]) return y[1] + i * (end[1] - end[0]) + (r - end[0]);
        return y[2] + i * (rows - end[1]) + (r - end[1]);
    }
    // Elements from one token's row r to the next token's: the rows of r's buffer.
    KVGEN_HD int64_t width(int64_t r, int64_t rows) const {
        return r < end[0] ? end[0] : r < end[1] ? end[1] - end[0] : rows - end[1];
    }
};

// RoPE and the K/V store of an f16 cache folded into the product that makes Q, K and V (qkv_store_row,
// elementwise.cuh), instead of rope_store_kv's launch: of the product's rows, [0, q_end) are queries, rotated and
// written where RowSplit says; [q_end, k_end) keys, rotated and stored as f16 into kc; [k_end, rows) values, stored
// into vc; token i of the step at position *d_pos0 + i, turned by row i of the RoPE tables cos_t / sin_t
// ([n][half_rope], pairs from half_rope on unturned). kc and vc: one layer's first K and V row, laid out as kv says.
// kc null: none.
struct QkvStore {
    __half* kc = nullptr;
    __half* vc = nullptr;
    int64_t q_end = 0, k_end = 0;
    const float* cos_t = nullptr;
    const float* sin_t = nullptr;
    const int* d_pos0 = nullptr;
    int half_rope = 0;
    KvLayout kv;
};

// A row whose length is not a multiple of 32 (float types only): lane l takes weights l, l + 32, ...; the sum over
// the warp's lanes is the row's product.
KVGEN_HD float matvec_ragged_lane(GgmlType type, const uint8_t* __restrict__ row, int64_t cols, int lane,
                                  const float* __restrict__ x) {
    float acc = 0.0f;
    for (int64_t j = lane; j < cols; j += 32) acc = fmaf(float_weight(type, row, j), x[j], acc);
    return acc;
}

// 32 activations (16-byte aligned), eight 16-byte loads.
KVGEN_HD void load_chunk(const float* __restrict__ x, float (&xv)[32]) {
    const float4* xp = reinterpret_cast<const float4*>(x);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
#if defined(__CUDA_ARCH__)
        const float4 t = __ldg(xp + k);
#else
        const float4 t = xp[k];
#endif
        xv[4 * k] = t.x;
        xv[4 * k + 1] = t.y;
        xv[4 * k + 2] = t.z;
        xv[4 * k + 3] = t.w;
    }
}

template <GgmlType T>
KVGEN_HD void matvec_lane(const uint8_t* __restrict__ w, int64_t row_bytes, int64_t n_chunks, int64_t rows, int64_t r0,
                          int lane, const float* __restrict__ x, float (&acc)[kMvRows]) {
#pragma unroll
    for (int r = 0; r < kMvRows; ++r) acc[r] = 0.0f;
    for (int64_t c = lane; c < n_chunks; c += 32) {
        float xv[32];
        load_chunk(x + c * 32, xv);
#pragma unroll
        for (int r = 0; r < kMvRows; ++r) {
            if (r0 + r < rows) {
                float wv[32];
                row_chunk<T>(w + (r0 + r) * row_bytes, c, n_chunks, wv);
                float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                for (int i = 0; i < 32; i += 2) {
                    s0 = fmaf(wv[i], xv[i], s0);
                    s1 = fmaf(wv[i + 1], xv[i + 1], s1);
                }
                acc[r] += s0 + s1;
            }
        }
    }
}

// A prompt of 2 .. kMvMaxTokens tokens (a chat turn, a short prompt): the same warp and lane split, but each
// weight chunk is decoded once and dotted with every token's activations, so the matrix is read once for all of
// them instead of being decoded whole to f16 for a GEMM. acc[r][i] is row r0 + r for token i (i < n <= NT); each
// token's sum runs in matvec_lane's order, so a token's result equals its single-token product.
constexpr int kMvMaxTokens = 16;

template <GgmlType T, int NT>
KVGEN_HD void matvec_batch_lane(const uint8_t* __restrict__ w, int64_t row_bytes, int64_t n_chunks, int64_t cols,
                                int64_t rows, int64_t r0, int lane, const float* __restrict__ x, int n,
                                float (&acc)[kMvRows][NT]) {
#pragma unroll
    for (int r = 0; r < kMvRows; ++r)
#pragma unroll
        for (int i = 0; i < NT; ++i) acc[r][i] = 0.0f;
    for (int64_t c = lane; c < n_chunks; c += 32) {
        // The chunk of every row of the warp, decoded once; then each token's 32 activations, loaded once.
        float wv[kMvRows][32];
#pragma unroll
        for (int r = 0; r < kMvRows; ++r)
            if (r0 + r < rows) row_chunk<T>(w + (r0 + r) * row_bytes, c, n_chunks, wv[r]);
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            if (i >= n) break;
            float xv[32];
            load_chunk(x + i * cols + c * 32, xv);
#pragma unroll
            for (int r = 0; r < kMvRows; ++r) {
                if (r0 + r >= rows) continue;
                float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                for (int j = 0; j < 32; j += 2) {
                    s0 = fmaf(wv[r][j], xv[j], s0);
                    s1 = fmaf(wv[r][j + 1], xv[j + 1], s1);
                }
                acc[r][i] += s0 + s1;
            }
        }
    }
}

}  // namespace kvgen::cuda
