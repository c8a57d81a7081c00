// The CUDA decoders and the decode matvec's lane arithmetic, run on the host: these need no GPU, so CI checks the
// device code's bit layouts and indexing on every run (the [cuda] tests repeat them on a device).
#include <cuda_occupancy.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <tuple>

#include "attention_case.h"
#include "common/half.h"
#include "cpu/ops.h"
#include "cpu/thread_pool.h"
#include "cpu/vecdot.h"
#include "cuda_backend.h"
#include "cuda_test_util.h"
#include "device.h"
#include "engine/kv_cache.h"
#include "engine/kv_offset.h"
#include "engine/kv_rotation.h"
#include "kv_bytes_compare.h"
#include "memory_plan.h"
#include "model/dequant.h"
#include "model/weights.h"
#include "synth/synth.h"
#include "testing.h"
#include "weight_layout.h"

using namespace kvgen;
using test::kv_rows_differing;
using test::offsets_differing;

namespace {
// Row r of W x in double (w: [rows][cols] as floats), and the sum of the products' magnitudes: the scale a float
// sum's error is measured on.
struct ExactRow {
    double sum = 0, mag = 0;
};
// rows x cols random weights of type t (GGUF bytes, synth_random_rows) and their values (dequantize_row).
struct RandomRows {
    std::vector<uint8_t> bytes;
    std::vector<float> values;
};
RandomRows random_rows(GgmlType t, int64_t rows, int64_t cols, uint64_t seed) {
    RandomRows w;
    w.bytes.resize(size_t(rows * ggml_row_bytes(*ggml_type_info(t), cols)));
    synth_random_rows(t, w.bytes.data(), rows, cols, 0.05f, seed);
    w.values.resize(size_t(rows * cols));
    dequantize_row(t, w.bytes.data(), w.values.data(), rows * cols);
    return w;
}

ExactRow exact_row(const std::vector<float>& w, const std::vector<float>& x, int64_t r, int64_t cols) {
    ExactRow e;
    for (int64_t j = 0; j < cols; ++j) {
        const double p = double(w[size_t(r * cols + j)]) * x[size_t(j)];
        e.sum += p;
        e.mag += std::fabs(p);
    }
    return e;
}

// Activation blocks equal field by field (d, the sums, every q).
void check_same_blocks(const std::vector<cuda::host::HostActBlock>& got,
                       const std::vector<cuda::host::HostActBlock>& want) {
    REQUIRE(got.size() == want.size());
    for (size_t b = 0; b < got.size(); ++b) {
        INFO("block " << b);
        CHECK(got[b].d == want[b].d);
        CHECK(got[b].s == want[b].s);
        CHECK(got[b].h[0] == want[b].h[0]);
        CHECK(got[b].h[1] == want[b].h[1]);
        CHECK(std::equal(got[b].q, got[b].q + 32, want[b].q));
    }
}

}  // namespace

