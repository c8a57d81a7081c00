#pragma once
// Quantization of float rows into ggml's Q8_0 and Q4_0 blocks of 32 (the KV cache's q8_0 / q4_0 types), with
// ggml's reference rounding: Q8_0 d = amax / 127, q = round(x / d); Q4_0 d = m / -8 for the value m of largest
// magnitude, q = min(15, trunc(x / d + 8.5)). dequantize_row (dequant.h) is the inverse.
#include <cstdint>

namespace kvgen {

// n: a multiple of 32; dst: n / 32 blocks.
void quantize_row_q8_0(const float* x, void* dst, int64_t n);
void quantize_row_q4_0(const float* x, void* dst, int64_t n);

}  // namespace kvgen
