#include <cmath>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "common/half.h"

using namespace kvgen;

TEST_CASE("fp16 decodes known values", "[half]") {
    CHECK(fp16_to_fp32(0x0000) == 0.0f);
    CHECK(fp16_to_fp32(0x3c00) == 1.0f);
    CHECK(fp16_to_fp32(0xc000) == -2.0f);
    CHECK(fp16_to_fp32(0x7bff) == 65504.0f);
    CHECK(fp16_to_fp32(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
    CHECK(fp16_to_fp32(0x03ff) == std::ldexp(1023.0f, -24));
    CHECK(std::isinf(fp16_to_fp32(0x7c00)));
    CHECK(std::isnan(fp16_to_fp32(0x7e00)));
}

TEST_CASE("fp16 round-trips every finite value and rounds to nearest even", "[half]") {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        if ((h & 0x7c00) == 0x7c00) continue;  // inf and NaN
        REQUIRE(fp32_to_fp16(fp16_to_fp32(uint16_t(h))) == h);
    }
    CHECK(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);      // halfway, rounds to even (down)
    CHECK(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // halfway, rounds to even (up)
    CHECK(fp32_to_fp16(70000.0f) == 0x7c00);                           // overflow to inf
    CHECK(fp32_to_fp16(std::ldexp(1.0f, -26)) == 0x0000);              // underflow to zero
}

TEST_CASE("bf16 keeps the top half of a float, rounded to nearest even", "[half]") {
    CHECK(bf16_to_fp32(0x3f80) == 1.0f);
    CHECK(fp32_to_bf16(1.0f) == 0x3f80);
    CHECK(fp32_to_bf16(-2.5f) == 0xc020);
    uint32_t bits = 0x3f808000;  // exactly halfway between 0x3f80 and 0x3f81: stays even
    float f;
    std::memcpy(&f, &bits, 4);
    CHECK(fp32_to_bf16(f) == 0x3f80);
}

TEST_CASE("fp32_to_fp16_row gives fp32_to_fp16's bits for every kind of value", "[half]") {
    // every exponent and sign, mantissas whose low bits sit at each rounding boundary (normal results drop 13 bits,
    // subnormal ones 14 to 24), random high bits; NaNs with payloads; rows of every length mod 8
    std::vector<uint32_t> bits;
    uint32_t seed = 12345;
    const auto next = [&] { return seed = seed * 1664525u + 1013904223u; };
    for (uint32_t e = 0; e < 256; ++e)
        for (uint32_t s = 0; s < 2; ++s)
            for (int drop = 13; drop <= 24; ++drop) {
                const uint32_t half = 1u << (drop - 1), mask = (1u << drop) - 1;
                for (uint32_t lo : {0u, 1u, half - 1, half, half + 1, mask})
                    for (int k = 0; k < 4; ++k) {
                        const uint32_t m = ((next() >> 9) & ~mask & 0x7fffffu) | (lo & mask & 0x7fffffu);
                        bits.push_back(s << 31 | e << 23 | m);
                    }
            }
    for (int k = 0; k < 100000; ++k) bits.push_back(next());
    std::vector<float> x(bits.size());
    std::memcpy(x.data(), bits.data(), bits.size() * 4);
    for (size_t off = 0; off < 9; ++off) {
        const size_t n = x.size() - off;
        std::vector<uint16_t> got(n);
        fp32_to_fp16_row(x.data() + off, got.data(), int64_t(n));
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) bad += got[i] != fp32_to_fp16(x[off + i]);
        CHECK(bad == 0);
    }
    CHECK(x.size() > 150000);
}
