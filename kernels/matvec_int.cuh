#pragma once
// Decode products in integers, for Q4_0, Q8_0, Q4_K and Q6_K weights. The input vector is quantized once per product
// to 16-bit integers in blocks of 32 (ActBlock: x ~ d * q, |q| <= 32512, the CPU's activation rounding, see
// src/cpu/vecdot.h), and each lane dots a weight chunk's small integers with the block's int16 values with __dp2a
// (two int16 x int8 products per instruction), converting to float once per chunk. Against the f32 matvec
// (matvec.cuh) a chunk costs 80 bytes of activations instead of 128 and about a third of the instructions; the
// activations' rounding (1 part in 32512 of a block's largest value) stays far below what the logits can show.
// Compiled for the host too: the CPU-only tests run these bodies (tests/cuda_support/host_emulation.cu).
#include "matvec.cuh"

namespace kvgen::cuda {

// 32 activations as 16-bit integers: x[j] ~ d * q[j], s = sum of q. 80 bytes, so q is four 16-byte loads.
struct alignas(16) ActBlock {
    int16_t q[32];
    float d;
    int32_t s;
    int32_t pad[2];
};
static_assert(sizeof(ActBlock) == 80, "ActBlock");

constexpr float kActQMax = 32512.0f;

// As quantize_a32 does on the CPU: a block's scale d = amax / 32512 (0 where that is below the smallest normal float:
// the block reads as zeros), id = 1 / d (0 for d = 0), and each value q = round-half-even(x * id).
KVGEN_HD float act_scale(float amax) {
    const float d = amax / kActQMax;
    return d >= 1.17549435e-38f ? d : 0.0f;
}
KVGEN_HD float act_inverse_scale(float d) {
    return d > 0.0f ? 1.0f / d : 0.0f;
}
KVGEN_HD int act_quant(float v, float id) {
    const float r = rintf(v * id);
    return int(r > kActQMax ? kActQMax : r < -kActQMax ? -kActQMax : r);
}

// Block b of x (32 values).
KVGEN_HD void quantize_act_item(int64_t b, const float* __restrict__ x, ActBlock* __restrict__ out) {
    const float* xb = x + b * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(xb[j]));
    const float d = act_scale(amax), id = act_inverse_scale(d);
    int s = 0;
    for (int j = 0; j < 32; ++j) {
        const int q = act_quant(xb[j], id);
        out[b].q[j] = int16_t(q);
        s += q;
    }
    out[b].d = d;
    out[b].s = s;
}

// Whether a type has an integer decode product.
KVGEN_HD bool has_int_matvec(GgmlType t) {
    return t == GgmlType::Q4_0 || t == GgmlType::Q8_0 || t == GgmlType::Q4_K || t == GgmlType::Q6_K;
}

// c + a.lo16 * b.byte[k] + a.hi16 * b.byte[k + 1], signed, with k = 0 (lo) or 2 (hi).
KVGEN_HD int dp2a_lo(int a, int b, int c) {
#if defined(__CUDA_ARCH__)
    return __dp2a_lo(a, b, c);
#else
    return c + int(int16_t(uint32_t(a) & 0xffffu)) * int(int8_t(uint32_t(b) & 0xffu)) +
           int(int16_t(uint32_t(a) >> 16)) * int(int8_t((uint32_t(b) >> 8) & 0xffu));
#endif
}
KVGEN_HD int dp2a_hi(int a, int b, int c) {
#if defined(__CUDA_ARCH__)
    return __dp2a_hi(a, b, c);
#else
    return c + int(int16_t(uint32_t(a) & 0xffffu)) * int(int8_t((uint32_t(b) >> 16) & 0xffu)) +
           int(int16_t(uint32_t(a) >> 16)) * int(int8_t(uint32_t(b) >> 24));
#endif
}
// Byte-wise a - b, each byte wrapping on its own.
KVGEN_HD uint32_t sub_bytes(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __vsub4(a, b);
#else
    uint32_t r = 0;
    for (int k = 0; k < 4; ++k) r |= (((a >> (8 * k)) - (b >> (8 * k))) & 0xffu) << (8 * k);
    return r;
#endif
}

// The block's 32 int16 values as 16 words: word p holds q[2p] (low half) and q[2p + 1].
KVGEN_HD void load_act_words(const ActBlock& a, int (&xw)[16]) {
    const uint4* p = reinterpret_cast<const uint4*>(a.q);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#if defined(__CUDA_ARCH__)
        const uint4 v = __ldg(p + k);
#else
        const uint4 v = p[k];
#endif
        xw[4 * k] = int(v.x);
        xw[4 * k + 1] = int(v.y);
        xw[4 * k + 2] = int(v.z);
        xw[4 * k + 3] = int(v.w);
    }
}

// sum over j of w[j] * q[j] for 32 int8 weights packed 4 to a word (words w4[0..7], weight 4m + k in byte k of word m).
KVGEN_HD int dot32(const uint32_t (&w4)[8], const int (&xw)[16]) {
    int s = 0;
#pragma unroll
    for (int m = 0; m < 8; ++m) {
        s = dp2a_lo(xw[2 * m], int(w4[m]), s);
        s = dp2a_hi(xw[2 * m + 1], int(w4[m]), s);
    }
    return s;
}

