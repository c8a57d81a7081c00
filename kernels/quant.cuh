#pragma once
// Device decoders of the GGUF weight types, read straight from the uploaded blocks. The unit of work is a chunk of
// 32 consecutive weights: a legacy block (Q4_0 .. Q8_0), one of the 8 chunks of a k-quant super-block, or 32 plain
// f16 / bf16 / f32 values. Every kernel that reads weights (decode matvec, embedding lookup, dequantization to f16
// for the prefill GEMM) decodes chunks with these, so one decoder per type serves them all. The CPU twin is
// dequantize_row (src/model/dequant_impl.h): an independent implementation of the same layouts, compared with
// these in the [cuda] tests.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "gguf/ggml_types.h"
#include "weight_layout.h"

// The decoders compile for the host too (KVGEN_HD), so the CPU-only CI checks their bit layouts against
// dequantize_row without a GPU (tests/test_cuda_host.cpp); the kernels call the very same functions.
#include "common/hd.h"

namespace kvgen::cuda {

KVGEN_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
}

KVGEN_HD float half_bits(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}
KVGEN_HD float h2f(const uint8_t* p) {  // a half at a 2-byte aligned address
    return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(p)));
}
KVGEN_HD uint32_t le32_unaligned(const uint8_t* p) {  // 2-byte aligned
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
}

// 16 bytes at a 16-byte aligned address, in one load (on the host, a misaligned address throws: the CPU-only tests
// so catch a layout that would fault on the device).
KVGEN_HD uint4 ld16(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
    return __ldg(reinterpret_cast<const uint4*>(p));
#else
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) throw std::logic_error("a 16-byte load from a misaligned address");
    uint4 v;
    std::memcpy(&v, p, 16);
    return v;
#endif
}

// Where a kernel reads or writes `bytes` (4, 8 or 16) at p with one vector access: on the host a misaligned p throws,
// as ld16 does, since the device would fault; nothing on the device.
KVGEN_HD void check_aligned(const void* p, unsigned bytes) {
#if !defined(__CUDA_ARCH__)
    if (reinterpret_cast<uintptr_t>(p) % bytes != 0) throw std::logic_error("a vector access at a misaligned address");
#endif
}

// One byte, two at a 2-byte aligned address and four at a 4-byte aligned one, through the read-only path on the
// device (on the host a misaligned 4-byte load throws, as ld16 does).
KVGEN_HD uint8_t ld_u8(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
    return __ldg(p);
#else
    return *p;
#endif
}
KVGEN_HD uint16_t ld_u16(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
    return __ldg(reinterpret_cast<const unsigned short*>(p));
#else
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
#endif
}
KVGEN_HD uint32_t ld_u32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
    return __ldg(reinterpret_cast<const unsigned int*>(p));
#else
    check_aligned(p, 4);
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
#endif
}

