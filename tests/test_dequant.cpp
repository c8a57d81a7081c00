// Dequantization: against an independent implementation (the gguf Python package's decoders, see
// data/make_dequant_golden.py) for every supported type, and on hand-built blocks whose values follow from the
// layouts written out weight by weight.
#include <cmath>
#include <random>
#include <cstring>

#include "common/error.h"
#include "common/half.h"
#include "gguf/gguf.h"
#include "model/dequant.h"
#include "model/quant_blocks.h"
#include "test_util.h"

using namespace kvgen;

TEST_CASE("every supported type decodes exactly as the independent reference does", "[dequant]") {
    const GgufFile f = GgufFile::open(test::source("tests/data/dequant_golden.bin"));
    int checked = 0;
    for (const char* name : {"F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                             "Q6_K"}) {
        INFO(name);
        const GgufTensor* q = f.tensor(std::string(name) + ".q");
        const GgufTensor* e = f.tensor(std::string(name) + ".f32");
        REQUIRE(q != nullptr);
        REQUIRE(e != nullptr);
        REQUIRE(ggml_type_name(q->type) == name);
        const int64_t n = q->n_elements();
        REQUIRE(n == 1024);
        std::vector<float> got(static_cast<size_t>(n));
        dequantize_row(GgmlType(q->type), q->data, got.data(), n);
        std::vector<float> want(static_cast<size_t>(n));
        std::memcpy(want.data(), e->data, size_t(n) * 4);
        for (int64_t j = 0; j < n; ++j) {
            INFO("weight " << j);
            REQUIRE(got[size_t(j)] == Approx(want[size_t(j)]).epsilon(1e-6).margin(1e-7));
        }
        ++checked;
    }
    CHECK(checked == 12);
}

TEST_CASE("F32 copies and unsupported types are refused", "[dequant]") {
    const float src[4] = {1.5f, -2.0f, 0.0f, 3.25f};
    float dst[4];
    dequantize_row(GgmlType::F32, src, dst, 4);
    CHECK(std::memcmp(src, dst, sizeof(src)) == 0);
    uint8_t block[292] = {};
    float out[256];
    CHECK_THROWS_WITH(dequantize_row(GgmlType::Q8_K, block, out, 256), Catch::Contains("supported: F32, F16"));
}

TEST_CASE("Q4_0 and Q4_1 hand-built blocks", "[dequant]") {
    BlockQ4_0 b{};
    b.d = fp32_to_fp16(0.5f);
    for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | ((15 - j) << 4));
    float y[32];
    dequantize_row(GgmlType::Q4_0, &b, y, 32);
    for (int j = 0; j < 16; ++j) {
        CHECK(y[j] == 0.5f * float(j - 8));
        CHECK(y[j + 16] == 0.5f * float(7 - j));
    }
    BlockQ4_1 c{};
    c.d = fp32_to_fp16(0.25f);
    c.m = fp32_to_fp16(-1.0f);
    for (int j = 0; j < 16; ++j) c.qs[j] = uint8_t(j | (j << 4));
    dequantize_row(GgmlType::Q4_1, &c, y, 32);
    for (int j = 0; j < 16; ++j) {
        CHECK(y[j] == 0.25f * float(j) - 1.0f);
        CHECK(y[j + 16] == 0.25f * float(j) - 1.0f);
    }
}

TEST_CASE("Q5_0, Q5_1 and Q8_0 hand-built blocks", "[dequant]") {
    // Weight j's fifth bit is bit j of qh: set it for odd j only.
    BlockQ5_0 b{};
    b.d = fp32_to_fp16(2.0f);
    const uint32_t qh = 0xaaaaaaaau;
    std::memcpy(b.qh, &qh, 4);
    for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(3 | (5 << 4));
    float y[32];
    dequantize_row(GgmlType::Q5_0, &b, y, 32);
    for (int j = 0; j < 32; ++j) {
        const int q = (j < 16 ? 3 : 5) + ((j % 2) ? 16 : 0);
        CHECK(y[j] == 2.0f * float(q - 16));
    }
    BlockQ5_1 c{};
    c.d = fp32_to_fp16(1.0f);
    c.m = fp32_to_fp16(0.5f);
    std::memcpy(c.qh, &qh, 4);
    for (int j = 0; j < 16; ++j) c.qs[j] = uint8_t(j | (j << 4));
    dequantize_row(GgmlType::Q5_1, &c, y, 32);
    for (int j = 0; j < 32; ++j) CHECK(y[j] == float((j % 16) + ((j % 2) ? 16 : 0)) + 0.5f);
    BlockQ8_0 e{};
    e.d = fp32_to_fp16(0.125f);
    for (int j = 0; j < 32; ++j) e.qs[j] = int8_t(j * 8 - 128);
    dequantize_row(GgmlType::Q8_0, &e, y, 32);
    for (int j = 0; j < 32; ++j) CHECK(y[j] == 0.125f * float(j * 8 - 128));
}

