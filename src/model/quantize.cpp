#include "model/quantize.h"

#include <algorithm>
#include <cmath>

#include "common/half.h"
#include "model/quant_blocks.h"

namespace kvgen {

void quantize_row_q8_0(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ8_0*>(dst);
    for (int64_t b = 0; b < n / 32; ++b, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fp32_to_fp16(d);
        for (int j = 0; j < 32; ++j) y[b].qs[j] = int8_t(std::round(x[j] * id));
    }
}

void quantize_row_q4_0(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ4_0*>(dst);
    for (int64_t b = 0; b < n / 32; ++b, x += 32) {
        float amax = 0.0f, m = 0.0f;  // the value of largest magnitude, with its sign
        for (int j = 0; j < 32; ++j)
            if (std::fabs(x[j]) > amax) {
                amax = std::fabs(x[j]);
                m = x[j];
            }
        const float d = m / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fp32_to_fp16(d);
        for (int j = 0; j < 16; ++j) {
            const int lo = std::min(15, int(int8_t(x[j] * id + 8.5f)));
            const int hi = std::min(15, int(int8_t(x[j + 16] * id + 8.5f)));
            y[b].qs[j] = uint8_t(lo | (hi << 4));
        }
    }
}

}  // namespace kvgen
