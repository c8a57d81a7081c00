// CPU kernels: every quantized type's integer dot product (AVX2 and portable builds) against dequantize-then-dot
// in f64, for 1 to 4 tokens at once; the activation quantizers' round trip; the thread pool; the portable attention
// build against the AVX2 one; a prompt's products against the exact math; every path to a product (instruction
// sets, prompt or generated tokens, batches) against the scalar reference, bit for bit.
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>

#include "cpu/cpu_features.h"
#include "cpu/matmul.h"
#include "cpu/ops.h"
#include "cpu/thread_pool.h"
#include "cpu/vecdot.h"
#include "model/dequant.h"
#include "model/quant_blocks.h"
#include "synth/synth.h"
#include "cuda_test_util.h"
#include "test_util.h"

using namespace kvgen;
using namespace kvgen::cpu;

namespace {

// rows x cols random weights of one type (synth_random_rows) and a view of them, as a model's tensor would give.
struct RandomWeight {
    std::vector<uint8_t> data;
    GgufTensor tensor;
    WeightView w;
    RandomWeight(GgmlType t, int64_t rows, int64_t cols, uint64_t seed) {
        const GgmlTypeInfo* info = ggml_type_info(t);
        const int64_t row_bytes = cols / info->block_size * int64_t(info->type_size);
        data.resize(size_t(rows * row_bytes));
        synth_random_rows(t, data.data(), rows, cols, 0.05f, seed);
        w = WeightView{&tensor, t, cols, rows, row_bytes, data.data()};
    }
    RandomWeight(const RandomWeight&) = delete;
    RandomWeight& operator=(const RandomWeight&) = delete;
};

// The SIMD row kernels this CPU can run, named.
using RowsFn = void (*)(GgmlType, ActFormat, const void*, int64_t, int, const void*, int64_t, int, float*, int64_t,
                        int64_t);
std::vector<std::pair<const char*, RowsFn>> simd_rows() {
    std::vector<std::pair<const char*, RowsFn>> isas;
    if (has_avx2()) isas.emplace_back("AVX2 rows", kernels::vec_dot_rows_avx2);
    if (has_avx512_vnni()) isas.emplace_back("AVX-512 rows", kernels::vec_dot_rows_avx512);
    return isas;
}

// Token i's activation j as the 8-bit forms hold it (d * q): from its B256 blocks (k) or its B32 blocks.
double rounded8(const std::vector<BlockB32>& b32, const std::vector<BlockB256>& b256, bool k, int64_t cols, int i,
                int64_t j) {
    if (k) {
        const BlockB256& b = b256[size_t(i * cols / 256 + j / 256)];
        return double(b.d) * b.q[j % 256];
    }
    const BlockB32& b = b32[size_t(i * cols / 32 + j / 32)];
    return double(b.d) * b.q[j % 32];
}

}  // namespace

TEST_CASE("integer dot products match dequantize-then-dot for every quantized type", "[cpu][vecdot]") {
    const int64_t cols = 512;
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(4 * cols);
    for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * (i % 97 == 0 ? 8.0f : 1.0f);  // a few outliers
    for (const char* name : {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}) {
        INFO(name);
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        const GgmlTypeInfo* info = ggml_type_info(t);
        std::vector<uint8_t> row(size_t(cols / info->block_size * info->type_size));
        synth_random_rows(t, row.data(), 1, cols, 0.05f, 99);
        std::vector<float> wf(cols);
        dequantize_row(t, row.data(), wf.data(), cols);

        // Activations in the form this type uses, for 4 tokens.
        std::vector<BlockA32> a32(4 * cols / 32);
        std::vector<BlockA256> a256(4 * cols / 256);
        const bool k = act_format(t) == ActFormat::A256;
        for (int tkn = 0; tkn < 4; ++tkn) {
            quantize_a32(x.data() + tkn * cols, a32.data() + tkn * cols / 32, cols);
            quantize_a256(x.data() + tkn * cols, a256.data() + tkn * cols / 256, cols);
        }
        const void* xq = k ? static_cast<const void*>(a256.data()) : static_cast<const void*>(a32.data());
        const int64_t stride = k ? cols / 256 * int64_t(sizeof(BlockA256)) : cols / 32 * int64_t(sizeof(BlockA32));

        const ActFormat xf = act_format(t);
        for (int nt = 1; nt <= 4; ++nt) {
            float generic[4], avx2[4], avx512[4];
            kernels::vec_dot_generic(t, xf, row.data(), xq, stride, nt, generic, cols);
            if (has_avx2()) kernels::vec_dot_avx2(t, xf, row.data(), xq, stride, nt, avx2, cols);
            if (has_avx512_vnni()) kernels::vec_dot_avx512(t, xf, row.data(), xq, stride, nt, avx512, cols);
            for (int tkn = 0; tkn < nt; ++tkn) {
                double ref = 0, mag = 0;
                for (int64_t j = 0; j < cols; ++j) {
                    ref += double(wf[size_t(j)]) * x[size_t(tkn * cols + j)];
                    mag += std::fabs(double(wf[size_t(j)]) * x[size_t(tkn * cols + j)]);
                }
                INFO("tokens " << nt << " token " << tkn << " ref " << ref);
                // 16-bit activations: the error is a few parts in 10^5 of the sum of magnitudes.
                CHECK(std::fabs(generic[tkn] - ref) <= 1e-4 * mag);
                if (has_avx2()) CHECK(std::fabs(avx2[tkn] - ref) <= 1e-4 * mag);
                if (has_avx512_vnni()) CHECK(std::fabs(avx512[tkn] - ref) <= 1e-4 * mag);
            }
        }
        if (!fast_type(t)) continue;
        // the 8-bit forms (--math fast): the exact product of the weights and the activations as rounded (d * q),
        // to float rounding, on every instruction set
        std::vector<BlockB32> b32(4 * cols / 32);
        std::vector<BlockB256> b256(4 * cols / 256);
        for (int tkn = 0; tkn < 4; ++tkn) {
            quantize_b32(x.data() + tkn * cols, b32.data() + tkn * cols / 32, cols);
            quantize_b256(x.data() + tkn * cols, b256.data() + tkn * cols / 256, cols);
        }
        const ActFormat bf = act_format(t, MathMode::Fast);
        REQUIRE(act_8bit(bf));
        const void* xb = k ? static_cast<const void*>(b256.data()) : static_cast<const void*>(b32.data());
        const int64_t bstride = k ? cols / 256 * int64_t(sizeof(BlockB256)) : cols / 32 * int64_t(sizeof(BlockB32));
        float generic[4], avx2[4], avx512[4];
        kernels::vec_dot_generic(t, bf, row.data(), xb, bstride, 4, generic, cols);
        if (has_avx2()) kernels::vec_dot_avx2(t, bf, row.data(), xb, bstride, 4, avx2, cols);
        if (has_avx512_vnni()) kernels::vec_dot_avx512(t, bf, row.data(), xb, bstride, 4, avx512, cols);
        for (int tkn = 0; tkn < 4; ++tkn) {
            double ref = 0, mag = 0, raw = 0;
            for (int64_t j = 0; j < cols; ++j) {
                const double xj = rounded8(b32, b256, k, cols, tkn, j);
                ref += double(wf[size_t(j)]) * xj;
                raw += double(wf[size_t(j)]) * x[size_t(tkn * cols + j)];
                mag += std::fabs(double(wf[size_t(j)]) * x[size_t(tkn * cols + j)]);
            }
            INFO("8-bit, token " << tkn << " ref " << ref);
            CHECK(std::fabs(generic[tkn] - ref) <= 1e-5 * mag);
            if (has_avx2()) CHECK(std::fabs(avx2[tkn] - ref) <= 1e-5 * mag);
            if (has_avx512_vnni()) CHECK(std::fabs(avx512[tkn] - ref) <= 1e-5 * mag);
            // and 8 bits are llama.cpp's precision: within a percent of the sum of magnitudes of the f32 product
            CHECK(std::fabs(generic[tkn] - raw) <= 1e-2 * mag);
        }
    }
}

