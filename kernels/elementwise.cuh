#pragma once
// The bodies of the element-wise kernels and RMSNorm: one work item per call (g, the global thread index), or a
// block body against a thread context (attention.cuh's DeviceThread / the tests' host emulation). ops.cu launches
// them; the CPU-only tests call the same functions on the host against the CPU twins.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "engine/kv_layout.h"
#include "engine/rope.h"
#include "matvec_int.cuh"
#include "quant.cuh"

namespace kvgen::cuda {

template <GgmlType T>
KVGEN_HD void get_rows_item(int64_t g, const uint8_t* __restrict__ w, int64_t row_bytes, int64_t chunks_per_row,
                            int64_t n_rows, const int32_t* __restrict__ tokens, float* __restrict__ out) {
    const int i = int(g / chunks_per_row);
    const int64_t c = g % chunks_per_row;
    int64_t row = tokens[i];
    row = row < 0 ? 0 : (row >= n_rows ? n_rows - 1 : row);  // the host checked; never read out of bounds
    float v[32];
    row_chunk<T>(w + row * row_bytes, c, chunks_per_row, v);
    float4* o4 = reinterpret_cast<float4*>(out + g * 32);
#pragma unroll
    for (int k = 0; k < 8; ++k) o4[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
}

// A short prompt's activations for a product on the tensor cores (f16_split_product, ops.cuh; split_prompt_type), as
// exact as f32: value j of count goes to y[j] as its f16 (saturating, as to_f16), and what that leaves, times
// kF16SplitScale, to y[count + j], so that its low part keeps 11 bits where the value is 2^-14 and more (unscaled, a
// value's low part of under about 2^-3 would be an f16 subnormal). x = high + low / kF16SplitScale to about 2^-22 of
// x; f16 x f16 products are exact in the f32 sums.
constexpr float kF16SplitScale = 2048.0f;
// Value x split into y[j] (its f16) and y[count + j] (the rest, scaled), as to_f16_split_item does for x[j]: also the
// epilogue of the kernels that make a short prompt's next split input (rmsnorm_body, f16_split_sum_item).
KVGEN_HD void f16_split_store(float x, int64_t j, int64_t count, __half* __restrict__ y) {
    const float v = fminf(fmaxf(x, -65504.0f), 65504.0f);
    const __half hi = __float2half_rn(v);
    y[j] = hi;
    y[count + j] = __float2half_rn((v - __half2float(hi)) * kF16SplitScale);
}
KVGEN_HD void to_f16_split_item(int64_t j, int64_t count, const float* __restrict__ x, __half* __restrict__ y) {
    f16_split_store(x[j], j, count, y);
}
// What f16_split_sum does with each token's sum s past writing it: with glu (SwiGLU's up product), out (one buffer)
// holds the gate product's sums, and each becomes silu_mul(gate, s), the swiglu kernel's arithmetic, without its
// launch; with xh, the value written is also split into xh ([2n][rows], f16_split_store) as the next product's
// input, without to_f16_split's launch; with qkv.kc (an f16 cache; neither glu nor xh nor accumulate), the sums are a
// Q|K|V product's rows as QkvStore says: Q rotated and written where out says, K rotated and V stored into the cache,
// rope_store_kv's arithmetic without its launch (f16_split_sum_qkv_item, two values at a time).
struct SplitSumTail {
    bool glu = false;
    __half* xh = nullptr;
    QkvStore qkv;
};

// The threads rmsnorm_kernel gives a row, and the order of its sum of squares: thread t of kNormThreads sums x[j]^2
// for j = t, t + kNormThreads, ... one after another (fused multiply-adds, written out so that the host rounds them as
// the device does), each warp's 32 sums by the butterfly, then the kNormWarps warps' sums by the butterfly of one
// warp. The order is fixed by kNormThreads, not by the block: a block of fewer threads (a multiple of 32) takes the
// sums of several of those warps per warp and gets the same bits.
constexpr int kNormThreads = 1024;
constexpr int kNormWarps = kNormThreads / 32;
constexpr int kNormUnroll = 4;  // values a thread normalizes (and quantizes) together
static_assert(kNormWarps == 32, "the warps' sums are one warp's butterfly");

// One row per block of block_threads (a multiple of 32, at most kNormThreads) threads; shared: kNormWarps floats. With
// xq (dim a multiple of 32), the row is also written as ActBlocks for the integer products, the quantization folded
// in: the values j = t + k block_threads of one warp are one block of 32, whose largest magnitude and integer sums
// (whole and first half) are warp reductions (the same integers as quantize_act of the f32 output). A 4096-wide row
// in a block of kNormThreads: 4 values a thread, 4 of the row's 128 ActBlocks a warp. With xh, the rows are also
// split for a short prompt's products (f16_split_store; xh_count the rows' values, n dim), as to_f16_split of the
// output would, without its launch.
#pragma nv_exec_check_disable
template <class Ctx>
KVGEN_HD void rmsnorm_body(const Ctx& ctx, int block_threads, const float* __restrict__ x, const float* __restrict__ w,
                           float* __restrict__ out, ActBlock* __restrict__ xq, int dim, float eps,
                           __half* __restrict__ xh = nullptr, int64_t xh_count = 0) {
    const float* xi = x + int64_t(ctx.block_x()) * dim;
    float* oi = out + int64_t(ctx.block_x()) * dim;
    const int t = ctx.thread(), lane = t % 32;
    float* part = ctx.shared();
    for (int vw = t / 32; vw < kNormWarps; vw += block_threads / 32) {  // the same trip count for the whole warp
        float ss = 0.0f;
        for (int j = 32 * vw + lane; j < dim; j += kNormThreads) ss = fmaf(xi[j], xi[j], ss);  // as nvcc contracts
        ss = ctx.warp_sum(ss);
        if (lane == 0) part[vw] = ss;
    }
    ctx.sync();
    if (t < 32) {
        const float v = ctx.warp_sum(part[t]);
        if (t == 0) part[0] = v;
    }
    ctx.sync();
    const float inv = float(1.0 / sqrt(double(part[0]) / dim + double(eps)));
    ActBlock* qi = xq ? xq + int64_t(ctx.block_x()) * (dim / 32) : nullptr;
    // kNormUnroll of a thread's values at a time (a 4096-wide row in 1024 threads: all 4), so that their loads and
    // their blocks' warp reductions overlap instead of running one after another; then the rest one by one. With xq,
    // both loops have the same trip count for the whole warp (dim and block_threads are multiples of 32).
    int j = t;
    for (; j + (kNormUnroll - 1) * block_threads < dim; j += kNormUnroll * block_threads) {
        float v[kNormUnroll];
#pragma unroll
        for (int k = 0; k < kNormUnroll; ++k) v[k] = xi[j + k * block_threads] * inv * w[j + k * block_threads];
#pragma unroll
        for (int k = 0; k < kNormUnroll; ++k) oi[j + k * block_threads] = v[k];
        if (xh)
#pragma unroll
            for (int k = 0; k < kNormUnroll; ++k)
                f16_split_store(v[k], int64_t(ctx.block_x()) * dim + j + k * block_threads, xh_count, xh);
        if (qi)
#pragma unroll
            for (int k = 0; k < kNormUnroll; ++k) {
                const int jk = j + k * block_threads;
                quantize_act_warp(ctx, v[k], jk % 32, qi[jk / 32]);
            }
    }
    for (; j < dim; j += block_threads) {
        const float v = xi[j] * inv * w[j];
        oi[j] = v;
        if (xh) f16_split_store(v, int64_t(ctx.block_x()) * dim + j, xh_count, xh);
        if (qi) quantize_act_warp(ctx, v, j % 32, qi[j / 32]);
    }
}

// Item g = (token i, pair j) of n x half.
KVGEN_HD void rope_tables_item(int g, const int* __restrict__ d_pos0, int half, const double* __restrict__ inv_freq,
                               const double* __restrict__ factors, double pos_div, float* __restrict__ cos_t,
                               float* __restrict__ sin_t) {
    const int i = g / half, j = g % half;
    const double theta = rope_theta(*d_pos0 + i, j, inv_freq, factors, pos_div);
    cos_t[g] = float(cos(theta));
    sin_t[g] = float(sin(theta));
}

// One RoPE pair (a, b) turned by the angle whose cosine and sine are c and sn. The fused multiply-adds are written
// out, so that every kernel that turns a pair (and the host tests) rounds it the same way whatever the compiler
// contracts.
KVGEN_HD void rope_pair(float& a, float& b, float c, float sn) {
    const float ra = fmaf(a, c, -(b * sn)), rb = fmaf(a, sn, b * c);
    a = ra;
    b = rb;
}

// The epilogue of a Q|K|V product with QkvStore (matvec.cuh), called by every lane of the block's first warp (the
// shuffle): lane t holds v, the sum of row `row` for token i of the step, valid where the block owns that row and the
// launch that token; the other row of its RoPE pair (row ^ 1: segments and heads start at even rows) is lane
// t ^ pair_lane's. The arithmetic of rope_item and store_kv_item, so the bits of rope_store_kv's launch.
#pragma nv_exec_check_disable
template <class Ctx>
KVGEN_HD void qkv_store_row(const Ctx& ctx, float v, bool valid, int64_t row, int i, int pair_lane, const RowSplit& y,
                            int64_t rows, const QkvStore& st) {
    const float other = ctx.shfl_xor(v, pair_lane);
    if (!valid) return;
    const bool query = row < st.q_end, value = row >= st.k_end;
    const int64_t local = query ? row : row - (value ? st.k_end : st.q_end);
    const int hd = st.kv.head_dim, d = int(local % hd), j = d / 2;
    float out = v;
    if (!value && j < st.half_rope) {
        float a = d % 2 == 0 ? v : other, b = d % 2 == 0 ? other : v;
        rope_pair(a, b, st.cos_t[int64_t(i) * st.half_rope + j], st.sin_t[int64_t(i) * st.half_rope + j]);
        out = d % 2 == 0 ? a : b;
    }
    if (query) {
        *y.at(row, i, rows) = out;
        return;
    }
    (value ? st.vc : st.kc)[st.kv.row(int(local / hd), *st.d_pos0 + i) + d] = __float2half_rn(out);
}

// Item g = (token, head, pair j < half) of x [n][n_heads][head_dim].
KVGEN_HD void rope_item(int64_t g, float* __restrict__ x, const float* __restrict__ cos_t,
                        const float* __restrict__ sin_t, int n_heads, int head_dim, int half) {
    const int j = int(g % half);
    const int64_t ih = g / half;  // token * n_heads + head
    const int i = int(ih / n_heads);
    float* v = x + ih * head_dim;
    const float c = cos_t[int64_t(i) * half + j], sn = sin_t[int64_t(i) * half + j];
    rope_pair(v[2 * j], v[2 * j + 1], c, sn);
}

// Item g = (token i, KV head h, pair j of head_dim / 2): K rotated (pairs below half_rope; cos_t null: none) and V,
// stored as f16 at position *d_pos0 + i of one layer's cache.
KVGEN_HD void store_kv_item(int64_t g, const float* __restrict__ k, const float* __restrict__ v,
                            const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                            const int* __restrict__ d_pos0, const KvLayout& kv, int half_rope, __half* __restrict__ kc,
                            __half* __restrict__ vc) {
    const int pairs = kv.head_dim / 2;
    const int j = int(g % pairs);
    const int64_t ih = g / pairs;  // token * n_kv_heads + head
    const int i = int(ih / kv.n_kv_heads), h = int(ih % kv.n_kv_heads);
    const float* kr = k + ih * kv.head_dim;
    const float* vr = v + ih * kv.head_dim;
    float a = kr[2 * j], b = kr[2 * j + 1];
    if (cos_t && j < half_rope) {
        const float c = cos_t[int64_t(i) * half_rope + j], sn = sin_t[int64_t(i) * half_rope + j];
        rope_pair(a, b, c, sn);
    }
    const int64_t dst = kv.row(h, *d_pos0 + i) + 2 * j;
    *reinterpret_cast<__half2*>(kc + dst) = __floats2half2_rn(a, b);
    *reinterpret_cast<__half2*>(vc + dst) = __floats2half2_rn(vr[2 * j], vr[2 * j + 1]);
}

// SwiGLU's product of a gate and an up value: silu(g) * u (cpu::swiglu's arithmetic).
KVGEN_HD float silu_mul(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

KVGEN_HD void swiglu_item(int64_t j, float* __restrict__ g, const float* __restrict__ u) {
    g[j] = silu_mul(g[j], u[j]);
}

KVGEN_HD void to_f16_item(int64_t j, const float* __restrict__ x, __half* __restrict__ y) {
    y[j] = __float2half_rn(fminf(fmaxf(x[j], -65504.0f), 65504.0f));
}

}  // namespace kvgen::cuda