TEST_CASE("k-quant scale packing round-trips", "[dequant]") {
    uint8_t sc[8], m[8], packed[12];
    for (int j = 0; j < 8; ++j) {
        sc[j] = uint8_t(7 * j + 3);
        m[j] = uint8_t(63 - 5 * j);
    }
    k4_pack_scales(sc, m, packed);
    for (int j = 0; j < 8; ++j) {
        uint8_t a, b;
        k4_scale_min(j, packed, &a, &b);
        CHECK(a == sc[j]);
        CHECK(b == m[j]);
    }
    uint8_t s16[16], p12[12], back[16];
    for (int j = 0; j < 16; ++j) s16[j] = uint8_t((j * 11 + 5) % 64);
    q3k_pack_scales(s16, p12);
    q3k_scales(p12, back);
    for (int j = 0; j < 16; ++j) CHECK(back[j] == s16[j]);
}

TEST_CASE("k4_scales_mins gives every sub-block's k4_scale_min, for any scale bytes", "[dequant]") {
    std::mt19937 rng(17);
    for (int trial = 0; trial < 2000; ++trial) {
        uint8_t q[12], sc[8], m[8];
        for (uint8_t& b : q) b = uint8_t(rng());
        k4_scales_mins(q, sc, m);
        for (int j = 0; j < 8; ++j) {
            uint8_t a, b;
            k4_scale_min(j, q, &a, &b);
            REQUIRE(sc[j] == a);
            REQUIRE(m[j] == b);
        }
    }
}

TEST_CASE("Q4_K and Q6_K hand-built blocks follow the per-weight layout", "[dequant]") {
    // Q4_K: weight k is in chunk c = k / 64, sub-block s = k / 32; its nibble is the low (s even) or high (s odd)
    // half of qs[32 c + k % 32].
    BlockQ4_K b{};
    b.d = fp32_to_fp16(0.5f);
    b.dmin = fp32_to_fp16(0.25f);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) {
        sc[j] = uint8_t(j + 1);
        m[j] = uint8_t(2 * j);
    }
    k4_pack_scales(sc, m, b.scales);
    for (int i = 0; i < 128; ++i) b.qs[i] = uint8_t((i % 16) | ((15 - i % 16) << 4));
    float y[256];
    dequantize_row(GgmlType::Q4_K, &b, y, 256);
    for (int k = 0; k < 256; ++k) {
        const int c = k / 64, s = k / 32, l = k % 32;
        const uint8_t byte = b.qs[32 * c + l];
        const int q = (s % 2 == 0) ? (byte & 15) : (byte >> 4);
        CHECK(y[k] == Approx(0.5f * sc[s] * q - 0.25f * m[s]));
    }
    // Q6_K: in half h, weight l + 32 r (r = 0..3) takes its low nibble from ql[64 h + l + 32 (r % 2)] (low half for
    // r < 2, high half otherwise), its top two bits from qh[32 h + l] at shift 2 r, and scale scales[8 h + l / 16 + 2 r].
    BlockQ6_K q{};
    q.d = fp32_to_fp16(0.125f);
    for (int i = 0; i < 16; ++i) q.scales[i] = int8_t(i - 8);
    for (int i = 0; i < 128; ++i) q.ql[i] = uint8_t(i * 37);
    for (int i = 0; i < 64; ++i) q.qh[i] = uint8_t(i * 101);
    dequantize_row(GgmlType::Q6_K, &q, y, 256);
    for (int k = 0; k < 256; ++k) {
        const int h = k / 128, r = (k % 128) / 32, l = k % 32;
        const uint8_t lo_byte = q.ql[64 * h + l + 32 * (r % 2)];
        const int lo = r < 2 ? (lo_byte & 15) : (lo_byte >> 4);
        const int hi = (q.qh[32 * h + l] >> (2 * r)) & 3;
        const int scale = q.scales[8 * h + l / 16 + 2 * r];
        CHECK(y[k] == Approx(0.125f * scale * float((lo | (hi << 4)) - 32)));
    }
}