TEST_CASE("activation quantization keeps 16 bits of each block", "[cpu][vecdot]") {
    std::vector<float> x(256);
    for (int j = 0; j < 256; ++j) x[size_t(j)] = std::sin(0.37f * float(j)) * (j == 5 ? 40.0f : 1.0f);
    BlockA256 b;
    quantize_a256(x.data(), &b, 256);
    BlockA32 a[8];
    quantize_a32(x.data(), a, 256);
    for (int j = 0; j < 256; ++j) {
        CHECK(std::abs(int(b.q[j])) <= 32512);
        CHECK(std::fabs(b.d * float(b.q[j]) - x[size_t(j)]) <= 0.5f * b.d + 1e-7f);
        const BlockA32& s = a[j / 32];
        CHECK(std::fabs(s.d * float(s.q[j % 32]) - x[size_t(j)]) <= 0.5f * s.d + 1e-7f);
    }
    int sum = 0;
    for (int j = 16; j < 32; ++j) sum += b.q[j];
    CHECK(b.bsums[1] == sum);
}

TEST_CASE("the thread pool covers every index once, for any thread count", "[cpu][threads]") {
    for (int threads : {1, 2, 3, 7}) {
        ThreadPool pool(threads);
        for (int64_t n : {0, 1, 5, 1000}) {
            std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
            for (int rep = 0; rep < 20; ++rep)
                pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
                    for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
                });
            for (auto& h : hits) CHECK(h.load() == 20);
            // slices differ by at most one index, the larger ones first (thread 0 is the caller)
            std::vector<int64_t> size(static_cast<size_t>(threads), 0);
            pool.parallel_for(n, [&](int64_t b, int64_t e, int t) { size[size_t(t)] = e - b; });
            for (int t = 1; t < threads; ++t) {
                CHECK(size[size_t(t)] <= size[size_t(t - 1)]);
                CHECK(size[0] - size[size_t(t)] <= 1);
            }
        }
    }
    CHECK(ThreadPool::physical_cores() >= 1);
}

TEST_CASE("the portable attention build: whole items equal its split parts bit for bit, and the AVX2 build within "
          "rounding",
          "[cpu][attention]") {
    const Config c = test::attention_config(9, 3, 64);
    const int n_ctx = 300, pos0 = 290, n = 2;
    const std::vector<float> q = test::randn(size_t(n) * 9 * 64, 7, 2.0f);
    const std::vector<float> k = test::randn(size_t(pos0 + n) * 3 * 64, 8, 1.0f);
    const std::vector<float> v = test::randn(size_t(pos0 + n) * 3 * 64, 9, 1.0f);
    for (KvType t : {KvType::F16, KvType::Q8_0, KvType::Q4_0}) {
        INFO(kv_type_name(t));
        KvCache kv(c, n_ctx, t, t);
        kv.write(0, 0, pos0 + n, k.data(), v.data());
        std::vector<float> scratch(size_t(attention_scratch(c, n_ctx)));
        const int64_t n_items = int64_t(n) * 3;
        std::vector<float> whole(q.size()), parts(q.size());
        kernels::attention_items_generic(whole.data(), q.data(), kv, 0, pos0, c, n, 1, 0, n_items, scratch.data());
        // the same items from their parts, positions and columns in uneven pieces
        std::vector<float> scores(size_t(3 * n_ctx)), q_rot(3 * 64), rows(size_t(kAttentionRowTile * 64));
        for (int i = 0; i < n; ++i)
            for (int g = 0; g < 3; ++g) {
                const int n_pos = pos0 + i + 1;
                const float* qg = kernels::attention_query(q_rot.data(), q.data(), kv, i, g, c);
                kernels::attention_scores_generic(scores.data(), n_ctx, qg, kv, 0, g, 0, 104, n_pos, c, rows.data());
                kernels::attention_scores_generic(scores.data(), n_ctx, qg, kv, 0, g, 104, n_pos, n_pos, c,
                                                  rows.data());
                float* og = parts.data() + (size_t(i) * 9 + size_t(g) * 3) * 64;
                for (int r = 0; r < 3; ++r)
                    kernels::attention_softmax_generic(scores.data() + r * n_ctx, n_pos, og + r * 64, 64);
                kernels::attention_values_generic(og, scores.data(), n_ctx, kv, 0, g, n_pos, 0, 32, c, rows.data());
                kernels::attention_values_generic(og, scores.data(), n_ctx, kv, 0, g, n_pos, 32, 32, c, rows.data());
                kernels::attention_output(og, kv, c);
            }
        CHECK(whole == parts);
        if (has_avx2()) {
            std::vector<float> avx2(q.size());
            kernels::attention_items_avx2(avx2.data(), q.data(), kv, 0, pos0, c, n, 1, 0, n_items, scratch.data());
            float worst = 0, scale = 0;
            for (size_t j = 0; j < q.size(); ++j) {
                worst = std::max(worst, std::fabs(avx2[j] - whole[j]));
                scale = std::max(scale, std::fabs(whole[j]));
            }
            CHECK(worst <= 1e-5f * scale);
        }
    }
}

