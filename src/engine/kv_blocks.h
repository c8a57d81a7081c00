#pragma once
// The rounding of a quantized KV cache row's blocks, shared by the CPU backend (kv_encode_row) and the CUDA kernels
// (store_kv_row_warp), so that both write the same bytes: every product and sum is rounded on its own (kv_mul,
// kv_add), never fused into a multiply-add.
//
// q4_0 keeps ggml's Q4_0 block (an f16 scale d, 32 levels l in -8..7 stored as l + 8; value = d * l), but chooses d
// and the levels by least squares instead of ggml's rule (the value of largest magnitude maps to -8): for each of a
// fixed set of trial scales, every value is rounded to its nearest level (clamped to -8..7), and for those levels the
// best d is sum(x l) / sum(l l), which leaves the squared error sum(x x) - sum(x l)^2 / sum(l l). The trial with the
// smallest error wins. ggml's rule is one of the trials, so a block never rounds worse than it would there.
#include <cmath>
#include <cstdint>

#include "common/hd.h"

#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
#include <emmintrin.h>
#endif

namespace kvgen {

// x * y and x + y, each rounded once (kept from fused multiply-adds on the GPU; host code is built without them).
KVGEN_HD float kv_mul(float x, float y) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(x, y);
#else
    return x * y;
#endif
}
KVGEN_HD float kv_add(float x, float y) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(x, y);
#else
    return x + y;
#endif
}

// The trials: the value of largest magnitude m maps to level -8 * (1 + t / 16) for t = -2, -1, 0, 1, 2 (clamped to -8
// beyond it). t = 0 is ggml's rule; a larger t clips m a little to give the other values finer steps.
constexpr int kKvQ4Trials = 5;

// The nearest level of x at 1 / scale id, floor(x id + 1/2): computed as floor(x id + 8.5) clamped to 0..15 (so a
// truncation) less 8.
KVGEN_HD int kv_q4_0_level(float x, float id) {
    float v = kv_add(kv_mul(x, id), 8.5f);
    v = v < 0.0f ? 0.0f : v;
    v = v > 15.0f ? 15.0f : v;
    return int(v) - 8;
}

// Trial i's 1 / scale, for m the value of largest magnitude.
KVGEN_HD float kv_q4_0_trial_id(int i, float m) {
    return kv_mul(-8.0f, kv_add(1.0f, float(i - 2) * (1.0f / 16.0f))) / m;
}

// One trial at 1 / scale id: l <- each value's kv_q4_0_level; *sxl <- sum(x l) in 8 partial sums (j mod 8) added
// pairwise; returns sum(l l) (exact: small integers). The reference arithmetic; kv_q4_0_trial is the same, lane for
// lane, in SSE2.
KVGEN_HD int kv_q4_0_trial_scalar(const float* x, float id, int8_t* l, float* sxl) {
    float part[8];
    int sll = 0;
    for (int k = 0; k < 8; ++k) part[k] = 0.0f;
    for (int j = 0; j < 32; ++j) {
        const int q = kv_q4_0_level(x[j], id);
        l[j] = int8_t(q);
        part[j % 8] = kv_add(part[j % 8], kv_mul(x[j], float(q)));
        sll += q * q;
    }
    *sxl = kv_add(kv_add(kv_add(part[0], part[4]), kv_add(part[2], part[6])),
                  kv_add(kv_add(part[1], part[5]), kv_add(part[3], part[7])));
    return sll;
}

