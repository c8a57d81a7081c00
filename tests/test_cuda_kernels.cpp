// [cuda] Every CUDA kernel against its CPU twin, on fresh random inputs with poisoned (NaN) outputs, so a wrong
// index or an element left unwritten fails.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>

#include "attention_case.h"
#include "common/half.h"
#include "cpu/ops.h"
#include "cpu/thread_pool.h"
#include "cpu/vecdot.h"
#include "cuda_test_util.h"
#include "engine/kv_cache.h"
#include "kv_bytes_compare.h"
#include "model/dequant.h"
#include "synth/synth.h"
#include "tensor_core_device.h"
#include "testing.h"

#include "device.h"
#include "memory_plan.h"

using namespace kvgen;
using test::kv_rows_differing;
using test::offsets_differing;
namespace ct = kvgen::cuda::testing;
using test::max_abs;
using test::randn;

namespace {

const char* const kTypes[] = {"F32",  "F16",  "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                              "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"};

std::vector<uint8_t> random_weights(GgmlType t, int64_t rows, int64_t cols, uint64_t seed) {
    const GgmlTypeInfo* info = ggml_type_info(t);
    std::vector<uint8_t> b(size_t(rows * ggml_row_bytes(*info, cols)));
    synth_random_rows(t, b.data(), rows, cols, 0.05f, seed);
    return b;
}

// The type called name, in *t; false where rows of cols weights are not whole blocks of it.
bool whole_blocks(const char* name, int64_t cols, GgmlType* t) {
    REQUIRE(ggml_type_from_name(name, t));
    return cols % ggml_type_info(*t)->block_size == 0;
}

// Every element within tol (absolute); NaN never passes.
void require_close(const std::vector<float>& got, const std::vector<float>& want, double tol) {
    REQUIRE(got.size() == want.size());
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double d = std::fabs(double(got[i]) - double(want[i]));
        if (!(d <= worst)) {  // NaN lands here too
            worst = std::isnan(d) ? INFINITY : d;
            at = i;
        }
    }
    INFO("worst |diff| " << worst << " at " << at << " (got " << got[at] << ", want " << want[at] << "), tol " << tol);
    REQUIRE(worst <= tol);
}

}  // namespace

TEST_CASE("device dequantization equals dequantize_row for every type", "[cuda][kernels]") {
    for (const char* name : kTypes) {
        INFO(name);
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        const int64_t rows = 5, cols = 768;
        const std::vector<uint8_t> b = random_weights(t, rows, cols, 7);
        std::vector<float> want(size_t(rows * cols));
        dequantize_row(t, b.data(), want.data(), rows * cols);
        const ct::HostWeight w{t, rows, cols, &b};
        // note: nvcc may fuse d * q - m into one FMA where the CPU rounds twice: a few ulps.
        require_close(ct::dequantize(w, false), want, 1e-6 * max_abs(want));
        std::vector<float> want16(want.size());
        for (size_t i = 0; i < want.size(); ++i) want16[i] = fp16_to_fp32(fp32_to_fp16(want[i]));
        require_close(ct::dequantize(w, true), want16, 1e-3 * max_abs(want));
    }
}

TEST_CASE("embedding lookup decodes the requested rows", "[cuda][kernels]") {
    for (const char* name : kTypes) {
        INFO(name);
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        const int64_t rows = 50, cols = 512;
        const std::vector<uint8_t> b = random_weights(t, rows, cols, 11);
        const std::vector<int32_t> ids = {0, 49, 7, 7, 23};
        std::vector<float> want(ids.size() * size_t(cols));
        const int64_t rb = int64_t(b.size()) / rows;
        for (size_t i = 0; i < ids.size(); ++i)
            dequantize_row(t, b.data() + ids[i] * rb, want.data() + i * size_t(cols), cols);
        require_close(ct::get_rows({t, rows, cols, &b}, ids), want, 1e-6 * max_abs(want));
    }
}

TEST_CASE("float rows that are not whole 32-weight chunks decode, look up and multiply", "[cuda][kernels]") {
    for (const char* name : {"F32", "F16", "BF16"}) {
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        for (int64_t cols : {8, 40}) {
            INFO(name << " cols " << cols);
            const int64_t rows = 9;
            const std::vector<uint8_t> b = random_weights(t, rows, cols, 5);
            std::vector<float> want(size_t(rows * cols));
            dequantize_row(t, b.data(), want.data(), rows * cols);
            const ct::HostWeight w{t, rows, cols, &b};
            require_close(ct::dequantize(w, false), want, 0.0);
            const std::vector<int32_t> ids = {8, 0, 3};
            std::vector<float> want_rows;
            for (int32_t id : ids)
                want_rows.insert(want_rows.end(), want.begin() + id * cols, want.begin() + (id + 1) * cols);
            require_close(ct::get_rows(w, ids), want_rows, 0.0);
            const std::vector<float> x = randn(size_t(3 * cols), 3);
            std::vector<float> y(size_t(3 * rows));
            double mag = 0;
            for (int i = 0; i < 3; ++i)
                for (int64_t r = 0; r < rows; ++r) {
                    double s = 0;
                    for (int64_t j = 0; j < cols; ++j) {
                        s += double(want[size_t(r * cols + j)]) * x[size_t(i * cols + j)];
                        mag = std::max(mag, std::fabs(double(want[size_t(r * cols + j)]) * x[size_t(i * cols + j)]));
                    }
                    y[size_t(i * rows + r)] = float(s);
                }
            const std::vector<float> x1(x.begin(), x.begin() + cols), y1(y.begin(), y.begin() + rows);
            require_close(ct::matvec(w, x1, nullptr), y1, 1e-5 * mag * double(cols));
            require_close(ct::gemm(w, x, 3, nullptr), y, 2e-3 * mag * double(cols));  // f16 operands
        }
    }
}