TEST_CASE("attention over tiles of a prompt's tokens gives each token's bits, in every build, any tile size; the "
          "AVX-512 build the AVX2 build's bits",
          "[cpu][attention]") {
    // note: a tile decodes each K and V row once for its tokens; each token's scores, softmax and weighted values must
    // still be the ones a tile of one token computes (and so the ones decode computes for it)
    using S = test::AttentionShape;
    for (const S sh : {S{9, 3, 64, KvType::F16, KvType::F16}, S{9, 3, 64, KvType::Q8_0, KvType::Q4_0},
                       S{4, 1, 128, KvType::Q4_0, KvType::F16}, S{6, 2, 36, KvType::F32, KvType::F32},
                       S{6, 2, 96, KvType::F16, KvType::Q8_0}}) {
        const int n_ctx = 200;
        // a prompt from the start (inside and past the first kKvOffsetPositions), and one after a cache of 150
        for (const auto& [pos0, n] : {std::pair{0, 37}, std::pair{150, 19}}) {
            INFO(sh.name() << " pos0 " << pos0 << " n " << n);
            const test::AttentionProblem problem(sh, n_ctx, pos0, n, 21);
            const Config& c = problem.c;
            const std::vector<float>& q = problem.q;
            const KvCache& kv = problem.kv;
            std::vector<float> scratch(size_t(attention_scratch(c, n_ctx)));
            const auto run = [&](auto items, int tile, int64_t w0, int64_t w1, std::vector<float>& out) {
                items(out.data(), q.data(), kv, 0, pos0, c, n, tile, w0, w1, scratch.data());
            };
            std::vector<float> avx2_one;  // the AVX2 build's answer, which the AVX-512 build must give too
            const auto check = [&](auto items) {
                std::vector<float> one(q.size(), -1.0f);
                run(items, 1, 0, int64_t(n) * sh.n_kv, one);
                if (items == kernels::attention_items_avx2) avx2_one = one;
                if (items == kernels::attention_items_avx512) CHECK(one == avx2_one);
                for (int tile : {2, 3, 8}) {
                    INFO("tile " << tile);
                    const int64_t n_items = int64_t((n + tile - 1) / tile) * sh.n_kv;
                    std::vector<float> tiled(q.size(), -1.0f);
                    run(items, tile, 0, n_items / 2, tiled);  // in two slices, as two threads take them
                    run(items, tile, n_items / 2, n_items, tiled);
                    CHECK(tiled == one);
                }
            };
            check(kernels::attention_items_generic);
            if (has_avx2()) check(kernels::attention_items_avx2);
            if (has_avx512_vnni()) check(kernels::attention_items_avx512);
        }
    }
}

TEST_CASE("a prompt's integer products (16 tokens per vector) match dequantize-then-dot, whatever the batch",
          "[cpu][matmul]") {
    if (!has_avx512_vnni()) {
        WARN("no AVX-512 VNNI here: this case checks its prompt kernels (the next test case checks every path)");
        return;
    }
    const int64_t cols = 512, rows = 21;  // 16 blocks or 2 super-blocks; rows not a multiple of the tile's 8
    const int n = 37;                    // two whole groups of 16 tokens and a partial one
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(size_t(n * cols));
    for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * (i % 53 == 0 ? 10.0f : 1.0f);
    ThreadPool pool(2);
    std::vector<float> scratch(size_t(pool.size() * matmul_scratch(cols)));
    // y = x W^T for tokens [i0, i0 + m) in a batch of their own: the integer products of 16-token groups, or
    // without the buffers for the groups the generated tokens' kernels
    auto product = [&](const WeightView& w, int i0, int m, bool integer) {
        std::vector<BlockA32> a32(size_t(m * cols / 32));
        std::vector<BlockA256> a256(size_t(m * cols / 256));
        std::vector<BlockT16> t16(size_t((m + 15) / 16 * cols / 32));
        std::vector<BlockT256> t256(size_t((m + 15) / 16 * cols / 256));
        ActBuffers buf;
        buf.a32 = a32.data(), buf.a256 = a256.data();
        if (integer) buf.t16 = t16.data(), buf.t256 = t256.data();
        Activations a(x.data() + i0 * cols, m, cols, buf, true);
        std::vector<float> y(size_t(m * rows));
        matmul(y.data(), a, w, scratch.data(), pool);
        return y;
    };
    for (const char* name : {"Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1", "Q2_K", "Q3_K"}) {
        INFO(name);
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        REQUIRE(prompt_integer(t));
        const bool k = act_format(t) == ActFormat::A256;
        const RandomWeight weight(t, rows, cols, 23);
        const WeightView& w = weight.w;
        std::vector<float> wf(size_t(rows * cols));
        for (int64_t r = 0; r < rows; ++r) dequantize_row(t, w.row(r), wf.data() + r * cols, cols);

        const std::vector<float> y = product(w, 0, n, true), by_rows = product(w, 0, n, false);
        // each token's 16-bit activations as the products see them (d * q)
        std::vector<double> xd(x.size());
        for (int i = 0; i < n; ++i) {
            std::vector<BlockA32> a32(size_t(cols / 32));
            std::vector<BlockA256> a256(size_t(cols / 256));
            quantize_a32(x.data() + i * cols, a32.data(), cols);
            quantize_a256(x.data() + i * cols, a256.data(), cols);
            for (int64_t j = 0; j < cols; ++j)
                xd[size_t(i * cols + j)] = k ? double(a256[size_t(j / 256)].d) * a256[size_t(j / 256)].q[j % 256]
                                             : double(a32[size_t(j / 32)].d) * a32[size_t(j / 32)].q[j % 32];
        }
        for (int i = 0; i < n; ++i)
            for (int64_t r = 0; r < rows; ++r) {
                // the exact product of the weights and the 16-bit activations (d * q), and its magnitude
                double ref = 0, mag = 0;
                for (int64_t j = 0; j < cols; ++j) {
                    const double p = double(wf[size_t(r * cols + j)]) * xd[size_t(i * cols + j)];
                    ref += p;
                    mag += std::fabs(p);
                }
                INFO("token " << i << " row " << r);
                const float got = y[size_t(i * rows + r)];
                CHECK(std::fabs(got - ref) <= 1e-5 * mag + 1e-30);
                // and the generated tokens' kernels give the same bits
                CHECK(got == by_rows[size_t(i * rows + r)]);
            }
        // each token's result is the same bits alone, or in another lane of another batch
        for (const auto& [i0, m] : {std::pair{0, 1}, std::pair{5, 1}, std::pair{20, 17}, std::pair{3, 30}}) {
            INFO("tokens " << i0 << " .. " << i0 + m - 1 << " as a batch");
            const std::vector<float> part = product(w, i0, m, true);
            CHECK(std::memcmp(part.data(), y.data() + i0 * rows, part.size() * sizeof(float)) == 0);
        }
    }
}

