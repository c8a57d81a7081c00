#pragma once
// The per-type decoders, inline so that the CPU matmul kernels can compile them for each instruction set
// (src/cpu/matmul_*.cpp); dequant.cpp is the reference entry point.
#include <cstdint>
#include <cstring>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "common/half.h"
#include "gguf/ggml_types.h"
#include "model/quant_blocks.h"

namespace kvgen::detail {


inline float h2f(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return fp16_to_fp32(h);
#endif
}

inline void deq_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < QK / 2; ++j) {
            y[j] = d * float((b[i].qs[j] & 0x0f) - 8);
            y[j + QK / 2] = d * float((b[i].qs[j] >> 4) - 8);
        }
    }
}

inline void deq_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK) {
        const float d = h2f(b[i].d), m = h2f(b[i].m);
        for (int j = 0; j < QK / 2; ++j) {
            y[j] = d * float(b[i].qs[j] & 0x0f) + m;
            y[j + QK / 2] = d * float(b[i].qs[j] >> 4) + m;
        }
    }
}

template <typename Block>
inline uint32_t qh_bits(const Block& b) {
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    return qh;
}

inline void deq_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK) {
        const float d = h2f(b[i].d);
        const uint32_t qh = qh_bits(b[i]);
        for (int j = 0; j < QK / 2; ++j) {
            const int lo = (b[i].qs[j] & 0x0f) | int(((qh >> j) & 1u) << 4);
            const int hi = (b[i].qs[j] >> 4) | int(((qh >> (j + 16)) & 1u) << 4);
            y[j] = d * float(lo - 16);
            y[j + QK / 2] = d * float(hi - 16);
        }
    }
}

inline void deq_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK) {
        const float d = h2f(b[i].d), m = h2f(b[i].m);
        const uint32_t qh = qh_bits(b[i]);
        for (int j = 0; j < QK / 2; ++j) {
            const int lo = (b[i].qs[j] & 0x0f) | int(((qh >> j) & 1u) << 4);
            const int hi = (b[i].qs[j] >> 4) | int(((qh >> (j + 16)) & 1u) << 4);
            y[j] = d * float(lo) + m;
            y[j + QK / 2] = d * float(hi) + m;
        }
    }
}

inline void deq_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < QK; ++j) y[j] = d * float(b[i].qs[j]);
    }
}

// Q2_K: each 128-weight half uses 32 bytes of qs; byte l holds 2-bit weights at shifts 0, 2, 4, 6 for four
// consecutive groups of 32 (each group two sub-blocks of 16 with their own scale byte).
inline void deq_q2_k(const BlockQ2_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        const uint8_t* q = b[i].qs;
        int is = 0;
        for (int half = 0; half < 2; ++half, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int sub = 0; sub < 2; ++sub) {
                    const uint8_t sc = b[i].scales[is++];
                    const float dl = d * float(sc & 0x0f), ml = dmin * float(sc >> 4);
                    for (int l = 0; l < 16; ++l) *y++ = dl * float((q[l + 16 * sub] >> shift) & 3) - ml;
                }
            }
        }
    }
}

// Q3_K: like Q2_K for the low two bits; hmask bit (1 << (4 * half + shift / 2)) of byte l adds the third bit,
// and a clear bit means "subtract 4".
inline void deq_q3_k(const BlockQ3_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d_all = h2f(b[i].d);
        uint8_t scales[16];
        q3k_scales(b[i].scales, scales);
        const uint8_t* q = b[i].qs;
        const uint8_t* hm = b[i].hmask;
        int is = 0;
        uint8_t m = 1;
        for (int half = 0; half < 2; ++half, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
                for (int sub = 0; sub < 2; ++sub) {
                    const float dl = d_all * float(int(scales[is++]) - 32);
                    for (int l = 16 * sub; l < 16 * sub + 16; ++l) {
                        const int v = int((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4);
                        *y++ = dl * float(v);
                    }
                }
            }
        }
    }
}

// Q4_K: 4 chunks of 64 weights; chunk c reads 32 bytes of qs, low nibbles are sub-block 2c, high nibbles 2c + 1.
inline void deq_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        const uint8_t* q = b[i].qs;
        for (int c = 0; c < 4; ++c, q += 32) {
            uint8_t sc, m;
            k4_scale_min(2 * c, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            k4_scale_min(2 * c + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * float(q[l] & 0x0f) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * float(q[l] >> 4) - m2;
        }
    }
}

// Q5_K: as Q4_K; bit 2c of qh[l] is the fifth bit of sub-block 2c's weight l, bit 2c + 1 of sub-block 2c + 1's.
inline void deq_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        const uint8_t* ql = b[i].qs;
        const uint8_t* qh = b[i].qh;
        for (int c = 0; c < 4; ++c, ql += 32) {
            uint8_t sc, m;
            k4_scale_min(2 * c, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            k4_scale_min(2 * c + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            const uint8_t u1 = uint8_t(1u << (2 * c)), u2 = uint8_t(2u << (2 * c));
            for (int l = 0; l < 32; ++l) *y++ = d1 * float((ql[l] & 0x0f) + ((qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * float((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
        }
    }
}

// Q6_K: two halves of 128; in each, ql[l] and ql[l + 32] give low nibbles and qh[l] the 2-bit tops of the four
// weights l, l + 32, l + 64, l + 96.
inline void deq_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = h2f(b[i].d);
        const uint8_t* ql = b[i].ql;
        const uint8_t* qh = b[i].qh;
        const int8_t* sc = b[i].scales;
        for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int q1 = int((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = int((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * float(sc[is + 0]) * float(q1);
                y[l + 32] = d * float(sc[is + 2]) * float(q2);
                y[l + 64] = d * float(sc[is + 4]) * float(q3);
                y[l + 96] = d * float(sc[is + 6]) * float(q4);
            }
        }
    }
}

}  // namespace kvgen::detail

namespace kvgen::detail {

// Decodes n weights of a supported type; returns false for any other type.
inline bool dequantize_any(GgmlType type, const void* src, float* dst, int64_t n, int64_t nb) {
    switch (type) {
        case GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); return true;
        case GgmlType::F16: {
            const auto* h = static_cast<const uint16_t*>(src);
            for (int64_t j = 0; j < n; ++j) dst[j] = h2f(h[j]);
            return true;
        }
        case GgmlType::BF16: {
            const auto* h = static_cast<const uint16_t*>(src);
            for (int64_t j = 0; j < n; ++j) dst[j] = bf16_to_fp32(h[j]);
            return true;
        }
        case GgmlType::Q4_0: deq_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb); return true;
        case GgmlType::Q4_1: deq_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb); return true;
        case GgmlType::Q5_0: deq_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb); return true;
        case GgmlType::Q5_1: deq_q5_1(static_cast<const BlockQ5_1*>(src), dst, nb); return true;
        case GgmlType::Q8_0: deq_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb); return true;
        case GgmlType::Q2_K: deq_q2_k(static_cast<const BlockQ2_K*>(src), dst, nb); return true;
        case GgmlType::Q3_K: deq_q3_k(static_cast<const BlockQ3_K*>(src), dst, nb); return true;
        case GgmlType::Q4_K: deq_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb); return true;
        case GgmlType::Q5_K: deq_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb); return true;
        case GgmlType::Q6_K: deq_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb); return true;
        default: return false;
    }
}

}  // namespace kvgen::detail
