// Activation quantization for the integer dot products (vecdot.h): one code path for every instruction set, since
// it runs once per token and row while the dot products run once per weight.
#include <cfloat>
#include <cmath>

#if defined(__x86_64__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#include "cpu/vecdot.h"

namespace kvgen::cpu {

namespace {
constexpr float kQMax = 32512.0f;  // 16-bit forms
constexpr float kQMax8 = 127.0f;   // 8-bit forms

// v rounded to the nearest integer, ties to even (std::nearbyint in the default rounding mode). note: on x86 one
// conversion instruction; std::nearbyint and std::fmax are library calls there without SSE4.1 and -ffast-math, which
// made this loop a visible share of a decode step.
inline int round_even(float v) {
#if defined(__x86_64__) || defined(__SSE2__)
    return _mm_cvtss_si32(_mm_set_ss(v));
#else
    return int(std::nearbyint(v));
#endif
}

inline float block_scale(const float* x, int n, float* id, float qmax) {
    float amax = 0;
    int j = 0;
#if defined(__x86_64__) || defined(__SSE2__)
    // note: four lanes of |x| maxima; max is exact, so the order does not matter
    __m128 m = _mm_setzero_ps();
    const __m128 sign = _mm_set1_ps(-0.0f);
    for (; j + 4 <= n; j += 4) m = _mm_max_ps(m, _mm_andnot_ps(sign, _mm_loadu_ps(x + j)));
    alignas(16) float l[4];
    _mm_store_ps(l, m);
    for (float v : l) amax = v > amax ? v : amax;
#endif
    for (; j < n; ++j) {
        const float a = std::fabs(x[j]);
        amax = a > amax ? a : amax;  // activations are finite
    }
    // note: a scale below the smallest normal float has no finite inverse (x * id would be 0 * inf for zeros): such a
    // block (|x| below about 1e-35) reads as zeros, d = 0
    const float d = amax / qmax;
    if (!(d >= FLT_MIN)) {
        *id = 0.0f;
        return 0.0f;
    }
    *id = 1.0f / d;
    return d;
}

// q[0..16) = x[j] * id rounded to the nearest integer (ties to even) and clamped to +-qmax (32512 for int16 q, 127
// for int8), and their sum. On x86 four at a time: the product clamped in floats first, then rounded by the
// conversion (the same integer as rounding and then clamping).
template <typename Q>
inline int32_t quant16(const float* x, float id, Q* q) {
    constexpr bool k8 = sizeof(Q) == 1;
    const float qmax = k8 ? kQMax8 : kQMax;
#if defined(__x86_64__) || defined(__SSE2__)
    const __m128 v_id = _mm_set1_ps(id), hi = _mm_set1_ps(qmax), lo = _mm_set1_ps(-qmax);
    __m128i sum = _mm_setzero_si128();
    for (int j = 0; j < 16; j += 8) {
        const __m128i a = _mm_cvtps_epi32(_mm_min_ps(_mm_max_ps(_mm_mul_ps(_mm_loadu_ps(x + j), v_id), lo), hi));
        const __m128i b = _mm_cvtps_epi32(_mm_min_ps(_mm_max_ps(_mm_mul_ps(_mm_loadu_ps(x + j + 4), v_id), lo), hi));
        const __m128i p = _mm_packs_epi32(a, b);
        if constexpr (k8) _mm_storel_epi64(reinterpret_cast<__m128i*>(q + j), _mm_packs_epi16(p, p));
        else _mm_storeu_si128(reinterpret_cast<__m128i*>(q + j), p);
        sum = _mm_add_epi32(sum, _mm_add_epi32(a, b));
    }
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0x4e));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0xb1));
    return _mm_cvtsi128_si32(sum);
#else
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) {
        const int v = round_even(x[j] * id);
        s += q[j] = Q(v > qmax ? int(qmax) : v < -qmax ? -int(qmax) : v);
    }
    return s;
#endif
}
}  // namespace

namespace {
template <typename Block>
void quantize_32(const float* x, Block* y, int64_t n, float qmax) {
    for (int64_t b = 0; b < n / 32; ++b, x += 32) {
        float id;
        y[b].d = block_scale(x, 32, &id, qmax);
        const int32_t s0 = quant16(x, id, y[b].q), s1 = quant16(x + 16, id, y[b].q + 16);
        y[b].sum[0] = s0;
        y[b].sum[1] = s1;
        y[b].ds = y[b].d * float(s0 + s1);
    }
}

template <typename Block>
void quantize_256(const float* x, Block* y, int64_t n, float qmax) {
    for (int64_t b = 0; b < n / 256; ++b, x += 256) {
        float id;
        y[b].d = block_scale(x, 256, &id, qmax);
        for (int g = 0; g < 16; ++g) y[b].bsums[g] = quant16(x + 16 * g, id, y[b].q + 16 * g);
    }
}
}  // namespace