TEST_CASE("a token's products are the same bits on every path: the scalar reference, the AVX2 and AVX-512 rows, "
          "a prompt's integer groups or f32 tiles, any batch, in each --math mode",
          "[cpu][matmul]") {
    const int64_t rows = 37;  // groups of 16 (AVX2: 8) rows and a partial one
    const int n = 21;         // a prompt group of 16 tokens and a partial one; decode tokens in fours and a rest
    ThreadPool pool(2);
    for (const char* name :
         {"Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "F16", "F32", "Q5_0", "Q5_1", "Q2_K", "Q3_K"})
        for (MathMode mode : {MathMode::Exact, MathMode::Fast, MathMode::F32}) {
            GgmlType t;
            REQUIRE(ggml_type_from_name(name, &t));
            if (mode != MathMode::Exact && !fast_type(t)) continue;  // float weights: one way in every mode
            INFO(name << ", --math " << math_mode_name(mode));
            // Q5_0, Q5_1, Q2_K and Q3_K: integer prompts on AVX2 and AVX-512 VNNI (elsewhere f32 tiles)
            const bool a32_prompt =
                t == GgmlType::Q5_0 || t == GgmlType::Q5_1 || t == GgmlType::Q2_K || t == GgmlType::Q3_K;
            if (!prompt_matches_decode(t)) {
                CHECK(a32_prompt);
                CHECK_FALSE(has_avx2());
                continue;
            }
            const ActFormat f = mode == MathMode::F32 ? ActFormat::None : act_format(t, mode);
            // 17 blocks (odd, not a multiple of 16), 3 super-blocks, or a float row with 8 columns past its last 16
            const ActFormat shape = act_format(t);
            const int64_t cols = shape == ActFormat::A256 || ggml_type_info(t)->block_size == 256 ? 768
                                 : shape == ActFormat::A32                                        ? 544
                                                                                                  : 584;
            const RandomWeight weight(t, rows, cols, 31);
            const WeightView& w = weight.w;
            const int64_t row_bytes = w.row_bytes;
            const std::vector<float> x = test::randn(size_t(n * cols), 12, 1.0f);

            // the reference: each token's activations quantized alone, each row by the scalar kernel; float rows
            // (and every row with --math f32, decoded) in the documented order (16 lanes of fused multiply-adds, then
            // (p0 + p2) + (p1 + p3) per four lanes, and (g0 + g1) + (g2 + g3))
            std::vector<BlockA32> a32(size_t(n * cols / 32));
            std::vector<BlockA256> a256(size_t(n * (cols / 256)));
            std::vector<BlockB32> b32(size_t(n * cols / 32));
            std::vector<BlockB256> b256(size_t(n * (cols / 256)));
            for (int i = 0; i < n; ++i) {
                if (f == ActFormat::A32) quantize_a32(x.data() + i * cols, a32.data() + i * cols / 32, cols);
                if (f == ActFormat::A256) quantize_a256(x.data() + i * cols, a256.data() + i * (cols / 256), cols);
                if (f == ActFormat::B32) quantize_b32(x.data() + i * cols, b32.data() + i * cols / 32, cols);
                if (f == ActFormat::B256) quantize_b256(x.data() + i * cols, b256.data() + i * (cols / 256), cols);
            }
            const void* xq = f == ActFormat::A256   ? static_cast<const void*>(a256.data())
                             : f == ActFormat::B32  ? static_cast<const void*>(b32.data())
                             : f == ActFormat::B256 ? static_cast<const void*>(b256.data())
                                                    : a32.data();
            const int64_t stride = f == ActFormat::A256   ? cols / 256 * int64_t(sizeof(BlockA256))
                                   : f == ActFormat::B32  ? cols / 32 * int64_t(sizeof(BlockB32))
                                   : f == ActFormat::B256 ? cols / 256 * int64_t(sizeof(BlockB256))
                                                          : cols / 32 * int64_t(sizeof(BlockA32));
            std::vector<float> ref(size_t(n * rows));
            std::vector<float> wf(static_cast<size_t>(cols));
            for (int64_t r = 0; r < rows; ++r) {
                dequantize_row(t, w.row(r), wf.data(), cols);
                for (int i = 0; i < n; ++i) {
                    float& out = ref[size_t(i * rows + r)];
                    if (f != ActFormat::None) {
                        kernels::vec_dot_generic(t, f, w.row(r), static_cast<const char*>(xq) + i * stride, stride, 1,
                                                 &out, cols);
                        continue;
                    }
                    float p[16] = {};
                    for (int64_t j = 0; j < cols; ++j)
                        p[j % 16] = std::fma(wf[size_t(j)], x[size_t(i * cols + j)], p[j % 16]);
                    float g[4];
                    for (int k = 0; k < 4; ++k) g[k] = (p[4 * k] + p[4 * k + 2]) + (p[4 * k + 1] + p[4 * k + 3]);
                    out = (g[0] + g[1]) + (g[2] + g[3]);
                }
            }
            auto same = [&](const std::vector<float>& y, const char* path) {
                INFO(path);
                CHECK(std::memcmp(y.data(), ref.data(), ref.size() * sizeof(float)) == 0);
            };
            // the rows kernels of each instruction set, tokens in fours
            if (f != ActFormat::None) {
                std::vector<std::pair<const char*, RowsFn>> isas = simd_rows();
                isas.emplace(isas.begin(), "generic rows", kernels::vec_dot_rows_generic);
                for (const auto& [isa, fn] : isas) {
                    std::vector<float> y(ref.size());
                    for (int i = 0; i < n; i += 4)
                        fn(t, f, w.data, row_bytes, int(rows), static_cast<const char*>(xq) + i * stride, stride,
                           std::min(4, n - i), y.data() + i * rows, rows, cols);
                    same(y, isa);
                }
            }
            // this machine's matmul, as generated tokens and as a prompt (whole, and in batches of other sizes)
            std::vector<float> scratch(size_t(pool.size() * matmul_scratch(cols)));
            struct Buffers {  // every activation form of m tokens
                std::vector<BlockA32> c32;
                std::vector<BlockA256> c256;
                std::vector<BlockT16> t16;
                std::vector<BlockT256> t256;
                std::vector<BlockB32> d32;
                std::vector<BlockB256> d256;
                std::vector<BlockU16> u16;
                std::vector<BlockU256> u256;
                Buffers(int m, int64_t cols)
                    : c32(size_t(m * cols / 32 + 1)), c256(size_t(m * (cols / 256) + 1)),
                      t16(size_t((m + 15) / 16 * (cols / 32) + 1)), t256(size_t((m + 15) / 16 * (cols / 256) + 1)),
                      d32(size_t(m * cols / 32 + 1)), d256(size_t(m * (cols / 256) + 1)),
                      u16(size_t((m + 15) / 16 * (cols / 32) + 1)), u256(size_t((m + 15) / 16 * (cols / 256) + 1)) {}
                ActBuffers view() {
                    return {c32.data(), c256.data(), t16.data(), t256.data(),
                            d32.data(), d256.data(), u16.data(), u256.data()};
                }
            };
            auto product = [&](int i0, int m, bool prompt) {
                Buffers b(m, cols);
                Activations a(x.data() + i0 * cols, m, cols, b.view(), prompt, mode);
                std::vector<float> y(size_t(m * rows));
                matmul(y.data(), a, w, scratch.data(), pool);
                return y;
            };
            same(product(0, n, false), "matmul, generated tokens");
            same(product(0, n, true), "matmul, a prompt");
            std::vector<float> parts;
            for (const auto& [i0, m] : {std::pair{0, 3}, std::pair{3, 17}, std::pair{20, 1}}) {
                const std::vector<float> y = product(i0, m, true);
                parts.insert(parts.end(), y.begin(), y.end());
            }
            same(parts, "matmul, a prompt in batches of 3, 17 and 1");
            // each instruction set's prompt kernels called directly (where matmul would take them), over row ranges of
            // 1 to 9 rows (partial tiles and passes) and groups of 8, 9 and 15 tokens (one vector of 8 tokens, or two
            // with a partial second): the reference's bits in range, nothing written outside it
            if (f != ActFormat::None) {
                using PromptFn = void (*)(float*, const float*, bool, ActFormat, const void*, int64_t,
                                          const WeightView&, int, int64_t, int64_t, float*);
                std::vector<std::pair<const char*, PromptFn>> isas;
                if (has_avx2() && (act_8bit(f) || f == ActFormat::A256 || a32_prompt))
                    isas.emplace_back("AVX2 prompt kernel", kernels::matmul_rows_avx2);
                if (has_avx512_vnni()) isas.emplace_back("AVX-512 prompt kernel", kernels::matmul_rows_avx512);
                for (int m : {8, 9, 15}) {
                    Buffers b(m, cols);
                    Activations a(x.data(), m, cols, b.view(), true, mode);
                    const void* t16 = a.tokens16(f, pool);
                    REQUIRE(t16 != nullptr);
                    for (const auto& [isa, fn] : isas)
                        for (int64_t len = 1; len <= 9; ++len) {
                            const int64_t r0 = 5;
                            INFO(isa << ", " << m << " tokens, rows " << r0 << " .. " << r0 + len - 1);
                            std::vector<float> y(size_t(m * rows), -7.0f);
                            fn(y.data(), x.data(), true, f, t16, 0, w, m, r0, r0 + len, scratch.data());
                            int wrong = 0;
                            for (int i = 0; i < m; ++i)
                                for (int64_t r = 0; r < rows; ++r) {
                                    const float want = r >= r0 && r < r0 + len ? ref[size_t(i * rows + r)] : -7.0f;
                                    const float got = y[size_t(i * rows + r)];
                                    wrong += std::memcmp(&got, &want, sizeof(float)) != 0;
                                }
                            CHECK(wrong == 0);
                        }
                }
            }
            // the f32 tiles of each instruction set, for float weights (and every weight with --math f32)
            if (f == ActFormat::None) {
                using TilesFn = void (*)(float*, const float*, bool, ActFormat, const void*, int64_t,
                                         const WeightView&, int, int64_t, int64_t, float*);
                std::vector<std::pair<const char*, TilesFn>> isas = {{"generic tiles", kernels::matmul_rows_generic}};
                if (has_avx2()) isas.emplace_back("AVX2 tiles", kernels::matmul_rows_avx2);
                if (has_avx512_vnni()) isas.emplace_back("AVX-512 tiles", kernels::matmul_rows_avx512);
                for (const auto& [isa, fn] : isas) {
                    std::vector<float> y(ref.size());
                    fn(y.data(), x.data(), true, ActFormat::None, nullptr, 0, w, n, 0, rows, scratch.data());
                    same(y, isa);
                }
            }
        }
}

TEST_CASE("Q2_K, Q3_K, Q5_0, Q5_1: a generated token's rows on every instruction set give the scalar reference's bits",
          "[cpu][vecdot]") {
    const int64_t rows = 37, cols = 768;  // groups of 16 (AVX2: 8) rows and a partial one, 3 super-blocks
    std::vector<float> x = test::randn(size_t(4 * cols), 23, 1.0f);
    for (size_t i = 0; i < x.size(); i += 41) x[i] *= 12.0f;  // outliers: activations near +-32512
    std::vector<BlockA32> a(size_t(4 * cols / 32));
    for (int t = 0; t < 4; ++t) quantize_a32(x.data() + t * cols, a.data() + t * cols / 32, cols);
    const int64_t stride = cols / 32 * int64_t(sizeof(BlockA32));
    for (GgmlType type : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q5_0, GgmlType::Q5_1}) {
        INFO(ggml_type_info(type)->name);
        const RandomWeight weight(type, rows, cols, 17);
        const WeightView& w = weight.w;
        for (int nt = 1; nt <= 4; ++nt) {
            INFO("tokens " << nt);
            std::vector<float> ref(size_t(nt * rows)), got(size_t(nt * rows));
            kernels::vec_dot_rows_generic(type, ActFormat::A32, w.data, w.row_bytes, int(rows), a.data(), stride, nt,
                                          ref.data(), rows, cols);
            for (int r = 0; r < rows; ++r)
                for (int t = 0; t < nt; ++t) {
                    float one;
                    kernels::vec_dot_generic(type, ActFormat::A32, w.row(r),
                                             reinterpret_cast<const char*>(a.data()) + t * stride, stride, 1, &one,
                                             cols);
                    CHECK(std::memcmp(&one, &ref[size_t(t * rows + r)], 4) == 0);
                }
            if (has_avx2()) {
                kernels::vec_dot_rows_avx2(type, ActFormat::A32, w.data, w.row_bytes, int(rows), a.data(), stride, nt,
                                           got.data(), rows, cols);
                CHECK(std::memcmp(got.data(), ref.data(), ref.size() * 4) == 0);
            }
            if (has_avx512_vnni()) {
                kernels::vec_dot_rows_avx512(type, ActFormat::A32, w.data, w.row_bytes, int(rows), a.data(), stride,
                                             nt, got.data(), rows, cols);
                CHECK(std::memcmp(got.data(), ref.data(), ref.size() * 4) == 0);
            }
        }
    }
}

TEST_CASE("8-bit products at the extremes: saturated weights and activations give the reference's bits on every "
          "path, the exact integer sums",
          "[cpu][matmul]") {
    // Weight bytes at their limits (every quant bit set, none set, Q8_0 at -128 and 127, Q6_K scales at -128 and
    // 127, k-quant scales and mins at 63) with their f16 scales kept, against activations whose blocks are all
    // +-127 after rounding: the largest integer sums and vpmaddubsw pairs the kernels can meet.
    const int64_t rows = 19, cols = 768;  // 24 blocks or 3 super-blocks
    const int n = 17;  // tokens four at a time, then one (AVX2's one-token k-quant path)
    ThreadPool pool(2);
    for (const char* name : {"Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"}) {
        INFO(name);
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        RandomWeight weight(t, rows, cols, 41);
        const GgmlTypeInfo* info = ggml_type_info(t);
        const size_t bs = info->type_size;
        // the f16 fields of a block: kept from the random weight so that the scales stay finite
        std::vector<std::pair<size_t, size_t>> halves;
        if (t == GgmlType::Q6_K) halves = {{offsetof(BlockQ6_K, d), 2}};
        else if (t == GgmlType::Q4_1 || t == GgmlType::Q4_K || t == GgmlType::Q5_K) halves = {{0, 4}};
        else halves = {{0, 2}};
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t b = 0; b < cols / info->block_size; ++b) {
                uint8_t* blk = weight.data.data() + size_t(r) * size_t(weight.w.row_bytes) + size_t(b) * bs;
                std::vector<uint8_t> keep(blk, blk + bs);
                const int pattern = int((r + b) % 4);  // all bits set, none, 0x80 bytes (Q8_0 -128), random
                if (pattern < 3) std::memset(blk, pattern == 0 ? 0xff : pattern == 1 ? 0x00 : 0x80, bs);
                if (t == GgmlType::Q6_K && pattern == 0)  // scales at 127 (0xff is -1)
                    std::memset(blk + offsetof(BlockQ6_K, scales), 0x7f, 16);
                for (const auto& [off, len] : halves) std::memcpy(blk + off, keep.data() + off, len);
            }
        const WeightView& w = weight.w;
        // activations: blocks of +-1 (q = +-127 everywhere), of one sign or alternating, and a random tail
        std::vector<float> x = test::randn(size_t(n * cols), 43, 1.0f);
        for (int i = 0; i < n; ++i)
            for (int64_t j = 0; j < cols; ++j) {
                float& v = x[size_t(i * cols + j)];
                const int kind = int((i + j / 256) % 3);
                if (kind == 0) v = 1.0f;
                if (kind == 1) v = (j % 2 == 0) == (i % 2 == 0) ? 1.0f : -1.0f;
            }
        const ActFormat f = act_format(t, MathMode::Fast);
        const bool k = f == ActFormat::B256;
        std::vector<BlockB32> b32(size_t(n * cols / 32));
        std::vector<BlockB256> b256(size_t(n * cols / 256));
        for (int i = 0; i < n; ++i) {
            quantize_b32(x.data() + i * cols, b32.data() + i * cols / 32, cols);
            quantize_b256(x.data() + i * cols, b256.data() + i * cols / 256, cols);
        }
        const void* xq = k ? static_cast<const void*>(b256.data()) : b32.data();
        const int64_t stride = k ? cols / 256 * int64_t(sizeof(BlockB256)) : cols / 32 * int64_t(sizeof(BlockB32));
        std::vector<float> ref(size_t(n * rows)), wf(static_cast<size_t>(cols));
        for (int64_t r = 0; r < rows; ++r) {
            dequantize_row(t, w.row(r), wf.data(), cols);
            for (int i = 0; i < n; ++i) {
                const char* xi = static_cast<const char*>(xq) + i * stride;
                float& out = ref[size_t(i * rows + r)];
                kernels::vec_dot_generic(t, f, w.row(r), xi, stride, 1, &out, cols);
                // the reference against the exact product of the decoded weights and the rounded activations
                double exact = 0, mag = 0;
                for (int64_t j = 0; j < cols; ++j) {
                    const double xj = rounded8(b32, b256, k, cols, i, j);
                    exact += double(wf[size_t(j)]) * xj;
                    mag += std::fabs(double(wf[size_t(j)]) * xj);
                }
                INFO("row " << r << " token " << i);
                CHECK(std::fabs(double(out) - exact) <= 1e-5 * mag + 1e-30);
            }
        }
        auto same = [&](const std::vector<float>& y, const char* path) {
            INFO(path);
            CHECK(std::memcmp(y.data(), ref.data(), ref.size() * sizeof(float)) == 0);
        };
        for (const auto& [isa, fn] : simd_rows()) {
            std::vector<float> y(ref.size());
            for (int i = 0; i < n; i += 4)
                fn(t, f, w.data, w.row_bytes, int(rows), static_cast<const char*>(xq) + i * stride, stride,
                   std::min(4, n - i), y.data() + i * rows, rows, cols);
            same(y, isa);
        }
        std::vector<BlockB32> d32(size_t(n * cols / 32));
        std::vector<BlockB256> d256(size_t(n * cols / 256));
        std::vector<BlockU16> u16(size_t((n + 15) / 16 * cols / 32));
        std::vector<BlockU256> u256(size_t((n + 15) / 16 * cols / 256));
        ActBuffers buf;
        buf.b32 = d32.data(), buf.b256 = d256.data(), buf.u16 = u16.data(), buf.u256 = u256.data();
        Activations a(x.data(), n, cols, buf, true, MathMode::Fast);
        std::vector<float> scratch(size_t(pool.size() * matmul_scratch(cols))), y(ref.size());
        matmul(y.data(), a, w, scratch.data(), pool);
        same(y, "matmul, a prompt");
    }
}

