#include "common/half.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace kvgen {

float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // subnormal: normalize
            int e = -1;
            do {
                ++e;
                mant <<= 1;
            } while ((mant & 0x400u) == 0);
            bits = sign | uint32_t(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | mant << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | mant << 13;
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

uint16_t fp32_to_fp16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
    const uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
    if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
    if (abs < 0x38800000u) {                         // below the smallest normal: subnormal or zero
        if (abs < 0x33000000u) return sign;          // below half the smallest subnormal
        const uint32_t e = abs >> 23;
        const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e;  // 14..24
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) ++r;
        return sign | uint16_t(r);
    }
    uint32_t r = ((abs - 0x38000000u) >> 13);  // rebias exponent 127 -> 15
    const uint32_t rem = abs & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
    return sign | uint16_t(r);
}

namespace {

#if defined(__x86_64__)
// F16C rounds to nearest even as fp32_to_fp16 does (overflow to inf, subnormal results kept); only a NaN's bits
// differ (F16C keeps the payload's top bits), so eight values with a NaN among them take the portable path.
__attribute__((target("avx,f16c"))) void row_f16c(const float* x, uint16_t* y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
            for (int j = 0; j < 8; ++j) y[i + j] = fp32_to_fp16(x[i + j]);
            continue;
        }
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

// CPUID leaf 1's AVX and F16C bits, and the OS saving the vector registers (OSXSAVE, XCR0's SSE and AVX state), read
// directly: not every compiler's __builtin_cpu_supports knows "f16c". (KVGEN_ISA=generic, which keeps the kernels
// portable, keeps this portable too.)
const bool kF16c = [] {
    const char* isa = std::getenv("KVGEN_ISA");
    if (isa && std::strcmp(isa, "generic") == 0) return false;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const unsigned need = 1u << 27 | 1u << 28 | 1u << 29;  // OSXSAVE, AVX, F16C
    if ((c & need) != need) return false;
    unsigned lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 6u) == 6u;
}();
#endif

}  // namespace

void fp32_to_fp16_row(const float* x, uint16_t* y, int64_t n) {
#if defined(__x86_64__)
    if (kF16c) {
        row_f16c(x, y, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

}  // namespace kvgen