TEST_CASE("decode matvec and prefill GEMM match a double-precision product for every type", "[cuda][kernels]") {
    for (const char* name : kTypes) {
        INFO(name);
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        const int64_t rows = 37, cols = 1280;  // rows not a multiple of the rows per block; 5 k-quant blocks
        const std::vector<uint8_t> b = random_weights(t, rows, cols, 13);
        std::vector<float> wf(size_t(rows * cols));
        dequantize_row(t, b.data(), wf.data(), rows * cols);
        const int n = 5;
        const std::vector<float> x = randn(size_t(n * cols), 17);
        const std::vector<float> y0 = randn(size_t(n * rows), 19);
        const ct::HostWeight w{t, rows, cols, &b};

        // matvec: one token, plain and accumulating
        std::vector<float> want(static_cast<size_t>(rows)), want_acc(static_cast<size_t>(rows));
        double mag = 0;
        for (int64_t r = 0; r < rows; ++r) {
            double s = 0;
            for (int64_t j = 0; j < cols; ++j) {
                s += double(wf[size_t(r * cols + j)]) * x[size_t(j)];
                mag = std::max(mag, std::fabs(double(wf[size_t(r * cols + j)]) * x[size_t(j)]));
            }
            want[size_t(r)] = float(s);
            want_acc[size_t(r)] = float(s + y0[size_t(r)]);
        }
        const std::vector<float> x1(x.begin(), x.begin() + cols);
        const std::vector<float> y1(y0.begin(), y0.begin() + rows);  // first token's rows
        require_close(ct::matvec(w, x1, nullptr), want, 1e-5 * mag * double(cols) / 32);
        require_close(ct::matvec(w, x1, &y1), want_acc, 1e-5 * mag * double(cols) / 32);
        // the short-prompt kernel: n tokens, each weight read once, plain and accumulating
        {
            std::vector<float> want_b(size_t(n * rows)), want_b_acc(size_t(n * rows));
            for (int i = 0; i < n; ++i)
                for (int64_t r = 0; r < rows; ++r) {
                    double s = 0;
                    for (int64_t j = 0; j < cols; ++j) s += double(wf[size_t(r * cols + j)]) * x[size_t(i * cols + j)];
                    want_b[size_t(i * rows + r)] = float(s);
                    want_b_acc[size_t(i * rows + r)] = float(s + y0[size_t(i * rows + r)]);
                }
            require_close(ct::matvec_batch(w, x, n, nullptr), want_b, 1e-5 * mag * double(cols) / 32);
            require_close(ct::matvec_batch(w, x, n, &y0), want_b_acc, 1e-5 * mag * double(cols) / 32);
            if (t == GgmlType::F16) {  // on split activations (cuBLAS), as exact; also into two buffers, as Q|K|V
                require_close(ct::f16_split(w, x, n, nullptr, rows, 0), want_b, 1e-5 * mag * double(cols) / 32);
                require_close(ct::f16_split(w, x, n, &y0, rows / 3, (rows - rows / 3) / 2), want_b_acc,
                              1e-5 * mag * double(cols) / 32);
            }
        }
        if (t == GgmlType::Q4_0 || t == GgmlType::Q8_0 || t == GgmlType::Q4_K || t == GgmlType::Q6_K) {
            // the integer product on 16-bit activations: within their rounding of the exact product
            double mag_sum = 0;
            for (int64_t r = 0; r < rows; ++r) {
                double m = 0;
                for (int64_t j = 0; j < cols; ++j) m += std::fabs(double(wf[size_t(r * cols + j)]) * x[size_t(j)]);
                mag_sum = std::max(mag_sum, m);
            }
            require_close(ct::matvec_int(w, x1), want, 1e-4 * mag_sum);
        }
        if (rows >= 3) {  // the same product spread over three buffers, as a fused Q|K|V fills q, k and v
            const int64_t q_rows = rows / 3, k_rows = (rows - q_rows) / 2;
            require_close(ct::matvec_qkv(w, x1, q_rows, k_rows), want, 1e-5 * mag * double(cols) / 32);
        }

        // the fused SwiGLU pair: this weight as gate, another of its type as up
        const std::vector<uint8_t> b_up = random_weights(t, rows, cols, 14);
        std::vector<float> uf(size_t(rows * cols));
        dequantize_row(t, b_up.data(), uf.data(), rows * cols);
        std::vector<float> g(want), u(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) {
            double s = 0;
            for (int64_t j = 0; j < cols; ++j) s += double(uf[size_t(r * cols + j)]) * x[size_t(j)];
            u[size_t(r)] = float(s);
        }
        cpu::swiglu(g.data(), u.data(), rows);
        require_close(ct::matvec_glu(w, {t, rows, cols, &b_up}, x1), g, 1e-5 * mag * double(cols) / 32 * 4);
        if (t == GgmlType::Q4_0 || t == GgmlType::Q8_0 || t == GgmlType::Q4_K || t == GgmlType::Q6_K)
            require_close(ct::matvec_glu_int(w, {t, rows, cols, &b_up}, x1), g, 1e-4 * mag * double(cols) * 4);

        // GEMM: the same product of the f16-rounded operands, f32 accumulation
        std::vector<float> want_g(size_t(n * rows));
        for (int i = 0; i < n; ++i)
            for (int64_t r = 0; r < rows; ++r) {
                double s = y0[size_t(i * rows + r)];
                for (int64_t j = 0; j < cols; ++j)
                    s += double(fp16_to_fp32(fp32_to_fp16(wf[size_t(r * cols + j)]))) *
                         fp16_to_fp32(fp32_to_fp16(x[size_t(i * cols + j)]));
                want_g[size_t(i * rows + r)] = float(s);
            }
        require_close(ct::gemm(w, x, n, &y0), want_g, 1e-5 * mag * double(cols) / 32);
        if (t != GgmlType::F16 && cuda::split_prompt_type(t)) {
            // a short prompt's product on split activations through the weight-tile kernel: the f16-rounded weights
            // with the activations to about 2^-22 (the columns split 2 ways for 132 SMs, and not)
            std::vector<float> want_s(size_t(n * rows));
            for (int i = 0; i < n; ++i)
                for (int64_t r = 0; r < rows; ++r) {
                    double s = y0[size_t(i * rows + r)];
                    for (int64_t j = 0; j < cols; ++j)
                        s += double(fp16_to_fp32(fp32_to_fp16(wf[size_t(r * cols + j)]))) * x[size_t(i * cols + j)];
                    want_s[size_t(i * rows + r)] = float(s);
                }
            require_close(ct::f16_split_tiled(w, x, n, &y0, 132), want_s, 1e-5 * mag * double(cols) / 32);
            require_close(ct::f16_split_tiled(w, x, n, &y0, 1), want_s, 1e-5 * mag * double(cols) / 32);
        }
        require_close(ct::gemm(w, x, n, &y0, true), want_g, 1e-5 * mag * double(cols) / 32);  // --cuda-gemm mma
    }
}

TEST_CASE("the integer decode products on blocks of 3 to 8 warps and of several passes", "[cuda][kernels]") {
    // 2816 columns: 3 warps, the last partly idle; 4096: 4; 13824: 7 x 2 passes; 16384: 8 x 2; 16416: 6 x 3; 20480:
    // 7 x 3 (mvi_warps). Gate and up of SwiGLU: 2 rows each per block.
    for (const char* name : {"Q4_0", "Q4_K", "Q5_K", "Q6_K"})
        for (const int64_t cols : {2816, 4096, 13824, 16384, 16416, 20480}) {
            GgmlType t;
            if (!whole_blocks(name, cols, &t)) continue;
            INFO(name << " cols " << cols);
            const int64_t rows = 9;
            const std::vector<uint8_t> b = random_weights(t, rows, cols, 23), b_up = random_weights(t, rows, cols, 29);
            std::vector<float> wf(size_t(rows * cols)), uf(size_t(rows * cols));
            dequantize_row(t, b.data(), wf.data(), rows * cols);
            dequantize_row(t, b_up.data(), uf.data(), rows * cols);
            const std::vector<float> x = randn(size_t(cols), 31);
            std::vector<float> want(static_cast<size_t>(rows)), up(static_cast<size_t>(rows));
            double mag = 0;
            for (int64_t r = 0; r < rows; ++r) {  // mag: the largest sum of a row's products' magnitudes
                double s = 0, su = 0, m = 0, mu = 0;
                for (int64_t j = 0; j < cols; ++j) {
                    s += double(wf[size_t(r * cols + j)]) * x[size_t(j)];
                    su += double(uf[size_t(r * cols + j)]) * x[size_t(j)];
                    m += std::fabs(double(wf[size_t(r * cols + j)]) * x[size_t(j)]);
                    mu += std::fabs(double(uf[size_t(r * cols + j)]) * x[size_t(j)]);
                }
                want[size_t(r)] = float(s);
                up[size_t(r)] = float(su);
                mag = std::max({mag, m, mu});
            }
            const ct::HostWeight w{t, rows, cols, &b}, wu{t, rows, cols, &b_up};
            const std::vector<float> y = ct::matvec_int(w, x);
            require_close(y, want, 1e-4 * mag);
            // every multiply-add of the sums is written out (unit_dot), so the device's are the host emulation's
            CHECK(y == kvgen::cuda::host::matvec_int(t, b.data(), rows, cols, x));
            if (t == GgmlType::Q4_0) {  // and in steps of one unit (--cuda-matvec-unit 32): its own bits
                const std::vector<float> one = ct::matvec_int(w, x, 1, 0, false, false);
                CHECK(one == kvgen::cuda::host::matvec_int(t, b.data(), rows, cols, x, 1, false));
                require_close(one, y, 1e-5 * mag);  // the same unit dots, added in another order
                const std::vector<float> x4 = randn(size_t(4 * cols), 37);  // 4 tokens, one launch
                CHECK(ct::matvec_int(w, x4, 4, 0, false, false) ==
                      kvgen::cuda::host::matvec_int(t, b.data(), rows, cols, x4, 4, false));
                // (SwiGLU's silu goes through expf, the device's within 2 ulp of the host library's: against the
                // device's steps of two units, within what the sums' rounding moves silu(g) u, as above)
                const std::vector<float> gs = ct::matvec_int(w, x4, 4), us = ct::matvec_int(wu, x4, 4);
                require_close(ct::matvec_glu_int(w, wu, x4, 4, 0, false, false), ct::matvec_glu_int(w, wu, x4, 4),
                              1e-5 * mag * 2 * (max_abs(us) + max_abs(gs)));
            }
            // silu(g) u moves by at most 1.1 |u| dg + |g| du
            std::vector<float> g = want;
            cpu::swiglu(g.data(), up.data(), rows);
            require_close(ct::matvec_glu_int(w, wu, x), g, 1e-4 * mag * 2 * (max_abs(up) + max_abs(want)));
        }
}