// Chunk c of a row (32 weights) dotted with the activation block of the same 32 positions, in float.
template <GgmlType T>
KVGEN_HD float int_chunk_dot(const uint8_t* __restrict__ row, int64_t c, const ActBlock& a, const int (&xw)[16]);

template <>
KVGEN_HD float int_chunk_dot<GgmlType::Q4_0>(const uint8_t* row, int64_t c, const ActBlock& a, const int (&xw)[16]) {
    const uint8_t* b = row + c * 18;
    uint32_t lo[8];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        const uint32_t v = le32_unaligned(b + 2 + 4 * m);
        lo[m] = v & 0x0f0f0f0fu;             // weights 4m .. 4m + 3
        lo[m + 4] = (v >> 4) & 0x0f0f0f0fu;  // weights 16 + 4m ..
    }
    // note: the nibbles go in unsigned (0..15); the offset of 8 comes back through the activations' sum.
    return h2f(b) * a.d * float(dot32(lo, xw) - 8 * a.s);
}

template <>
KVGEN_HD float int_chunk_dot<GgmlType::Q8_0>(const uint8_t* row, int64_t c, const ActBlock& a, const int (&xw)[16]) {
    const uint8_t* b = row + c * 34;
    uint32_t w[8];
#pragma unroll
    for (int m = 0; m < 8; ++m) w[m] = le32_unaligned(b + 2 + 4 * m);
    return h2f(b) * a.d * float(dot32(w, xw));
}

template <>
KVGEN_HD float int_chunk_dot<GgmlType::Q4_K>(const uint8_t* row, int64_t c, const ActBlock& a, const int (&xw)[16]) {
    const uint8_t* b = row + (c / 8) * 144;
    const int j = int(c % 8);
    float sc, mn;
    k4_scale_min_dev(j, b + 4, &sc, &mn);
    const uint8_t* q = b + 16 + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    uint32_t w[8];
#pragma unroll
    for (int m = 0; m < 8; ++m) w[m] = (le32_unaligned(q + 4 * m) >> shift) & 0x0f0f0f0fu;
    return a.d * (h2f(b) * sc * float(dot32(w, xw)) - h2f(b + 2) * mn * float(a.s));
}

template <>
KVGEN_HD float int_chunk_dot<GgmlType::Q6_K>(const uint8_t* row, int64_t c, const ActBlock& a, const int (&xw)[16]) {
    const uint8_t* b = row + (c / 8) * 210;
    const int s = int(c % 8), half = s / 4, qq = s % 4;
    const uint8_t* ql = b + 64 * half + 32 * (qq & 1);
    const uint8_t* qh = b + 128 + 32 * half;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * half + 2 * qq);
    const int nshift = qq >= 2 ? 4 : 0, hshift = 2 * qq;
    uint32_t w[8];
#pragma unroll
    for (int m = 0; m < 8; ++m) {
        const uint32_t lv = (le32_unaligned(ql + 4 * m) >> nshift) & 0x0f0f0f0fu;
        const uint32_t hv = ((le32_unaligned(qh + 4 * m) >> hshift) & 0x03030303u) << 4;
        w[m] = sub_bytes(lv | hv, 0x20202020u);  // 6-bit values minus 32, as int8
    }
    // Weights 0..15 take scale sc[0], 16..31 sc[1].
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        s0 = dp2a_lo(xw[2 * m], int(w[m]), s0);
        s0 = dp2a_hi(xw[2 * m + 1], int(w[m]), s0);
        s1 = dp2a_lo(xw[2 * m + 8], int(w[m + 4]), s1);
        s1 = dp2a_hi(xw[2 * m + 9], int(w[m + 4]), s1);
    }
    return h2f(b + 208) * a.d * float(int(sc[0]) * s0 + int(sc[1]) * s1);
}

// The integer twin of matvec_lane: kMvRows rows per warp, lanes striding over chunks; each chunk's activation block
// is loaded once for the warp's rows.
template <GgmlType T>
KVGEN_HD void matvec_int_lane(const uint8_t* __restrict__ w, int64_t row_bytes, int64_t n_chunks, int64_t rows,
                              int64_t r0, int lane, const ActBlock* __restrict__ x, float (&acc)[kMvRows]) {
#pragma unroll
    for (int r = 0; r < kMvRows; ++r) acc[r] = 0.0f;
    for (int64_t c = lane; c < n_chunks; c += 32) {
        const ActBlock& a = x[c];
        int xw[16];
        load_act_words(a, xw);
#pragma unroll
        for (int r = 0; r < kMvRows; ++r)
            if (r0 + r < rows) acc[r] += int_chunk_dot<T>(w + (r0 + r) * row_bytes, c, a, xw);
    }
}

// Calls f(TypeTag<T>{}) for the types with an integer product; false for the others.
template <typename F>
bool dispatch_int_type(GgmlType t, F&& f) {
    switch (t) {
        case GgmlType::Q4_0:
            f(TypeTag<GgmlType::Q4_0>{});
            return true;
        case GgmlType::Q8_0:
            f(TypeTag<GgmlType::Q8_0>{});
            return true;
        case GgmlType::Q4_K:
            f(TypeTag<GgmlType::Q4_K>{});
            return true;
        case GgmlType::Q6_K:
            f(TypeTag<GgmlType::Q6_K>{});
            return true;
        default:
            return false;
    }
}

}  // namespace kvgen::cuda