KVGEN_HD int kv_q4_0_trial(const float* x, float id, int8_t* l, float* sxl) {
#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
    // lanes k of lo and k - 4 of hi hold partial sums k; every operation is the scalar one, rounded the same
    const __m128 vid = _mm_set1_ps(id), half = _mm_set1_ps(8.5f), zero = _mm_setzero_ps(), top = _mm_set1_ps(15.0f);
    const __m128i eight = _mm_set1_epi32(8);
    __m128 lo = zero, hi = zero;
    __m128i sq = _mm_setzero_si128();
    __m128i q[8];
    for (int i = 0; i < 8; ++i) {
        const __m128 xv = _mm_loadu_ps(x + 4 * i);
        const __m128 v = _mm_min_ps(_mm_max_ps(_mm_add_ps(_mm_mul_ps(xv, vid), half), zero), top);
        q[i] = _mm_sub_epi32(_mm_cvttps_epi32(v), eight);
        const __m128 p = _mm_mul_ps(xv, _mm_cvtepi32_ps(q[i]));
        if (i % 2 == 0)
            lo = _mm_add_ps(lo, p);
        else
            hi = _mm_add_ps(hi, p);
        sq = _mm_add_epi32(sq, _mm_madd_epi16(_mm_packs_epi32(q[i], q[i]), _mm_packs_epi32(q[i], q[i])));
    }
    const __m128i w0 = _mm_packs_epi32(q[0], q[1]), w1 = _mm_packs_epi32(q[2], q[3]);
    const __m128i w2 = _mm_packs_epi32(q[4], q[5]), w3 = _mm_packs_epi32(q[6], q[7]);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(l), _mm_packs_epi16(w0, w1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(l + 16), _mm_packs_epi16(w2, w3));
    // (0 + 4) + (2 + 6), (1 + 5) + (3 + 7): lo + hi pairs lanes k and k + 4, then lanes 0 + 2 and 1 + 3
    const __m128 s = _mm_add_ps(lo, hi);
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));  // lane 0: s0 + s2, lane 1: s1 + s3
    *sxl = _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
    // each 32-bit lane of sq holds two copies of q^2 summed (packs duplicated the four values)
    alignas(16) int32_t sqs[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(sqs), sq);
    return (sqs[0] + sqs[1] + sqs[2] + sqs[3]) / 2;
#else
    return kv_q4_0_trial_scalar(x, id, l, sxl);
#endif
}

// Whether a trial with sum(x l)^2 = num and sum(l l) = sll beats the best so far: num / sll larger, compared without a
// division.
KVGEN_HD bool kv_q4_0_better(float num, int sll, float best_num, int best_sll) {
    return sll > 0 && kv_mul(num, float(best_sll)) > kv_mul(best_num, float(sll));
}

// levels <- the 32 levels (-8..7) of the block x that round it best; returns its scale d (before f16 rounding; 0 for
// a block of zeros, whose levels are then all 0).
KVGEN_HD float kv_q4_0_levels(const float* x, int8_t* levels) {
    float amax = 0.0f, m = 0.0f;  // the value of largest magnitude, with its sign
    for (int j = 0; j < 32; ++j)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            m = x[j];
        }
    for (int j = 0; j < 32; ++j) levels[j] = 0;
    if (amax == 0.0f) return 0.0f;
    float best_num = 0.0f, best_sxl = 0.0f;  // the best trial's sum(x l)^2 and sum(x l)
    int best_sll = 1;                        // and its sum(l l)
    for (int i = 0; i < kKvQ4Trials; ++i) {
        const float id = kv_q4_0_trial_id(i, m);
        int8_t l[32];
        float sxl;
        const int sll = kv_q4_0_trial(x, id, l, &sxl);
        const float num = kv_mul(sxl, sxl);
        if (kv_q4_0_better(num, sll, best_num, best_sll)) {
            best_num = num;
            best_sll = sll;
            best_sxl = sxl;
            for (int j = 0; j < 32; ++j) levels[j] = l[j];
        }
    }
    return best_sxl / float(best_sll);
}

// The 16 bytes of a Q4_0 block's levels: element j in the low nibble of byte j, element j + 16 in its high nibble.
KVGEN_HD void kv_q4_0_pack(const int8_t* levels, uint8_t* qs) {
    for (int j = 0; j < 16; ++j) qs[j] = uint8_t((levels[j] + 8) | ((levels[j + 16] + 8) << 4));
}

}  // namespace kvgen