// Q4_K / Q5_K 6-bit scale and min of sub-block j (0..7), packed in 12 bytes.
KVGEN_HD void k4_scale_min_dev(int j, const uint8_t* q, float* sc, float* m) {
    if (j < 4) {
        *sc = float(q[j] & 63);
        *m = float(q[j + 4] & 63);
    } else {
        *sc = float((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *m = float((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// Q3_K 6-bit scale j (0..15), minus 32.
KVGEN_HD int q3k_scale_dev(int j, const uint8_t* packed) {
    const int lo = (j < 8) ? (packed[j] & 0x0f) : (packed[j - 8] >> 4);
    const int hi = (packed[8 + (j % 4)] >> (2 * (j / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

template <GgmlType T>
struct Dq;

// Each Dq<T>: kWeights per block, kBytes per block, kChunks = kWeights / 32, and chunk(blk, s, w) writing the 32
// weights of chunk s of the block at blk; for the planar types (weight_layout.h) instead planar_chunk(row, c, cpr, w),
// chunk c of a row of cpr chunks.

// Q4_0, planar: the chunk's 16 bytes of nibbles (byte j: weight j low, j + 16 high), then d.
template <>
struct Dq<GgmlType::Q4_0> {
    KVGEN_HD static void planar_chunk(const uint8_t* row, int64_t c, int64_t cpr, float (&w)[32]) {
        const float d = h2f(row + 16 * cpr + 2 * c);
        const uint4 v4 = ld16(row + 16 * c);
        const uint32_t v[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
        for (int e = 0; e < 4; ++e)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                w[4 * e + i] = d * float(int((v[e] >> (8 * i)) & 0x0f) - 8);
                w[4 * e + i + 16] = d * float(int((v[e] >> (8 * i + 4)) & 0x0f) - 8);
            }
    }
};

template <>
struct Dq<GgmlType::Q4_1> {
    static constexpr int kWeights = 32, kBytes = 20, kChunks = 1;
    KVGEN_HD static void chunk(const uint8_t* b, int, float (&w)[32]) {
        const float d = h2f(b), m = h2f(b + 2);
        const uint32_t* qs = reinterpret_cast<const uint32_t*>(b + 4);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t v = qs[k];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                w[4 * k + i] = d * float((v >> (8 * i)) & 0x0f) + m;
                w[4 * k + i + 16] = d * float((v >> (8 * i + 4)) & 0x0f) + m;
            }
        }
    }
};

template <>
struct Dq<GgmlType::Q5_0> {
    static constexpr int kWeights = 32, kBytes = 22, kChunks = 1;
    KVGEN_HD static void chunk(const uint8_t* b, int, float (&w)[32]) {
        const float d = h2f(b);
        const uint32_t qh = le32_unaligned(b + 2);
        const uint16_t* qs = reinterpret_cast<const uint16_t*>(b + 6);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const uint32_t v = qs[k];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int j = 2 * k + i;
                const int lo = int((v >> (8 * i)) & 0x0f) | int(((qh >> j) & 1u) << 4);
                const int hi = int((v >> (8 * i + 4)) & 0x0f) | int(((qh >> (j + 16)) & 1u) << 4);
                w[j] = d * float(lo - 16);
                w[j + 16] = d * float(hi - 16);
            }
        }
    }
};

template <>
struct Dq<GgmlType::Q5_1> {
    static constexpr int kWeights = 32, kBytes = 24, kChunks = 1;
    KVGEN_HD static void chunk(const uint8_t* b, int, float (&w)[32]) {
        const float d = h2f(b), m = h2f(b + 2);
        const uint32_t qh = *reinterpret_cast<const uint32_t*>(b + 4);
        const uint32_t* qs = reinterpret_cast<const uint32_t*>(b + 8);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t v = qs[k];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int j = 4 * k + i;
                const int lo = int((v >> (8 * i)) & 0x0f) | int(((qh >> j) & 1u) << 4);
                const int hi = int((v >> (8 * i + 4)) & 0x0f) | int(((qh >> (j + 16)) & 1u) << 4);
                w[j] = d * float(lo) + m;
                w[j + 16] = d * float(hi) + m;
            }
        }
    }
};

// Q8_0, planar: the chunk's 32 int8 weights, then d.
template <>
struct Dq<GgmlType::Q8_0> {
    KVGEN_HD static void planar_chunk(const uint8_t* row, int64_t c, int64_t cpr, float (&w)[32]) {
        const float d = h2f(row + 32 * cpr + 2 * c);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint4 v4 = ld16(row + 32 * c + 16 * k);
            const uint32_t v[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int i = 0; i < 4; ++i) w[16 * k + 4 * e + i] = d * float(int8_t((v[e] >> (8 * i)) & 0xff));
        }
    }
};

// Q2_K (84 bytes: scales[16], qs[64], d, dmin). Chunk s: half s / 4 (32 bytes of qs), bit shift 2 * (s % 4);
// weights 0..15 and 16..31 of the chunk have their own scale byte.
template <>
struct Dq<GgmlType::Q2_K> {
    static constexpr int kWeights = 256, kBytes = 84, kChunks = 8;
    KVGEN_HD static void chunk(const uint8_t* b, int s, float (&w)[32]) {
        const float d = h2f(b + 80), dmin = h2f(b + 82);
        const int half = s / 4, shift = 2 * (s % 4);
        const uint32_t* q = reinterpret_cast<const uint32_t*>(b + 16 + 32 * half);
#pragma unroll
        for (int sub = 0; sub < 2; ++sub) {
            const uint8_t sc = b[half * 8 + (s % 4) * 2 + sub];
            const float dl = d * float(sc & 0x0f), ml = dmin * float(sc >> 4);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const uint32_t v = q[4 * sub + k] >> shift;
#pragma unroll
                for (int i = 0; i < 4; ++i) w[16 * sub + 4 * k + i] = dl * float((v >> (8 * i)) & 3) - ml;
            }
        }
    }
};

// Q3_K (110 bytes: hmask[32], qs[64], scales[12], d). As Q2_K for the low two bits; hmask bit
// 4 * half + s % 4 of byte l is the third bit (clear: subtract 4).
template <>
struct Dq<GgmlType::Q3_K> {
    static constexpr int kWeights = 256, kBytes = 110, kChunks = 8;
    KVGEN_HD static void chunk(const uint8_t* b, int s, float (&w)[32]) {
        const float d = h2f(b + 108);
        const int half = s / 4, shift = 2 * (s % 4);
        const uint32_t hbit = 4 * half + s % 4;
        const uint16_t* q = reinterpret_cast<const uint16_t*>(b + 32 + 32 * half);
        const uint16_t* hm = reinterpret_cast<const uint16_t*>(b);
#pragma unroll
        for (int sub = 0; sub < 2; ++sub) {
            const float dl = d * float(q3k_scale_dev(half * 8 + (s % 4) * 2 + sub, b + 96));
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const uint32_t v = uint32_t(q[8 * sub + k]) >> shift;
                const uint32_t h = uint32_t(hm[8 * sub + k]) >> hbit;
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const int val = int((v >> (8 * i)) & 3) - (((h >> (8 * i)) & 1u) ? 0 : 4);
                    w[16 * sub + 2 * k + i] = dl * float(val);
                }
            }
        }
    }
};

