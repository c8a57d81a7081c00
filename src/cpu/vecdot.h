#pragma once
// Quantized dot products. Each token's activations are quantized once to 16-bit integers (x ~ d * q, |q| <= 32512
// per block), each weight block is widened to 16 bits, and the two are multiplied in integers (AVX2 madd, AVX-512
// VNNI dpwssd). The activation rounding (1 part in 32512 of a block's largest value) stays far below the 8-bit
// rounding of llama.cpp's kernels, so logits land near the exact math at integer speed. --math fast takes 8-bit forms
// instead (BlockB32, BlockB256: llama.cpp's precision) through the same kernels, with 8-bit products where the CPU has
// them (AVX-512 VNNI dpbusd, AVX2 maddubs).
#include <cstdint>

#include "engine/settings.h"
#include "gguf/ggml_types.h"

namespace kvgen::cpu {

// 32 activations, for the legacy 32-weight blocks (and Q2_K, Q3_K).
struct BlockA32 {
    float d;
    float ds;        // d * (sum[0] + sum[1]): the block's sum in real units, for the weights' offsets and mins
    int32_t sum[2];  // sums of q over elements 0..15 and 16..31
    int16_t q[32];
};
static_assert(sizeof(BlockA32) == 80, "BlockA32");

// 256 activations, for Q4_K, Q5_K and Q6_K: one scale per super-block, so sub-block scales stay integers.
struct BlockA256 {
    float d;
    int32_t bsums[16];  // sums of q over each 16 elements
    int16_t q[256];
};
static_assert(sizeof(BlockA256) == 580, "BlockA256");

// The 8-bit forms (--math fast): llama.cpp's activation precision (x ~ d * q, |q| <= 127 per block), the same
// layouts with int8 q, multiplied by the same kernels' structure (8-bit products where the CPU has them).
struct BlockB32 {
    float d;
    float ds;
    int32_t sum[2];
    int8_t q[32];
};
static_assert(sizeof(BlockB32) == 48, "BlockB32");

struct BlockB256 {
    float d;
    int32_t bsums[16];
    int8_t q[256];
};
static_assert(sizeof(BlockB256) == 324, "BlockB256");

enum class ActFormat { None, A32, A256, B32, B256 };

// Whether the 8-bit forms have kernels for t.
inline bool fast_type(GgmlType t) {
    switch (t) {
        case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q4_K: case GgmlType::Q5_K:
        case GgmlType::Q6_K: return true;
        default: return false;
    }
}

// Which activation form a weight type multiplies with (None: float weights, dequantize-and-dot in f32).
inline ActFormat act_format(GgmlType t, MathMode m = MathMode::Exact) {
    const bool b = m == MathMode::Fast && fast_type(t);
    switch (t) {
        case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: return b ? ActFormat::B256 : ActFormat::A256;
        case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
        case GgmlType::Q2_K: case GgmlType::Q3_K: return b ? ActFormat::B32 : ActFormat::A32;
        default: return ActFormat::None;
    }
}
inline bool act_8bit(ActFormat f) { return f == ActFormat::B32 || f == ActFormat::B256; }
inline bool act_256(ActFormat f) { return f == ActFormat::A256 || f == ActFormat::B256; }

// A32 activations of 16 tokens side by side, for prompt products that put tokens in vector lanes: per block of 32
// columns, pair j (values 2j, 2j + 1) of the 16 tokens as 16 int32 words, then the 16 tokens' d and ds. Tokens past
// the batch's end are zeros.
struct BlockT16 {
    int32_t pairs[16][16];  // [pair][token]: two int16, value 2j low
    float d[16];
    float ds[16];
};
static_assert(sizeof(BlockT16) == 1152, "BlockT16");

// The A256 form likewise, per super-block of 256 columns: the 16 tokens' pairs, d, and the sums of q over each 32
// columns, s = 2048 hi + lo (|s| < 2^20, lo in 0 .. 2047), as pairs of int16 like q: lo[j] holds (lo of columns
// 64 j .., lo of columns 64 j + 32 ..), hi[j] likewise.
struct BlockT256 {
    int32_t pairs[128][16];
    float d[16];
    int32_t lo[4][16];
    int32_t hi[4][16];
};
static_assert(sizeof(BlockT256) == 8768, "BlockT256");

// The B32 form of 16 tokens: per block of 32 columns, quad j (values 4j .. 4j + 3) of the 16 tokens as 16 int32
// words (vpdpbusd's operand), the tokens' sums of q over the block, d and ds.
struct BlockU16 {
    int32_t quads[8][16];
    int32_t sum[16];
    float d[16];
    float ds[16];
};
static_assert(sizeof(BlockU16) == 704, "BlockU16");

// The B256 form of 16 tokens, per super-block: quads, d, and the sums of q over each 16 columns as pairs of int16
// (s16[j]: columns 32 j .. and 32 j + 16 ..) and over each 32 (s32[j]: columns 64 j .. and 64 j + 32 ..).
struct BlockU256 {
    int32_t quads[64][16];
    float d[16];
    int32_t s16[8][16];
    int32_t s32[4][16];
};
static_assert(sizeof(BlockU256) == 4928, "BlockU256");

// One group of 16 tokens: the A32 blocks of m <= 16 tokens (nb blocks each) as nb BlockT16, or their A256 blocks (nsb
// each) as nsb BlockT256; tokens past m are zeros.
void tokens16_from_a32(const BlockA32* x, int m, int64_t nb, BlockT16* y);
void tokens16_from_a256(const BlockA256* x, int m, int64_t nsb, BlockT256* y);

void tokens16_from_b32(const BlockB32* x, int m, int64_t nb, BlockU16* y);
void tokens16_from_b256(const BlockB256* x, int m, int64_t nsb, BlockU256* y);

// n: a multiple of 32 (of 256 for the A256 and B256 forms).
void quantize_a32(const float* x, BlockA32* y, int64_t n);
void quantize_a256(const float* x, BlockA256* y, int64_t n);
void quantize_b32(const float* x, BlockB32* y, int64_t n);
void quantize_b256(const float* x, BlockB256* y, int64_t n);

namespace kernels {
// out[t * out_stride + r] = dot(weight row r, activations x_t) for rows r < nr (row_bytes apart from w) and tokens
// t < nt (1 to 4), x_t at x + t * x_stride bytes, in the form xf: act_format(type, mode). Q8_0, Q4_0, Q4_1, Q4_K,
// Q5_K and Q6_K give the same bits on every instruction set (the canonical order in vecdot_kernels.inc), and the
// same bits as a prompt's products (matmul.h), in either integer form; Q5_0, Q5_1, Q2_K and Q3_K give the scalar
// reference's bits too, from AVX2 and AVX-512 kernels of one token (several tokens take them a token at a time) or
// the scalar code elsewhere, and on AVX2 and AVX-512 VNNI a prompt's. One implementation per instruction set.
void vec_dot_rows_avx512(GgmlType type, ActFormat xf, const void* w, int64_t row_bytes, int nr, const void* x,
                         int64_t x_stride, int nt, float* out, int64_t out_stride, int64_t n);
void vec_dot_rows_avx2(GgmlType type, ActFormat xf, const void* w, int64_t row_bytes, int nr, const void* x,
                       int64_t x_stride, int nt, float* out, int64_t out_stride, int64_t n);
void vec_dot_rows_generic(GgmlType type, ActFormat xf, const void* w, int64_t row_bytes, int nr, const void* x,
                          int64_t x_stride, int nt, float* out, int64_t out_stride, int64_t n);
// One row: out[t] = dot(w, x_t) (vec_dot_rows with nr = 1). vec_dot_generic is the reference.
void vec_dot_avx512(GgmlType type, ActFormat xf, const void* w, const void* x, int64_t x_stride, int nt, float* out,
                    int64_t n);
void vec_dot_avx2(GgmlType type, ActFormat xf, const void* w, const void* x, int64_t x_stride, int nt, float* out,
                  int64_t n);
void vec_dot_generic(GgmlType type, ActFormat xf, const void* w, const void* x, int64_t x_stride, int nt, float* out,
                     int64_t n);
}  // namespace kernels

}  // namespace kvgen::cpu
