#pragma once
// ggml quantization block layouts, byte for byte as stored in GGUF files. Scales are IEEE half (uint16_t).
// Legacy types hold 32 weights per block; k-quants hold 256 in a super-block of 16 or 8 sub-blocks.
#include <cstdint>
#include <cstring>

namespace kvgen {

constexpr int QK = 32;     // legacy block size
constexpr int QK_K = 256;  // k-quant super-block size
constexpr int K_SCALE_SIZE = 12;

struct BlockQ4_0 {  // w = d * (q - 8), q in 0..15; qs[j] holds weight j (low nibble) and j + 16 (high)
    uint16_t d;
    uint8_t qs[QK / 2];
};
struct BlockQ4_1 {  // w = d * q + m
    uint16_t d, m;
    uint8_t qs[QK / 2];
};
struct BlockQ5_0 {  // w = d * (q - 16), q in 0..31; bit 4 of weight j is bit j of qh
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[QK / 2];
};
struct BlockQ5_1 {  // w = d * q + m
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[QK / 2];
};
struct BlockQ8_0 {  // w = d * q
    uint16_t d;
    int8_t qs[QK];
};
struct BlockQ2_K {  // 16 sub-blocks of 16: w = d * (sc & 15) * q - dmin * (sc >> 4), q in 0..3
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    uint16_t d, dmin;
};
struct BlockQ3_K {  // 16 sub-blocks of 16: w = d * (sc - 32) * (q - 4 * !hbit), 6-bit scales packed in 12 bytes
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
};
struct BlockQ4_K {  // 8 sub-blocks of 32: w = d * sc * q - dmin * m, 6-bit sc and m packed in 12 bytes
    uint16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
};
struct BlockQ5_K {  // as Q4_K with a fifth bit per weight in qh
    uint16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
struct BlockQ6_K {  // 16 sub-blocks of 16: w = d * sc * (q - 32), 4 low bits in ql, 2 high bits in qh
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
};

static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block");
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block");
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block");
static_assert(sizeof(BlockQ5_1) == 24, "Q5_1 block");
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block");
static_assert(sizeof(BlockQ2_K) == 84, "Q2_K block");
static_assert(sizeof(BlockQ3_K) == 110, "Q3_K block");
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block");
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block");
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block");

// Sub-block j (0..7) scale and min of Q4_K/Q5_K: 6 bits each; j < 4 in the low bits of bytes j and j + 4,
// j >= 4 split between the nibbles of bytes j + 4 and the top two bits of bytes j - 4 and j.
inline void k4_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = uint8_t((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// All eight scales and mins at once (k4_scale_min for j = 0..7), four bytes to a 32-bit word: sc[0..3] and m[0..3]
// are the low 6 bits of bytes 0..3 and 4..7; sc[4..7] the low nibbles of bytes 8..11 under the top two bits of bytes
// 0..3, m[4..7] the high nibbles of bytes 8..11 under the top two bits of bytes 4..7.
inline void k4_scales_mins(const uint8_t* q, uint8_t sc[8], uint8_t m[8]) {
    uint32_t w0, w1, w2;
    std::memcpy(&w0, q, 4);
    std::memcpy(&w1, q + 4, 4);
    std::memcpy(&w2, q + 8, 4);
    const uint32_t s03 = w0 & 0x3f3f3f3fu, m03 = w1 & 0x3f3f3f3fu;
    const uint32_t s47 = (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);
    const uint32_t m47 = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
    std::memcpy(sc, &s03, 4);
    std::memcpy(sc + 4, &s47, 4);
    std::memcpy(m, &m03, 4);
    std::memcpy(m + 4, &m47, 4);
}

// The 16 6-bit scales of Q3_K (0..63, to be offset by -32): low 4 bits in bytes 0..7 (two per byte: scales j and
// j + 8), high 2 bits in bytes 8..11 (four per byte: scales j, j + 4, j + 8, j + 12 for j = byte - 8).
inline void q3k_scales(const uint8_t* packed, uint8_t out[16]) {
    for (int j = 0; j < 16; ++j) {
        const uint8_t lo = (j < 8) ? (packed[j] & 0x0f) : (packed[j - 8] >> 4);
        const uint8_t hi = (packed[8 + (j % 4)] >> (2 * (j / 4))) & 3;
        out[j] = uint8_t(lo | (hi << 4));
    }
}

}  // namespace kvgen

namespace kvgen {

// Inverse of k4_scale_min for all 8 sub-blocks: sc and m are 6-bit values.
inline void k4_pack_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t out[K_SCALE_SIZE]) {
    for (int j = 0; j < 4; ++j) {
        out[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        out[j + 4] = uint8_t((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        out[j + 8] = uint8_t((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
    }
}

// Inverse of q3k_scales: 16 6-bit values (0..63, meaning value - 32) into 12 bytes.
inline void q3k_pack_scales(const uint8_t in[16], uint8_t out[12]) {
    for (int j = 0; j < 8; ++j) out[j] = uint8_t((in[j] & 0x0f) | ((in[j + 8] & 0x0f) << 4));
    for (int k = 0; k < 4; ++k) {
        out[8 + k] = uint8_t(((in[k] >> 4) & 3) | (((in[k + 4] >> 4) & 3) << 2) | (((in[k + 8] >> 4) & 3) << 4) |
                             (((in[k + 12] >> 4) & 3) << 6));
    }
}

}  // namespace kvgen