TEST_CASE("the CUDA decoders, run on the host, equal dequantize_row for every type", "[cuda-host]") {
    // 96 and 768 columns: rows whose device layout is padded (weight_layout.h) for some types.
    for (const char* name :
         {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"})
        for (const int64_t cols : {96, 768, 1024}) {
            GgmlType t;
            REQUIRE(ggml_type_from_name(name, &t));
            if (cols % ggml_type_info(t)->block_size != 0) continue;
            INFO(name << " cols " << cols);
            const int64_t rows = 7;
            const RandomRows w = random_rows(t, rows, cols, 3);
            const std::vector<uint8_t>& b = w.bytes;
            const std::vector<float>& want = w.values;
            const std::vector<float> got = cuda::host::dequantize(t, b.data(), rows, cols);
            REQUIRE(got.size() == want.size());
            size_t bad = 0;
            for (size_t i = 0; i < got.size(); ++i)
                if (!(std::fabs(got[i] - want[i]) <= 1e-6f * (1.0f + std::fabs(want[i])))) ++bad;
            CHECK(bad == 0);

            // The matvec lane split (rows not a multiple of the rows per warp) against a double-precision product.
            const std::vector<float> x = test::randn(size_t(cols), 9);
            const std::vector<float> y = cuda::host::matvec(t, b.data(), rows, cols, x);
            for (int64_t r = 0; r < rows; ++r) {
                const ExactRow e = exact_row(want, x, r, cols);
                INFO("row " << r << " got " << y[size_t(r)] << " want " << e.sum);
                CHECK(std::fabs(y[size_t(r)] - e.sum) <= 1e-5 * e.mag);
            }

            // The short-prompt kernel's body: 5 tokens, each equal to its own single-token product, bit for bit.
            const int n = 5;
            std::vector<float> xs = test::randn(size_t(n * cols), 10);
            std::copy(x.begin(), x.end(), xs.begin() + 2 * cols);  // token 2 is the x above
            const std::vector<float> yb = cuda::host::matvec_batch(t, b.data(), rows, cols, xs, n);
            for (int i = 0; i < n; ++i) {
                const std::vector<float> xi(xs.begin() + i * cols, xs.begin() + (i + 1) * cols);
                const std::vector<float> yi = cuda::host::matvec(t, b.data(), rows, cols, xi);
                INFO("token " << i);
                CHECK(std::equal(yi.begin(), yi.end(), yb.begin() + i * rows));
            }
        }
}

TEST_CASE("a short prompt's F16 product on split activations is as exact as the f32 product", "[cuda-host]") {
    // Activations over 14 binary orders of magnitude and both signs, past f16's range at the ends (saturated, as
    // to_f16 saturates them), and 0.
    const int64_t rows = 9, cols = 256;
    const int n = 3;
    std::vector<float> x = test::randn(size_t(n * cols), 21);
    for (size_t j = 0; j < x.size(); ++j) x[j] *= std::ldexp(1.0f, int(j % 15) - 7);
    x[5] = 0.0f;
    x[40] = 1e5f;
    x[41] = -7e4f;
    // each value is its f16 high part plus its low part / kF16SplitScale, to 2^-22 of it where in range
    const std::vector<double> back = cuda::host::f16_split_values(x);
    REQUIRE(back.size() == x.size());
    for (size_t j = 0; j < x.size(); ++j) {
        const float v = std::fmin(std::fmax(x[j], -65504.0f), 65504.0f);
        INFO("x " << x[j] << " back " << back[j]);
        // (plus half an f16 subnormal's step, divided by the scale, for values near 2^-14 and under)
        CHECK(std::fabs(back[j] - double(v)) <= std::ldexp(std::fabs(double(v)), -22) + std::ldexp(1.0, -35));
    }
    // the product, each weight exact in f16: within f32 rounding of the double-precision one, where the activations
    // rounded to f16 alone land about 2^-12 of the terms away
    const RandomRows w = random_rows(GgmlType::F16, rows, cols, 22);
    const std::vector<float> y0 = test::randn(size_t(n * rows), 23);
    const std::vector<float> got = cuda::host::f16_split(w.bytes.data(), rows, cols, x, n, nullptr);
    const std::vector<float> got_acc = cuda::host::f16_split(w.bytes.data(), rows, cols, x, n, &y0);
    double worst = 0, worst_f16 = 0;
    for (int i = 0; i < n; ++i) {
        // the product of the saturated activations (x[40] and x[41] past f16's range)
        std::vector<float> xi(x.begin() + i * cols, x.begin() + (i + 1) * cols);
        for (float& v : xi) v = std::fmin(std::fmax(v, -65504.0f), 65504.0f);
        for (int64_t r = 0; r < rows; ++r) {
            const ExactRow e = exact_row(w.values, xi, r, cols);
            double f16 = 0;
            for (int64_t j = 0; j < cols; ++j)
                f16 += double(w.values[size_t(r * cols + j)]) * double(fp16_to_fp32(fp32_to_fp16(xi[size_t(j)])));
            const size_t k = size_t(i * rows + r);
            INFO("token " << i << " row " << r << " got " << got[k] << " want " << e.sum);
            CHECK(std::fabs(double(got[k]) - e.sum) <= 1e-6 * e.mag);
            CHECK(std::fabs(double(got_acc[k]) - (e.sum + y0[k])) <= 1e-6 * e.mag + 1e-6 * std::fabs(y0[k]));
            worst = std::max(worst, std::fabs(double(got[k]) - e.sum) / e.mag);
            worst_f16 = std::max(worst_f16, std::fabs(f16 - e.sum) / e.mag);
        }
    }
    CHECK(worst * 100 < worst_f16);
}

TEST_CASE("a short prompt's product on split activations through the weight-tile kernel", "[cuda-host]") {
    // BF16 and the quantized types without integer products: the 2n split rows through gemm_mma, then each token's
    // two results added: the product of the tile decoder's f16 weights with the activations to about 2^-22 of each
    // (two ways of splitting the columns among blocks, and accumulating).
    for (const char* name : {"BF16", "Q4_1", "Q5_0", "Q3_K", "Q5_K"}) {
        INFO(name);
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        REQUIRE(cuda::split_prompt_type(t));
        const int64_t rows = 40, cols = 512;
        const int n = 5;
        const RandomRows w = random_rows(t, rows, cols, 31);
        const std::vector<float> wh = cuda::host::dequantize_rows(t, w.bytes.data(), cols, 0, rows);  // as f16
        std::vector<float> x = test::randn(size_t(n * cols), 32);
        for (size_t j = 0; j < x.size(); ++j) x[j] *= std::ldexp(1.0f, int(j % 9) - 4);
        const std::vector<float> y0 = test::randn(size_t(n * rows), 33);
        for (const int splits : {1, 3}) {
            INFO("splits " << splits);
            const std::vector<float> got =
                cuda::host::f16_split_tiled(t, w.bytes.data(), rows, cols, x, n, nullptr, splits);
            const std::vector<float> acc =
                cuda::host::f16_split_tiled(t, w.bytes.data(), rows, cols, x, n, &y0, splits);
            for (int i = 0; i < n; ++i) {
                const std::vector<float> xi(x.begin() + i * cols, x.begin() + (i + 1) * cols);
                for (int64_t r = 0; r < rows; ++r) {
                    const ExactRow e = exact_row(wh, xi, r, cols);
                    const size_t k = size_t(i * rows + r);
                    INFO("token " << i << " row " << r << " got " << got[k] << " want " << e.sum);
                    CHECK(std::fabs(double(got[k]) - e.sum) <= 1e-6 * e.mag);
                    CHECK(std::fabs(double(acc[k]) - (e.sum + y0[k])) <= 1e-6 * e.mag + 1e-6 * std::fabs(y0[k]));
                }
            }
        }
    }
}

TEST_CASE("the prefill GEMM's chunked f16 decoding, run on the host, equals dequantize_row rounded to f16",
          "[cuda-host]") {
    for (const char* name : {"F32", "BF16", "Q4_0", "Q5_1", "Q8_0", "Q3_K", "Q4_K", "Q6_K"}) {
        INFO(name);
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        const int64_t rows = 21, cols = 1024;  // 32 chunks a row: 672 chunks, the last of three blocks partial
        const RandomRows w = random_rows(t, rows, cols, 4);
        const std::vector<uint8_t>& b = w.bytes;
        const std::vector<float>& want = w.values;
        for (const auto& [r0, nr] : {std::pair<int64_t, int64_t>{0, rows}, {5, 13}, {20, 1}}) {
            INFO("rows " << r0 << " + " << nr);
            const std::vector<float> got = cuda::host::dequantize_rows(t, b.data(), cols, r0, nr);
            REQUIRE(got.size() == size_t(nr * cols));
            size_t bad = 0;
            for (size_t i = 0; i < got.size(); ++i)
                if (got[i] != fp16_to_fp32(fp32_to_fp16(want[size_t(r0 * cols) + i]))) ++bad;
            CHECK(bad == 0);
        }
    }
}

TEST_CASE("the one-kernel prefill GEMM, its mma fragments run on the host, equals the product of f16 operands",
          "[cuda-host]") {
    // 133 rows and 130 tokens: two tiles of rows, the second of 5 rows, and two or three of tokens, the last of 2 or 3
    // tokens; 160 columns: three 64-weight steps, the last ending half way (so that with two stages one is filled
    // twice); the k-quants' rows are whole 256-weight super-blocks, four steps
    for (const char* name : {"F32", "BF16", "Q4_0", "Q5_1", "Q8_0", "Q3_K", "Q4_K", "Q6_K"}) {
        INFO(name);
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        const int64_t rows = 133, cols = ggml_type_info(t)->block_size == 256 ? 256 : 160;
        const int n = 130;
        const RandomRows w = random_rows(t, rows, cols, 41);
        const std::vector<float> x = test::randn(size_t(n * cols), 42);
        const std::vector<float> y0 = test::randn(size_t(n * rows), 43);
        // one output buffer, or three as Q, K and V (the middle one ending inside a 16-row fragment); the columns
        // in one block or split among 2, 3 or 4 (160 columns in 3 or 4: a step each, a fourth range past the end;
        // 256 in 4: a step each); one step in shared memory at a time or two
        for (const auto& [tok, accumulate, end0, end1, splits, stages] :
             {std::tuple<int, bool, int64_t, int64_t, int, int>{128, false, rows, rows, 1, 2}, {128, true, 40, 101, 3, 1},
              {64, false, 40, 101, 2, 2}, {64, true, rows, rows, 4, 1}, {128, true, rows, rows, 1, 1},
              {64, true, rows, rows, 1, 2}}) {
            INFO(tok << "-token tiles, accumulate " << accumulate << ", rows split at " << end0 << ", " << end1
                     << ", columns in " << splits << ", " << stages << " stages");
            const std::vector<float> got =
                cuda::host::gemm_mma(t, w.bytes.data(), rows, cols, x, n, accumulate ? &y0 : nullptr, tok, nullptr,
                                     end0, end1, splits, stages);
            REQUIRE(got.size() == size_t(n * rows));
            if (splits == 1 && stages == 2) {  // the same sums in the same order with one stage: the same bits
                const std::vector<float> one = cuda::host::gemm_mma(t, w.bytes.data(), rows, cols, x, n,
                                                                    accumulate ? &y0 : nullptr, tok, nullptr, end0,
                                                                    end1, 1, 1);
                CHECK(std::memcmp(one.data(), got.data(), got.size() * sizeof(float)) == 0);
            }
            size_t bad = 0;
            for (int i = 0; i < n; ++i)
                for (int64_t r = 0; r < rows; ++r) {
                    double s = accumulate ? y0[size_t(i * rows + r)] : 0.0, mag = std::fabs(s);
                    for (int64_t j = 0; j < cols; ++j) {
                        const double p = double(fp16_to_fp32(fp32_to_fp16(w.values[size_t(r * cols + j)]))) *
                                         fp16_to_fp32(fp32_to_fp16(x[size_t(i * cols + j)]));
                        s += p;
                        mag += std::fabs(p);
                    }
                    const float g = got[size_t(i * rows + r)];
                    if (!(std::fabs(g - s) <= 1e-5 * mag)) {  // f32 sums of at most 256 terms; NaN: not written
                        if (bad++ < 5) UNSCOPED_INFO("token " << i << " row " << r << " got " << g << " want " << s);
                    }
                }
            CHECK(bad == 0);
        }
    }
}

TEST_CASE("the one-kernel prefill GEMM with gate and up in one block, run on the host, equals silu(gate) * up of the "
          "f16 operands' products", "[cuda-host]") {
    // 133 rows: three tiles of 64 (the last of 5 rows: gate and up rows past the matrix in every warp's fragments)
    for (const char* name : {"Q4_0", "Q8_0", "Q4_K", "Q6_K"}) {
        INFO(name);
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        const int64_t rows = 133, cols = ggml_type_info(t)->block_size == 256 ? 256 : 96;
        const int n = 130;
        const RandomRows gate = random_rows(t, rows, cols, 51), up = random_rows(t, rows, cols, 52);
        const std::vector<float> x = test::randn(size_t(n * cols), 53);
        // the product of row r with token i's f16 activations, and the sum of its terms' magnitudes
        const auto dot = [&](const RandomRows& w, int i, int64_t r) {
            double s = 0.0, mag = 0.0;
            for (int64_t j = 0; j < cols; ++j) {
                const double p = double(fp16_to_fp32(fp32_to_fp16(w.values[size_t(r * cols + j)]))) *
                                 fp16_to_fp32(fp32_to_fp16(x[size_t(i * cols + j)]));
                s += p;
                mag += std::fabs(p);
            }
            return std::pair<double, double>{s, mag};
        };
        for (const auto& [tok, stages] : {std::pair{128, 2}, {64, 1}, {64, 2}}) {
            INFO(tok << "-token tiles, " << stages << " stages");
            const std::vector<float> got = cuda::host::gemm_mma(t, gate.bytes.data(), rows, cols, x, n, nullptr, tok,
                                                                up.bytes.data(), rows, rows, 1, stages);
            REQUIRE(got.size() == size_t(n * rows));
            size_t bad = 0;
            for (int i = 0; i < n; ++i)
                for (int64_t r = 0; r < rows; ++r) {
                    const auto [g, gmag] = dot(gate, i, r);
                    const auto [u, umag] = dot(up, i, r);
                    const double silu = g / (1.0 + std::exp(-g)), want = silu * u;
                    // f32 sums within 1e-5 of their magnitudes; silu's slope is under 1.1
                    const double tol =
                        1e-5 * (1.1 * gmag * std::fabs(u) + std::fabs(silu) * umag) + 1e-6 * std::fabs(want);
                    const float v = got[size_t(i * rows + r)];
                    if (!(std::fabs(v - want) <= tol + 1e-30)) {  // NaN: not written
                        if (bad++ < 5) UNSCOPED_INFO("token " << i << " row " << r << " got " << v << " want " << want);
                    }
                }
            CHECK(bad == 0);
        }
    }
}

TEST_CASE("the one-kernel prefill GEMM takes 64-token tiles for short prompts and where 128 leave SMs idle",
          "[cuda-host]") {
    // devices as cudaDeviceGetAttribute gives them: SMs, shared memory bytes an SM has and one block may ask for
    const cuda::GemmMmaDevice h200{132, 233472, 232448}, small{16, 233472, 232448}, a100{108, 167936, 166912},
        ada{128, 102400, 101376}, turing{40, 65536, 65536};
    using cuda::gemm_mma_tokens;
    CHECK(gemm_mma_tokens(17, 11008, h200) == 64);
    CHECK(gemm_mma_tokens(64, 11008, h200) == 64);
    CHECK(gemm_mma_tokens(512, 11008, h200) == 128);  // LLaMA-2-7B gate or up alone: 86 x 4 blocks fill 264 places
    CHECK(gemm_mma_tokens(512, 4096, h200) == 64);    // output and down: 32 x 4 would not (32 x 8)
    CHECK(gemm_mma_tokens(512, 3 * 4096, h200) == 128);  // Q|K|V as one matrix: 96 x 4
    CHECK(gemm_mma_tokens(512, 2 * 11008, h200) == 128);  // gate|up in one kernel (both weights' rows): 172 x 4
    CHECK(gemm_mma_tokens(2048, 4096, h200) == 128);  // 32 x 16
    CHECK(gemm_mma_tokens(512, 4096, small) == 128);  // a small GPU
    CHECK(gemm_mma_tokens(2048, 4096, ada) == 128);   // two blocks of 37 KiB in 100
    CHECK(gemm_mma_tokens(2048, 4096, turing) == 64);  // not in 64: two of 28 KiB do
    // columns split among blocks where the grid has fewer blocks than SMs (capacity: floats of scratch)
    using cuda::gemm_mma_splits;
    CHECK(gemm_mma_splits(512, 4096, 11008, h200, 1 << 22) == 1);  // 32 x 8 blocks
    CHECK(gemm_mma_splits(40, 4096, 11008, h200, 1 << 22) == 8);   // 7B down at 40 tokens: 32 blocks -> 256
    CHECK(gemm_mma_splits(40, 4096, 4096, h200, 1 << 22) == 8);    // output: 8 ranges of 512 columns
    CHECK(gemm_mma_splits(40, 3 * 4096, 4096, h200, 1 << 22) == 3);  // Q|K|V: 96 blocks -> 288
    CHECK(gemm_mma_splits(40, 4096, 1024, h200, 1 << 22) == 2);    // at least 512 columns a range
    CHECK(gemm_mma_splits(40, 4096, 11008, h200, 3 * 40 * 4096) == 3);  // partial sums within the scratch
    CHECK(gemm_mma_splits(40, 4096, 11008, h200, 0) == 1);
    CHECK(gemm_mma_splits(40, 4096, 11008, small, 1 << 22) == 1);  // 32 blocks fill a 16-SM GPU
    CHECK(cuda::gemm_mma_token_tiles(130, 64) == 3);
    CHECK(cuda::gemm_mma_token_tiles(128, 128) == 1);
    CHECK(cuda::gemm_mma_row_tiles(133) == 2);
    // two stages of shared memory where two blocks of twice the bytes fit on an SM (bytes a multiprocessor has and
    // one block may ask for, as cudaDeviceGetAttribute gives them)
    using cuda::gemm_mma_stages;
    CHECK(cuda::gemm_mma_stage_bytes(128) == 36864);
    CHECK(gemm_mma_stages(128, h200) == 2);
    CHECK(gemm_mma_stages(64, h200) == 2);
    CHECK(gemm_mma_stages(128, a100) == 2);
    CHECK(gemm_mma_stages(128, ada) == 1);  // 72 KiB blocks: one an SM instead of two of 36
    CHECK(gemm_mma_stages(64, ada) == 1);   // two of 54 KiB do not fit in 100
    CHECK(gemm_mma_stages(64, turing) == 1);
    CHECK(gemm_mma_stages(128, cuda::GemmMmaDevice{132, 0, 0}) == 1);
    // prefill flash attention's two stages of tiles (--cuda-flash-pipeline): head_dim 128 where two blocks of 68 KiB
    // fit an SM
    using cuda::flash_async_fits;
    CHECK(cuda::kFlashAsyncBytes == 69632);
    CHECK(flash_async_fits(128, h200));
    CHECK(flash_async_fits(128, a100));
    CHECK_FALSE(flash_async_fits(128, ada));     // one block an SM
    CHECK_FALSE(flash_async_fits(128, turing));  // over what a block may ask for
    CHECK_FALSE(flash_async_fits(64, h200));     // the register path's occupancy is higher there
    CHECK_FALSE(flash_async_fits(96, h200));     // no flash kernel
    CHECK_FALSE(flash_async_fits(128, cuda::GemmMmaDevice{132, 0, 0}));
    // flash attention over a quantized cache (the only prefill of one): one block's K and V tiles with their low parts
    using cuda::flash_quantized_fits;
    CHECK(cuda::flash_quantized_bytes(128) == 71680);
    CHECK(cuda::flash_quantized_bytes(64) == 36864);
    CHECK(flash_quantized_fits(128, h200));
    CHECK(flash_quantized_fits(128, a100));
    CHECK(flash_quantized_fits(128, ada));
    CHECK_FALSE(flash_quantized_fits(128, turing));  // a T4 refuses a quantized cache at head_dim 128
    CHECK(flash_quantized_fits(64, turing));
}

TEST_CASE("the rings' carveout holds as many blocks as all of an SM's shared memory would, and no more",
          "[cuda-host]") {
    // --cuda-ring-carveout fit: the smallest percentage of an SM's shared memory (as cudaDeviceGetAttribute gives it)
    // that holds the blocks, each with the runtime's 1 KiB and in 128-byte units; the rest is L1
    using cuda::ring_carveout_percent;
    const int64_t h200 = 233472, a100 = 167936;
    CHECK(ring_carveout_percent(5, 36864, h200) == 82);  // 185 KiB of 228: the driver's 196, 60 KiB L1
    CHECK(ring_carveout_percent(6, 36864, h200) == 98);
    CHECK(ring_carveout_percent(7, 36864, h200) == 100);  // more than the SM has: all of it
    CHECK(ring_carveout_percent(10, 100, h200) == 5);     // 1,124 bytes a block take 1,152
    CHECK(ring_carveout_percent(4, 36864, a100) == 91);
    CHECK(ring_carveout_percent(1, 1024, 0) == 100);
    for (int64_t blocks = 1; blocks <= 8; ++blocks)
        for (int64_t bytes : {0, 1, 4000, 24576, 36864, 55296}) {
            const int pct = ring_carveout_percent(blocks, bytes, h200);
            const int64_t need = blocks * ((bytes + 1024 + 127) / 128 * 128);
            CHECK(pct * h200 / 100 + 1 > std::min(need, h200));              // what they take
            if (pct > 1 && pct < 100) CHECK((pct - 1) * h200 < 100 * need);  // and no more
        }
}

TEST_CASE("the rings' carveout holds the blocks NVIDIA's occupancy calculator counts at all of the shared memory",
          "[cuda-host]") {
    // cuda_occupancy.h (the CUDA toolkit's, host code) with a ring kernel's registers, threads and static and dynamic
    // shared memory on four devices: at ring_carveout_percent's share the same blocks an SM as at 100 (ring_grid
    // also asks the runtime, and takes all of it where the runtime counts fewer)
    struct Dev {
        int major, minor, threads_per_sm;
        int64_t per_sm, per_block;
    };
    for (const Dev& dv : {Dev{9, 0, 2048, 233472, 232448}, Dev{8, 0, 2048, 167936, 166912},
                          Dev{8, 9, 1536, 102400, 101376}, Dev{8, 6, 1536, 102400, 101376}}) {
        cudaOccDeviceProp p;
        p.computeMajor = dv.major;
        p.computeMinor = dv.minor;
        p.maxThreadsPerBlock = 1024;
        p.maxThreadsPerMultiprocessor = dv.threads_per_sm;
        p.regsPerBlock = p.regsPerMultiprocessor = 65536;
        p.warpSize = 32;
        p.sharedMemPerBlock = 49152;
        p.sharedMemPerMultiprocessor = size_t(dv.per_sm);
        p.numSms = 100;
        p.sharedMemPerBlockOptin = size_t(dv.per_block);
        p.reservedSharedMemPerBlock = 1024;
        int below = 0;  // launches whose share leaves L1 more than all of it would
        for (int threads : {128, 192, 256})
            for (int regs : {64, 72, 91, 96, 128})
                for (int64_t fixed : {0, 512, 4096})
                    for (int64_t dynamic : {4096, 12288, 18432, 36864, 55296, 73728, 98304}) {
                        if (fixed + dynamic > dv.per_block) continue;
                        cudaOccFuncAttributes a;
                        a.maxThreadsPerBlock = 1024;
                        a.numRegs = regs;
                        a.sharedSizeBytes = size_t(fixed);
                        a.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN;
                        a.maxDynamicSharedSizeBytes = size_t(dv.per_block - fixed);
                        a.numBlockBarriers = 1;
                        const auto blocks = [&](int carveout) {
                            cudaOccDeviceState st;
                            st.carveoutConfig = carveout;
                            cudaOccResult r{};
                            REQUIRE(cudaOccMaxActiveBlocksPerMultiprocessor(&r, &p, &a, &st, threads,
                                                                            size_t(dynamic)) == CUDA_OCC_SUCCESS);
                            return r.activeBlocksPerMultiprocessor;
                        };
                        const int most = blocks(100);
                        if (most == 0) continue;
                        const int pct = cuda::ring_carveout_percent(most, fixed + dynamic, dv.per_sm);
                        INFO("sm_" << dv.major << dv.minor << ", " << threads << " threads, " << regs << " registers, "
                                   << fixed << " + " << dynamic << " bytes: " << pct << "%");
                        CHECK(blocks(pct) == most);
                        if (pct < 100 && blocks(pct - 1) < most) ++below;
                    }
        CHECK(below > 0);  // the share is the least on some launches, not 100 on all
    }
}

TEST_CASE("the prefill GEMM's chunks stay within the L2-sized scratch, in whole tile steps", "[cuda-host]") {
    using cuda::gemm_chunk_rows;
    CHECK(gemm_chunk_rows(4096, 896) == 4096);  // 3.7M weights: one chunk, the whole matrix
    CHECK(gemm_chunk_rows(4096, 4096) == 2048);  // LLaMA-2-7B attention: two chunks
    CHECK(gemm_chunk_rows(13824, 5120) == 1536);
    CHECK(gemm_chunk_rows(5120, 13824) == 512);
    CHECK(gemm_chunk_rows(1000, 65536) == 256);  // wider than a chunk allows: one step of rows, the least there is
    CHECK(gemm_chunk_rows(100, 200000) == 100);
    CHECK(gemm_chunk_rows(2304, 4096) == 1280);  // two chunks of 1280 and 1024 rows, not 2048 and 256
    for (int64_t cols : {896, 4096, 5120, 11008, 13824})
        for (int64_t rows : {256, 4096, 11008, 32000}) {
            const int64_t r = gemm_chunk_rows(rows, cols);
            CHECK(r >= 1);
            CHECK(r <= rows);
            CHECK((r == rows || r % cuda::kGemmChunkRowStep == 0));
            CHECK((r * cols <= cuda::kGemmChunkElems || r == cuda::kGemmChunkRowStep || r == rows));
            // as few chunks as the 16 MiB allow, the rows shared out evenly (in steps of rows)
            const int64_t fit = std::max<int64_t>(cuda::kGemmChunkElems / cols / 256 * 256, 256);
            if (r < rows) {
                CHECK((rows + r - 1) / r == (rows + fit - 1) / fit);
                CHECK(rows - (rows + r - 1) / r * r > -cuda::kGemmChunkRowStep * ((rows + r - 1) / r));
            }
            CHECK(cuda::gemm_scratch_elems(GgmlType::Q4_K, rows, cols) == r * cols);
            // --cuda-gemm-overlap: two buffers of a chunk, which the next product's first chunk takes in turn
            CHECK(cuda::gemm_scratch_elems(GgmlType::Q4_K, rows, cols, cuda::kGemmChunkElems, true) == 2 * r * cols);
            CHECK(cuda::gemm_scratch_elems(GgmlType::F16, rows, cols) == 0);
        }
    // --cuda-gemm-chunk: 64 MiB (32M weights) holds four times the rows; 0, the whole matrix
    CHECK(cuda::gemm_chunk_elems_of_mib(16) == cuda::kGemmChunkElems);
    const int64_t big = cuda::gemm_chunk_elems_of_mib(64);
    CHECK(gemm_chunk_rows(4096, 4096, big) == 4096);
    CHECK(gemm_chunk_rows(11008, 4096, big) == 5632);  // two chunks (8192 fit)
    CHECK(gemm_chunk_rows(4096, 11008, big) == 2048);  // 512 at 16 MiB
    CHECK(gemm_chunk_rows(11008, 4096, 0) == 11008);
    CHECK(cuda::gemm_scratch_elems(GgmlType::Q4_0, 11008, 4096, 0) == 11008 * 4096);
    CHECK(cuda::gemm_scratch_elems(GgmlType::Q4_0, 11008, 4096, 0, true) == 2 * 11008 * 4096);
    CHECK(cuda::gemm_scratch_elems(GgmlType::Q4_0, 11008, 4096, cuda::kGemmChunkElems, true) == 2 * 2048 * 4096);
    CHECK(cuda::gemm_scratch_elems(GgmlType::F16, 11008, 4096, cuda::kGemmChunkElems, true) == 0);
}

TEST_CASE("decode attention's L2 prefetch: what is planned, and every piece asked for once by one thread",
          "[cuda-host]") {
    using cuda::decode_l2_prefetch;
    using cuda::L2Prefetch;
    using cuda::L2Range;
    alignas(16) static uint8_t buf[1 << 12];
    const uint8_t *wo = buf, *gate = buf + 1024, *up = buf + 2048;  // only their addresses are used
    const int64_t l2 = int64_t(50) << 20, third = l2 / 3 / 16 * 16;
    // LLaMA-2-7B Q4_0 (rows of 2304 bytes for 4096 columns), an f16 cache of 32 KV heads of 128: the whole output
    // projection, gate and up each half of what is left of a third of the L2, at positions whose 16 KiB a layer fill
    // at most another third
    const int64_t per_pos = 32 * (256 + 256), wo_bytes = 4096 * 2304, ff_bytes = 11008 * 2304;
    L2Prefetch p = decode_l2_prefetch({{wo, wo_bytes}, {gate, ff_bytes}, {up, ff_bytes}}, l2, per_pos);
    CHECK(p.range[0].data == wo);
    CHECK(p.range[0].bytes == wo_bytes);
    const int64_t share = (third - wo_bytes) / 2 / 16 * 16;
    CHECK(p.range[1].data == gate);
    CHECK(p.range[1].bytes == share);
    CHECK(p.range[2].data == up);
    CHECK(p.range[2].bytes == share);
    CHECK(p.range[0].bytes + p.range[1].bytes + p.range[2].bytes <= third);
    CHECK(p.max_pos == third / per_pos - 1);
    CHECK(int64_t(p.max_pos + 1) * per_pos <= third);
    CHECK(int64_t(p.max_pos + 2) * per_pos > third);
    // a first weight larger than a third: its first bytes, and nothing left for the others
    p = decode_l2_prefetch({{wo, 8192 * 4608}, {gate, ff_bytes}, {up, ff_bytes}}, l2, per_pos);
    CHECK(p.range[0].bytes == third);
    CHECK(p.range[1].bytes == 0);
    CHECK(p.range[2].bytes == 0);
    // small weights whole; unaligned starts and ends: the 16-byte pieces inside
    p = decode_l2_prefetch({{wo + 3, 100}, {gate + 1, 15}, {up, 4096}}, l2, per_pos);
    CHECK(p.range[0].data == wo + 16);
    CHECK(p.range[0].bytes == 80);
    CHECK(p.range[1].bytes == 0);  // no whole piece inside
    CHECK(p.range[2].data == up);
    CHECK(p.range[2].bytes == 4096);
    CHECK(decode_l2_prefetch({{wo, 4096}}, l2, third + 1).range[0].bytes == 0);  // one position's rows over a third
    CHECK(decode_l2_prefetch({{wo, 4096}}, 0, per_pos).range[0].bytes == 0);     // no L2
    for (const L2Prefetch& none : {decode_l2_prefetch({{wo, 4096}}, l2, third + 1),
                                   decode_l2_prefetch({{wo + 1, 15}, {gate + 1, 15}}, l2, per_pos)})
        CHECK(none.max_pos == -1);
    // a first weight without a whole piece: the others still share the third
    p = decode_l2_prefetch({{wo + 1, 15}, {gate, 4096}}, l2, per_pos);
    CHECK(p.range[0].bytes == 0);
    CHECK(p.range[1].bytes == 4096);
    CHECK(p.max_pos >= 0);
    // every piece of every range exactly once, each within its range, whole 16-byte pieces, spread over the blocks
    const std::vector<std::vector<int64_t>> layouts = {
        {16}, {4096, 4112}, {9437184, 3706880, 3706880}, {17476272, 0, 4096}, {0, 0, 48}};
    for (const std::vector<int64_t>& sizes : layouts)
        for (const auto& [blocks, threads] : {std::pair<int, int>{1, 1}, {544, 128}, {32, 128}, {3, 5}, {1000, 32}}) {
            INFO(sizes.size() << " ranges, the first " << sizes[0] << " bytes, " << blocks << " x " << threads);
            L2Prefetch q;
            std::vector<std::vector<int>> seen;
            for (size_t r = 0; r < sizes.size(); ++r) {
                q.range[r] = L2Range{buf, sizes[r]};
                seen.emplace_back(size_t((sizes[r] + cuda::kL2PrefetchChunk - 1) / cuda::kL2PrefetchChunk), 0);
            }
            seen.resize(cuda::kL2PrefetchRanges);
            std::vector<int64_t> per_block(size_t(blocks), 0), total(cuda::kL2PrefetchRanges, 0);
            bool ok = true;
            for (int b = 0; b < blocks; ++b)
                for (int t = 0; t < threads; ++t)
                    cuda::l2_prefetch_pieces(q, blocks, threads, b, t, [&](int r, int64_t off, int64_t n) {
                        const int64_t bytes = q.range[r].bytes;
                        ok = ok && off % cuda::kL2PrefetchChunk == 0 && n > 0 && n % 16 == 0 && off + n <= bytes &&
                             (n == cuda::kL2PrefetchChunk || off + n == bytes);
                        if (ok) seen[size_t(r)][size_t(off / cuda::kL2PrefetchChunk)] += 1;
                        per_block[size_t(b)] += 1;
                        total[size_t(r)] += n;
                    });
            CHECK(ok);
            for (size_t r = 0; r < size_t(cuda::kL2PrefetchRanges); ++r) {
                CHECK(total[r] == q.range[r].bytes);
                CHECK(std::all_of(seen[r].begin(), seen[r].end(), [](int c) { return c == 1; }));
            }
            const auto [lo, hi] = std::minmax_element(per_block.begin(), per_block.end());
            CHECK(*hi - *lo <= 1);
        }
}

TEST_CASE("a GPU's peak memory bandwidth from its memory clock and bus width", "[cuda-host]") {
    // what the driver reports for an H100 SXM (HBM3), an A100 80GB (HBM2e) and an RTX 4090 (GDDR6X), against their
    // published 3.35 TB/s, 2,039 GB/s and 1,008 GB/s
    CHECK(cuda::memory_peak_gbs(2619000, 5120) == Approx(3352.3).epsilon(1e-4));
    CHECK(cuda::memory_peak_gbs(1593000, 5120) == Approx(2039.0).epsilon(1e-4));
    CHECK(cuda::memory_peak_gbs(10501000, 384) == Approx(1008.1).epsilon(1e-4));
    // nothing reported: unknown, not a bandwidth
    CHECK(cuda::memory_peak_gbs(0, 5120) == 0.0);
    CHECK(cuda::memory_peak_gbs(2619000, 0) == 0.0);
}

TEST_CASE("the prefill GEMM's auto chunks come from the tokens and the SMs, within the scratch planned",
          "[cuda-host]") {
    using cuda::gemm_chunk_rows;
    const int64_t autoc = cuda::kGemmChunkAuto;
    CHECK(cuda::gemm_chunk_elems_of_mib(-1) == autoc);
    auto rows_of = [](int64_t rows, int64_t cols, int n, int sms) {
        return gemm_chunk_rows(rows, cols, cuda::gemm_chunk_elems_for(cuda::kGemmChunkAuto, rows, cols, n, sms));
    };
    // 512 tokens on 132 SMs (an H100/H200): LLaMA-2-7B's matrices whole, 13B's gate, up and down in two (the cap),
    // the output's 32000 rows (every position's logits) in three of at least 8448 rows (two waves)
    for (const auto& [rows, cols] :
         {std::pair<int64_t, int64_t>{4096, 4096}, {11008, 4096}, {4096, 11008}, {5120, 5120}})
        CHECK(rows_of(rows, cols, 512, 132) == rows);
    CHECK(rows_of(32000, 4096, 512, 132) == 10752);
    CHECK(rows_of(13824, 5120, 512, 132) == 6912);
    CHECK(rows_of(5120, 13824, 512, 132) == 2560);
    // 16 MiB where that already gives each GEMM two waves of 128 x 128 tiles
    CHECK(rows_of(4096, 4096, 2048, 132) == 4096);  // 2176 rows wanted: one chunk
    CHECK(rows_of(4096, 4096, 2049, 132) == 2048);  // 2048 wanted: two, as at 16 MiB
    CHECK(rows_of(4096, 4096, 2049, 132) == gemm_chunk_rows(4096, 4096));
    CHECK(rows_of(4096, 4096, 8192, 132) == 2048);  // never below 16 MiB
    // short prompts: a chunk's tiles cannot fill the GPU, so as few chunks as the cap allows
    CHECK(rows_of(4096, 4096, 20, 132) == 4096);
    CHECK(rows_of(11008, 4096, 100, 132) == 11008);
    // fewer SMs, fewer rows: 512 tokens on 28 SMs want 1792 rows a chunk, two 16 MiB chunks of a 4096-row matrix
    CHECK(rows_of(4096, 4096, 512, 28) == 2048);
    CHECK(rows_of(11008, 4096, 512, 28) == 2048);
    for (int64_t cols : {896, 4096, 5120, 8192, 11008, 13824, 28672})
        for (int64_t rows : {256, 1000, 4096, 11008, 28672, 128256})
            for (int n : {17, 100, 512, 2048, 8192})
                for (int sms : {1, 28, 132, 264}) {
                    INFO(rows << " x " << cols << ", " << n << " tokens, " << sms << " SMs");
                    const int64_t r = rows_of(rows, cols, n, sms);
                    CHECK(r >= 1);
                    CHECK(r <= rows);
                    CHECK((r == rows || r % cuda::kGemmChunkRowStep == 0));
                    // the scratch planned for auto holds every chunk auto takes
                    CHECK(r <= gemm_chunk_rows(rows, cols, autoc));
                    CHECK(r * cols <= std::max(cuda::kGemmChunkAutoMaxElems, cuda::kGemmChunkRowStep * cols));
                    // never smaller than a 16 MiB chunk
                    CHECK(r >= gemm_chunk_rows(rows, cols));
                    // where the matrix has rows for two chunks of two waves each, every chunk has two waves, unless
                    // the cap holds it
                    const int64_t fill = (2 * sms + (n + 127) / 128 - 1) / ((n + 127) / 128) * 128;
                    if (rows >= 2 * fill && (2 * fill + 256) * cols <= cuda::kGemmChunkAutoMaxElems) {
                        const int64_t chunks = (rows + r - 1) / r;
                        CHECK(rows / chunks >= fill - cuda::kGemmChunkRowStep);
                    }
                }
    CHECK(cuda::gemm_scratch_elems(GgmlType::Q4_K, 11008, 4096, autoc, true) == 2 * 11008 * 4096);
    CHECK(cuda::gemm_scratch_elems(GgmlType::Q4_K, 13824, 5120, autoc) == 6912 * 5120);
}

TEST_CASE("the CUDA memory plan counts weights, the f16 KV cache and buffers", "[cuda-host]") {
    const Model m = Model::load(std::string(KVGEN_SHARED_DIR) + "/testdata/ref/open-gqa-Q8_0.gguf");
    size_t matrices = 0;
    for (const LayerWeights& L : m.weights.layers)
        for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
            matrices += size_t(w->rows * cuda::device_row_bytes(w->type, w->cols));
    const WeightView &e = m.weights.token_embd, &o = m.weights.output;
    matrices += size_t(e.rows * cuda::device_row_bytes(e.type, e.cols));
    if (!m.weights.tied_output) matrices += size_t(o.rows * cuda::device_row_bytes(o.type, o.cols));

    const Config& c = m.config;
    const size_t norms = (2 * size_t(c.n_layers) + 1) * size_t(c.n_embd) * 4, rope = size_t(c.rope_dim / 2) * 8;

    Settings s;
    s.n_ctx = 1000;
    s.n_batch = 1;
    const cuda::CudaMemoryPlan one = cuda::plan_memory(m, s);
    CHECK(one.weights >= matrices + norms + rope);
    CHECK(one.weights <= matrices + norms + rope + 256 * (7 * m.weights.layers.size() + 5));  // alignment padding only
    CHECK(one.kv_cache == KvLayout::of(c, 1000, KvType::F16).bytes());
    s.n_batch = 512;
    const cuda::CudaMemoryPlan batch = cuda::plan_memory(m, s);
    CHECK(batch.buffers > one.buffers);  // activations for 512 tokens and the f16 GEMM scratch
    CHECK(batch.weights == one.weights);
    CHECK(batch.kv_cache == one.kv_cache);
    // A quantized K keeps its key offsets beside the cache: f32 [n_layers][n_kv_heads][head_dim].
    s.kv_type_k = KvType::Q4_0;
    s.kv_type_v = KvType::Q8_0;
    const KvLayout q = KvLayout::of(c, 1000, KvType::Q4_0, KvType::Q8_0);
    REQUIRE(q.k_offsets());
    const size_t offsets = size_t(c.n_layers) * size_t(c.n_kv_heads) * size_t(c.head_dim) * 4;
    const cuda::CudaMemoryPlan quantized = cuda::plan_memory(m, s);
    CHECK(quantized.kv_cache >= q.bytes() + offsets);
    CHECK(quantized.kv_cache <= q.bytes() + offsets + 3 * 256);  // alignment padding only
    CHECK(quantized.weights == batch.weights);
    CHECK(quantized.buffers == batch.buffers);
    s.kv_type_k = KvType::F16;  // offsets belong to a quantized K alone
    const cuda::CudaMemoryPlan v_only = cuda::plan_memory(m, s);
    CHECK(v_only.kv_cache >= KvLayout::of(c, 1000, KvType::F16, KvType::Q8_0).bytes());
    CHECK(v_only.kv_cache < KvLayout::of(c, 1000, KvType::F16, KvType::Q8_0).bytes() + 3 * 256);
}

TEST_CASE("the CUDA memory plan places every region inside one allocation, none overlapping", "[cuda-host]") {
    for (const char* f : {"ref/open-gqa-Q4_K_M.gguf", "ref/open-mha-F16.gguf", "tiny/llama-2-tiny-random.gguf"}) {
        INFO(f);
        const Model m = Model::load(std::string(KVGEN_SHARED_DIR) + "/testdata/" + f);
        const Config& c = m.config;
        for (const auto& [n_batch, kt] : {std::pair{1, KvType::F16}, std::pair{64, KvType::F16},
                                          std::pair{1, KvType::Q8_0}, std::pair{64, KvType::Q4_0}}) {
            if (kv_type_quantized(kt) && c.head_dim % 32 != 0) continue;
            INFO("n_batch " << n_batch << " K " << kv_type_name(kt));
            const KvLayout kv = KvLayout::of(c, 300, kt, KvType::F16);
            const cuda::MemoryPlan p = cuda::plan_memory(m, kv, n_batch, n_batch, 1234);
            std::vector<cuda::Region> all = p.matrices;
            for (const cuda::Region& r : {p.norms,
                                          p.rope_inv_freq,
                                          p.rope_factors,
                                          p.k_cache,
                                          p.v_cache,
                                          p.k_offsets,
                                          p.x,
                                          p.q,
                                          p.k,
                                          p.v,
                                          p.att,
                                          p.ffn,
                                          p.up,
                                          p.logits,
                                          p.xn,
                                          p.partials,
                                          p.cos,
                                          p.sin,
                                          p.xh,
                                          p.ys,
                                          p.wh,
                                          p.step,
                                          p.xq,
                                          p.counters,
                                          p.hq,
                                          p.hq_counters,
                                          p.xnq,
                                          p.norm_sums,
                                          p.norm_counters})
                all.push_back(r);
            std::sort(all.begin(), all.end(), [](const cuda::Region& a, const cuda::Region& b) {
                return a.offset < b.offset || (a.offset == b.offset && a.bytes < b.bytes);
            });
            for (size_t i = 0; i + 1 < all.size(); ++i) CHECK(all[i].offset + all[i].bytes <= all[i + 1].offset);
            CHECK(all.back().offset + all.back().bytes <= p.total);
            CHECK(p.total == p.weights + p.kv_cache + p.buffers);
            CHECK(p.k_cache.bytes == kv.k_bytes());
            CHECK(p.v_cache.bytes == size_t(kv.elems()) * 2);
            CHECK(p.k_offsets.bytes == (kv.k_offsets() ? size_t(c.n_layers) * c.n_kv_heads * c.head_dim * 4 : 0));
            CHECK(p.k_offsets.offset >= p.weights);  // the cache's part of the allocation
            CHECK(p.k_offsets.offset + p.k_offsets.bytes <= p.weights + p.kv_cache);
            CHECK(p.x.bytes == size_t(n_batch) * size_t(c.n_embd) * 4);
            CHECK(p.partials.bytes == 1234 * 4);
            CHECK(p.step.bytes == size_t(2 + n_batch) * 4);
            CHECK(p.logits.bytes == size_t(n_batch) * size_t(c.n_vocab) * 4);
            CHECK((p.xh.bytes > 0) == (n_batch > 1));
            // a short prompt's products on split activations (F16 here): twice its tokens of activations, and the
            // products of both
            const int64_t wide = std::max({int64_t(c.n_embd), int64_t(c.n_heads) * c.head_dim, int64_t(c.n_ff)});
            const int64_t split_tokens = 2 * std::min(n_batch, 16);
            bool f16_layers = false;
            for (const LayerWeights& L : m.weights.layers)
                for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
                    f16_layers = f16_layers || cuda::split_prompt_type(w->type);
            // n_logits > 1 wherever n_batch > 1 here
            const bool f16_head = cuda::split_prompt_type(m.weights.output.type);
            const bool f16 = f16_layers || f16_head;
            CHECK(p.xh.bytes ==
                  (n_batch > 1 ? size_t(std::max<int64_t>(n_batch, f16 ? split_tokens : 0) * wide * 2) : 0));
            const int64_t qkv_rows = int64_t(c.n_heads + 2 * c.n_kv_heads) * c.head_dim;
            CHECK((p.ys.bytes > 0) == (n_batch > 1 && f16));
            if (p.ys.bytes > 0) {
                const int64_t layer_rows = f16_layers ? std::max<int64_t>(qkv_rows, c.n_ff) : 0;
                CHECK(p.ys.bytes >= size_t(split_tokens * std::max<int64_t>(layer_rows, f16_head ? c.n_vocab : 0) * 4));
            }
            // an integer product's input: one token's, or a short prompt's (up to 16 tokens, 64 on the tensor cores)
            const int64_t widest = std::max({int64_t(c.n_embd), int64_t(c.n_heads) * c.head_dim, int64_t(c.n_ff)});
            CHECK(p.xq.bytes == size_t(std::min(n_batch, 64)) * size_t((widest + 31) / 32) * 80);
            // the RMSNorm folded into a residual product: one token's blocks, a sum and a counter per group, one count
            const size_t groups = c.n_embd % 32 == 0 ? size_t(c.n_embd / 32) : 0;
            CHECK(p.xnq.bytes == groups * 80);
            CHECK(p.norm_sums.bytes == groups * 4);
            CHECK(p.norm_counters.bytes == (groups > 0 ? groups + 1 : 0) * 4);
            // Q, K and V of a fused layer follow each other without a gap, so they read as one matrix.
            const std::vector<const WeightView*> ws = cuda::device_weights(m);
            const size_t first = ws.size() - 7 * c.n_layers;
            for (int l = 0; l < c.n_layers; ++l) {
                if (!p.fused_qkv[size_t(l)]) continue;
                const cuda::Region &q = p.matrices[first + 7 * size_t(l)], &k = p.matrices[first + 7 * size_t(l) + 1],
                                   &v = p.matrices[first + 7 * size_t(l) + 2];
                CHECK(k.offset == q.offset + q.bytes);
                CHECK(v.offset == k.offset + k.bytes);
                CHECK(q.offset % 256 == 0);
            }
        }
    }
}

TEST_CASE("RowSplit sends each row of a fused Q|K|V product to its own buffer", "[cuda-host]") {
    const std::vector<int> t = cuda::host::row_split_targets(7, 3, 5);
    CHECK(t == std::vector<int>{0, 1, 2, 1000000, 1000001, 2000000, 2000001});
    const std::vector<int> one = cuda::host::row_split_targets(4, 4, 4);  // RowSplit::one: all rows to y[0]
    CHECK(one == std::vector<int>{0, 1, 2, 3});
    // A short prompt's: each buffer holds its rows token after token (q: 3 rows a token, k and v 2).
    const std::vector<int> t2 = cuda::host::row_split_targets(7, 3, 5, 2);
    CHECK(t2 == std::vector<int>{0, 1, 2, 1000000, 1000001, 2000000, 2000001,  // token 0
                                 3, 4, 5, 1000002, 1000003, 2000002, 2000003});
    const std::vector<int> one2 = cuda::host::row_split_targets(4, 4, 4, 3);
    CHECK(one2 == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
}

TEST_CASE("the integer decode product, run on the host: the CPU's activation rounding, then exact integer dots",
          "[cuda-host]") {
    // The activation blocks equal the CPU's (cpu::quantize_a32) bit for bit: quantize_act_kernel's (a warp per block,
    // its sums by shuffles) and quantize_act_item's (the host products' inputs).
    const int64_t cols = 1024;
    std::vector<float> x = test::randn(size_t(cols), 12, 3.0f);
    x[5] = 0.0f;
    std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero block: d = 0
    std::fill(x.begin() + 96, x.begin() + 128, -7.5f);  // one value throughout: every q at the largest magnitude
    for (int j = 128; j < 160; ++j) x[size_t(j)] = j < 144 ? 1e-3f : 40.0f;  // halves far apart
    std::vector<cpu::BlockA32> cpu_blocks(size_t(cols / 32));
    cpu::quantize_a32(x.data(), cpu_blocks.data(), cols);
    for (const auto& dev : {cuda::host::quantize_act(x), cuda::host::quantize_act_items(x)}) {
        REQUIRE(dev.size() == cpu_blocks.size());
        for (size_t b = 0; b < dev.size(); ++b) {
            INFO("block " << b);
            CHECK(dev[b].d == cpu_blocks[b].d);
            CHECK(dev[b].s == cpu_blocks[b].sum[0] + cpu_blocks[b].sum[1]);
            CHECK(dev[b].h[0] == cpu_blocks[b].sum[0]);
            CHECK(dev[b].h[1] == cpu_blocks[b].sum[1]);
            CHECK(std::equal(dev[b].q, dev[b].q + 32, cpu_blocks[b].q));
        }
    }

    // Every type on blocks of 1 warp (96 and 768 columns: 3 and 24 units), 3 with the last partly idle (2816: 88), 4
    // (4096: 128), 8 x 2 passes (16384: 512) and 7 x 3 passes (20480: 640), rows not a multiple of the block's 4,
    // and rows whose device layout is padded (96 and 768 columns: 54 / 102 / 630 bytes to 64 / 112 / 640): on the
    // host a misaligned 16-byte load throws.
    CHECK(cuda::host::matvec_int_warps(3) == 1);
    CHECK(cuda::host::matvec_int_warps(88) == 3);
    CHECK(cuda::host::matvec_int_warps(160) == 5);
    CHECK(cuda::host::matvec_int_warps(344) == 6);
    CHECK(cuda::host::matvec_int_warps(512) == 8);
    CHECK(cuda::host::matvec_int_warps(640) == 7);
    CHECK(cuda::host::matvec_int_warps(513) == 6);
    for (const char* name : {"Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})
        for (const int64_t n_cols : {96, 768, 2816, 4096, 16384, 20480}) {
            GgmlType t;
            REQUIRE(ggml_type_from_name(name, &t));
            if (n_cols % ggml_type_info(t)->block_size != 0) continue;
            INFO(name << " cols " << n_cols);
            const int64_t rows = 9;
            std::vector<float> xc = test::randn(size_t(n_cols), 13, 3.0f);
            std::copy(x.begin(), x.begin() + std::min(cols, n_cols), xc.begin());  // with the zero block above
            std::vector<cpu::BlockA32> xb(size_t(n_cols / 32));
            cpu::quantize_a32(xc.data(), xb.data(), n_cols);
            const RandomRows w = random_rows(t, rows, n_cols, 6);
            const std::vector<uint8_t>& b = w.bytes;
            const std::vector<float>& wf = w.values;
            const std::vector<float> y = cuda::host::matvec_int(t, b.data(), rows, n_cols, xc);
            // Q4_0 takes two units a step by default (--cuda-matvec-unit 64; 96 columns: an odd unit left over), one
            // with 32: the same integer dots, summed in another order.
            const std::vector<float> y_units = cuda::host::matvec_int(t, b.data(), rows, n_cols, xc, 1, false);
            const int64_t row_bytes = int64_t(b.size()) / rows;
            for (int64_t r = 0; r < rows; ++r) {
                double s = 0, sq = 0, mag = 0;
                for (int64_t j = 0; j < n_cols; ++j) {
                    const double wj = wf[size_t(r * n_cols + j)];
                    const cpu::BlockA32& a = xb[size_t(j / 32)];
                    s += wj * xc[size_t(j)];
                    sq += wj * (double(a.d) * a.q[j % 32]);  // the activation as quantized
                    mag += std::fabs(wj * xc[size_t(j)]);
                }
                INFO("row " << r << " got " << y[size_t(r)] << " exact " << s << " on quantized activations " << sq);
                // 16-bit activations: each value within half a step of 1/32512 of its block's largest.
                CHECK(std::fabs(y[size_t(r)] - s) <= 1e-4 * mag);
                // On the activations as rounded, only float sums of exact integer dots remain.
                CHECK(std::fabs(y[size_t(r)] - sq) <= 2e-6 * mag);
                CHECK(std::fabs(y_units[size_t(r)] - sq) <= 2e-6 * mag);
                if (t != GgmlType::Q4_0) CHECK(y_units[size_t(r)] == y[size_t(r)]);  // steps of one unit either way
                if (cpu::act_format(t) == cpu::ActFormat::A32) {
                    // Q4_0 and Q8_0 meet the same integer activations as the CPU's reference dot: the same block
                    // sums, added in another order.
                    float want = 0;
                    cpu::kernels::vec_dot_generic(t, cpu::act_format(t), b.data() + r * row_bytes, xb.data(), 0, 1,
                                                  &want, n_cols);
                    CHECK(std::fabs(y[size_t(r)] - want) <= 1e-6 * mag);
                }
            }
            // SwiGLU's kernel (gate and up two rows each per block) sums every row as the one-matrix kernel does.
            std::vector<uint8_t> up(b.size());
            synth_random_rows(t, up.data(), rows, n_cols, 0.05f, 7);
            const std::vector<float> yu = cuda::host::matvec_int(t, up.data(), rows, n_cols, xc);
            const std::vector<float> glu = cuda::host::matvec_glu_int(t, b.data(), up.data(), rows, n_cols, xc);
            for (int64_t r = 0; r < rows; ++r) {
                const float g = y[size_t(r)];
                CHECK(glu[size_t(r)] == g / (1.0f + std::exp(-g)) * yu[size_t(r)]);
            }
        }
}

TEST_CASE("the integer products of a short prompt, run on the host: each token the same bits as its product alone",
          "[cuda-host]") {
    // 2 to 16 tokens go in launches of up to 8 (4 rows a block; SwiGLU 2 of each), 4 tokens or fewer by a kernel of 4;
    // blocks of 1, 3 and 4 warps; 9 rows, so the last block has rows past the matrix.
    const int n_max = 16;
    for (const char* name : {"Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})
        for (const int64_t cols : {96, 768, 2816, 4096}) {
            GgmlType t;
            REQUIRE(ggml_type_from_name(name, &t));
            if (cols % ggml_type_info(t)->block_size != 0) continue;
            INFO(name << " cols " << cols);
            const int64_t rows = 9;
            std::vector<float> x = test::randn(size_t(n_max * cols), 41, 2.0f);
            std::fill(x.begin() + 3 * cols + 32, x.begin() + 3 * cols + 64, 0.0f);  // a zero block in token 3
            const RandomRows gate = random_rows(t, rows, cols, 8), up = random_rows(t, rows, cols, 9);
            std::vector<float> alone, glu_alone;  // [token][row], one product per token
            for (int i = 0; i < n_max; ++i) {
                const std::vector<float> xi(x.begin() + i * cols, x.begin() + (i + 1) * cols);
                const std::vector<float> y = cuda::host::matvec_int(t, gate.bytes.data(), rows, cols, xi);
                const std::vector<float> g =
                    cuda::host::matvec_glu_int(t, gate.bytes.data(), up.bytes.data(), rows, cols, xi);
                alone.insert(alone.end(), y.begin(), y.end());
                glu_alone.insert(glu_alone.end(), g.begin(), g.end());
            }
            for (const int n : {2, 3, 4, 5, 8, 9, 13, 16}) {
                INFO(n << " tokens");
                const std::vector<float> xn(x.begin(), x.begin() + n * cols);
                const std::vector<float> y = cuda::host::matvec_int(t, gate.bytes.data(), rows, cols, xn, n);
                const std::vector<float> g =
                    cuda::host::matvec_glu_int(t, gate.bytes.data(), up.bytes.data(), rows, cols, xn, n);
                CHECK(y == std::vector<float>(alone.begin(), alone.begin() + n * rows));
                CHECK(g == std::vector<float>(glu_alone.begin(), glu_alone.begin() + n * rows));
                if (t != GgmlType::Q4_0) continue;
                // Q4_0 in steps of one unit (--cuda-matvec-unit 32): each token its own product's bits too
                std::vector<float> units_alone;
                for (int i = 0; i < n; ++i) {
                    const std::vector<float> xi(x.begin() + i * cols, x.begin() + (i + 1) * cols);
                    const std::vector<float> yi =
                        cuda::host::matvec_int(t, gate.bytes.data(), rows, cols, xi, 1, false);
                    units_alone.insert(units_alone.end(), yi.begin(), yi.end());
                }
                CHECK(cuda::host::matvec_int(t, gate.bytes.data(), rows, cols, xn, n, false) == units_alone);
            }
        }
}

TEST_CASE("the integer products of a short prompt on the tensor cores, run on the host: the CUDA-core sums",
          "[cuda-host]") {
    // --cuda-matvec-mma on: each block's integer dot as two mma.sync m16n8k32 on the activations' high and low bytes,
    // so each Q4_0 / Q8_0 block's term is the CUDA-core product's and only the order of a row's sums differs (Q4_K: a
    // sub-block's term at once, where the CUDA cores take two halves of two sub-blocks a unit; Q6_K: a 32-value block's
    // two halves, each a product of its own, where the CUDA cores take halves of two blocks a unit). 72 rows (a last
    // block with rows past the matrix: 32 a block, 16 of each of gate and up; with two sets of rows a block, 64, and
    // a last block whose second set is past the matrix), 3 units (warp 0's turn ends past the row, the other warps
    // have none), 344 (two warps a turn fewer), 1 to 16 tokens (one tile of 8, or two; Q6_K two groups of up to 8
    // above 8, two sets; tokens past n in the last tile), and 17 to 64 (groups of 16, Q6_K 8, the grid's x, and two
    // sets of rows a block: a last group of one token, whose second tile is skipped; 40 tokens, a last group of 8;
    // 64, four whole groups).
    for (const char* name : {"Q4_0", "Q8_0", "Q4_K", "Q6_K"})
        for (const int64_t cols : {96, 768, 4096, 11008}) {
            GgmlType t;
            REQUIRE(ggml_type_from_name(name, &t));
            if (cols % ggml_type_info(t)->block_size != 0) continue;
            const int64_t rows = 72;
            const RandomRows gate = random_rows(t, rows, cols, 51), up = random_rows(t, rows, cols, 52);
            for (const int n : {1, 2, 5, 8, 9, 16, 17, 40, 64}) {
                if (cols > 4096 && n != 16) continue;  // (time)
                if (n > 16 && cols > 768) continue;
                INFO(name << " cols " << cols << " tokens " << n);
                std::vector<float> x = test::randn(size_t(n * cols), 53 + n, 2.0f);
                std::fill(x.begin(), x.begin() + 32, 0.0f);                                         // a zero block
                for (int64_t j = 32; j < 64 && j < cols; ++j) x[size_t(j)] = j % 2 ? 1e4f : -1e4f;  // |q| 32512
                const std::vector<float> y =
                    cuda::host::matvec_int_mma(t, gate.bytes.data(), nullptr, rows, cols, x, n);
                const std::vector<float> g =
                    cuda::host::matvec_int_mma(t, gate.bytes.data(), up.bytes.data(), rows, cols, x, n);
                const std::vector<float> y_ref = cuda::host::matvec_int(t, gate.bytes.data(), rows, cols, x, n);
                const std::vector<float> g_ref =
                    cuda::host::matvec_glu_int(t, gate.bytes.data(), up.bytes.data(), rows, cols, x, n);
                for (const auto& [got, want] : {std::pair{&y, &y_ref}, std::pair{&g, &g_ref}}) {
                    float scale = 0.0f;
                    for (float v : *want) scale = std::max(scale, std::fabs(v));
                    REQUIRE(got->size() == want->size());
                    for (size_t k = 0; k < got->size(); ++k) {
                        INFO("output " << k << ": " << (*got)[k] << " vs " << (*want)[k]);
                        REQUIRE(std::isfinite((*got)[k]));
                        CHECK(std::fabs((*got)[k] - (*want)[k]) <= 2e-6f * scale);
                    }
                }
            }
        }
}

TEST_CASE("the tensor cores' SwiGLU product quantizes its output for the down projection, run on the host",
          "[cuda-host]") {
    // int_mma_glu_quantize: each 32-row group's last block writes its tokens' ActBlocks, the blocks quantize_act makes
    // of the output, and every counter is back at zero. 96 rows: one group of tokens, blocks of 16 rows (two a group);
    // several groups, blocks of 32 (one a group), each group of tokens counting on its own counters (Q6_K: up to 8
    // groups of 8). 2 to 64 tokens (a last group of 1, or of 8).
    const int64_t rows = 96, cols = 256;
    for (const char* name : {"Q4_0", "Q6_K"}) {
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        const RandomRows gate = random_rows(t, rows, cols, 81), up = random_rows(t, rows, cols, 82);
        for (const int n : {2, 9, 16, 17, 40, 64}) {
            INFO(name << ", " << n << " tokens");
            const std::vector<float> x = test::randn(size_t(n * cols), 83 + n, 2.0f);
            std::vector<cuda::host::HostActBlock> yq;
            const std::vector<float> y =
                cuda::host::matvec_int_mma(t, gate.bytes.data(), up.bytes.data(), rows, cols, x, n, &yq);
            CHECK(y == cuda::host::matvec_int_mma(t, gate.bytes.data(), up.bytes.data(), rows, cols, x, n));
            REQUIRE(yq.size() == size_t(n) * size_t(rows / 32));
            check_same_blocks(yq, cuda::host::quantize_act(y));
        }
    }
}

TEST_CASE("an 8-bit mma.sync, run on the host: the fragments of the PTX ISA's m16n8k32", "[cuda-host]") {
    // A [16][32] and B [32][8] of bytes placed in each lane's registers as DeviceThread::mma_i8 says, against the
    // integer product; the four signed / unsigned combinations, C added to.
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> byte(0, 255);
    uint8_t A[16][32], B[32][8];
    for (auto& r : A)
        for (auto& v : r) v = uint8_t(byte(rng));
    for (auto& r : B)
        for (auto& v : r) v = uint8_t(byte(rng));
    for (const bool au : {false, true})
        for (const bool bu : {false, true}) {
            INFO("A " << (au ? "u8" : "s8") << ", B " << (bu ? "u8" : "s8"));
            const std::vector<int> c = cuda::host::mma_i8(&A[0][0], &B[0][0], au, bu, 1000);
            for (int row = 0; row < 16; ++row)
                for (int col = 0; col < 8; ++col) {
                    int64_t want = 1000;
                    for (int k = 0; k < 32; ++k)
                        want += (au ? int64_t(A[row][k]) : int64_t(int8_t(A[row][k]))) *
                                (bu ? int64_t(B[k][col]) : int64_t(int8_t(B[k][col])));
                    CHECK(c[size_t(row * 8 + col)] == want);
                }
        }
}

TEST_CASE("the integer products through rings of shared memory, run on the host: the register path's bits",
          "[cuda-host]") {
    // --cuda-matvec-stages 2-4 against 0: a few blocks that take several row groups each (37 rows: 10 groups of 4, 19
    // of 2 of each of gate and up, over 3 blocks; the last group with rows past the matrix), each thread's items
    // copied ahead across the groups' ends, the copies landing at the waits or at once (every other block); one
    // token and prompts of 5 and 13 (launches of 4 and 8); blocks of 1, 3, 4 and 6 warps, threads with no step of a
    // group (2816 columns: 88 units for 96 threads), with one, and with two (11008 columns: 344 units for 192 threads;
    // Q4_0's pairs at 20480 columns: 320 steps for 160), an odd unit left over (96 columns).
    for (const char* name : {"Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})
        for (const int64_t cols : {96, 768, 2816, 4096, 11008, 20480}) {
            GgmlType t;
            REQUIRE(ggml_type_from_name(name, &t));
            if (cols % ggml_type_info(t)->block_size != 0) continue;
            const int64_t rows = 37;
            const RandomRows gate = random_rows(t, rows, cols, 31), up = random_rows(t, rows, cols, 32);
            for (const int n : {1, 5, 13})
                for (const bool pairs : {true, false}) {
                    if (!pairs && t != GgmlType::Q4_0) continue;
                    if (cols > 4096 && n == 13) continue;  // (time)
                    const std::vector<float> x = test::randn(size_t(n * cols), 33 + n, 2.0f);
                    const std::vector<float> y = cuda::host::matvec_int(t, gate.bytes.data(), rows, cols, x, n, pairs);
                    const std::vector<float> g =
                        cuda::host::matvec_glu_int(t, gate.bytes.data(), up.bytes.data(), rows, cols, x, n, pairs);
                    for (const int stages : {2, 3, 4}) {
                        INFO(name << " cols " << cols << " tokens " << n << " pairs " << pairs << " stages " << stages);
                        CHECK(cuda::host::matvec_int(t, gate.bytes.data(), rows, cols, x, n, pairs, stages) == y);
                        CHECK(cuda::host::matvec_glu_int(t, gate.bytes.data(), up.bytes.data(), rows, cols, x, n, pairs,
                                                         stages) == g);
                    }
                }
        }
}

TEST_CASE("a ring's pieces: each thread's slots apart from every other's, inside the ring, aligned", "[cuda-host]") {
    // Every (stage, slot, piece, thread) of the rings the launches take (one token's 4 rows, SwiGLU's 2 + 2, 8
    // tokens' 2 rows; 32-256 threads; 2-4 stages) at its own offset, 16-byte pieces at multiples of 16 and words of 4,
    // all of them inside bytes(), which they fill.
    for (const int threads : {32, 96, 160, 256})
        for (const int slots : {2, 4})
            for (const int stages : {2, 3, 4})
                for (const int n16 : {1, 2})
                    for (const int n4 : {1, 2, 3}) {
                        const cuda::RingLayout L{threads, slots, n16, n4, stages};
                        std::vector<int> used(size_t(L.bytes()), 0);
                        bool ok = true;
                        const auto take = [&](int64_t at, int bytes) {
                            ok = ok && at >= 0 && at + bytes <= L.bytes() && at % bytes == 0;
                            for (int b = 0; ok && b < bytes; ++b) ok = used[size_t(at + b)]++ == 0;
                        };
                        for (int st = 0; st < stages; ++st)
                            for (int q = 0; q < slots; ++q)
                                for (int t = 0; t < threads; ++t) {
                                    for (int k = 0; k < n16; ++k) take(L.at16(st, q, k, t), 16);
                                    for (int j = 0; j < n4; ++j) take(L.at4(st, q, j, t), 4);
                                }
                        INFO("threads " << threads << " slots " << slots << " stages " << stages << " pieces " << n16
                                        << " + " << n4);
                        CHECK(ok);
                        CHECK(std::count(used.begin(), used.end(), 1) == L.bytes());
                    }
}

TEST_CASE("the Q|K|V product's epilogue rotates Q and K and stores K and V: the bits of rope_store_kv's launch",
          "[cuda-host]") {
    // One product over Q|K|V, and Q, K and V as three products (a Q4_K_M file's Q6_K V); one token and prompts in one
    // and two launches (NT 1, 4, 8), blocks of 2 and 4 rows; a partial rotation; positions 0 and 37 (13 tokens: the
    // second launch's from position 45).
    for (const char* name : {"Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})
        for (int rope_dim : {64, 32})
            for (int n : {1, 3, 8, 13}) {
                GgmlType t;
                REQUIRE(ggml_type_from_name(name, &t));
                Config c = test::attention_config(4, 2, 64);
                c.rope_dim = rope_dim;
                const int64_t cols = 256, qd = 256, kvd = 128, rows = qd + 2 * kvd;
                const int n_ctx = 64, pos0 = n == 3 || n == 13 ? 37 : 0;
                INFO(name << " rope_dim " << rope_dim << " n " << n << " pos0 " << pos0);
                const RandomRows w = random_rows(t, rows, cols, 21);
                const std::vector<float> x = test::randn(size_t(n * cols), 22, 2.0f);
                // the plain product, then RoPE and the store as their own kernels' bodies do them
                const std::vector<float> y = cuda::host::matvec_int(t, w.bytes.data(), rows, cols, x, n);
                std::vector<float> q(size_t(n * qd)), k(size_t(n * kvd)), v(size_t(n * kvd));
                for (int i = 0; i < n; ++i) {
                    const float* yi = y.data() + size_t(i) * rows;
                    std::copy(yi, yi + qd, q.begin() + i * qd);
                    std::copy(yi + qd, yi + qd + kvd, k.begin() + i * kvd);
                    std::copy(yi + qd + kvd, yi + rows, v.begin() + i * kvd);
                }
                const std::vector<float> want_q = cuda::host::rope(q, n, c.n_heads, pos0, c, {});
                const std::vector<float> want_k = cuda::host::store_k(c, k, pos0, n, n_ctx);
                std::vector<float> want_v = v;
                for (float& e : want_v) e = fp16_to_fp32(fp32_to_fp16(e));
                const cuda::host::QkvStored one =
                    cuda::host::matvec_int_qkv_store(t, w.bytes.data(), rows, cols, x, n, c, pos0, n_ctx, qd, qd + kvd);
                CHECK(one.q == want_q);
                CHECK(one.k == want_k);
                CHECK(one.v == want_v);
                // Q, K and V as three products, each with its own segment
                const int64_t rb = int64_t(w.bytes.size()) / rows;
                const uint8_t* wq = w.bytes.data();
                const uint8_t* wk = wq + qd * rb;
                const uint8_t* wv = wk + kvd * rb;
                const auto sq = cuda::host::matvec_int_qkv_store(t, wq, qd, cols, x, n, c, pos0, n_ctx, qd, qd);
                const auto sk = cuda::host::matvec_int_qkv_store(t, wk, kvd, cols, x, n, c, pos0, n_ctx, 0, kvd);
                const auto sv = cuda::host::matvec_int_qkv_store(t, wv, kvd, cols, x, n, c, pos0, n_ctx, 0, 0);
                CHECK(sq.q == want_q);
                CHECK(sk.k == want_k);
                CHECK(sv.v == want_v);
            }
}

TEST_CASE("the sums of a Q|K|V product on split activations rotate Q and K and store K and V: rope_store_kv's bits",
          "[cuda-host]") {
    // f16_split_sum with QkvStore as its tail against the plain sums, then RoPE and the store as their own kernels'
    // bodies do them: one product over Q|K|V, and Q, K and V as three; a partial rotation; 2 to 16 tokens at positions
    // 0 and 37.
    for (int rope_dim : {64, 32})
        for (int n : {2, 5, 16}) {
            Config c = test::attention_config(4, 2, 64);
            c.rope_dim = rope_dim;
            const int64_t qd = 256, kvd = 128, rows = qd + 2 * kvd;
            const int n_ctx = 64, pos0 = n == 5 ? 37 : 0;
            INFO("rope_dim " << rope_dim << " n " << n << " pos0 " << pos0);
            const std::vector<float> t = test::randn(size_t(2 * n * rows), uint32_t(40 + n), 3.0f);
            const std::vector<float> sums =
                cuda::host::f16_split_sum(t, n, rows, std::vector<float>(size_t(n * rows), 0.0f), false, false, false);
            // rows [r0, r1) of each of t's 2n rows (sums': n), as the product of those rows alone gives them
            auto rows_of = [&](const std::vector<float>& y, int m, int64_t r0, int64_t r1) {
                std::vector<float> out;
                for (int i = 0; i < m; ++i) out.insert(out.end(), y.begin() + i * rows + r0, y.begin() + i * rows + r1);
                return out;
            };
            const std::vector<float> want_q = cuda::host::rope(rows_of(sums, n, 0, qd), n, c.n_heads, pos0, c, {});
            const std::vector<float> want_k = cuda::host::store_k(c, rows_of(sums, n, qd, qd + kvd), pos0, n, n_ctx);
            std::vector<float> want_v = rows_of(sums, n, qd + kvd, rows);
            for (float& e : want_v) e = fp16_to_fp32(fp32_to_fp16(e));
            const cuda::host::QkvStored one =
                cuda::host::f16_split_sum_qkv_store(t, n, rows, c, pos0, n_ctx, qd, qd + kvd);
            CHECK(one.q == want_q);
            CHECK(one.k == want_k);
            CHECK(one.v == want_v);
            const auto sq =
                cuda::host::f16_split_sum_qkv_store(rows_of(t, 2 * n, 0, qd), n, qd, c, pos0, n_ctx, qd, qd);
            const auto sk =
                cuda::host::f16_split_sum_qkv_store(rows_of(t, 2 * n, qd, qd + kvd), n, kvd, c, pos0, n_ctx, 0, kvd);
            const auto sv =
                cuda::host::f16_split_sum_qkv_store(rows_of(t, 2 * n, qd + kvd, rows), n, kvd, c, pos0, n_ctx, 0, 0);
            CHECK(sq.q == want_q);
            CHECK(sk.k == want_k);
            CHECK(sv.v == want_v);
        }
}

TEST_CASE("the SwiGLU product quantizes its output for the down projection: the blocks quantize_act makes of it",
          "[cuda-host]") {
    // 96 rows: three 32-row groups of 16 blocks each, the last block of a group to finish quantizing it (the blocks
    // run in a shuffled order).
    const int64_t rows = 96, cols = 768;
    const std::vector<float> x = test::randn(size_t(cols), 17, 2.0f);
    for (const char* name : {"Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"}) {
        INFO(name);
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        const RandomRows gate = random_rows(t, rows, cols, 5), up = random_rows(t, rows, cols, 6);
        const std::vector<float> y = cuda::host::matvec_glu_int(t, gate.bytes.data(), up.bytes.data(), rows, cols, x);
        std::vector<cuda::host::HostActBlock> yq;
        const std::vector<float> yf =
            cuda::host::matvec_glu_int_quantized(t, gate.bytes.data(), up.bytes.data(), rows, cols, x, &yq);
        CHECK(yf == y);
        check_same_blocks(yq, cuda::host::quantize_act(y));
    }
    // A short prompt's tokens (launches of up to 8): each token's rows the blocks quantize_act makes of them, the
    // counters zero after each launch; 13 tokens in launches of 8 (8 + 5) and of 4 (4 + 4 + 4 + 1)
    const int n = 13;
    const std::vector<float> sums = test::randn(size_t(n * rows), 19, 2.0f);
    // (Q5_K's 2-4 tokens: blocks of 1 row; 8 tokens: 1 or 2; the other types 2 rows for 4 and 8 tokens)
    for (const auto& [r, nt] : {std::pair{1, 4}, std::pair{1, 8}, std::pair{2, 8}, std::pair{2, 4}, std::pair{4, 2}}) {
        INFO("rows a block " << r << ", tokens a launch " << nt);
        std::vector<cuda::host::HostActBlock> yq;
        CHECK(cuda::host::glu_quantized_tokens(sums, n, rows, r, nt, &yq) == sums);
        check_same_blocks(yq, cuda::host::quantize_act(sums));
    }
}

TEST_CASE("F16 and BF16 decode products by blocks of warps over 4 rows, run on the host, match the exact product",
          "[cuda-host]") {
    // 96 columns: one warp, most lanes idle; 4096: 4 warps, one unit a thread; 11008: 6 warps x 2 passes. 9 rows: the
    // last block of 4 has rows past the matrix (gate and up: blocks of 2 of each).
    const int64_t rows = 9;
    for (const GgmlType t : {GgmlType::F16, GgmlType::BF16})
        for (const int64_t cols : {96, 4096, 11008}) {
            INFO(ggml_type_name(t) << " cols " << cols);
            const RandomRows w = random_rows(t, rows, cols, 3), up = random_rows(t, rows, cols, 4);
            const std::vector<float> x = test::randn(size_t(cols), 5, 2.0f);
            const std::vector<float> y = cuda::host::matvec_f16(t, w.bytes.data(), rows, cols, x);
            const std::vector<float> g = cuda::host::matvec_f16(t, w.bytes.data(), rows, cols, x, up.bytes.data());
            const std::vector<float> lanes = cuda::host::matvec(t, w.bytes.data(), rows, cols, x);
            for (int64_t r = 0; r < rows; ++r) {
                INFO("row " << r);
                const ExactRow e = exact_row(w.values, x, r, cols), eu = exact_row(up.values, x, r, cols);
                CHECK(std::fabs(y[size_t(r)] - e.sum) <= 1e-6 * e.mag);
                CHECK(std::fabs(y[size_t(r)] - lanes[size_t(r)]) <= 2e-6 * e.mag);  // the warp kernel's sums
                const double want = e.sum / (1.0 + std::exp(-e.sum)) * eu.sum;
                CHECK(std::fabs(g[size_t(r)] - want) <=
                      1e-5 * (e.mag * std::fabs(eu.sum) + eu.mag * std::fabs(e.sum)) + 1e-7);
            }
            // Through rings of shared memory (--cuda-matvec-stages), 37 rows (10 groups of 4, 19 of 2 + 2, over 3
            // blocks): the register path's bits.
            const int64_t more = 37;
            const RandomRows w37 = random_rows(t, more, cols, 6), u37 = random_rows(t, more, cols, 7);
            const std::vector<float> y37 = cuda::host::matvec_f16(t, w37.bytes.data(), more, cols, x);
            const std::vector<float> g37 = cuda::host::matvec_f16(t, w37.bytes.data(), more, cols, x, u37.bytes.data());
            for (const int stages : {2, 3, 4}) {
                INFO("stages " << stages);
                CHECK(cuda::host::matvec_f16(t, w37.bytes.data(), more, cols, x, nullptr, stages) == y37);
                CHECK(cuda::host::matvec_f16(t, w37.bytes.data(), more, cols, x, u37.bytes.data(), stages) == g37);
            }
        }
    // A BF16 row is not read as F16: the same bytes give other sums.
    const RandomRows b = random_rows(GgmlType::BF16, rows, 4096, 8);
    const std::vector<float> x = test::randn(4096, 9, 2.0f);
    CHECK(cuda::host::matvec_f16(GgmlType::BF16, b.bytes.data(), rows, 4096, x) !=
          cuda::host::matvec_f16(GgmlType::F16, b.bytes.data(), rows, 4096, x));
}

TEST_CASE("a residual product folds the next RMSNorm in: the blocks rmsnorm quantizes, within a rounding step",
          "[cuda-host]") {
    // 1280 rows: 40 groups of 32 (more than a warp's lanes, so the last block sums some groups' squares in turn),
    // blocks of 4 and 8 rows finishing in a shuffled order.
    const int64_t rows = 1280, cols = 256;
    const float eps = 1e-5f;
    const std::vector<float> x = test::randn(size_t(cols), 21, 2.0f), residual = test::randn(size_t(rows), 22, 3.0f);
    const std::vector<float> norm_w = test::randn(size_t(rows), 23, 1.0f);
    for (const char* name : {"Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"}) {
        INFO(name);
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        const RandomRows w = random_rows(t, rows, cols, 7);
        const std::vector<float> y = cuda::host::matvec_int(t, w.bytes.data(), rows, cols, x);
        std::vector<cuda::host::HostActBlock> xq, xq8;
        const std::vector<float> got =
            cuda::host::matvec_int_residual_norm(t, w.bytes.data(), rows, cols, x, residual, norm_w, eps, 4, &xq);
        // the residual as the plain accumulating product leaves it
        std::vector<float> want(static_cast<size_t>(rows));
        for (size_t r = 0; r < want.size(); ++r) want[r] = residual[r] + y[r];
        CHECK(got == want);
        // 8 rows a block, another order of blocks: the same bits
        CHECK(cuda::host::matvec_int_residual_norm(t, w.bytes.data(), rows, cols, x, residual, norm_w, eps, 8, &xq8) ==
              got);
        REQUIRE(xq8.size() == xq.size());
        for (size_t b = 0; b < xq.size(); ++b) {
            CHECK(xq8[b].d == xq[b].d);
            CHECK(std::equal(xq[b].q, xq[b].q + 32, xq8[b].q));
        }
        // The integers are those of the blocks of got * w (the norm's factor left out), and each scale theirs divided
        // by rms(got).
        std::vector<float> u(got.size());
        for (size_t j = 0; j < u.size(); ++j) u[j] = got[j] * norm_w[j];
        const std::vector<cuda::host::HostActBlock> uq = cuda::host::quantize_act(u);
        double ss = 0.0;
        for (float v : got) ss += double(v) * v;
        const double inv = 1.0 / std::sqrt(ss / double(rows) + double(eps));
        REQUIRE(uq.size() == xq.size());
        for (size_t b = 0; b < xq.size(); ++b) {
            INFO("block " << b);
            CHECK(std::equal(xq[b].q, xq[b].q + 32, uq[b].q));
            CHECK(xq[b].s == uq[b].s);
            CHECK(xq[b].h[0] == uq[b].h[0]);
            CHECK(xq[b].h[1] == uq[b].h[1]);
            CHECK(std::fabs(double(xq[b].d) - double(uq[b].d) * inv) <= 1e-6 * double(uq[b].d) * inv);
        }
        // Against rmsnorm's own quantization of the same row: every value within one step of the block's, the
        // scales within a few rounding steps of f32.
        const std::vector<float> both = cuda::host::rmsnorm_quantized(got, norm_w, 1, int(rows), eps);
        for (size_t b = 0; b < xq.size(); ++b) {
            const float* ref = both.data() + rows + b * 36;
            INFO("block " << b);
            CHECK(std::fabs(xq[b].d - ref[0]) <= 1e-6f * ref[0]);
            for (int j = 0; j < 32; ++j) CHECK(std::abs(int(xq[b].q[j]) - int(ref[4 + j])) <= 1);
        }
    }
}

TEST_CASE("float rows that are not whole 32-weight chunks: the ragged decoders and matvec, run on the host",
          "[cuda-host]") {
    for (const char* name : {"F32", "F16", "BF16"}) {
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        for (int64_t cols : {8, 40, 100}) {
            INFO(name << " cols " << cols);
            const int64_t rows = 5;
            const RandomRows w = random_rows(t, rows, cols, 4);
            const std::vector<uint8_t>& b = w.bytes;
            const std::vector<float>& want = w.values;
            CHECK(test::worst_diff(cuda::host::dequantize(t, b.data(), rows, cols), want) == 0.0f);
            const std::vector<int32_t> ids = {4, 0, 2};
            std::vector<float> want_rows;
            for (int32_t id : ids)
                want_rows.insert(want_rows.end(), want.begin() + id * cols, want.begin() + (id + 1) * cols);
            CHECK(test::worst_diff(cuda::host::get_rows(t, b.data(), rows, cols, ids), want_rows) == 0.0f);
            const std::vector<float> x = test::randn(size_t(cols), 11);
            const std::vector<float> y = cuda::host::matvec(t, b.data(), rows, cols, x);
            for (int64_t r = 0; r < rows; ++r) {
                const ExactRow e = exact_row(want, x, r, cols);
                CHECK(std::fabs(y[size_t(r)] - e.sum) <= 1e-5 * e.mag);
            }
        }
    }
}

TEST_CASE("host emulation: a shuffle or mma.sync after a lane of the warp returned is an error, as on the device",
          "[cuda-host]") {
    // (a full-mask shuffle needs every lane at it, whichever lanes it reads)
    CHECK_THROWS_WITH(cuda::host::warp_after_a_lane_returned(0), Catch::Contains("a shuffle with thread 31"));
    CHECK_THROWS_WITH(cuda::host::warp_after_a_lane_returned(1), Catch::Contains("mma.sync with thread 31"));
    CHECK_NOTHROW(cuda::host::warp_after_a_lane_returned(2));
}

TEST_CASE("host emulation runs each warp as far as it goes before the next, in turn forwards and backwards between "
          "barriers, lands asynchronous copies only when the thread waits for them, and finds a deadlock",
          "[cuda-host]") {
    // so that a kernel that leaves out a barrier between one warp's write and another's read of shared memory, or a
    // wait for its copies, computes a wrong result here (its shared memory starts as NaN, not zeros)
    const auto [first, second] = cuda::host::unsynchronized_reads();
    CHECK(first == 0.0f);   // after the first barrier (block 0, 0: backwards) the second warp ran first
    CHECK(second == 1.0f);  // after the second, the first warp went on past its warp barrier and wrote before
    CHECK_THROWS_WITH(cuda::host::copy_never_waited(), Catch::Contains("never waited for"));
    CHECK_THROWS_WITH(cuda::host::barrier_deadlock(), Catch::Contains("deadlocked at a barrier"));
}

TEST_CASE("the CUDA attention kernels' bodies, run on the host, match cpu::attention", "[cuda-host]") {
    struct Shape {
        int n_heads, n_kv, hd;
    };
    cpu::ThreadPool pool(1);
    uint32_t seed = 21;
    // Decode over an f16 cache reads 16 bytes a lane for head_dim 32, 64 and 128 with at most 4 query heads a block
    // (the first seven shapes; kAttnWide), a lane per 1-8 columns otherwise (the next five: head_dim 96 and 256, 8
    // query heads). The last four shapes take the one-thread-per-query fallback. Depths past the positions a split
    // takes at least give several active splits.
    for (const Shape s : {Shape{4, 2, 64}, Shape{3, 1, 128}, Shape{2, 2, 128}, Shape{8, 2, 128}, Shape{4, 1, 32},
                          Shape{2, 1, 32}, Shape{5, 5, 64}, Shape{6, 2, 96}, Shape{2, 2, 256}, Shape{8, 1, 32},
                          Shape{16, 2, 128}, Shape{8, 1, 64}, Shape{2, 2, 4}, Shape{4, 2, 80}, Shape{6, 3, 48},
                          Shape{2, 1, 192}}) {
        const Config c = test::attention_config(s.n_heads, s.n_kv, s.hd);
        const int n_ctx = 200;
        for (const auto& [pos0, n] : {std::pair{0, 1}, std::pair{1, 1}, std::pair{37, 1}, std::pair{130, 1},
                                      std::pair{199, 1}, std::pair{0, 6}, std::pair{9, 11}}) {
            const auto [q, k, v, want] = test::attention_case(c, n_ctx, pos0, n, seed += 3, pool);
            const float scale = test::max_abs(want);
            for (int splits : n == 1 ? std::vector<int>{1, 3, 16} : std::vector<int>{0}) {
                INFO("heads " << s.n_heads << "/" << s.n_kv << " hd " << s.hd << " pos0 " << pos0 << " n " << n
                              << " splits " << splits);
                // (n > 1: the warp-per-query prefill kernel; the tensor-core one has a test of its own below)
                const std::vector<float> got = cuda::host::attention(c, q, k, v, pos0, n, n_ctx, splits, false, false);
                const float worst = test::worst_diff(got, want);
                INFO("worst |diff| " << worst << " of " << scale);
                CHECK(worst <= 2e-5f * scale);
                if (n == 1)  // the combine folded into the decode kernel: the same sums in the same order
                    CHECK(cuda::host::attention(c, q, k, v, pos0, n, n_ctx, splits, true) == got);
                if (n == 1 && s.hd % 32 == 0) {
                    // The output quantized where it is made (the output projection's input), by either combine:
                    // the blocks quantize_act makes of it.
                    const std::vector<cuda::host::HostActBlock> want_q = cuda::host::quantize_act(got);
                    for (bool fold : {false, true}) {
                        std::vector<cuda::host::HostActBlock> xq;
                        const std::vector<float> o = cuda::host::attention(c, q, k, v, pos0, n, n_ctx, splits, fold,
                                                                           true, KvType::F16, KvType::F16, &xq);
                        CHECK(o == got);
                        INFO("fold " << fold);
                        check_same_blocks(xq, want_q);
                    }
                }
            }
        }
    }
}


TEST_CASE("decode attention uses as many splits as the depth fills, the grid as many as the deepest cache",
          "[cuda-host]") {
    namespace ch = cuda::host;
    const int per = ch::attention_split_positions();
    CHECK(ch::attention_active_splits(1, 16) == 1);
    CHECK(ch::attention_active_splits(per, 16) == 1);
    CHECK(ch::attention_active_splits(per + 1, 16) == 2);
    CHECK(ch::attention_active_splits(100 * per, 16) == 16);
    CHECK(ch::attention_active_splits(5 * per, 1) == 1);
    // LLaMA-2-7B on 132 multiprocessors: about four blocks each once the depth fills them; fewer for a short context
    const Config c = test::attention_config(32, 32, 128);
    const auto kv = [&](int n_ctx) { return KvLayout::of(c, n_ctx, KvType::F16, KvType::F16); };
    CHECK(ch::attention_splits(32, kv(4096), 132) == 17);
    CHECK(ch::attention_splits(32, kv(5 * per - 1), 132) == 5);
    CHECK(ch::attention_max_splits(kv(5 * per - 1)) == 5);
    CHECK(ch::attention_max_splits(kv(1 << 20)) == 64);
    // 8 query heads a KV head: blocks of 8 over an f16 cache, of 4 over one with a quantized half (twice the groups)
    const Config c8 = test::attention_config(32, 4, 64);
    CHECK(ch::attention_splits(32, KvLayout::of(c8, 4096, KvType::F16, KvType::F16), 16) == 16);
    CHECK(ch::attention_splits(32, KvLayout::of(c8, 4096, KvType::Q8_0, KvType::Q8_0), 16) == 8);
    CHECK(ch::attention_splits(32, KvLayout::of(c8, 4096, KvType::Q8_0, KvType::F16), 16) == 8);
}

TEST_CASE("a short prompt over a deep cache splits its positions among enough blocks to fill the GPU", "[cuda-host]") {
    namespace ch = cuda::host;
    const Config c7 = test::attention_config(32, 32, 128);  // LLaMA-2-7B's heads
    const KvLayout kv7 = KvLayout::of(c7, 8192, KvType::F16, KvType::F16);
    // 20 queries at depth 4096: 32 blocks, 8 splits fill 2 per SM of 132; at depth 100 (2 tiles) none.
    CHECK(ch::attention_prefill_splits(32, kv7, 20, 4096, 132) == 8);
    CHECK(ch::attention_prefill_splits(32, kv7, 20, 100, 132) == 1);
    CHECK(ch::attention_prefill_splits(32, kv7, 20, 1300, 132) == 5);  // 21 tiles: at least 4 a split
    // 512 queries: 256 blocks already fill the GPU
    CHECK(ch::attention_prefill_splits(32, kv7, 512, 4096, 132) == 1);
    // LLaMA-2-13B's 40 heads: 320 blocks for 264 places would leave the second wave mostly empty; at depth 4096 4
    // splits (5 waves for 4.85 waves' work; 3 would take 4 for 3.64, 2 three for 2.42), at 1024 and 512 (16 tiles,
    // at most 4 splits) the same; none where the prompt's own positions make the blocks' work unequal (depth 0 and
    // 100), nor at depth 4096 on a GPU with room for all 320
    const Config c13 = test::attention_config(40, 40, 128);
    const KvLayout kv13 = KvLayout::of(c13, 8192, KvType::F16, KvType::F16);
    CHECK(ch::attention_prefill_splits(40, kv13, 512, 4096, 132) == 4);
    CHECK(ch::attention_prefill_splits(40, kv13, 512, 1024, 132) == 4);
    CHECK(ch::attention_prefill_splits(40, kv13, 512, 512, 132) == 4);
    CHECK(ch::attention_prefill_splits(40, kv13, 512, 0, 132) == 1);
    CHECK(ch::attention_prefill_splits(40, kv13, 512, 100, 132) == 1);
    CHECK(ch::attention_prefill_splits(40, kv13, 512, 4096, 160) == 1);
    // 4 query heads a block (n_rep 4: 8 KV heads), 3 queries: 8 blocks; at most 16 splits
    const Config cg = test::attention_config(32, 8, 128);
    CHECK(ch::attention_prefill_splits(32, KvLayout::of(cg, 8192, KvType::F16, KvType::F16), 3, 4096, 132) == 16);
    // head_dim 32: no flash attention, no split
    const Config c32 = test::attention_config(8, 8, 32);
    CHECK(ch::attention_prefill_splits(8, KvLayout::of(c32, 8192, KvType::F16, KvType::F16), 3, 4096, 132) == 1);
    // The memory plan's partials hold the largest split launch: at most 2048 blocks of 64 rows, or the batch's rows
    // times 16 splits; and decode's.
    CHECK(ch::attention_partials(32, 128, 17, 512) == int64_t(2048) * 64 * 130);
    CHECK(ch::attention_partials(32, 128, 17, 4) == int64_t(4) * 32 * 16 * 130);
    CHECK(ch::attention_partials(32, 128, 17, 1) == int64_t(32) * 17 * 130);
    CHECK(ch::attention_partials(8, 32, 5, 512) == int64_t(8) * 5 * 34);
    // a short prompt's blocks of up to 16 rows split each tile's positions among their warps (n_rep 3: a head a block)
    CHECK(ch::flash_warp_split(16, 1));
    CHECK_FALSE(ch::flash_warp_split(17, 1));
    CHECK(ch::flash_warp_split(16, 3));
    CHECK(ch::flash_warp_split(4, 4));
    CHECK_FALSE(ch::flash_warp_split(5, 4));
    CHECK(ch::flash_warp_split(2, 8));
    CHECK_FALSE(ch::flash_warp_split(3, 8));
    for (const int sms : {16, 66, 132, 148})
        for (const int n : {2, 9, 20, 64, 65, 200})
            for (const int pos0 : {0, 500, 4096, 8000}) {
                const int sp = ch::attention_prefill_splits(32, kv7, n, pos0, sms);
                INFO(sms << " SMs, " << n << " queries at " << pos0 << ": " << sp << " splits");
                CHECK(sp >= 1);
                CHECK(int64_t(n) * 32 * sp * 130 <= ch::attention_partials(32, 128, 1, 512));
            }
}

TEST_CASE("flash attention on the tensor cores, its mma fragments run on the host, matches cpu::attention",
          "[cuda-host]") {
    struct Shape {
        int n_heads, n_kv, hd;
    };
    cpu::ThreadPool pool(1);
    uint32_t seed = 51;
    // heads per block 1, 2, 4, 8 and an n_rep of 3 (one head per block); queries spanning two blocks, the diagonal
    // inside a tile and across tiles, rows past n in the last block; blocks of at most 16 rows (2 queries; 9 and 5
    // with one head a block, 5 with two), whose warps split each tile's positions (flash_warp_split), one warp's
    // quarter of a tile all past a row's position
    for (const Shape s : {Shape{2, 2, 128}, Shape{4, 2, 64}, Shape{8, 2, 128}, Shape{8, 1, 64}, Shape{6, 2, 64}}) {
        const Config c = test::attention_config(s.n_heads, s.n_kv, s.hd);
        const int n_ctx = 160;
        for (const auto& [pos0, n] :
             {std::pair{0, 2}, std::pair{0, 70}, std::pair{61, 9}, std::pair{130, 21}, std::pair{130, 5}})
            // the positions split among 2 or 4 blocks per query block (130 + 21: 3 tiles, so with 4 splits one block
            // has none and one split takes the diagonal), then combined
            for (const int splits : {0, 2, 4}) {
                if (s.n_heads >= 8 && n == 70) continue;  // many fibers, nothing new
                if (splits > 0 && (pos0 == 0 || (s.n_heads >= 8 && splits == 2))) continue;
                const auto [q, k, v, want] = test::attention_case(c, n_ctx, pos0, n, seed += 3, pool);
                INFO("heads " << s.n_heads << "/" << s.n_kv << " hd " << s.hd << " pos0 " << pos0 << " n " << n
                              << " splits " << splits);
                const std::vector<float> got = cuda::host::attention(c, q, k, v, pos0, n, n_ctx, splits, false, true);
                // the tiles copied in two stages and read by ldmatrix (the default) or loaded through registers and
                // transposed (--cuda-flash-pipeline off): the same fragments into the same products, the same bits
                const std::vector<float> sync = cuda::host::attention(c, q, k, v, pos0, n, n_ctx, splits, false, true,
                                                                      KvType::F16, KvType::F16, nullptr, false);
                REQUIRE(std::memcmp(sync.data(), got.data(), got.size() * sizeof(float)) == 0);
                // P is rounded to f16 for P V (2^-12 relative per weight); the scores keep f32 precision (Q in two
                // parts). Where the warps split the tiles' positions, also one warp over whole tiles
                // (--cuda-flash-warps rows): the same bounds.
                std::vector<const std::vector<float>*> outs{&got};
                std::vector<float> rows;
                if (cuda::host::flash_warp_split(n, s.n_heads / s.n_kv)) {
                    rows = cuda::host::attention(c, q, k, v, pos0, n, n_ctx, splits, false, true, KvType::F16,
                                                 KvType::F16, nullptr, true, false);
                    outs.push_back(&rows);
                }
                for (const std::vector<float>* o : outs) {
                    INFO((o == &got ? "as the backend runs it" : "--cuda-flash-warps rows"));
                    double err = 0, ref = 0;
                    for (size_t i = 0; i < o->size(); ++i) {
                        REQUIRE(std::isfinite((*o)[i]));
                        err += (double((*o)[i]) - want[i]) * (double((*o)[i]) - want[i]);
                        ref += double(want[i]) * want[i];
                    }
                    const double nrmse = std::sqrt(err / ref), worst = test::worst_diff(*o, want);
                    INFO("relative RMS error " << nrmse << ", worst |diff| " << worst << " of " << test::max_abs(want));
                    CHECK(nrmse < 3e-4);
                    CHECK(worst <= 2e-3 * test::max_abs(want));
                }
            }
    }
}

TEST_CASE("the wide decode attention reads a quantized row's values 8 at a time as kv_load does, bit for bit",
          "[cuda-host]") {
    // Rows one after another from a 4-byte but not 8-byte aligned start, as a cache's rows may lie (the host loads
    // throw on a misaligned 4-byte read): random quant bytes (both signs and both nibbles) and scales of either sign,
    // large, small and subnormal.
    std::mt19937 rng(77);
    for (const KvType t : {KvType::Q8_0, KvType::Q4_0})
        for (const int hd : {64, 128}) {
            INFO(kv_type_name(t) << " hd " << hd);
            const int rows = 7, rb = int(KvLayout::row_bytes(t, hd)), block = t == KvType::Q8_0 ? 34 : 18;
            REQUIRE(rb % 4 == 0);
            std::vector<uint8_t> buf(size_t(rows * rb) + 8);
            uint8_t* bytes = buf.data() + (reinterpret_cast<uintptr_t>(buf.data()) % 8 == 0 ? 4 : 0);
            REQUIRE(reinterpret_cast<uintptr_t>(bytes) % 8 == 4);
            for (int i = 0; i < rows * rb; ++i) bytes[i] = uint8_t(rng());
            const float scales[] = {0.031f, -2.5f, 6e-8f, 1000.0f, -0.0f, 1.0f / 127.0f, 7e-5f};
            for (int r = 0; r < rows; ++r)
                for (int b = 0; b < hd / 32; ++b) {
                    const uint16_t h = fp32_to_fp16(scales[(r + b) % 7] * float(1 + b));
                    std::memcpy(bytes + r * rb + b * block, &h, 2);
                }
            const std::vector<float> got = cuda::host::kv_block_values(t, bytes, rows, hd);
            const std::vector<float> want = cuda::host::kv_load_values(t, bytes, rows, hd);
            REQUIRE(got.size() == want.size());
            int differ = 0;
            for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
            CHECK(differ == 0);
            CHECK(test::max_abs(want) > 0.0f);
        }
}

TEST_CASE("a quantized CUDA cache: store_kv writes the CPU cache's bytes, attention reads them like cpu::attention",
          "[cuda-host]") {
    struct Types {
        KvType k, v;
    };
    cpu::ThreadPool pool(1);
    uint32_t seed = 91;
    auto randn = [&](size_t count, float sigma) { return test::randn(count, seed++, sigma); };
    for (const Types ty : {Types{KvType::Q8_0, KvType::Q8_0}, Types{KvType::Q4_0, KvType::Q4_0},
                           Types{KvType::Q8_0, KvType::Q4_0}, Types{KvType::F16, KvType::Q4_0},
                           Types{KvType::Q4_0, KvType::F16}}) {
        // (one query head a KV head: a 9-token prompt's flash blocks of 9 rows split each tile among their warps)
        for (const auto& [n_heads, n_kv, hd] :
             {std::tuple{4, 2, 64}, std::tuple{2, 1, 128}, std::tuple{8, 1, 64}, std::tuple{2, 2, 128}}) {
            const Config c = test::attention_config(n_heads, n_kv, hd);
            const int n_ctx = 150;
            const size_t row = size_t(n_kv) * size_t(hd);
            INFO(kv_types_name(ty.k, ty.v) << " heads " << n_heads << "/" << n_kv << " hd " << hd);
            REQUIRE(KvLayout::of(c, n_ctx, ty.k, ty.v).k_offsets() == kv_type_quantized(ty.k));
            // the bytes and the key offsets: equal to KvCache::write's, the rotation and the rounding included, the
            // positions written in steps as the backend's batches come (crossing kKvOffsetPositions inside a step, at
            // its first or its last row, or not at all)
            for (const std::vector<int>& steps :
                 std::vector<std::vector<int>>{{7}, {30}, {10, 20}, {15, 1, 4}, {16, 3}, {3, 13, 2}, {12, 4, 1}}) {
                int n = 0;
                for (int m : steps) n += m;
                std::vector<float> k = randn(size_t(n) * row, 1.0f), v = randn(size_t(n) * row, 1.0f);
                k[3] = 40.0f;  // an outlier channel, as keys have
                for (size_t j = 0; j < k.size(); ++j) k[j] += 0.5f * float(int(j % size_t(hd)) % 5 - 2);  // a bias
                KvCache cpu_kv(c, n_ctx, ty.k, ty.v);
                cuda::host::KvBytes gpu(cpu_kv.layout());
                int pos = 0;
                for (int m : steps) {
                    cpu_kv.write(0, pos, m, k.data() + size_t(pos) * row, v.data() + size_t(pos) * row);
                    cuda::host::store_step(gpu, 0, k.data() + size_t(pos) * row, v.data() + size_t(pos) * row, pos, m);
                    pos += m;
                }
                INFO("positions " << n << " in " << steps.size() << " steps");
                CHECK(kv_rows_differing(cpu_kv, gpu, 0, n) == 0);
                CHECK(offsets_differing(cpu_kv, gpu, 0) == 0);
                if (cpu_kv.layout().k_offsets() && n >= kKvOffsetPositions)
                    CHECK(test::max_abs(gpu.k_offsets) > 0.0f);  // set, so the rows past them are stored less them
            }
            // the kv_write path (a prompt-cache file, a context shift): two layers' rows copied in, their key offsets
            // set again from the rows, then a step stored past them
            for (const int n_loaded : {20, 16, 12}) {
                Config c2 = c;
                c2.n_layers = 2;
                INFO("kv_write of " << n_loaded << " positions");
                KvCache src(c2, n_ctx, ty.k, ty.v);
                for (int l = 0; l < 2; ++l) {
                    const std::vector<float> k = randn(size_t(n_loaded) * row, 2.0f);
                    const std::vector<float> v = randn(size_t(n_loaded) * row, 1.0f);
                    src.write(l, 0, n_loaded, k.data(), v.data());
                }
                const KvLayout& kv = src.layout();
                std::vector<uint8_t> kb(size_t(2 * n_kv * n_loaded) * size_t(kv.k_row_bytes()));
                std::vector<uint8_t> vb(size_t(2 * n_kv * n_loaded) * size_t(kv.v_row_bytes()));
                src.read(kb.data(), vb.data(), n_loaded);
                KvCache cpu_kv(c2, n_ctx, ty.k, ty.v);
                cpu_kv.write_rows(kb.data(), vb.data(), n_loaded);
                cuda::host::KvBytes gpu(kv);
                cuda::host::kv_write(gpu, kb.data(), vb.data(), n_loaded);
                for (int l = 0; l < 2; ++l) {
                    CHECK(kv_rows_differing(cpu_kv, gpu, l, n_loaded) == 0);
                    CHECK(offsets_differing(cpu_kv, gpu, l) == 0);
                    if (kv.k_offsets() && n_loaded >= kKvOffsetPositions) CHECK(offsets_differing(src, gpu, l) == 0);
                }
                const int m = 6;
                const std::vector<float> k = randn(size_t(m) * row, 2.0f), v = randn(size_t(m) * row, 1.0f);
                cpu_kv.write(1, n_loaded, m, k.data(), v.data());
                cuda::host::store_step(gpu, 1, k.data(), v.data(), n_loaded, m);
                CHECK(kv_rows_differing(cpu_kv, gpu, 1, n_loaded + m) == 0);
                CHECK(offsets_differing(cpu_kv, gpu, 1) == 0);
            }
            // attention: decode (folded combine) and flash attention (which every quantized prefill takes), over rows
            // stored as two steps (the positions before the queries', then theirs) and the key offsets they set
            for (const auto& [pos0, n] :
                 {std::pair{40, 1}, std::pair{16, 1}, std::pair{0, 9}, std::pair{10, 20}, std::pair{70, 66}}) {
                const auto [q, k, v, want] = test::attention_case(c, n_ctx, pos0, n, seed += 3, pool, ty.k, ty.v);
                const float scale = test::max_abs(want);
                INFO("pos0 " << pos0 << " n " << n);
                if (n == 1) {
                    const std::vector<float> got =
                        cuda::host::attention(c, q, k, v, pos0, n, n_ctx, 3, true, true, ty.k, ty.v);
                    CHECK(test::worst_diff(got, want) <= 2e-5f * scale);
                    continue;
                }
                // the tile's values as f16 high and low parts, P rounded to f16: within 3e-4 of the largest output
                // (measured: at most 1.5e-4, as for an f16 cache; with the values rounded to f16 alone, up to 6.7e-4)
                const std::vector<float> flash =
                    cuda::host::attention(c, q, k, v, pos0, n, n_ctx, 0, false, true, ty.k, ty.v);
                CHECK(test::worst_diff(flash, want) <= 3e-4f * scale);
                // --cuda-attention warp does not apply to a quantized cache: the same kernel runs
                CHECK(cuda::host::attention(c, q, k, v, pos0, n, n_ctx, 0, false, false, ty.k, ty.v) == flash);
            }
        }
    }
}

TEST_CASE("decode attention over a cache with a quantized half reads it wide and matches cpu::attention",
          "[cuda-host]") {
    // A cache with a half in blocks (K and V both, or one of them beside an f16 half) takes the wide kernel, 8
    // columns a lane, with 1 to 4 query heads a block (4 or 2 positions a subgroup in flight); 8 query heads a KV
    // head are two blocks of 4. Depths from the first key offsets to a full context, one split or three, the combine
    // folded or not.
    struct Types {
        KvType k, v;
    };
    cpu::ThreadPool pool(1);
    uint32_t seed = 301;
    for (const Types ty :
         {Types{KvType::Q8_0, KvType::Q8_0}, Types{KvType::Q4_0, KvType::Q4_0}, Types{KvType::Q4_0, KvType::Q8_0},
          Types{KvType::F16, KvType::Q8_0}, Types{KvType::Q4_0, KvType::F16}})
        for (const auto& [n_heads, n_kv, hd] :
             {std::tuple{2, 2, 128}, std::tuple{2, 2, 64}, std::tuple{2, 1, 128}, std::tuple{3, 1, 64},
              std::tuple{8, 2, 128}, std::tuple{16, 2, 64}, std::tuple{16, 2, 128}}) {
            const Config c = test::attention_config(n_heads, n_kv, hd);
            const int n_ctx = 100;
            CHECK(cuda::host::decode_reads_wide(c, ty.k, ty.v));
            for (const int pos0 : {17, 99}) {
                INFO(kv_types_name(ty.k, ty.v)
                     << " heads " << n_heads << "/" << n_kv << " hd " << hd << " pos0 " << pos0);
                const auto [q, k, v, want] = test::attention_case(c, n_ctx, pos0, 1, seed += 3, pool, ty.k, ty.v);
                const float scale = test::max_abs(want);
                for (const int splits : {1, 3}) {
                    INFO("splits " << splits);
                    const std::vector<float> got =
                        cuda::host::attention(c, q, k, v, pos0, 1, n_ctx, splits, true, true, ty.k, ty.v);
                    CHECK(test::worst_diff(got, want) <= 2e-5f * scale);
                    CHECK(cuda::host::attention(c, q, k, v, pos0, 1, n_ctx, splits, false, true, ty.k, ty.v) == got);
                }
            }
        }
}

TEST_CASE(
    "a query or an output turned by a warp per row equals kv_rotate_scaled bit for bit, its blocks quantize_act's",
    "[cuda-host]") {
    for (const int hd : {64, 128}) {
        INFO("hd " << hd);
        std::vector<float> x = test::randn(size_t(7 * hd), uint32_t(hd), 3.0f);
        x[5] = 1e30f;  // large and tiny values: the same sums, so the same roundings
        x[size_t(hd) + 1] = -1e-30f;
        std::vector<float> want = x;
        for (int r = 0; r < 7; ++r) kv_rotate_scaled(want.data() + size_t(r * hd), hd, hd);
        std::vector<cuda::host::HostActBlock> xq;
        const std::vector<float> got = cuda::host::rotate_rows(x, hd, &xq);
        REQUIRE(got.size() == want.size());
        int differ = 0;
        for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
        CHECK(differ == 0);
        // with the activation blocks of the turned rows: quantize_act's of them, each row's blocks in its place
        const std::vector<cuda::host::HostActBlock> want_q = cuda::host::quantize_act(want);
        REQUIRE(xq.size() == want_q.size());
        int blocks_differ = 0;
        for (size_t b = 0; b < xq.size(); ++b)
            blocks_differ += std::memcmp(&xq[b], &want_q[b], sizeof(cuda::host::HostActBlock)) != 0;
        CHECK(blocks_differ == 0);
        CHECK(cuda::host::rotate_rows(x, hd) == got);  // the same rows without them
    }
}

TEST_CASE("a query turned by RoPE and into a quantized K's basis by one warp a row: the bits of the two launches",
          "[cuda-host]") {
    // rope_store_kv over a quantized K: rope_item's pairs, then kv_rotate_rows, in one warp per row (full and partial
    // rotation, positions 0 and 3001, head_dim 64 and 128).
    for (const int hd : {64, 128})
        for (const int rope_dim : {hd, hd / 2})
            for (const int pos0 : {0, 3001}) {
                Config c = test::attention_config(6, 2, hd);
                c.rope_dim = rope_dim;
                const int n = 5;
                INFO("hd " << hd << " rope_dim " << rope_dim << " pos0 " << pos0);
                std::vector<float> q = test::randn(size_t(n * c.n_heads * hd), uint32_t(hd + pos0), 2.0f);
                q[7] = 50.0f;  // an outlier, as queries have
                const std::vector<float> want =
                    cuda::host::rotate_rows(cuda::host::rope(q, n, c.n_heads, pos0, c, {}), hd);
                const std::vector<float> got = cuda::host::rope_turn_q(q, n, c.n_heads, pos0, c);
                REQUIRE(got.size() == want.size());
                int differ = 0;
                for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
                CHECK(differ == 0);
            }
}

TEST_CASE("a quantized CUDA cache row whose values tie in magnitude, or are all zero, gets the CPU's bytes",
          "[cuda-host]") {
    // After the rotation a row with one nonzero value is +-1 everywhere: every value of every block ties for the
    // largest magnitude, and the warp's choice must be the loop's (the first). Two nonzero values give 0 and +-2.
    for (const int hd : {64, 128})
        for (const KvType t : {KvType::Q8_0, KvType::Q4_0}) {
            const Config c = test::attention_config(2, 1, hd);
            INFO(kv_type_name(t) << " hd " << hd);
            const int n = 9;
            std::vector<float> k(size_t(n * hd), 0.0f);
            const int one[][2] = {{-1, -1}, {0, -1}, {1, -1}, {5, -1}, {0, 1}, {2, 7}, {hd - 1, -1}, {3, hd / 2}};
            for (int i = 0; i < 8; ++i)
                for (int e : one[i])
                    if (e >= 0) k[size_t(i * hd + e)] = i % 3 == 1 ? -0.75f : 1.5f;
            for (int j = 0; j < hd; ++j) k[size_t(8 * hd + j)] = j % 2 == 0 ? 0.25f : -0.25f;
            KvCache cpu_kv(c, 16, t, t);
            cuda::host::KvBytes gpu(cpu_kv.layout());
            cpu_kv.write(0, 0, n, k.data(), k.data());
            cuda::host::store_step(gpu, 0, k.data(), k.data(), 0, n);
            CHECK(kv_rows_differing(cpu_kv, gpu, 0, n) == 0);
        }
}

TEST_CASE("the CUDA element-wise bodies, run on the host, match the CPU ops", "[cuda-host]") {
    // RMSNorm: one block of 256 threads per row (fibers), rows longer and shorter than the block
    for (int dim : {96, 896, 2049, 4160}) {
        const int n = 3;
        const std::vector<float> x = test::randn(size_t(n * dim), 5, 3.0f), w = test::randn(size_t(dim), 6, 1.0f);
        std::vector<float> want(x.size());
        cpu::rmsnorm(want.data(), x.data(), w.data(), n, dim, 1e-5f);
        INFO("dim " << dim);
        CHECK(test::worst_diff(cuda::host::rmsnorm(x, w, n, dim, 1e-5f), want) <= 1e-5f * 8.0f);
        if (dim % 32 == 0) {
            // The quantization folded into the norm: the same f32 rows, and the blocks quantize_act makes of them.
            const std::vector<float> both = cuda::host::rmsnorm_quantized(x, w, n, dim, 1e-5f);
            const std::vector<float> rows(both.begin(), both.begin() + n * dim);
            CHECK(rows == cuda::host::rmsnorm(x, w, n, dim, 1e-5f));
            const std::vector<cuda::host::HostActBlock> want_q = cuda::host::quantize_act(rows);
            REQUIRE(both.size() == rows.size() + want_q.size() * 36);
            for (size_t b = 0; b < want_q.size(); ++b) {
                const float* got = both.data() + rows.size() + b * 36;
                INFO("block " << b);
                CHECK(got[0] == want_q[b].d);
                CHECK(got[1] == float(want_q[b].s));
                CHECK(got[2] == float(want_q[b].h[0]));
                CHECK(got[3] == float(want_q[b].h[1]));
                for (int j = 0; j < 32; ++j) CHECK(got[4 + j] == float(want_q[b].q[j]));
            }
            // The order of the sum of squares is kNormThreads', whatever the block: blocks of 1, 3, 8 and 32 warps
            // (the device's) give the same bits, rows and blocks.
            for (int threads : {32, 96, 1024}) {
                INFO(threads << " threads");
                CHECK(cuda::host::rmsnorm_quantized(x, w, n, dim, 1e-5f, threads) == both);
            }
        }
        // The split folded into the norm (a short prompt's Q|K|V, gate and up): the same rows, and the halves
        // to_f16_split makes of them.
        for (int threads : {32, 256, 1024}) {
            INFO(threads << " threads, split");
            const std::vector<float> split = cuda::host::rmsnorm_split(x, w, n, dim, 1e-5f, threads);
            const std::vector<float> rows(split.begin(), split.begin() + n * dim);
            CHECK(rows == cuda::host::rmsnorm(x, w, n, dim, 1e-5f));
            CHECK(std::vector<float>(split.begin() + n * dim, split.end()) == cuda::host::split_halves(rows));
        }
    }
    // A split product's sums (f16_split_sum_item): as SwiGLU's up product, silu(gate) * up, the swiglu kernel's
    // bits, and the next product's split input, to_f16_split's halves of those values; with values past f16's range
    // (saturated as to_f16_split saturates them).
    {
        const int n = 5;
        const int64_t rows = 96;
        std::vector<float> t = test::randn(size_t(2 * n * rows), 31, 3.0f);
        t[7] = 9e4f;  // the high part's product far past 65504
        const std::vector<float> gate = test::randn(size_t(n * rows), 32, 2.0f);
        const std::vector<float> zeros(size_t(n * rows), 0.0f);
        const std::vector<float> up = cuda::host::f16_split_sum(t, n, rows, zeros, false, false, false);
        const std::vector<float> glu = cuda::host::f16_split_sum(t, n, rows, gate, false, true, true);
        std::vector<float> want = gate;
        cpu::swiglu(want.data(), up.data(), int64_t(want.size()));
        const std::vector<float> rows_got(glu.begin(), glu.begin() + n * rows);
        CHECK(rows_got == want);
        CHECK(std::vector<float>(glu.begin() + n * rows, glu.end()) == cuda::host::split_halves(want));
        // a plain (accumulating) sum with the split: the split of what it wrote
        const std::vector<float> acc = cuda::host::f16_split_sum(t, n, rows, gate, true, false, true);
        const std::vector<float> acc_rows(acc.begin(), acc.begin() + n * rows);
        CHECK(acc_rows == cuda::host::f16_split_sum(t, n, rows, gate, true, false, false));
        CHECK(std::vector<float>(acc.begin() + n * rows, acc.end()) == cuda::host::split_halves(acc_rows));
    }
    // RoPE (plain, linear scaling, frequency factors with a partial rotation) and the rotated K store
    for (int variant = 0; variant < 3; ++variant) {
        Config c = test::attention_config(6, 2, 64);
        c.rope_base = 500000.0f;
        std::vector<float> ff;
        if (variant == 1) {
            c.rope_scaling = RopeScaling::Linear;
            c.rope_scale = 4.0f;
        }
        if (variant == 2) {
            c.rope_dim = 32;
            ff = test::randn(size_t(c.rope_dim / 2), 7, 1.0f);
            for (float& f : ff) f = 1.0f + std::fabs(f) * 4.0f;
        }
        for (int pos0 : {0, 3001}) {
            INFO("variant " << variant << " pos0 " << pos0);
            const int n = 4, half = c.rope_dim / 2;
            std::vector<float> cs(size_t(n * half)), sn(size_t(n * half));
            cpu::rope_tables(cs.data(), sn.data(), pos0, n, RopeFreqs::of(c, ff));
            const std::vector<float> q = test::randn(size_t(n * c.n_heads * c.head_dim), 8, 1.0f);
            std::vector<float> want = q;
            cpu::rope(want.data(), cs.data(), sn.data(), n, c.n_heads, c);
            CHECK(test::worst_diff(cuda::host::rope(q, n, c.n_heads, pos0, c, ff), want) <= 1e-5f);
            if (variant != 2) {
                const std::vector<float> k = test::randn(size_t(n * c.n_kv_heads * c.head_dim), 9, 1.0f);
                std::vector<float> wk = k;
                cpu::rope(wk.data(), cs.data(), sn.data(), n, c.n_kv_heads, c);
                for (float& v : wk) v = fp16_to_fp32(fp32_to_fp16(v));
                CHECK(test::worst_diff(cuda::host::store_k(c, k, pos0, n, 4096), wk) <= 4e-3f);
            }
        }
    }
}

TEST_CASE("the CUDA embedding lookup body, run on the host, decodes the requested rows", "[cuda-host]") {
    for (const char* name : {"F16", "Q4_0", "Q5_1", "Q3_K", "Q4_K", "Q6_K"}) {
        INFO(name);
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        const int64_t rows = 40, cols = 512, rb = ggml_row_bytes(*ggml_type_info(t), cols);
        std::vector<uint8_t> b(size_t(rows * rb));
        synth_random_rows(t, b.data(), rows, cols, 0.05f, 4);
        const std::vector<int32_t> ids = {0, 39, 7, 7, 23};
        std::vector<float> want(ids.size() * size_t(cols));
        for (size_t i = 0; i < ids.size(); ++i)
            dequantize_row(t, b.data() + ids[i] * rb, want.data() + i * size_t(cols), cols);
        CHECK(test::worst_diff(cuda::host::get_rows(t, b.data(), rows, cols, ids), want) <= 1e-6f);
    }
}