void quantize_a32(const float* x, BlockA32* y, int64_t n) { quantize_32(x, y, n, kQMax); }
void quantize_a256(const float* x, BlockA256* y, int64_t n) { quantize_256(x, y, n, kQMax); }
void quantize_b32(const float* x, BlockB32* y, int64_t n) { quantize_32(x, y, n, kQMax8); }
void quantize_b256(const float* x, BlockB256* y, int64_t n) { quantize_256(x, y, n, kQMax8); }

namespace {
// Two int16 as one int32 word, a in the low half (the order vpdpwssd multiplies pairs in).
inline int32_t pair16(int a, int b) { return int32_t(uint32_t(uint16_t(a)) | (uint32_t(uint16_t(b)) << 16)); }
// Four int8 as one int32 word, q[0] in the low byte (vpdpbusd's order).
inline int32_t quad8(const int8_t* q) {
    return int32_t(uint32_t(uint8_t(q[0])) | (uint32_t(uint8_t(q[1])) << 8) | (uint32_t(uint8_t(q[2])) << 16) |
                   (uint32_t(uint8_t(q[3])) << 24));
}
}  // namespace

void tokens16_from_a32(const BlockA32* x, int m, int64_t nb, BlockT16* y) {
    for (int64_t b = 0; b < nb; ++b) {
        BlockT16& o = y[b];
        for (int t = 0; t < 16; ++t) {
            static const BlockA32 kZero{};
            const BlockA32& a = t < m ? x[int64_t(t) * nb + b] : kZero;
            for (int j = 0; j < 16; ++j) o.pairs[j][t] = pair16(a.q[2 * j], a.q[2 * j + 1]);
            o.d[t] = a.d;
            o.ds[t] = a.ds;
        }
    }
}

void tokens16_from_a256(const BlockA256* x, int m, int64_t nsb, BlockT256* y) {
    for (int64_t b = 0; b < nsb; ++b) {
        BlockT256& o = y[b];
        for (int t = 0; t < 16; ++t) {
            static const BlockA256 kZero{};
            const BlockA256& a = t < m ? x[int64_t(t) * nsb + b] : kZero;
            for (int j = 0; j < 128; ++j) o.pairs[j][t] = pair16(a.q[2 * j], a.q[2 * j + 1]);
            o.d[t] = a.d;
            int32_t lo[8], hi[8];
            for (int s = 0; s < 8; ++s) {
                const int32_t sum = a.bsums[2 * s] + a.bsums[2 * s + 1];
                lo[s] = sum & 2047;
                hi[s] = (sum - lo[s]) / 2048;
            }
            for (int j = 0; j < 4; ++j) {
                o.lo[j][t] = pair16(lo[2 * j], lo[2 * j + 1]);
                o.hi[j][t] = pair16(hi[2 * j], hi[2 * j + 1]);
            }
        }
    }
}

void tokens16_from_b32(const BlockB32* x, int m, int64_t nb, BlockU16* y) {
    for (int64_t b = 0; b < nb; ++b) {
        BlockU16& o = y[b];
        for (int t = 0; t < 16; ++t) {
            static const BlockB32 kZero{};
            const BlockB32& a = t < m ? x[int64_t(t) * nb + b] : kZero;
            for (int j = 0; j < 8; ++j) o.quads[j][t] = quad8(a.q + 4 * j);
            o.sum[t] = a.sum[0] + a.sum[1];
            o.d[t] = a.d;
            o.ds[t] = a.ds;
        }
    }
}

void tokens16_from_b256(const BlockB256* x, int m, int64_t nsb, BlockU256* y) {
    for (int64_t b = 0; b < nsb; ++b) {
        BlockU256& o = y[b];
        for (int t = 0; t < 16; ++t) {
            static const BlockB256 kZero{};
            const BlockB256& a = t < m ? x[int64_t(t) * nsb + b] : kZero;
            for (int j = 0; j < 64; ++j) o.quads[j][t] = quad8(a.q + 4 * j);
            o.d[t] = a.d;
            for (int j = 0; j < 8; ++j) o.s16[j][t] = pair16(a.bsums[2 * j], a.bsums[2 * j + 1]);
            for (int j = 0; j < 4; ++j)
                o.s32[j][t] = pair16(a.bsums[4 * j] + a.bsums[4 * j + 1], a.bsums[4 * j + 2] + a.bsums[4 * j + 3]);
        }
    }
}

}  // namespace kvgen::cpu
