#pragma once
// IEEE binary16 and bfloat16 conversions, portable (no F16C needed); the hot paths convert whole rows.
#include <cstdint>
#include <cstring>

namespace kvgen {

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);  // round to nearest even, overflow to inf, NaN kept

// y[i] = fp32_to_fp16(x[i]) for i < n, the same bits (F16C's conversion where the CPU has it).
void fp32_to_fp16_row(const float* x, uint16_t* y, int64_t n);

inline float bf16_to_fp32(uint16_t h) {
    uint32_t bits = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

inline uint16_t fp32_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // quiet NaN
    bits += 0x7fffu + ((bits >> 16) & 1u);                                          // round to nearest even
    return uint16_t(bits >> 16);
}

}  // namespace kvgen