TEST_CASE("16-bit products at the extremes: weights and scales at their limits against activations of +-32512 give "
          "the reference's bits on the SIMD rows, one token or four",
          "[cpu][matmul]") {
    // The largest exact run sums the 16-bit kernels meet (a Q4_K run of 64 columns: 64 * 63 * 15 * 32512 < 2^31), and
    // the widest vpmaddubsw pairs of AVX2's one-token byte-plane paths (the activations' low bytes at 255, q = 32511
    // or -1, against nibbles of 15 and Q6_K's 63). Patterns per block: every bit set (nibbles 15, scales and mins
    // 63), none, 0x80, random.
    const int64_t rows = 19, cols = 768;
    for (const char* name : {"Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q4_1"}) {
        INFO(name);
        GgmlType t;
        REQUIRE(ggml_type_from_name(name, &t));
        RandomWeight weight(t, rows, cols, 47);
        const size_t bs = ggml_type_info(t)->type_size;
        const int block = ggml_type_info(t)->block_size;
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t b = 0; b < cols / block; ++b) {
                uint8_t* blk = weight.data.data() + size_t(r) * size_t(weight.w.row_bytes) + size_t(b) * bs;
                const bool q6 = t == GgmlType::Q6_K;
                const size_t d_at = q6 ? offsetof(BlockQ6_K, d) : 0, d_len = q6 || t == GgmlType::Q4_0 ? 2 : 4;
                std::vector<uint8_t> keep(blk + d_at, blk + d_at + d_len);  // finite f16 scales
                const int pattern = int((r + b) % 4);
                if (pattern < 3) std::memset(blk, pattern == 0 ? 0xff : pattern == 1 ? 0x00 : 0x80, bs);
                if (t == GgmlType::Q6_K && pattern == 0) std::memset(blk + offsetof(BlockQ6_K, scales), 0x7f, 16);
                std::memcpy(blk + d_at, keep.data(), d_len);
            }
        const WeightView& w = weight.w;
        const int n = 5;  // one token, then four
        std::vector<float> x = test::randn(size_t(n * cols), 49, 1.0f);
        for (int i = 0; i < n; ++i)
            for (int64_t j = 0; j < cols; ++j) {
                float& v = x[size_t(i * cols + j)];
                const int kind = int((i + j / 256) % 4);  // a block at +-1 is q = +-32512 everywhere
                if (kind == 0) v = i % 2 == 0 ? 1.0f : -1.0f;
                if (kind == 1) v = (j % 2 == 0) == (i % 2 == 0) ? 1.0f : -1.0f;
                if (kind == 2)  // each block's first value sets its scale: q = 32511 and -1 (low bytes 255)
                    v = j % 32 == 0 ? 1.0f : j % 2 == 0 ? 32511.0f / 32512.0f : -1.0f / 32512.0f;
            }
        const ActFormat f = act_format(t);
        std::vector<BlockA256> a256(size_t(n * cols / 256));
        std::vector<BlockA32> a32(size_t(n * cols / 32));
        for (int i = 0; i < n; ++i) {
            quantize_a256(x.data() + i * cols, a256.data() + i * cols / 256, cols);
            quantize_a32(x.data() + i * cols, a32.data() + i * cols / 32, cols);
        }
        const BlockA256& low = a256[size_t(2 * cols / 256)];  // token 2's first super-block: the low bytes at 255
        REQUIRE((low.q[2] == 32511 && low.q[1] == -1 && a32[size_t(2 * cols / 32)].q[2] == 32511));
        const char* xq = f == ActFormat::A256 ? reinterpret_cast<const char*>(a256.data())
                                              : reinterpret_cast<const char*>(a32.data());
        const int64_t stride = f == ActFormat::A256 ? cols / 256 * int64_t(sizeof(BlockA256))
                                                    : cols / 32 * int64_t(sizeof(BlockA32));
        std::vector<float> ref(size_t(n * rows));
        for (int i = 0; i < n; ++i)
            for (int64_t r = 0; r < rows; ++r)
                kernels::vec_dot_generic(t, f, w.row(r), xq + i * stride, stride, 1, &ref[size_t(i * rows + r)], cols);
        for (const auto& [isa, fn] : simd_rows()) {
            INFO(isa);
            std::vector<float> y(ref.size());
            fn(t, f, w.data, w.row_bytes, int(rows), xq, stride, 1, y.data(), rows, cols);
            fn(t, f, w.data, w.row_bytes, int(rows), xq + stride, stride, 4, y.data() + rows, rows, cols);
            CHECK(std::memcmp(y.data(), ref.data(), ref.size() * sizeof(float)) == 0);
        }
    }
}