TEST_CASE(
    "F16 and BF16 decode products by blocks of warps: the host emulation's bits, the warp kernel's within "
    "rounding",
    "[cuda][kernels]") {
    // 4096 columns: 4 warps; 11008: 6 x 2 passes; 13824: 7 x 2. 4099 rows: the last block past the matrix.
    for (const GgmlType t : {GgmlType::F16, GgmlType::BF16})
        for (const int64_t cols : {4096, 11008, 13824}) {
            INFO(ggml_type_name(t) << " cols " << cols);
            const int64_t rows = 4099;
            const std::vector<uint8_t> b = random_weights(t, rows, cols, 71), b_up = random_weights(t, rows, cols, 72);
            const ct::HostWeight w{t, rows, cols, &b}, wu{t, rows, cols, &b_up};
            const std::vector<float> x = randn(size_t(cols), 73), y0 = randn(size_t(rows), 74);
            const std::vector<float> y = ct::matvec(w, x, nullptr);
            CHECK(y == kvgen::cuda::host::matvec_f16(t, b.data(), rows, cols, x));
            const std::vector<float> warp = ct::matvec(w, x, nullptr, false);
            require_close(y, warp, 1e-5 * max_abs(warp));
            // accumulate onto y0: y0 + y, one rounding
            const std::vector<float> acc = ct::matvec(w, x, &y0);
            for (size_t r = 0; r < acc.size(); ++r) REQUIRE(acc[r] == y0[r] + y[r]);
            // gate and up in one block: each row's sum the bits of its product alone (the same threads' shares and
            // order), then the swiglu kernel's arithmetic
            const std::vector<float> g = ct::matvec_glu(w, wu, x);
            CHECK(g == ct::swiglu(y, ct::matvec(wu, x, nullptr)));
            require_close(g, ct::matvec_glu(w, wu, x, false), 1e-5 * max_abs(g));
            // through rings of shared memory (--cuda-matvec-stages; 1025 groups of 4 rows, several a block): the bits
            for (const int stages : {2, 3, 4}) {
                INFO("stages " << stages);
                CHECK(ct::matvec(w, x, nullptr, true, stages) == y);
                CHECK(ct::matvec(w, x, &y0, true, stages) == acc);
                CHECK(ct::matvec_glu(w, wu, x, true, stages) == g);
            }
        }
}

TEST_CASE("a ring launch's carveout with --cuda-ring-carveout fit goes into the graph captured from it",
          "[cuda][kernels]") {
    // One token's Q4_K product over 4096 x 4096 through rings of 3 stages (5 blocks of 36 KiB an H100 or H200 SM at all
    // of the shared memory, 82-84% with fit); with max the launch says nothing and the kernel's own attribute holds.
    if (!test::sm80_device("rings of shared memory")) return;
    const int64_t n = 4096;
    const std::vector<uint8_t> b = random_weights(GgmlType::Q4_K, n, n, 91);
    const ct::HostWeight w{GgmlType::Q4_K, n, n, &b};
    const int fit = ct::ring_node_carveout(w, 3, true);
    if (fit < 0) {
        WARN("SKIPPED: this build or driver has no launch carveout (CUDA 12.6 and later)");
        return;
    }
    CHECK(fit > 0);
    CHECK(fit < 100);
    CHECK(ct::ring_node_carveout(w, 3, false) != fit);
}

