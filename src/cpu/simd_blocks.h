#pragma once
// Weight-block unpacking shared by the SIMD kernels (vecdot_kernels.inc, matmul_kernels.inc). Each instruction set's
// translation unit compiles its own copy (an unnamed namespace): the bodies differ by the flags they are built with.
#if defined(__AVX2__)
#include <immintrin.h>

#include <cstdint>

namespace kvgen::cpu::kernels {
namespace {

// Q5_0 / Q5_1: bit j of qh as 16 in byte j (AVX-512: a masked byte move; AVX2: byte j / 8 of qh spread to bytes
// 8 (j / 8) .., then bit j % 8 of each tested)
inline __m256i q5_high(uint32_t qh) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_maskz_mov_epi8(__mmask32(qh), _mm256_set1_epi8(16));
#else
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(int32_t(qh)),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                                                2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
#endif
}

// Columns 32 b .. 32 b + 31 of a Q2_K or Q3_K super-block's 2-bit fields (b / 4: which 32 bytes, b % 4: which bit pair)
inline __m256i k_low2(const uint8_t* qs, int b) {
    return _mm256_and_si256(
        _mm256_srli_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (b / 4))), 2 * (b % 4)),
        _mm256_set1_epi8(3));
}

}  // namespace
}  // namespace kvgen::cpu::kernels
#endif