TEST_CASE("attention's softmax: the AVX2 and portable builds give the same bits, within a few ulp of the exact one",
          "[cpu][attention]") {
    for (int n : {1, 7, 8, 9, 100, 4099}) {
        INFO(n << " positions");
        std::vector<float> s = test::randn(size_t(n), uint32_t(40 + n), 6.0f);
        s[size_t(n / 2)] = -200.0f;  // far below the rest: clamped, its weight 0 to f32 precision
        std::vector<float> a = s, b = s, oa(8), ob(8);
        kernels::attention_softmax_generic(a.data(), n, oa.data(), 8);
        if (has_avx2()) {
            kernels::attention_softmax_avx2(b.data(), n, ob.data(), 8);
            CHECK(a == b);
        }
        // each weight over the largest one is e^(s - max) of the shifted score as f32 holds it, to a few ulp (exp,
        // then the two normalizing roundings); the weights add up to 1 within the f32 sum's rounding
        const size_t top = size_t(std::max_element(s.begin(), s.end()) - s.begin());
        double total = 0;
        for (int t = 0; t < n; ++t) {
            const double want = std::exp(double(s[size_t(t)] - s[top]));
            if (want < 1e-30) continue;  // clamped at e^-87
            CHECK(std::fabs(double(a[size_t(t)]) / a[top] - want) <= 5e-7 * want);
            total += a[size_t(t)];
        }
        CHECK(std::fabs(total - 1.0) <= 1.2e-7 * n);
        CHECK(oa == std::vector<float>(8, 0.0f));
    }
}