TEST_CASE("the integer products of a short prompt: each token the same bits as its product alone", "[cuda][kernels]") {
    // 2 to 16 tokens in launches of up to 8 (the second launch writes from token 8 on); 37 rows (the last block has
    // rows past the matrix); 1280 columns: 2 warps, 11008: 6 x 2 passes. The products are also the host emulation's
    // bits, so the CPU-only tests' checks of the emulation hold for the device.
    const int n_max = 16;
    for (const char* name : {"Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})
        for (const int64_t cols : {1280, 11008}) {
            GgmlType t;
            if (!whole_blocks(name, cols, &t)) continue;
            INFO(name << " cols " << cols);
            const int64_t rows = 37;
            const std::vector<uint8_t> b = random_weights(t, rows, cols, 43), b_up = random_weights(t, rows, cols, 47);
            const ct::HostWeight w{t, rows, cols, &b}, wu{t, rows, cols, &b_up};
            const std::vector<float> x = randn(size_t(n_max * cols), 53);
            std::vector<float> alone, glu_alone;
            for (int i = 0; i < n_max; ++i) {
                const std::vector<float> xi(x.begin() + i * cols, x.begin() + (i + 1) * cols);
                const std::vector<float> y = ct::matvec_int(w, xi), g = ct::matvec_glu_int(w, wu, xi);
                alone.insert(alone.end(), y.begin(), y.end());
                glu_alone.insert(glu_alone.end(), g.begin(), g.end());
            }
            for (const int n : {2, 4, 5, 8, 9, 13, 16}) {
                INFO(n << " tokens");
                const std::vector<float> xn(x.begin(), x.begin() + n * cols);
                const std::vector<float> y = ct::matvec_int(w, xn, n);
                CHECK(y == std::vector<float>(alone.begin(), alone.begin() + n * rows));
                CHECK(y == kvgen::cuda::host::matvec_int(t, b.data(), rows, cols, xn, n));
                CHECK(ct::matvec_glu_int(w, wu, xn, n) ==
                      std::vector<float>(glu_alone.begin(), glu_alone.begin() + n * rows));
            }
        }
}

TEST_CASE("the integer products of a short prompt on the tensor cores: the host emulation's bits", "[cuda][kernels]") {
    // --cuda-matvec-mma on (sm_80 and later): 2 to 64 tokens in one launch (groups of up to 16, Q6_K 8, the grid's x,
    // and with several groups two sets of 32 rows a block; 17 a last group of one, 40 of 8), the same bits as
    // the host emulation of the kernel's body (whose CPU-only tests check the fragments' integer sums against the
    // CUDA-core products'), so this checks the m16n8k32 fragment layout on the device; and within f32 rounding of the
    // CUDA-core products. 37 rows (blocks with rows past the matrix); 1280 columns (40 units: warps 0-1 two turns of 4,
    // the others one), 1312 (41: a turn that ends past the row; not Q4_K and Q6_K, whose rows are whole super-blocks),
    // 11008 (344: two warps a turn fewer).
    if (!test::sm80_device()) return;
    for (const char* name : {"Q4_0", "Q8_0", "Q4_K", "Q6_K"})
        for (const int64_t cols : {1280, 1312, 11008}) {
            GgmlType t;
            if (!whole_blocks(name, cols, &t)) continue;
            const int64_t rows = 37;
            const std::vector<uint8_t> b = random_weights(t, rows, cols, 61), b_up = random_weights(t, rows, cols, 67);
            const ct::HostWeight w{t, rows, cols, &b}, wu{t, rows, cols, &b_up};
            for (const int n : {2, 5, 8, 9, 16, 17, 40, 64}) {
                if (n > 16 && cols > 1312) continue;  // (the host emulation's time)
                INFO(name << " cols " << cols << ", " << n << " tokens");
                const std::vector<float> x = randn(size_t(n * cols), 71 + n);
                const std::vector<float> y = ct::matvec_int(w, x, n, 0, true);
                const std::vector<float> g = ct::matvec_glu_int(w, wu, x, n, 0, true);
                CHECK(y == kvgen::cuda::host::matvec_int_mma(t, b.data(), nullptr, rows, cols, x, n));
                // the up product's sums bit for bit too; SwiGLU's silu goes through expf, which the device computes
                // within 2 ulp and the host's library more closely, so its outputs within a few ulp
                CHECK(ct::matvec_int(wu, x, n, 0, true) ==
                      kvgen::cuda::host::matvec_int_mma(t, b_up.data(), nullptr, rows, cols, x, n));
                const std::vector<float> g_host =
                    kvgen::cuda::host::matvec_int_mma(t, b.data(), b_up.data(), rows, cols, x, n);
                require_close(g, g_host, 1e-6 * max_abs(g_host));
                // the CUDA-core products, 16 tokens at a time (their most)
                std::vector<float> y_ref, g_ref;
                for (int i0 = 0; i0 < n; i0 += 16) {
                    const int m = std::min(16, n - i0);
                    const std::vector<float> xm(x.begin() + i0 * cols, x.begin() + (i0 + m) * cols);
                    const std::vector<float> ym = ct::matvec_int(w, xm, m), gm = ct::matvec_glu_int(w, wu, xm, m);
                    y_ref.insert(y_ref.end(), ym.begin(), ym.end());
                    g_ref.insert(g_ref.end(), gm.begin(), gm.end());
                }
                require_close(y, y_ref, 2e-6 * max_abs(y_ref));
                require_close(g, g_ref, 2e-6 * max_abs(g_ref));
            }
        }
}

TEST_CASE("the integer SwiGLU product quantizes its output for the down projection", "[cuda][kernels]") {
    // 96 rows: three groups of 32, each quantized by its last block (ct::matvec_glu_int checks the blocks against
    // quantize_act of the output, and the counters)
    const int64_t rows = 96, cols = 4096;
    const std::vector<float> x = test::randn(size_t(cols), 23, 1.0f);
    for (const char* name : {"Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"}) {
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        INFO(name);
        const std::vector<uint8_t> b = random_weights(t, rows, cols, 25), b_up = random_weights(t, rows, cols, 26);
        std::vector<float> y;
        REQUIRE_NOTHROW(y = ct::matvec_glu_int({t, rows, cols, &b}, {t, rows, cols, &b_up}, x));
        CHECK(y.size() == size_t(rows));
    }
}

TEST_CASE("the tensor cores' SwiGLU product quantizes its output for the down projection", "[cuda][kernels]") {
    // --cuda-matvec-mma on: 96 rows, 2 to 64 tokens in one launch (one group of tokens: blocks of 16 rows, two a
    // 32-row group; several: blocks of 32, each group of tokens on its own counters; Q6_K up to 8 groups of 8);
    // ct::matvec_glu_int checks the blocks against quantize_act of the output and the counters after two launches.
    if (!test::sm80_device()) return;
    const int64_t rows = 96, cols = 1280;
    for (const char* name : {"Q4_0", "Q8_0", "Q4_K", "Q6_K"}) {
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        const std::vector<uint8_t> b = random_weights(t, rows, cols, 27), b_up = random_weights(t, rows, cols, 28);
        for (const int n : {2, 9, 17, 40, 64}) {
            INFO(name << ", " << n << " tokens");
            const std::vector<float> x = test::randn(size_t(n * cols), 29 + n, 1.0f);
            std::vector<float> y;
            REQUIRE_NOTHROW(y = ct::matvec_glu_int({t, rows, cols, &b}, {t, rows, cols, &b_up}, x, n, 0, true));
            // (SwiGLU's expf: the device's within a few ulp of the host's, as in the case above)
            const std::vector<float> g_host =
                kvgen::cuda::host::matvec_int_mma(t, b.data(), b_up.data(), rows, cols, x, n);
            require_close(y, g_host, 1e-6 * max_abs(g_host));
        }
    }
}

TEST_CASE("the integer products through rings of shared memory: the register path's bits, many row groups a block",
          "[cuda][kernels]") {
    // 8192 rows: 2048 groups of 4 (4096 of 2 of each of gate and up), several a block of a grid of as many blocks as
    // the SMs hold; 4096 columns (4 warps, a step a thread) and 11008 (6 warps x 2 passes: two steps for most
    // threads); one token, with the SwiGLU product's quantized output (its counters) and the folded norm (its
    // counters, the last group's scaling), and 5 tokens. On a device without cp.async (sm_75) the copies are loads
    // and stores: the same bits still.
    const int64_t rows = 8192;
    for (const char* name : {"Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})
        for (const int64_t cols : {4096, 11008}) {
            GgmlType t;
            if (!whole_blocks(name, cols, &t)) continue;
            const std::vector<uint8_t> b = random_weights(t, rows, cols, 81), b_up = random_weights(t, rows, cols, 82);
            const ct::HostWeight w{t, rows, cols, &b}, wu{t, rows, cols, &b_up};
            for (const int n : {1, 5}) {
                const std::vector<float> x = randn(size_t(n * cols), 83 + n);
                const std::vector<float> y = ct::matvec_int(w, x, n), g = ct::matvec_glu_int(w, wu, x, n);
                for (const int stages : {2, 3, 4}) {
                    INFO(name << " cols " << cols << " tokens " << n << " stages " << stages);
                    CHECK(ct::matvec_int(w, x, n, stages) == y);
                    CHECK(ct::matvec_glu_int(w, wu, x, n, stages) == g);  // (one token: and its quantized output)
                }
            }
            const std::vector<float> x = randn(size_t(cols), 85), residual = randn(size_t(rows), 86),
                                     norm_w = randn(size_t(rows), 87);
            const std::vector<float> folded = ct::matvec_int_residual_norm(w, x, residual, norm_w, 1e-5f, false);
            INFO(name << " cols " << cols << ", the norm folded in");
            CHECK(ct::matvec_int_residual_norm(w, x, residual, norm_w, 1e-5f, false, 3) == folded);
        }
}

TEST_CASE("a residual product folds the next RMSNorm in: the host emulation's bits, counters left at zero",
          "[cuda][kernels]") {
    // 4096 rows (128 groups of 32) and 5120 (160): a 7B and a 13B residual; 4 and 8 rows a block. The host emulation
    // (whose blocks the CPU-only tests hold against rmsnorm's quantization) gives the same bits, whatever the order
    // in which the device's blocks finish.
    const int64_t cols = 1024;
    const std::vector<float> x = test::randn(size_t(cols), 61, 1.0f);
    for (const char* name : {"Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})
        for (const int64_t rows : {4096, 5120})
            for (const bool wide : {false, true}) {
                GgmlType t;
                REQUIRE(ggml_type_from_name(name, &t));
                INFO(name << " rows " << rows << (wide ? ", 8 rows a block" : ""));
                const std::vector<uint8_t> b = random_weights(t, rows, cols, 62);
                const std::vector<float> residual = test::randn(size_t(rows), 63, 4.0f);
                const std::vector<float> norm_w = test::randn(size_t(rows), 64, 1.0f);
                const std::vector<float> got =
                    ct::matvec_int_residual_norm({t, rows, cols, &b}, x, residual, norm_w, 1e-5f, wide);
                const size_t groups = size_t(rows / 32);
                REQUIRE(got.size() == size_t(rows) + groups * 36 + groups + 1);
                for (size_t k = 0; k <= groups; ++k) CHECK(got[size_t(rows) + groups * 36 + k] == 0.0f);
                std::vector<kvgen::cuda::host::HostActBlock> xq;
                const std::vector<float> want = kvgen::cuda::host::matvec_int_residual_norm(
                    t, b.data(), rows, cols, x, residual, norm_w, 1e-5f, wide ? 8 : 4, &xq);
                CHECK(std::vector<float>(got.begin(), got.begin() + rows) == want);
                REQUIRE(xq.size() == groups);
                for (size_t g = 0; g < groups; ++g) {
                    const float* blk = got.data() + rows + g * 36;
                    INFO("block " << g);
                    CHECK(blk[0] == xq[g].d);
                    CHECK(blk[1] == float(xq[g].s));
                    CHECK(blk[2] == float(xq[g].h[0]));
                    CHECK(blk[3] == float(xq[g].h[1]));
                    for (int j = 0; j < 32; ++j) CHECK(blk[4 + j] == float(xq[g].q[j]));
                }
            }
}

TEST_CASE("the prefill GEMM of a weight larger than one decoded chunk covers every row", "[cuda][kernels]") {
    // 2304 x 4096 = 9.4M weights: a 2048-row chunk, then a 256-row one (gemm_chunk_rows); with --cuda-gemm mma 18
    // row tiles, and 150 tokens two or three token tiles
    for (const char* name : {"Q4_0", "Q4_K", "Q6_K"}) {
        for (const int n : {20, 150}) {
            INFO(name << " n " << n);
            GgmlType t;
            REQUIRE(ggml_type_from_name(name, &t));
            const int64_t rows = 2304, cols = 4096;
            const std::vector<uint8_t> b = random_weights(t, rows, cols, 31);
            std::vector<float> wf(size_t(rows * cols));
            dequantize_row(t, b.data(), wf.data(), rows * cols);
            for (float& v : wf) v = fp16_to_fp32(fp32_to_fp16(v));
            std::vector<float> x = randn(size_t(n) * size_t(cols), 32);
            for (float& v : x) v = fp16_to_fp32(fp32_to_fp16(v));
            std::vector<float> want(size_t(n) * size_t(rows));
            double mag = 0;
            for (int i = 0; i < n; ++i)
                for (int64_t r = 0; r < rows; ++r) {
                    double s = 0;
                    for (int64_t j = 0; j < cols; ++j) {
                        const double p = double(wf[size_t(r * cols + j)]) * x[size_t(i) * size_t(cols) + size_t(j)];
                        s += p;
                        mag = std::max(mag, std::fabs(p));
                    }
                    want[size_t(i) * size_t(rows) + size_t(r)] = float(s);
                }
            require_close(ct::gemm({t, rows, cols, &b}, x, n, nullptr), want, 1e-5 * mag * double(cols) / 32);
            // --cuda-gemm-chunk: the whole matrix at once, and 2 MiB (256 rows a chunk, 9 chunks); at 16 and 2 MiB
            // with the next chunk decoded on a second stream (--cuda-gemm-overlap), the same bits as in turn, also
            // added onto earlier sums
            const std::vector<float> y0 = randn(size_t(n) * size_t(rows), 33);
            for (const int mib : {0, 2, 16}) {
                const std::vector<float> in_turn =
                    ct::gemm({t, rows, cols, &b}, x, n, nullptr, false, 132, true, 2, mib);
                require_close(in_turn, want, 1e-5 * mag * double(cols) / 32);
                if (mib == 0) continue;
                CHECK(ct::gemm({t, rows, cols, &b}, x, n, nullptr, false, 132, true, 2, mib, true) == in_turn);
                CHECK(ct::gemm({t, rows, cols, &b}, x, n, &y0, false, 132, true, 2, mib, true) ==
                      ct::gemm({t, rows, cols, &b}, x, n, &y0, false, 132, true, 2, mib));
            }
            // --cuda-gemm mma in 64-token tiles (an H200's 132 SMs want more blocks than 128-token tiles give; at 20
            // tokens 18 blocks, so the columns split 8 ways) and in 128-token tiles (one SM)
            for (const int sms : {132, 1})
                require_close(ct::gemm({t, rows, cols, &b}, x, n, nullptr, true, sms), want,
                              1e-5 * mag * double(cols) / 32);
        }
    }
}

TEST_CASE("prefill GEMMs that decode the next product's first chunk ahead give each product's bits in turn",
          "[cuda][kernels]") {
    // A layer's products in a row with --cuda-gemm-overlap: each names the one after it, whose first chunk is decoded
    // on the side stream while its own last is multiplied. The same chunks multiplied by the same GEMMs as without
    // overlap, so the same bits, whether the next product is the one named (taken from the buffer) or not (decoded
    // again: a weight of the same type and shape with other bytes is not taken), through an F16 weight (used in place,
    // naming the next all the same), at 2 MiB (9 chunks of 256 rows), 16 MiB (2) and auto (whole matrices at these
    // sizes on 132 SMs; 16 MiB chunks on 1)
    const std::vector<std::pair<const char*, int64_t>> shapes = {
        {"Q4_0", 2304}, {"Q4_K", 1000}, {"F16", 512}, {"Q6_K", 2304}, {"Q4_0", 2304}};
    const int64_t cols = 4096;
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<ct::HostWeight> ws;
    for (size_t i = 0; i < shapes.size(); ++i) {
        GgmlType t;
        REQUIRE(ggml_type_from_name(shapes[i].first, &t));
        bytes.push_back(random_weights(t, shapes[i].second, cols, 40 + int(i)));
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
        GgmlType t;
        REQUIRE(ggml_type_from_name(shapes[i].first, &t));
        ws.push_back({t, shapes[i].second, cols, &bytes[i]});
    }
    // products 0 and 4 alike but for their bytes (A and A'), 1 B, 2 C (F16), 3 D
    const std::vector<std::vector<int>> orders = {
        {1, 2, 3, 4, -1},    // each names the one after it: B, D (named by the F16 C) and A' take theirs
        {3, 3, -1, 0, -1}};  // A and B name D: B decodes its own, D takes B's (C, F16, leaves it); A' not D's A
    const int64_t taken_want[] = {3, 1};
    for (const int n : {20, 150}) {
        const std::vector<float> x = randn(size_t(n) * size_t(cols), 41);
        for (const auto& [mib, sms] : {std::pair{2, 132}, std::pair{16, 132}, std::pair{-1, 132}, std::pair{-1, 1}}) {
            std::vector<std::vector<float>> in_turn;
            for (const ct::HostWeight& w : ws) in_turn.push_back(ct::gemm(w, x, n, nullptr, false, sms, true, 2, mib));
            for (size_t o = 0; o < orders.size(); ++o) {
                INFO("n " << n << ", chunk " << mib << " MiB, " << sms << " SMs, order " << o);
                int64_t taken = -1;
                const auto got = ct::gemm_chain(ws, orders[o], x, n, mib, sms, true, &taken);
                CHECK(taken == taken_want[o]);
                REQUIRE(got.size() == ws.size());
                for (size_t i = 0; i < ws.size(); ++i) {
                    INFO("product " << i);
                    CHECK(got[i] == in_turn[i]);
                }
                CHECK(ct::gemm_chain(ws, orders[o], x, n, mib, sms, false) == in_turn);  // without overlap
            }
        }
    }
}

TEST_CASE("the one-kernel prefill GEMM writes Q, K and V to three buffers bit for bit as into one, folds SwiGLU in "
          "bit for bit as the unsplit products and the swiglu kernel, and gives one stage's bits with two",
          "[cuda][kernels]") {
    // 2304 rows as Q, K and V of 1000, 200 and 1104 rows (the splits fall inside row tiles and fragments); gate and up
    // of 1000 rows: 16 tiles of 64, the last of 40
    const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
        REQUIRE(a.size() == b.size());
        size_t bad = 0;
        for (size_t i = 0; i < a.size(); ++i)
            if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && bad++ < 5)
                UNSCOPED_INFO("element " << i << ": " << a[i] << " against " << b[i]);
        CHECK(bad == 0);
    };
    for (const char* name : {"Q4_0", "Q4_K", "Q6_K"}) {
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        const int64_t rows = 2304, cols = 1024, ff = 1000;
        const std::vector<uint8_t> b = random_weights(t, rows, cols, 33), bg = random_weights(t, ff, cols, 34),
                                   bu = random_weights(t, ff, cols, 35);
        const ct::HostWeight w{t, rows, cols, &b}, gate{t, ff, cols, &bg}, up{t, ff, cols, &bu};
        for (const int n : {20, 150}) {
            const std::vector<float> x = randn(size_t(n) * size_t(cols), 36);
            for (const int sms : {132, 1}) {
                INFO(name << " n " << n << " SMs " << sms);
                same(ct::gemm_mma_qkv(w, x, n, 1000, 200, sms), ct::gemm(w, x, n, nullptr, true, sms));
                // two stages of shared memory where the device has room for them (an H200, an A100), one stage
                same(ct::gemm(w, x, n, nullptr, true, sms), ct::gemm(w, x, n, nullptr, true, sms, true, 1));
                // (the SwiGLU kernel never splits the columns: the products one by one unsplit)
                same(ct::gemm_glu_mma(gate, up, x, n, sms), ct::swiglu(ct::gemm(gate, x, n, nullptr, true, sms, false),
                                                                       ct::gemm(up, x, n, nullptr, true, sms, false)));
            }
        }
    }
}

TEST_CASE("a quantized cache on the GPU: the CPU's bytes, and attention over them", "[cuda][kernels]") {
    struct Types {
        KvType k, v;
    };
    cpu::ThreadPool pool(2);
    for (const Types ty :
         {Types{KvType::Q8_0, KvType::Q8_0}, Types{KvType::Q4_0, KvType::Q4_0}, Types{KvType::Q8_0, KvType::Q4_0},
          Types{KvType::F16, KvType::Q4_0}, Types{KvType::Q8_0, KvType::F16}}) {
        for (const auto& [n_heads, n_kv, hd] :
             {std::tuple{8, 2, 64}, std::tuple{4, 4, 128}, std::tuple{32, 8, 128}, std::tuple{16, 2, 128}}) {
            const Config c = test::attention_config(n_heads, n_kv, hd);
            const int n_ctx = 1200;
            INFO(kv_types_name(ty.k, ty.v) << " heads " << n_heads << "/" << n_kv << " hd " << hd);
            for (const auto& [pos0, n] :
                 {std::pair{0, 9}, std::pair{300, 1}, std::pair{1000, 150}, std::pair{16, 1}, std::pair{10, 20}}) {
                const int n_pos = pos0 + n;
                const auto [q, k, v, want] =
                    test::attention_case(c, n_ctx, pos0, n, 83 + uint32_t(pos0 + n), pool, ty.k, ty.v, 30.0f);
                INFO("pos0 " << pos0 << " n " << n);
                // store_kv's bytes and kv_offsets' key offsets are the CPU cache's, the positions before the queries'
                // stored as one step and theirs as the next, as the backend's batches come
                KvCache kv(c, n_ctx, ty.k, ty.v);
                ct::KvBytes got(kv.layout());
                const size_t row = size_t(n_kv) * size_t(hd);
                for (const auto& [p0, m] : {std::pair{0, pos0}, std::pair{pos0, n}}) {
                    kv.write(0, p0, m, k.data() + size_t(p0) * row, v.data() + size_t(p0) * row);
                    ct::store_step(got, 0, k.data() + size_t(p0) * row, v.data() + size_t(p0) * row, p0, m);
                }
                CHECK(kv_rows_differing(kv, got, 0, n_pos) == 0);
                CHECK(offsets_differing(kv, got, 0) == 0);
                if (n == 1) {
                    require_close(ct::attention(c, q, k, v, pos0, n, n_ctx, 16, true, true, ty.k, ty.v), want,
                                  2e-5 * max_abs(want));
                    continue;
                }
                require_close(ct::attention(c, q, k, v, pos0, n, n_ctx, 0, false, true, ty.k, ty.v), want,
                              2e-3 * max_abs(want));
                if (pos0 >= 16)  // the positions split among blocks (past the key offsets' first rows), then combined
                    require_close(ct::attention(c, q, k, v, pos0, n, n_ctx, 5, false, true, ty.k, ty.v), want,
                                  2e-3 * max_abs(want));
            }
        }
    }
}

TEST_CASE("a quantized K on the GPU: the key offsets and the bytes whatever the steps, and after kv_write",
          "[cuda][kernels]") {
    for (const KvType kt : {KvType::Q8_0, KvType::Q4_0}) {
        Config c = test::attention_config(8, 2, 128);
        c.n_layers = 3;
        const int n_ctx = 600;
        const size_t row = size_t(c.n_kv_heads) * size_t(c.head_dim);
        INFO(kv_type_name(kt));
        // positions crossing kKvOffsetPositions inside a step, at its first or last row, or a decode step at a time
        for (const std::vector<int>& steps :
             std::vector<std::vector<int>>{{40}, {10, 20}, {15, 1, 1, 3}, {16, 200}, {5, 11, 1}}) {
            int n = 0;
            for (int m : steps) n += m;
            std::vector<float> k = randn(size_t(n) * row, 61 + uint32_t(n), 2.0f), v = randn(size_t(n) * row, 67);
            for (size_t j = 0; j < k.size(); ++j) k[j] += 0.5f * float(int(j % 128) % 5 - 2);  // a bias
            KvCache kv(c, n_ctx, kt, KvType::Q4_0);
            ct::KvBytes got(kv.layout());
            int pos = 0;
            for (int m : steps) {
                kv.write(2, pos, m, k.data() + size_t(pos) * row, v.data() + size_t(pos) * row);
                ct::store_step(got, 2, k.data() + size_t(pos) * row, v.data() + size_t(pos) * row, pos, m);
                pos += m;
            }
            INFO(n << " positions in " << steps.size() << " steps");
            CHECK(kv_rows_differing(kv, got, 2, n) == 0);
            CHECK(offsets_differing(kv, got, 2) == 0);
        }
        // kv_write (a prompt-cache file, a context shift) sets every layer's offsets again; a step continues past it
        for (const int n_loaded : {12, 16, 100}) {
            INFO("kv_write of " << n_loaded << " positions");
            KvCache src(c, n_ctx, kt, KvType::Q4_0);
            for (int l = 0; l < c.n_layers; ++l) {
                const std::vector<float> k = randn(size_t(n_loaded) * row, 71 + uint32_t(l), 2.0f);
                const std::vector<float> v = randn(size_t(n_loaded) * row, 81 + uint32_t(l));
                src.write(l, 0, n_loaded, k.data(), v.data());
            }
            const KvLayout& kv = src.layout();
            const size_t heads = size_t(c.n_layers) * size_t(c.n_kv_heads);
            std::vector<uint8_t> kb(heads * size_t(n_loaded) * size_t(kv.k_row_bytes()));
            std::vector<uint8_t> vb(heads * size_t(n_loaded) * size_t(kv.v_row_bytes()));
            src.read(kb.data(), vb.data(), n_loaded);
            KvCache cpu_kv(c, n_ctx, kt, KvType::Q4_0);
            cpu_kv.write_rows(kb.data(), vb.data(), n_loaded);
            ct::KvBytes got(kv);
            ct::kv_write(got, kb.data(), vb.data(), n_loaded);
            for (int l = 0; l < c.n_layers; ++l) {
                CHECK(kv_rows_differing(cpu_kv, got, l, n_loaded) == 0);
                CHECK(offsets_differing(cpu_kv, got, l) == 0);
            }
            const int m = 9;
            const std::vector<float> k = randn(size_t(m) * row, 91, 2.0f), v = randn(size_t(m) * row, 92);
            cpu_kv.write(1, n_loaded, m, k.data(), v.data());
            ct::store_step(got, 1, k.data(), v.data(), n_loaded, m);
            CHECK(kv_rows_differing(cpu_kv, got, 1, n_loaded + m) == 0);
            CHECK(offsets_differing(cpu_kv, got, 1) == 0);
        }
    }
}

TEST_CASE("the Q|K|V products' epilogue stores K and V as rope_store_kv's launch does, bit for bit",
          "[cuda][kernels]") {
    // One product over Q|K|V and three products (a Q4_K_M file's Q6_K V); a token and prompts of one and two launches;
    // a partial rotation; positions 0, 1000 and 700 (the second launch's tokens from position 708).
    for (const char* name : {"Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})
        for (int rope_dim : {128, 64})
            for (int n : {1, 5, 12}) {
                GgmlType t;
                REQUIRE(ggml_type_from_name(name, &t));
                Config c = test::attention_config(8, 2, 128);
                c.rope_dim = rope_dim;
                const int64_t cols = 1024, qd = 8 * 128, kvd = 2 * 128;
                const int pos0 = n == 1 ? 0 : n == 5 ? 1000 : 700;
                INFO(name << " rope_dim " << rope_dim << " n " << n << " pos0 " << pos0);
                const std::vector<uint8_t> bq = random_weights(t, qd, cols, 51), bk = random_weights(t, kvd, cols, 53),
                                           bv = random_weights(t, kvd, cols, 57);
                const ct::HostWeight wq{t, qd, cols, &bq}, wk{t, kvd, cols, &bk}, wv{t, kvd, cols, &bv};
                const std::vector<float> x = randn(size_t(n * cols), 59, 2.0f);
                for (bool one : {true, false}) {
                    INFO((one ? "one product" : "three products"));
                    const auto [fold, launch] = ct::qkv_store(wq, wk, wv, one, x, n, c, pos0, 2048);
                    REQUIRE(fold.q == launch.q);
                    REQUIRE(fold.k == launch.k);
                    REQUIRE(fold.v == launch.v);
                }
            }
}

TEST_CASE("the sums of the Q|K|V products on split activations store K and V as rope_store_kv's launch does",
          "[cuda][kernels]") {
    // f16_split_sum with QkvStore (a short prompt's Q|K|V on the tensor cores over an f16 cache) against the plain
    // sums then rope_store_kv's launch, on the same RoPE tables, bit for bit; Q, K and V as three products give the
    // one product's rows. A partial rotation; 2, 8 and 16 tokens at positions 0, 1000 and 700. (The host test checks
    // the emulation of the same item against the plain sums and rope_store_kv's arithmetic.)
    for (int rope_dim : {128, 64})
        for (int n : {2, 8, 16}) {
            Config c = test::attention_config(8, 2, 128);
            c.rope_dim = rope_dim;
            const int64_t qd = 8 * 128, kvd = 2 * 128, rows = qd + 2 * kvd;
            const int pos0 = n == 2 ? 0 : n == 8 ? 1000 : 700, n_ctx = 2048;
            INFO("rope_dim " << rope_dim << " n " << n << " pos0 " << pos0);
            const std::vector<float> t = randn(size_t(2 * n * rows), uint32_t(61 + n), 3.0f);
            auto rows_of = [&](int64_t r0, int64_t r1) {  // each of t's 2n rows' [r0, r1)
                std::vector<float> out;
                for (int i = 0; i < 2 * n; ++i)
                    out.insert(out.end(), t.begin() + i * rows + r0, t.begin() + i * rows + r1);
                return out;
            };
            const ct::QkvStored fold = ct::f16_split_sum_qkv_store(t, n, rows, c, pos0, n_ctx, qd, qd + kvd);
            const ct::QkvStored launch = ct::f16_split_sum_qkv_store(t, n, rows, c, pos0, n_ctx, qd, qd + kvd, true);
            REQUIRE(fold.q == launch.q);
            REQUIRE(fold.k == launch.k);
            REQUIRE(fold.v == launch.v);
            REQUIRE(ct::f16_split_sum_qkv_store(rows_of(0, qd), n, qd, c, pos0, n_ctx, qd, qd).q == fold.q);
            REQUIRE(ct::f16_split_sum_qkv_store(rows_of(qd, qd + kvd), n, kvd, c, pos0, n_ctx, 0, kvd).k == fold.k);
            REQUIRE(ct::f16_split_sum_qkv_store(rows_of(qd + kvd, rows), n, kvd, c, pos0, n_ctx, 0, 0).v == fold.v);
        }
}

TEST_CASE("quantize_act makes the CPU's activation blocks bit for bit", "[cuda][kernels]") {
    // A warp per block: the largest magnitude and the sums of q (each half, both) by shuffles. Among the blocks an
    // all-zero one (d = 0), one value throughout, and halves far apart.
    const int64_t count = 32 * 300;
    std::vector<float> x = randn(size_t(count), 47, 3.0f);
    std::fill(x.begin() + 64, x.begin() + 96, 0.0f);
    std::fill(x.begin() + 96, x.begin() + 128, -7.5f);
    for (int j = 128; j < 160; ++j) x[size_t(j)] = j < 144 ? 1e-3f : 40.0f;
    std::vector<cpu::BlockA32> want(size_t(count / 32));
    cpu::quantize_a32(x.data(), want.data(), count);
    const std::vector<float> got = ct::quantize_act(x);
    REQUIRE(got.size() == want.size() * 36);
    for (size_t b = 0; b < want.size(); ++b) {
        const float* g = got.data() + b * 36;
        INFO("block " << b);
        REQUIRE(g[0] == want[b].d);
        REQUIRE(g[1] == float(want[b].sum[0] + want[b].sum[1]));
        REQUIRE(g[2] == float(want[b].sum[0]));
        REQUIRE(g[3] == float(want[b].sum[1]));
        for (int j = 0; j < 32; ++j) REQUIRE(g[4 + j] == float(want[b].q[j]));
    }
}

TEST_CASE("an attention output turned back from a quantized V is quantized as quantize_act quantizes it",
          "[cuda][kernels]") {
    // One token's output over a quantized V: kv_rotate_rows writes the output projection's blocks itself (no launch
    // of quantize_act); the rows as the rotation alone turns them, the blocks quantize_act's of those rows.
    for (const int hd : {64, 128}) {
        INFO("hd " << hd);
        std::vector<float> x = randn(size_t(40 * hd), uint32_t(53 + hd), 2.0f);
        std::fill(x.begin(), x.begin() + hd, 0.0f);  // a row of zeros: blocks with d = 0
        const std::vector<float> got = ct::rotate_rows_quantized(x, hd);
        const std::vector<float> want_rows = cuda::host::rotate_rows(x, hd);  // kv_rotate_scaled's bits (host test)
        REQUIRE(got.size() == want_rows.size() + want_rows.size() / 32 * 36);
        const std::vector<float> rows(got.begin(), got.begin() + std::ptrdiff_t(want_rows.size()));
        CHECK(rows == want_rows);
        const std::vector<float> want_blocks = ct::quantize_act(rows);
        CHECK(std::vector<float>(got.begin() + std::ptrdiff_t(rows.size()), got.end()) == want_blocks);
    }
}

TEST_CASE("rmsnorm and swiglu match the CPU ops", "[cuda][kernels]") {
    const int n = 3, dim = 896;
    const std::vector<float> x = randn(size_t(n * dim), 23, 3.0f), w = randn(size_t(dim), 29);
    std::vector<float> want(x.size());
    cpu::rmsnorm(want.data(), x.data(), w.data(), n, dim, 1e-5f);
    require_close(ct::rmsnorm(x, w, n, dim, 1e-5f), want, 1e-5 * max_abs(want));
    // The quantization folded in: exactly the f32 rows of the plain kernel, then blocks within one step of them.
    const std::vector<float> both = ct::rmsnorm_quantized(x, w, n, dim, 1e-5f);
    const std::vector<float> rows(both.begin(), both.begin() + n * dim);
    require_close(rows, ct::rmsnorm(x, w, n, dim, 1e-5f), 0.0);
    for (int b = 0; b < n * dim / 32; ++b) {
        const float* blk = both.data() + n * dim + b * 36;
        float h[2] = {0, 0};
        for (int j = 0; j < 32; ++j) {
            REQUIRE(std::fabs(blk[0] * blk[4 + j] - rows[size_t(b * 32 + j)]) <= blk[0]);
            h[j / 16] += blk[4 + j];
        }
        REQUIRE(blk[2] == h[0]);  // the sums of each half of q, and of both
        REQUIRE(blk[3] == h[1]);
        REQUIRE(blk[1] == h[0] + h[1]);
    }
    // The device's blocks of kNormThreads give the bits of the host emulation's blocks of 256 (the sum of squares in
    // kNormThreads' order whatever the block), rows and ActBlocks; 64 rows 4096 wide too (4 values a thread, summed by
    // fused multiply-adds on both sides: rounded apart, several of 64 rows would differ).
    REQUIRE(both == kvgen::cuda::host::rmsnorm_quantized(x, w, n, dim, 1e-5f));
    const std::vector<float> x4k = randn(size_t(64 * 4096), 41, 2.0f), w4k = randn(4096, 43);
    REQUIRE(ct::rmsnorm_quantized(x4k, w4k, 64, 4096, 1e-5f) ==
            kvgen::cuda::host::rmsnorm_quantized(x4k, w4k, 64, 4096, 1e-5f));
    // The split folded in (a short prompt's products on split activations): the host emulation's rows and halves.
    REQUIRE(ct::rmsnorm_split(x, w, n, dim, 1e-5f) == kvgen::cuda::host::rmsnorm_split(x, w, n, dim, 1e-5f));
    const std::vector<float> x16(x4k.begin(), x4k.begin() + 16 * 4096);  // 16 rows: a short prompt's most
    REQUIRE(ct::rmsnorm_split(x16, w4k, 16, 4096, 1e-5f) ==
            kvgen::cuda::host::rmsnorm_split(x16, w4k, 16, 4096, 1e-5f));
    // A split product's sums with SwiGLU and the next split folded in, and accumulated with the split: the host's
    {
        const int ns = 7;
        const int64_t rows = 11008;
        const std::vector<float> t = randn(size_t(2 * ns * rows), 47, 3.0f), y0 = randn(size_t(ns * rows), 53, 2.0f);
        for (const bool split : {false, true}) {
            INFO("split " << split);
            REQUIRE(ct::f16_split_sum(t, ns, rows, y0, true, false, split) ==
                    kvgen::cuda::host::f16_split_sum(t, ns, rows, y0, true, false, split));
        }
        // With SwiGLU folded in, the host's bits would part from the device's wherever their expf do (the device's
        // is within 2 ulp, the host library's closer): the device's own swiglu kernel on the plain sums instead, and
        // the split of that
        const std::vector<float> sums = ct::f16_split_sum(t, ns, rows, std::vector<float>(y0.size(), 0.0f), false,
                                                          false, false);
        std::vector<float> want = ct::swiglu(y0, sums);
        REQUIRE(ct::f16_split_sum(t, ns, rows, y0, false, true, false) == want);
        const std::vector<float> halves = kvgen::cuda::host::split_halves(want);
        want.insert(want.end(), halves.begin(), halves.end());
        REQUIRE(ct::f16_split_sum(t, ns, rows, y0, false, true, true) == want);
    }

    const std::vector<float> g = randn(4099, 31, 4.0f), u = randn(4099, 37);
    std::vector<float> sw = g;
    cpu::swiglu(sw.data(), u.data(), int64_t(sw.size()));
    require_close(ct::swiglu(g, u), sw, 1e-5 * max_abs(sw));
}

TEST_CASE("RoPE and the K store match cpu::rope at small and large positions", "[cuda][kernels]") {
    for (int variant = 0; variant < 3; ++variant) {
        Config c = test::attention_config(6, 2, 64);
        c.rope_base = 500000.0f;
        std::vector<float> ff;
        if (variant == 1) {  // linear scaling
            c.rope_scaling = RopeScaling::Linear;
            c.rope_scale = 4.0f;
        }
        if (variant == 2) {  // Llama 3.1 frequency factors, and a partial rotation
            c.rope_dim = 32;
            ff = randn(size_t(c.rope_dim / 2), 41);
            for (float& f : ff) f = 1.0f + std::fabs(f) * 4.0f;
        }
        for (int pos0 : {0, 3001}) {
            INFO("variant " << variant << " pos0 " << pos0);
            const int n = 4;
            const int half = c.rope_dim / 2;
            std::vector<float> ct_(size_t(n * half)), st_(size_t(n * half));
            cpu::rope_tables(ct_.data(), st_.data(), pos0, n, RopeFreqs::of(c, ff));
            const std::vector<float> q = randn(size_t(n * c.n_heads * c.head_dim), 43);
            std::vector<float> want = q;
            cpu::rope(want.data(), ct_.data(), st_.data(), n, c.n_heads, c);
            require_close(ct::rope(q, n, c.n_heads, pos0, c, ff), want, 2e-6 * max_abs(want));
            if (variant != 2) {
                const std::vector<float> k = randn(size_t(n * c.n_kv_heads * c.head_dim), 47);
                std::vector<float> wk = k;
                cpu::rope(wk.data(), ct_.data(), st_.data(), n, c.n_kv_heads, c);
                for (float& v : wk) v = fp16_to_fp32(fp32_to_fp16(v));
                const std::vector<float> stored = ct::store_k(c, k, pos0, n, 4096);
                require_close(stored, wk, 1e-3 * max_abs(wk));
                // Q's RoPE folded into the store's launch: the same bits as the two launches.
                std::vector<float> qr = q;
                REQUIRE(ct::rope_store_k(c, &qr, k, pos0, n, 4096) == stored);
                REQUIRE(qr == ct::rope(q, n, c.n_heads, pos0, c, ff));
                // A quantized K stored in two parts, the second empty (the step ends at the offsets' position): q
                // still turns, by RoPE and into K's basis (kv_rotate_rows' bits, checked on the host).
                REQUIRE(ct::rope_q_after_store(c, q, pos0, n) == cuda::host::rotate_rows(qr, c.head_dim));
            }
        }
    }
}

TEST_CASE("rope_store_kv turns the query into a quantized K's basis in the launch that stores K and V",
          "[cuda][kernels]") {
    // The query's blocks (a warp a row over a quantized K) and the store's after them in one grid: q as RoPE then
    // kv_rotate_rows give it, the cache's bytes and offsets as store_kv's launch writes them without q; steps that
    // cross position 16 (stored in two parts, q with the second, which may store nothing), decode steps before and
    // after it; an f16 K (q RoPE'd only) beside.
    struct Types {
        KvType k, v;
    };
    for (const int hd : {64, 128})
        for (const int rope_dim : {hd, hd / 2})
            for (const Types ty : {Types{KvType::Q8_0, KvType::Q8_0}, Types{KvType::Q4_0, KvType::F16},
                                   Types{KvType::F16, KvType::Q4_0}})
                for (const auto& [pos0, n] : {std::pair{0, 1}, std::pair{0, 5}, std::pair{3, 20}, std::pair{10, 6},
                                              std::pair{20, 1}, std::pair{0, 16}}) {
                    Config c = test::attention_config(6, 2, hd);
                    c.rope_dim = rope_dim;
                    INFO("hd " << hd << " rope_dim " << rope_dim << " " << kv_types_name(ty.k, ty.v) << " pos0 " << pos0
                               << " n " << n);
                    const std::vector<float> q = randn(size_t(n * c.n_heads * hd), uint32_t(7 + pos0 + n), 2.0f);
                    const std::vector<float> k = randn(size_t((pos0 + n) * c.n_kv_heads * hd), 8, 1.0f),
                                             v = randn(k.size(), 9, 1.0f);
                    const ct::RopeStored with = ct::rope_store_step(c, ty.k, ty.v, q, k, v, pos0, n, 64, true);
                    const ct::RopeStored without = ct::rope_store_step(c, ty.k, ty.v, q, k, v, pos0, n, 64, false);
                    CHECK(with.k == without.k);
                    CHECK(with.v == without.v);
                    CHECK(with.k_offsets == without.k_offsets);
                    const std::vector<float> roped = ct::rope(q, n, c.n_heads, pos0, c, {});
                    CHECK(with.q == (kv_type_quantized(ty.k) ? cuda::host::rotate_rows(roped, hd) : roped));
                }
}

TEST_CASE("flash-decoding and prefill attention match cpu::attention", "[cuda][kernels]") {
    struct Shape {
        int n_heads, n_kv, hd;
    };
    cpu::ThreadPool pool(2);
    for (const Shape s : {Shape{8, 2, 64}, Shape{4, 4, 128}, Shape{9, 3, 64}, Shape{4, 2, 96}, Shape{2, 1, 256},
                          Shape{16, 2, 32}, Shape{4, 1, 32}, Shape{2, 1, 32}, Shape{5, 1, 64}, Shape{8, 2, 128},
                          Shape{16, 2, 128}, Shape{8, 1, 64}, Shape{2, 2, 4}, Shape{4, 2, 80}}) {
        const Config c = test::attention_config(s.n_heads, s.n_kv, s.hd);
        const int n_ctx = 1200;
        for (int pos0 : {0, 1, 37, 1100}) {
            for (int n : {1, 7, 40}) {
                if (pos0 + n > n_ctx) continue;
                const auto [q, k, v, want] = test::attention_case(c, n_ctx, pos0, n, 53 + uint32_t(pos0 + n), pool);
                for (int splits : n == 1 ? std::vector<int>{1, 3, 64} : std::vector<int>{0}) {
                    INFO("heads " << s.n_heads << "/" << s.n_kv << " hd " << s.hd << " pos0 " << pos0 << " n " << n
                                  << " splits " << splits);
                    // n > 1: the warp-per-query kernel here; the tensor-core one in the next test
                    const std::vector<float> got = ct::attention(c, q, k, v, pos0, n, n_ctx, splits, false, false);
                    require_close(got, want, 2e-5 * max_abs(want));
                    if (n == 1) require_close(ct::attention(c, q, k, v, pos0, n, n_ctx, splits, true), got, 0.0);
                }
            }
        }
    }
}

TEST_CASE("flash attention on the tensor cores matches cpu::attention", "[cuda][kernels]") {
    struct Shape {
        int n_heads, n_kv, hd;
    };
    cpu::ThreadPool pool(2);
    for (const Shape s : {Shape{8, 2, 64}, Shape{4, 4, 128}, Shape{9, 3, 64}, Shape{32, 8, 128}, Shape{16, 2, 128},
                          Shape{4, 2, 96}}) {  // the last: no tensor-core kernel for 96, the warp kernel runs
        const Config c = test::attention_config(s.n_heads, s.n_kv, s.hd);
        const int n_ctx = 1400;
        for (const auto& [pos0, n] : {std::pair{0, 2}, std::pair{0, 300}, std::pair{37, 64}, std::pair{1100, 130},
                                      std::pair{1300, 5}}) {
            const auto [q, k, v, want] = test::attention_case(c, n_ctx, pos0, n, 71 + uint32_t(pos0 + n), pool);
            INFO("heads " << s.n_heads << "/" << s.n_kv << " hd " << s.hd << " pos0 " << pos0 << " n " << n);
            // P is rounded to f16 for P V: within 2^-12 of itself per weight (the host test measures about 1e-4
            // relative RMS error over the output)
            const std::vector<float> got = ct::attention(c, q, k, v, pos0, n, n_ctx, 0, false, true);
            require_close(got, want, 2e-3 * max_abs(want));
            // the tiles through registers instead of copied in two stages (--cuda-flash-pipeline off): the same bits
            require_close(ct::attention(c, q, k, v, pos0, n, n_ctx, 0, false, true, KvType::F16, KvType::F16, false),
                          got, 0.0);
            // a block of up to 16 rows (2 and 5 queries of one head a block, 2 of four) over whole tiles by one warp
            // (--cuda-flash-warps rows) instead of its warps splitting each tile's positions
            require_close(
                ct::attention(c, q, k, v, pos0, n, n_ctx, 0, false, true, KvType::F16, KvType::F16, true, false), want,
                2e-3 * max_abs(want));
            // the positions split among blocks, as a short prompt over a deep cache runs (21 tiles at 1300 + 5: 7 and
            // 16 splits, 16 with some splits empty), then combined; both ways of loading the tiles
            if (pos0 > 0)
                for (const int splits : {7, 16}) {
                    INFO(splits << " splits");
                    const std::vector<float> split = ct::attention(c, q, k, v, pos0, n, n_ctx, splits, false, true);
                    require_close(split, want, 2e-3 * max_abs(want));
                    require_close(
                        ct::attention(c, q, k, v, pos0, n, n_ctx, splits, false, true, KvType::F16, KvType::F16, false),
                        split, 0.0);
                }
        }
    }
}
