#include <cmath>
#include <cstring>

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