namespace {
// The definition of an activation form: q = round-half-even(x / d) with d = max |x| / qmax per block (32 or 256
// values), clamped to +-qmax, and the sums of q the blocks carry.
template <typename B32, typename B256, typename Q32, typename Q256>
void check_activation_definition(Q32 quantize32, Q256 quantize256, float qmax) {
    for (uint32_t seed : {1u, 2u, 3u, 4u}) {
        std::vector<float> x = test::randn(512, seed, seed == 3 ? 1e-20f : 1.0f);
        x[7] = 0.0f;
        if (seed == 2) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // a block of zeros: d = 0, q = 0
        if (seed == 4)  // blocks too small for a normal scale, the first of them with a zero among its values
            for (size_t j = 0; j < 96; ++j) x[j] = j == 3 ? 0.0f : 1e-38f * float(int(j % 7) - 3);
        std::vector<B32> a(16);
        std::vector<B256> k(2);
        quantize32(x.data(), a.data(), 512);
        quantize256(x.data(), k.data(), 512);
        auto check = [&](int64_t b0, int len, float d, const auto* q) {
            float amax = 0;
            for (int j = 0; j < len; ++j) amax = std::max(amax, std::fabs(x[size_t(b0 + j)]));
            // a scale below the smallest normal float (no finite inverse): the block reads as zeros
            const float want_d = amax / qmax >= FLT_MIN ? amax / qmax : 0.0f, id = want_d > 0 ? 1.0f / want_d : 0.0f;
            CHECK(d == want_d);
            for (int j = 0; j < len; ++j) {
                const float r = std::nearbyint(x[size_t(b0 + j)] * id);
                CHECK(int(q[j]) == int(std::clamp(r, -qmax, qmax)));
            }
        };
        for (int b = 0; b < 16; ++b) {
            check(32 * b, 32, a[size_t(b)].d, a[size_t(b)].q);
            int s0 = 0, s1 = 0;
            for (int j = 0; j < 16; ++j) s0 += a[size_t(b)].q[j], s1 += a[size_t(b)].q[j + 16];
            CHECK(a[size_t(b)].sum[0] == s0);
            CHECK(a[size_t(b)].sum[1] == s1);
            CHECK(a[size_t(b)].ds == a[size_t(b)].d * float(s0 + s1));
        }
        for (int b = 0; b < 2; ++b) {
            check(256 * b, 256, k[size_t(b)].d, k[size_t(b)].q);
            for (int g = 0; g < 16; ++g) {
                int s = 0;
                for (int j = 0; j < 16; ++j) s += k[size_t(b)].q[16 * g + j];
                CHECK(k[size_t(b)].bsums[g] == s);
            }
        }
    }
}
}  // namespace