// Q4_K, planar: super-block b's qs[128] at 128 b, its scales and mins unpacked after all the row's quants (a word per
// pair of sub-blocks: sc[2p], sc[2p + 1], m[2p], m[2p + 1]), its d and dmin after them. Chunk s of the super-block:
// bytes 32 (s / 2) of qs, low nibbles for even s.
template <>
struct Dq<GgmlType::Q4_K> {
    KVGEN_HD static void planar_chunk(const uint8_t* row, int64_t c, int64_t cpr, float (&w)[32]) {
        const int64_t sb = c / 8, n_super = cpr / 8;
        const int s = int(c % 8);
        const uint8_t* sm = row + q4k_scales_at(n_super) + 16 * sb + 4 * (s / 2) + s % 2;
        const uint8_t* dd = row + q4k_d_at(n_super) + 4 * sb;
        const float dl = h2f(dd) * float(ld_u8(sm)), ml = h2f(dd + 2) * float(ld_u8(sm + 2));
        const int shift = 4 * (s % 2);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint4 v4 = ld16(row + 128 * sb + 32 * (s / 2) + 16 * k);
            const uint32_t v[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int i = 0; i < 4; ++i) w[16 * k + 4 * e + i] = dl * float((v[e] >> (8 * i + shift)) & 0x0f) - ml;
        }
    }
};

// Q5_K (176 bytes: d, dmin, scales[12], qh[32], qs[128]). As Q4_K; bit s of qh[l] is the fifth bit.
template <>
struct Dq<GgmlType::Q5_K> {
    static constexpr int kWeights = 256, kBytes = 176, kChunks = 8;
    KVGEN_HD static void chunk(const uint8_t* b, int s, float (&w)[32]) {
        float sc, m;
        k4_scale_min_dev(s, b + 4, &sc, &m);
        const float dl = h2f(b) * sc, ml = h2f(b + 2) * m;
        const int shift = 4 * (s % 2);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint4 v4 = ld16(b + 48 + 32 * (s / 2) + 16 * k), h4 = ld16(b + 16 + 16 * k);
            const uint32_t v[4] = {v4.x, v4.y, v4.z, v4.w};
            const uint32_t h[4] = {h4.x, h4.y, h4.z, h4.w};
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const uint32_t lo = (v[e] >> (8 * i + shift)) & 0x0f;
                    const uint32_t hi = (h[e] >> (8 * i + s)) & 1u;
                    w[16 * k + 4 * e + i] = dl * float(lo | (hi << 4)) - ml;
                }
        }
    }
};

// Q6_K, planar: super-block b's ql[128] and qh[64] at 192 b, its 16 int8 scales after all the row's quants, its d
// after all the scales. Chunk s of the super-block: half s / 4, quarter qq = s % 4: low nibbles from ql[l] (qq 0, 2)
// or ql[l + 32] (qq 1, 3), low (qq < 2) or high nibble, top bits (qh[l] >> 2 qq) & 3.
template <>
struct Dq<GgmlType::Q6_K> {
    KVGEN_HD static void planar_chunk(const uint8_t* row, int64_t c, int64_t cpr, float (&w)[32]) {
        const int64_t sb = c / 8, n_super = cpr / 8;
        const int s = int(c % 8), half = s / 4, qq = s % 4;
        const uint8_t* b = row + 192 * sb;
        const float d = h2f(row + 208 * n_super + 2 * sb);
        const int8_t* sc = reinterpret_cast<const int8_t*>(row + 192 * n_super + 16 * sb + 8 * half);
        const int nshift = (qq >= 2) ? 4 : 0, hshift = 2 * qq;
#pragma unroll
        for (int sub = 0; sub < 2; ++sub) {
            const float dl = d * float(sc[sub + 2 * qq]);
            const uint4 l4 = ld16(b + 64 * half + 32 * (qq & 1) + 16 * sub);
            const uint4 h4 = ld16(b + 128 + 32 * half + 16 * sub);
            const uint32_t lv[4] = {l4.x, l4.y, l4.z, l4.w}, hv[4] = {h4.x, h4.y, h4.z, h4.w};
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const uint32_t lo = (lv[e] >> (8 * i + nshift)) & 0x0f, hi = (hv[e] >> (8 * i + hshift)) & 3u;
                    w[16 * sub + 4 * e + i] = dl * float(int(lo | (hi << 4)) - 32);
                }
        }
    }
};