TEST_CASE("activation quantization: q = round-half-even(x / d) with d = max |x| / 32512, and the sums of q",
          "[cpu][vecdot]") {
    check_activation_definition<BlockA32, BlockA256>(quantize_a32, quantize_a256, 32512.0f);
}

TEST_CASE("8-bit activation quantization (--math fast): d = max |x| / 127, and the 16-token groups' quads and sums",
          "[cpu][vecdot]") {
    check_activation_definition<BlockB32, BlockB256>(quantize_b32, quantize_b256, 127.0f);
    // tokens side by side: quad j of token t is its values 4j .. 4j + 3, low byte first; past m, zeros
    const int m = 5;
    const std::vector<float> x = test::randn(size_t(m * 256), 9, 1.0f);
    std::vector<BlockB32> b32(size_t(m * 8));
    std::vector<BlockB256> b256(static_cast<size_t>(m));
    for (int t = 0; t < m; ++t) {
        quantize_b32(x.data() + t * 256, b32.data() + t * 8, 256);
        quantize_b256(x.data() + t * 256, b256.data() + t, 256);
    }
    std::vector<BlockU16> u16(8);
    BlockU256 u256;
    tokens16_from_b32(b32.data(), m, 8, u16.data());
    tokens16_from_b256(b256.data(), m, 1, &u256);
    auto byte = [](int32_t word, int i) { return int(int8_t(uint32_t(word) >> (8 * i))); };
    auto half = [](int32_t word, int i) { return int(int16_t(uint32_t(word) >> (16 * i))); };
    for (int t = 0; t < 16; ++t) {
        for (int b = 0; b < 8; ++b) {
            const BlockB32& a = b32[size_t(t < m ? t * 8 + b : 0)];
            for (int j = 0; j < 32; ++j) CHECK(byte(u16[size_t(b)].quads[j / 4][t], j % 4) == (t < m ? a.q[j] : 0));
            CHECK(u16[size_t(b)].sum[t] == (t < m ? a.sum[0] + a.sum[1] : 0));
            CHECK(u16[size_t(b)].d[t] == (t < m ? a.d : 0.0f));
        }
        const BlockB256& k = b256[size_t(t < m ? t : 0)];
        for (int j = 0; j < 256; ++j) CHECK(byte(u256.quads[j / 4][t], j % 4) == (t < m ? k.q[j] : 0));
        for (int g = 0; g < 16; ++g) CHECK(half(u256.s16[g / 2][t], g % 2) == (t < m ? k.bsums[g] : 0));
        for (int g = 0; g < 8; ++g)
            CHECK(half(u256.s32[g / 2][t], g % 2) == (t < m ? k.bsums[2 * g] + k.bsums[2 * g + 1] : 0));
    }
}