// 32 plain 16-bit values (64 bytes, four 16-byte loads), widened by ToFloat.
template <typename ToFloat>
struct Dq16 {
    static constexpr int kWeights = 32, kBytes = 64, kChunks = 1;
    KVGEN_HD static void chunk(const uint8_t* b, int, float (&w)[32]) {
        const uint4* p = reinterpret_cast<const uint4*>(b);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint4 v = p[k];
            const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                w[8 * k + 2 * e] = ToFloat::of(uint16_t(u[e] & 0xffffu));
                w[8 * k + 2 * e + 1] = ToFloat::of(uint16_t(u[e] >> 16));
            }
        }
    }
};

struct HalfToFloat {
    KVGEN_HD static float of(uint16_t h) { return __half2float(__ushort_as_half(h)); }
};
struct Bf16ToFloat {
    KVGEN_HD static float of(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }
};

template <>
struct Dq<GgmlType::F16> : Dq16<HalfToFloat> {};
template <>
struct Dq<GgmlType::BF16> : Dq16<Bf16ToFloat> {};

template <>
struct Dq<GgmlType::F32> {
    static constexpr int kWeights = 32, kBytes = 128, kChunks = 1;
    KVGEN_HD static void chunk(const uint8_t* b, int, float (&w)[32]) {
        const float4* p = reinterpret_cast<const float4*>(b);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const float4 v = p[k];
            w[4 * k] = v.x;
            w[4 * k + 1] = v.y;
            w[4 * k + 2] = v.z;
            w[4 * k + 3] = v.w;
        }
    }
};

// Weight j of a row of a float type (F32, F16, BF16): the path for rows whose length is not a multiple of 32 (a
// tiny model's n_embd of 8), which the chunk decoders cannot split. Quantized rows are always whole chunks.
KVGEN_HD bool is_float_type(GgmlType t) {
    return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}
KVGEN_HD float float_weight(GgmlType t, const uint8_t* row, int64_t j) {
    if (t == GgmlType::F32) return reinterpret_cast<const float*>(row)[j];
    const uint16_t h = reinterpret_cast<const uint16_t*>(row)[j];
    return t == GgmlType::F16 ? HalfToFloat::of(h) : Bf16ToFloat::of(h);
}

// Chunk c of a row of cpr chunks (cols / 32) that starts at `row`, in the device layout.
template <GgmlType T>
KVGEN_HD void row_chunk(const uint8_t* row, int64_t c, int64_t cpr, float (&w)[32]) {
    using D = Dq<T>;
    if constexpr (planar_type(T))
        D::planar_chunk(row, c, cpr, w);
    else
        D::chunk(row + (c / D::kChunks) * D::kBytes, int(c % D::kChunks), w);
}

template <GgmlType T>
using TypeTag = std::integral_constant<GgmlType, T>;

// Calls f(TypeTag<T>{}) for the runtime type t (a generic lambda reads T as decltype(tag)::value); false for a
// type without a device decoder.
template <typename F>
bool dispatch_type(GgmlType t, F&& f) {
    switch (t) {
        case GgmlType::F32:
            f(TypeTag<GgmlType::F32>{});
            return true;
        case GgmlType::F16:
            f(TypeTag<GgmlType::F16>{});
            return true;
        case GgmlType::BF16:
            f(TypeTag<GgmlType::BF16>{});
            return true;
        case GgmlType::Q4_0:
            f(TypeTag<GgmlType::Q4_0>{});
            return true;
        case GgmlType::Q4_1:
            f(TypeTag<GgmlType::Q4_1>{});
            return true;
        case GgmlType::Q5_0:
            f(TypeTag<GgmlType::Q5_0>{});
            return true;
        case GgmlType::Q5_1:
            f(TypeTag<GgmlType::Q5_1>{});
            return true;
        case GgmlType::Q8_0:
            f(TypeTag<GgmlType::Q8_0>{});
            return true;
        case GgmlType::Q2_K:
            f(TypeTag<GgmlType::Q2_K>{});
            return true;
        case GgmlType::Q3_K:
            f(TypeTag<GgmlType::Q3_K>{});
            return true;
        case GgmlType::Q4_K:
            f(TypeTag<GgmlType::Q4_K>{});
            return true;
        case GgmlType::Q5_K:
            f(TypeTag<GgmlType::Q5_K>{});
            return true;
        case GgmlType::Q6_K:
            f(TypeTag<GgmlType::Q6_K>{});
            return true;
        default:
            return false;
    }
}

}  // namespace kvgen::cuda
