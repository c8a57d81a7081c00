// The CPU engine against the shared references (../shared/README.md: prompt ids exact, logits within
// max(1%, 1.5 x peer_nrmse) of the exact math, greedy tokens equal while the exact gap is clear), and the
// invariants that catch KV-cache bugs: batched prefill equals token-by-token decode, cached equals recomputed.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/half.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_features.h"
#include "cpu/ops.h"
#include "cuda_test_util.h"
#include "engine/generator.h"
#include "engine/kv_blocks.h"
#include "engine/kv_cache.h"
#include "engine/kv_offset.h"
#include "engine/kv_rotation.h"
#include "model/dequant.h"
#include "model/quantize.h"
#include "model/weights.h"
#include "reference_check.h"
#include "synth_model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace kvgen;
using test::check_reference;
using test::kRefStems;

namespace {

std::function<std::unique_ptr<Backend>(const Model&)> cpu_backend(KvType kv_type, int threads, int n_batch,
                                                                   MathMode math = MathMode::Exact) {
    return [=](const Model& model) -> std::unique_ptr<Backend> {
        Settings s;
        s.n_ctx = 256;
        s.n_threads = threads;
        s.kv_type_k = s.kv_type_v = kv_type;
        s.n_batch = n_batch;
        s.math = math;
        return cpu::make_backend(model, s);
    };
}

}  // namespace

TEST_CASE("every reference case passes the fidelity rules (f16 cache), within 0.5% of the exact math",
          "[engine][fidelity]") {
    for (const char* stem : kRefStems) {
        INFO(stem);
        check_reference(stem, cpu_backend(KvType::F16, 2, 512), 0.005);
    }
}

TEST_CASE("every reference case passes the fidelity rules (f32 cache, one thread, batches of 7)",
          "[engine][fidelity]") {
    for (const char* stem : kRefStems) {
        INFO(stem);
        check_reference(stem, cpu_backend(KvType::F32, 1, 7), 0.005);
    }
}

TEST_CASE("the fidelity rules hold with --math fast (the peer's allowance), and --math f32 is the exact math to 0.01%",
          "[engine][fidelity]") {
    for (const char* stem : kRefStems) {
        INFO(stem << ", --math fast");
        check_reference(stem, cpu_backend(KvType::F16, 2, 512, MathMode::Fast));
    }
    for (const char* stem : kRefStems) {
        INFO(stem << ", --math f32");
        check_reference(stem, cpu_backend(KvType::F32, 2, 512, MathMode::F32), 1e-4);
    }
}

TEST_CASE("one prefill of N tokens gives the logits of N single-token steps, as prompt tokens or as generated ones, "
          "bit for bit",
          "[engine][invariant]") {
    const Model model = Model::load(test::shared("testdata/ref/open-gqa-Q4_K_M.gguf"));
    std::vector<int32_t> tokens;
    for (int i = 0; i < 40; ++i) tokens.push_back(int32_t(1 + (i * 97) % 4000));
    for (const auto& [kv, math] : {std::pair{KvType::F32, MathMode::Exact}, std::pair{KvType::F16, MathMode::Exact},
                                   std::pair{KvType::Q8_0, MathMode::Exact}, std::pair{KvType::Q4_0, MathMode::Exact},
                                   std::pair{KvType::F16, MathMode::Fast}, std::pair{KvType::Q4_0, MathMode::Fast},
                                   std::pair{KvType::F16, MathMode::F32}}) {
        INFO(kv_type_name(kv) << " cache, --math " << math_mode_name(math));
        Settings opt;
        opt.n_ctx = 64;
        opt.n_threads = 2;
        opt.kv_type_k = opt.kv_type_v = kv;
        opt.math = math;
        const std::unique_ptr<Backend> batched_backend = cpu::make_backend(model, opt);
        const std::unique_ptr<Backend> stepped_backend = cpu::make_backend(model, opt);
        Backend& batched = *batched_backend;
        Backend& stepped = *stepped_backend;
        // Q4_K and Q6_K: both passes compute every product the same way
        REQUIRE(batched.decode_matches_prompt());
        const int n_vocab = model.config.n_vocab;
        const float* a = batched.forward(tokens.data(), int(tokens.size()), 0, Pass::Prefill);
        std::vector<float> la(a, a + n_vocab);
        // a prompt's tokens are computed the same way in any batch: one at a time gives the same bits
        const float* p = nullptr;
        for (int i = 0; i < int(tokens.size()); ++i) p = stepped.forward(&tokens[size_t(i)], 1, i, Pass::Prefill);
        CHECK(std::vector<float>(p, p + n_vocab) == la);
        // and so are generated tokens
        const float* b = nullptr;
        for (int i = 0; i < int(tokens.size()); ++i) b = stepped.forward(&tokens[size_t(i)], 1, i, Pass::Decode);
        CHECK(std::vector<float>(b, b + n_vocab) == la);
    }
}

TEST_CASE("Q5_0, Q5_1, Q2_K and Q3_K: a prefill gives single steps' logits bit for bit where the CPU has AVX2",
          "[engine][invariant]") {
    std::vector<int32_t> tokens;
    for (int i = 0; i < 37; ++i) tokens.push_back(int32_t(1 + (i * 97) % 4000));  // two groups of 16 and 5 tokens
    for (const char* type : {"Q5_0", "Q5_1", "Q2_K", "Q3_K"}) {
        const Model model = test::synth_model(type, 2);
        for (MathMode math : {MathMode::Exact, MathMode::Fast}) {
            INFO(type << ", --math " << math_mode_name(math));
            Settings opt;
            opt.n_ctx = 64;
            opt.n_threads = 2;
            opt.math = math;
            const std::unique_ptr<Backend> batched = cpu::make_backend(model, opt);
            const std::unique_ptr<Backend> stepped = cpu::make_backend(model, opt);
            if (!batched->decode_matches_prompt()) {  // f32 tiles for a prompt
                CHECK_FALSE(cpu::has_avx2());
                continue;
            }
            const int n_vocab = model.config.n_vocab;
            // the prompt in batches of 18 (a group and 2 tokens, which take the one-token kernels) and 19 (a group
            // of 16 and one of 3), then token by token as prompt tokens and as generated ones
            batched->forward(tokens.data(), 18, 0, Pass::Prefill);
            const float* a = batched->forward(tokens.data() + 18, 19, 18, Pass::Prefill);
            const std::vector<float> la(a, a + n_vocab);
            const float* p = nullptr;
            for (int i = 0; i < int(tokens.size()); ++i) p = stepped->forward(&tokens[size_t(i)], 1, i, Pass::Prefill);
            CHECK(std::vector<float>(p, p + n_vocab) == la);
            const float* b = nullptr;
            for (int i = 0; i < int(tokens.size()); ++i) b = stepped->forward(&tokens[size_t(i)], 1, i, Pass::Decode);
            CHECK(std::vector<float>(b, b + n_vocab) == la);
            // and a short prompt of 4 tokens (the one-token kernels) and one of 5 (a group)
            for (int m : {4, 5}) {
                const float* s = batched->forward(tokens.data(), m, 0, Pass::Prefill);
                const std::vector<float> ls(s, s + n_vocab);
                const float* t = nullptr;
                for (int i = 0; i < m; ++i) t = stepped->forward(&tokens[size_t(i)], 1, i, Pass::Decode);
                CHECK(std::vector<float>(t, t + n_vocab) == ls);
            }
        }
    }
}

TEST_CASE("a fixed seed gives the same tokens with 1 and 2 threads", "[engine][invariant]") {
    const Model model = Model::load(test::shared("testdata/ref/open-gqa-Q8_0.gguf"));
    const Tokenizer tok = Tokenizer::from_gguf(model.file);
    const auto prompt = tok.encode("Once upon a time", true);
    std::vector<std::vector<int32_t>> runs;
    for (int threads : {1, 2}) {
        Settings opt;
        opt.n_ctx = 128;
        opt.n_threads = threads;
        const std::unique_ptr<Backend> made = cpu::make_backend(model, opt);
        Backend& backend = *made;
        GenerateOptions g;
        g.n_predict = 40;
        g.sampler.seed = 1234;
        g.sampler.temp = 1.0f;
        runs.push_back(Generator(backend).run(prompt, g, [](int32_t, const float*) { return true; }, nullptr,
                                              model.config.n_vocab).tokens);
    }
    CHECK(runs[0].size() == 40);
    CHECK(runs[0] == runs[1]);
}

namespace {
std::vector<int32_t> greedy(const Model& model, const std::vector<int32_t>& prompt, bool cache, int n) {
    Settings opt;
    opt.n_ctx = 256;
    opt.n_threads = 2;
    const std::unique_ptr<Backend> made = cpu::make_backend(model, opt);
    Backend& backend = *made;
    GenerateOptions g;
    g.n_predict = n;
    g.kv_cache = cache;
    g.sampler.temp = 0.0f;
    return Generator(backend).run(prompt, g, [](int32_t, const float*) { return true; }, nullptr,
                                  model.config.n_vocab).tokens;
}
}  // namespace

TEST_CASE("cached and --no-kv-cache greedy runs agree for 64 tokens (Q4_K_M reference)", "[engine][invariant]") {
    const Model model = Model::load(test::shared("testdata/ref/open-gqa-Q4_K_M.gguf"));
    const Tokenizer tok = Tokenizer::from_gguf(model.file);
    const auto prompt = tok.encode("The KV cache stores the keys and values of earlier tokens.", true);
    const auto a = greedy(model, prompt, true, 64), b = greedy(model, prompt, false, 64);
    CHECK(a.size() == 64);
    CHECK(a == b);
}

TEST_CASE("cached and --no-kv-cache greedy runs agree for 64 tokens (default model)", "[engine][invariant][default-model]") {
    if (!test::file_exists(KVGEN_DEFAULT_MODEL)) FAIL("default model missing: run models/fetch-default.sh");
    const Model model = Model::load(KVGEN_DEFAULT_MODEL);
    const Tokenizer tok = Tokenizer::from_gguf(model.file);
    const auto prompt = tok.encode("The capital of France is", tok.add_bos());
    const auto a = greedy(model, prompt, true, 64), b = greedy(model, prompt, false, 64);
    CHECK(a.size() == 64);
    CHECK(a == b);
}

TEST_CASE("n_predict 0 (-n 0) prefills the prompt and samples nothing", "[engine]") {
    const Model model = Model::load(test::shared("testdata/ref/open-gqa-Q8_0.gguf"));
    const Tokenizer tok = Tokenizer::from_gguf(model.file);
    const auto prompt = tok.encode("The KV cache", true);
    Settings opt;
    opt.n_ctx = 64;
    opt.n_threads = 1;
    const std::unique_ptr<Backend> made = cpu::make_backend(model, opt);
    Backend& backend = *made;
    GenerateOptions g;
    g.n_predict = 0;
    int calls = 0;
    const GenerateStats st = Generator(backend).run(
        prompt, g, [&calls](int32_t, const float*) { return ++calls > 0; }, nullptr, model.config.n_vocab);
    CHECK(calls == 0);
    CHECK(st.tokens.empty());
    CHECK(st.token_ms.empty());
    CHECK(st.n_prompt == int(prompt.size()));
    CHECK(st.prefill_ms > 0);
    CHECK(st.stop == "n_predict");
}

TEST_CASE("KvLayout: positions of a head are consecutive rows, heads and layers follow each other", "[engine][kv]") {
    const KvLayout kv{3, 2, 10, 8, KvType::F16};
    CHECK(kv.row(0, 0) == 0);
    CHECK(kv.row(0, 1) == 8);
    CHECK(kv.row(1, 0) == 80);
    CHECK(kv.layer_elems() == 160);
    CHECK(kv.offset(2, 1, 9) == 2 * 160 + 80 + 72);
    CHECK(kv.elems() == 480);
    CHECK(kv.bytes() == size_t(480) * 2 * 2);
    CHECK(kv.bytes_per_token() == 2 * 3 * 2 * 8 * 2);
}

TEST_CASE("quantized KV cache rows: q8_0 and q4_0 round trips within half a step of their block scale",
          "[engine][kv]") {
    const std::vector<float> x = test::randn(256, 31, 2.0f);
    for (KvType t : {KvType::Q8_0, KvType::Q4_0}) {
        INFO(kv_type_name(t));
        std::vector<uint8_t> row(size_t(KvLayout::row_bytes(t, 256)));
        const GgmlType g = t == KvType::Q8_0 ? GgmlType::Q8_0 : GgmlType::Q4_0;
        if (t == KvType::Q8_0)
            quantize_row_q8_0(x.data(), row.data(), 256);
        else
            quantize_row_q4_0(x.data(), row.data(), 256);
        std::vector<float> y(256);
        dequantize_row(g, row.data(), y.data(), 256);
        for (int b = 0; b < 8; ++b) {
            float amax = 0;
            for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[size_t(32 * b + j)]));
            // q8_0: half a step of amax / 127. q4_0: steps of amax / 8 from -8 to 7, so a value opposite the largest
            // one can clip by up to a whole step. The f16 scale adds a relative 2^-11.
            const float bound = t == KvType::Q8_0 ? 0.5f * amax / 127 : amax / 8;
            for (int j = 0; j < 32; ++j)
                CHECK(std::fabs(y[size_t(32 * b + j)] - x[size_t(32 * b + j)]) <= bound + 1e-3f * amax);
        }
    }
    const int64_t f16 = KvLayout{30, 3, 1, 64, KvType::F16, KvType::F16}.bytes_per_token();
    CHECK(KvLayout{30, 3, 1, 64, KvType::Q8_0, KvType::Q8_0}.bytes_per_token() * 64 == f16 * 34);
    CHECK(KvLayout{30, 3, 1, 64, KvType::Q4_0, KvType::Q4_0}.bytes_per_token() * 64 == f16 * 18);
    // K and V of their own types: each half at its own size
    const KvLayout mixed{30, 3, 10, 64, KvType::Q8_0, KvType::Q4_0};
    CHECK(mixed.bytes_per_token() * 128 == f16 * (34 + 18));
    CHECK(mixed.k_bytes() == size_t(30 * 3 * 10 * 68));
    CHECK(mixed.v_bytes() == size_t(30 * 3 * 10 * 36));
    CHECK(mixed.bytes() == size_t(mixed.bytes_per_token()) * 10);
    CHECK(mixed.types_name() == "q8_0/q4_0");
    KvType k = KvType::F16, v = KvType::F16;
    kv_types_from_name("q8_0/q4_0", "--kv-type", &k, &v);
    CHECK((k == KvType::Q8_0 && v == KvType::Q4_0));
    kv_types_from_name("f32", "--kv-type", &k, &v);
    CHECK((k == KvType::F32 && v == KvType::F32));
    CHECK_THROWS_WITH(kv_types_from_name("q8_0/q5_0", "--kv-type", &k, &v), Catch::Contains("K/V types"));
}

TEST_CASE("a q4_0 cache row: levels and scale by least squares, never rounding a block worse than ggml's rule",
          "[engine][kv]") {
    // rows as the cache sees them: Gaussian, and Gaussian with one value 6x the rest per block
    std::vector<float> x = test::randn(32 * 256, 77, 1.0f);
    for (size_t b = 128; b < 256; ++b) x[b * 32 + b % 32] *= 6.0f;
    double err_ls = 0, err_ggml = 0;
    for (size_t b = 0; b < 256; ++b) {
        const float* xb = x.data() + 32 * b;
        uint8_t ls[18], gg[18];
        int8_t l[32];
        const uint16_t d = fp32_to_fp16(kv_q4_0_levels(xb, l));
        std::memcpy(ls, &d, 2);
        kv_q4_0_pack(l, ls + 2);
        quantize_row_q4_0(xb, gg, 32);
        float yl[32], yg[32];
        dequantize_row(GgmlType::Q4_0, ls, yl, 32);
        dequantize_row(GgmlType::Q4_0, gg, yg, 32);
        double el = 0, eg = 0;
        for (int j = 0; j < 32; ++j) {
            CHECK(yl[j] == fp16_to_fp32(d) * float(l[j]));  // the packed levels are the returned ones
            el += double(yl[j] - xb[j]) * (yl[j] - xb[j]);
            eg += double(yg[j] - xb[j]) * (yg[j] - xb[j]);
        }
        INFO("block " << b);
        CHECK(el <= eg * (1 + 1e-3));  // up to the f16 rounding of the two scales
        err_ls += el;
        err_ggml += eg;
    }
    INFO("squared error: least squares " << err_ls << ", ggml's rule " << err_ggml);
    CHECK(err_ls < 0.96 * err_ggml);  // 226.9 against 240.7 on these rows
    // the vector trial (SSE2 on x86) is the scalar reference (the GPU's) lane for lane: levels, sums, bit for bit;
    // ids that land values exactly on a half level, far outside the levels, and on ordinary scales
    for (size_t b = 0; b < 256; ++b)
        for (float id : {0.37f, 2.0f, -3.5f, 40.0f, 8.0f / x[32 * b]}) {
            int8_t la[32], lb[32];
            float sa = 0, sb = 0;
            const int na = kv_q4_0_trial(x.data() + 32 * b, id, la, &sa);
            const int nb = kv_q4_0_trial_scalar(x.data() + 32 * b, id, lb, &sb);
            CHECK(na == nb);
            CHECK(std::memcmp(&sa, &sb, 4) == 0);
            CHECK(std::memcmp(la, lb, 32) == 0);
        }
    // a block of zeros: scale 0, every level 0 (stored as 8)
    const float zeros[32] = {};
    int8_t l[32];
    CHECK(kv_q4_0_levels(zeros, l) == 0.0f);
    uint8_t qs[16];
    kv_q4_0_pack(l, qs);
    for (uint8_t q : qs) CHECK(q == 0x88);
    // kv_encode_row stores exactly these blocks, in the rotated basis
    std::vector<float> row(x.begin(), x.begin() + 64), rotated = row, tmp(64);
    kv_rotate(rotated.data(), 64);
    std::vector<uint8_t> got(36), want(36);
    kv_encode_row(KvType::Q4_0, row.data(), got.data(), 64, tmp.data());
    for (int b = 0; b < 2; ++b) {
        const uint16_t d = fp32_to_fp16(kv_q4_0_levels(rotated.data() + 32 * b, l));
        std::memcpy(want.data() + 18 * b, &d, 2);
        kv_q4_0_pack(l, want.data() + 18 * b + 2);
    }
    CHECK(got == want);
}

TEST_CASE("the quantized cache's rotation: its own inverse up to w, and it tames an outlier channel", "[engine][kv]") {
    CHECK(kv_rotation_width(64) == 64);
    CHECK(kv_rotation_width(96) == 32);
    CHECK(kv_rotation_width(128) == 128);
    // small integers: every sum is exact, so H (H x) / w gives x back bit for bit
    std::vector<float> x(96);
    for (size_t j = 0; j < x.size(); ++j) x[j] = float(int(j * 7 % 23) - 11);
    std::vector<float> y = x;
    kv_rotate(y.data(), 96);
    CHECK(y != x);
    kv_rotate_scaled(y.data(), 96, 96);
    CHECK(y == x);
    // H / sqrt(w) is orthogonal: the rotated row has the same length, scaled by sqrt(w)
    std::vector<float> r = test::randn(128, 5, 1.0f), rr = r;
    kv_rotate(rr.data(), 128);
    double n0 = 0, n1 = 0;
    for (size_t j = 0; j < r.size(); ++j) {
        n0 += double(r[j]) * r[j];
        n1 += double(rr[j]) * rr[j];
    }
    CHECK(n1 == Approx(128 * n0).epsilon(1e-5));
    // a key row with one channel 30x the rest: q4_0 in the rotated basis, decoded and rotated back, errs far less
    // than q4_0 of the row as it is
    std::vector<float> k = test::randn(64, 9, 0.5f);
    k[5] = 15.0f;
    auto q4_error = [&](bool rotate) {
        std::vector<float> in = k, out(64);
        if (rotate) kv_rotate(in.data(), 64);
        std::vector<uint8_t> row(size_t(KvLayout::row_bytes(KvType::Q4_0, 64)));
        quantize_row_q4_0(in.data(), row.data(), 64);
        dequantize_row(GgmlType::Q4_0, row.data(), out.data(), 64);
        if (rotate) kv_rotate_scaled(out.data(), 64, 64);
        double e = 0;
        for (int j = 0; j < 64; ++j) e += double(out[size_t(j)] - k[size_t(j)]) * (out[size_t(j)] - k[size_t(j)]);
        return std::sqrt(e / 64);
    };
    CHECK(q4_error(true) < 0.5 * q4_error(false));
}

TEST_CASE("attention over a quantized cache is attention over its decoded values, exactly", "[engine][kv]") {
    const Config c = test::attention_config(8, 2, 64);
    cpu::ThreadPool pool(2);
    // note: within the first kKvOffsetPositions no key offset applies (the next test takes them on)
    const int n_ctx = 40, n_pos = kKvOffsetPositions;
    const std::vector<float> k = test::randn(size_t(n_pos) * 2 * 64, 41, 1.0f), v = test::randn(k.size(), 43, 1.0f);
    const std::vector<float> q = test::randn(size_t(3) * 8 * 64, 47, 2.0f);
    // one cached row decoded to floats, as stored
    auto decode = [](KvType t, const void* row, float* out) {
        if (t == KvType::F16)
            for (int j = 0; j < 64; ++j) out[j] = fp16_to_fp32(static_cast<const uint16_t*>(row)[j]);
        else
            dequantize_row(t == KvType::Q8_0 ? GgmlType::Q8_0 : GgmlType::Q4_0, row, out, 64);
    };
    const std::pair<KvType, KvType> kinds[] = {{KvType::Q8_0, KvType::Q8_0},
                                               {KvType::Q4_0, KvType::Q4_0},
                                               {KvType::Q8_0, KvType::Q4_0},
                                               {KvType::F16, KvType::Q4_0},
                                               {KvType::Q4_0, KvType::F16}};
    for (const auto& [kt, vt] : kinds) {
        INFO(kv_types_name(kt, vt));
        KvCache quant(c, n_ctx, kt, vt), exact(c, n_ctx, KvType::F32);
        quant.write(0, 0, n_pos, k.data(), v.data());
        // the decoded rows, stored exactly
        std::vector<float> kd(k.size()), vd(v.size());
        const int64_t k_rb = quant.layout().k_row_bytes(), v_rb = quant.layout().v_row_bytes();
        for (int i = 0; i < n_pos; ++i)
            for (int h = 0; h < 2; ++h) {
                const size_t at = (size_t(i) * 2 + size_t(h)) * 64;
                decode(kt, static_cast<const uint8_t*>(quant.k(0, h)) + i * k_rb, kd.data() + at);
                decode(vt, static_cast<const uint8_t*>(quant.v(0, h)) + i * v_rb, vd.data() + at);
            }
        exact.write(0, 0, n_pos, kd.data(), vd.data());
        // quantized rows are in the rotated basis (kv_rotation.h): the query goes in as H q / w where K is
        // quantized, and the output comes back the same way where V is
        std::vector<float> q_in = q;
        if (kv_type_quantized(kt)) kv_rotate_scaled(q_in.data(), int(q_in.size()), 64);
        std::vector<float> a(q.size()), b(q.size()), scratch(size_t(2 * cpu::attention_scratch(c, n_ctx)));
        cpu::attention(a.data(), q.data(), quant, 0, n_pos - 3, 3, c, scratch.data(), pool);
        cpu::attention(b.data(), q_in.data(), exact, 0, n_pos - 3, 3, c, scratch.data(), pool);
        if (kv_type_quantized(vt)) kv_rotate_scaled(b.data(), int(b.size()), 64);
        CHECK(a == b);
    }
}

TEST_CASE("a quantized K past its first positions is stored less the key offset, whatever the batches, and "
          "attention adds it back",
          "[engine][kv]") {
    const Config c = test::attention_config(8, 2, 64);
    cpu::ThreadPool pool(2);
    const int n_ctx = 48, n_pos = 48, hd = 64;
    // keys with a bias: the same large value on every dimension for every position, as slowly turning RoPE pairs
    // carry it
    std::vector<float> k = test::randn(size_t(n_pos) * 2 * hd, 61, 1.0f), v = test::randn(k.size(), 67, 1.0f);
    for (size_t e = 0; e < k.size(); ++e) k[e] += 3.0f + 0.05f * float(e % hd);
    const std::vector<float> q = test::randn(size_t(3) * 8 * hd, 71, 2.0f);
    for (KvType kt : {KvType::Q8_0, KvType::Q4_0}) {
        INFO(kv_type_name(kt));
        KvCache one(c, n_ctx, kt, KvType::F16), parts(c, n_ctx, kt, KvType::F16);
        const KvLayout& kv = one.layout();
        REQUIRE(kv.k_offsets());
        // RoPE base 10000 over 48 positions: pairs 14 .. 31 turn by at most a radian (48 * 10000^(-28/64) = 0.86)
        CHECK(kv.k_offset_dim0 == 28);
        one.write(0, 0, n_pos, k.data(), v.data());
        const int cut[] = {0, 10, 15, 16, 17, n_pos};
        for (int b = 0; b + 1 < 6; ++b)
            parts.write(0, cut[b], cut[b + 1] - cut[b], k.data() + size_t(cut[b]) * 2 * hd,
                        v.data() + size_t(cut[b]) * 2 * hd);
        const int64_t kb = kv.k_row_bytes();
        std::vector<float> off(static_cast<size_t>(hd)), model_basis(static_cast<size_t>(hd));
        for (int h = 0; h < 2; ++h) {
            INFO("head " << h);
            CHECK(std::memcmp(one.k(0, h), parts.k(0, h), size_t(n_pos * kb)) == 0);
            CHECK(std::memcmp(one.k_offset(0, h), parts.k_offset(0, h), size_t(hd) * 4) == 0);
            kv_offset_of_rows(kt, one.k(0, h), kb, hd, kv.k_offset_dim0, off.data());
            CHECK(std::memcmp(one.k_offset(0, h), off.data(), size_t(hd) * 4) == 0);
            // in the model's basis: zero below dim0, the mean of the first keys (as rounded) from there on
            model_basis = off;
            kv_rotate_scaled(model_basis.data(), hd, hd);
            double err = 0, norm = 0;
            for (int j = 0; j < hd; ++j) {
                double mean = 0;
                for (int t = 0; t < kKvOffsetPositions; ++t) mean += k[(size_t(t) * 2 + size_t(h)) * hd + size_t(j)];
                mean /= kKvOffsetPositions;
                if (j < kv.k_offset_dim0) {
                    CHECK(std::fabs(model_basis[size_t(j)]) < 1e-5f);
                } else {
                    err += (model_basis[size_t(j)] - mean) * (model_basis[size_t(j)] - mean);
                    norm += mean * mean;
                }
            }
            CHECK(std::sqrt(err / norm) < (kt == KvType::Q8_0 ? 0.01 : 0.1));
            // rows past the first decode (the offset added back) to the keys, closer than without the offset
            double err_off = 0, err_plain = 0;
            std::vector<float> row(static_cast<size_t>(hd)), tmp(static_cast<size_t>(hd));
            std::vector<uint8_t> plain(static_cast<size_t>(kb));
            for (int t = kKvOffsetPositions; t < n_pos; ++t) {
                const float* x = k.data() + (size_t(t) * 2 + size_t(h)) * hd;
                kv_decode_row(kt, static_cast<const uint8_t*>(one.k(0, h)) + t * kb, row.data(), hd, off.data());
                for (int j = 0; j < hd; ++j) err_off += double(row[size_t(j)] - x[j]) * (row[size_t(j)] - x[j]);
                kv_encode_row(kt, x, plain.data(), hd, tmp.data());
                kv_decode_row(kt, plain.data(), row.data(), hd);
                for (int j = 0; j < hd; ++j) err_plain += double(row[size_t(j)] - x[j]) * (row[size_t(j)] - x[j]);
            }
            INFO("squared error of the later keys: with the offset " << err_off << ", without " << err_plain);
            CHECK(err_off < 0.8 * err_plain);
        }
        // attention over the cache is attention over its decoded keys (each with its offset back), up to rounding
        KvCache exact(c, n_ctx, KvType::F32);
        std::vector<float> kd(k.size());
        for (int t = 0; t < n_pos; ++t)
            for (int h = 0; h < 2; ++h)
                kv_decode_row(kt, static_cast<const uint8_t*>(one.k(0, h)) + t * kb,
                              kd.data() + (size_t(t) * 2 + size_t(h)) * hd, hd,
                              t >= kKvOffsetPositions ? one.k_offset(0, h) : nullptr);
        std::vector<float> vd(v.size());
        for (size_t e = 0; e < v.size(); ++e) vd[e] = fp16_to_fp32(fp32_to_fp16(v[e]));
        exact.write(0, 0, n_pos, kd.data(), vd.data());
        std::vector<float> a(q.size()), b(q.size()), scratch(size_t(2 * cpu::attention_scratch(c, n_ctx)));
        for (int pos0 : {n_pos - 3, kKvOffsetPositions - 2}) {
            INFO("queries at " << pos0 << " ..");
            cpu::attention(a.data(), q.data(), one, 0, pos0, 3, c, scratch.data(), pool);
            cpu::attention(b.data(), q.data(), exact, 0, pos0, 3, c, scratch.data(), pool);
            CHECK(test::worst_diff(a, b) <= 1e-4f);
        }
    }
}

TEST_CASE("CPU attention gives the same bits on 1, 2 or 3 threads, whole items, tiles or split across the threads",
          "[engine][kv][invariant]") {
    // note: with fewer than two (token, KV head) items per thread and a long context, attention splits each item's
    // positions, query heads and columns across the threads; every element must still be computed as one thread
    // computes it
    using S = test::AttentionShape;
    for (const S sh : {S{9, 3, 64, KvType::F16, KvType::F16}, S{9, 3, 64, KvType::Q8_0, KvType::Q8_0},
                       S{9, 3, 64, KvType::Q4_0, KvType::Q4_0}, S{4, 1, 128, KvType::Q4_0, KvType::F16},
                       S{6, 2, 40, KvType::F16, KvType::F32}, S{6, 2, 96, KvType::F16, KvType::Q8_0}}) {
        const int n_ctx = 1100;
        // one or two tokens (items split across the threads), and a prompt (tiles of tokens, as large as leave
        // four items a thread: 8, 4 and 2 tokens here)
        for (const auto& [pos0, n] : {std::pair{700, 1}, std::pair{1020, 2}, std::pair{300, 1}, std::pair{300, 37}}) {
            INFO(sh.name() << " pos0 " << pos0 << " n " << n);
            const test::AttentionProblem problem(sh, n_ctx, pos0, n, 3);
            const Config& c = problem.c;
            const std::vector<float>& q = problem.q;
            const KvCache& kv = problem.kv;
            std::vector<std::vector<float>> outs;
            for (int threads : {1, 2, 3}) {
                cpu::ThreadPool pool(threads);
                std::vector<float> scratch(size_t(threads * cpu::attention_scratch(c, n_ctx)));
                std::vector<float> out(q.size(), -1.0f);
                cpu::attention(out.data(), q.data(), kv, 0, pos0, n, c, scratch.data(), pool);
                outs.push_back(std::move(out));
            }
            CHECK(outs[0] == outs[1]);
            CHECK(outs[0] == outs[2]);
        }
    }
}

TEST_CASE("cached and --no-kv-cache greedy runs give the same logits bit for bit, with every cache type and "
          "--math mode",
          "[engine][kv][invariant]") {
    // note: a generated token's products, attention and cache rows are a prompt token's (decode_matches_prompt), so
    // a run that recomputes the whole sequence every step writes the same K/V bytes as the cached run, quantized
    // caches included, and gives the same logits.
    const Model model = Model::load(test::shared("testdata/ref/open-gqa-Q4_K_M.gguf"));
    const Tokenizer tok = Tokenizer::from_gguf(model.file);
    const auto prompt = tok.encode("The KV cache stores the keys and values of earlier tokens.", true);
    const int n_vocab = model.config.n_vocab, n_predict = 32;
    auto run = [&](KvType t, MathMode math, bool cache, std::vector<float>& all) {
        Settings s;
        s.n_ctx = 128;
        s.n_threads = 2;
        s.kv_type_k = s.kv_type_v = t;
        s.math = math;
        const std::unique_ptr<Backend> backend = cpu::make_backend(model, s);
        REQUIRE(backend->decode_matches_prompt());
        GenerateOptions g;
        g.n_predict = n_predict;
        g.kv_cache = cache;
        g.sampler.temp = 0.0f;
        return Generator(*backend)
            .run(prompt, g,
                 [&](int32_t, const float* l) {
                     all.insert(all.end(), l, l + n_vocab);
                     return true;
                 },
                 nullptr, n_vocab)
            .tokens;
    };
    for (const auto& [t, math] : {std::pair{KvType::F16, MathMode::Exact}, std::pair{KvType::Q8_0, MathMode::Exact},
                                  std::pair{KvType::Q4_0, MathMode::Exact}, std::pair{KvType::F16, MathMode::Fast},
                                  std::pair{KvType::Q8_0, MathMode::Fast}}) {
        INFO(kv_type_name(t) << ", --math " << math_mode_name(math));
        std::vector<float> cached_logits, recomputed_logits;
        const std::vector<int32_t> cached = run(t, math, true, cached_logits);
        const std::vector<int32_t> recomputed = run(t, math, false, recomputed_logits);
        CHECK(cached.size() == size_t(n_predict));
        CHECK(cached == recomputed);
        CHECK(cached_logits == recomputed_logits);
    }
}

TEST_CASE("a quantized KV cache on a head_dim that is not a multiple of 32 is refused", "[engine][kv]") {
    const Config c = test::attention_config(2, 2, 4);
    CHECK_THROWS_WITH(KvCache(c, 8, KvType::Q8_0), Catch::Contains("head_dim is 4"));
}

TEST_CASE("a KV cache leaves room for the model's mapped weights", "[engine][kv]") {
    const Config c = test::attention_config(2, 2, 32);
    CHECK_NOTHROW(KvCache(c, 8, KvType::F16, KvType::F16, 1 << 20));
    // weights that take all the memory there is leave the cache none (where the machine says what it has)
    if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
        std::fclose(f);
        CHECK_THROWS_WITH(KvCache(c, 8, KvType::F16, KvType::F16, uint64_t(1) << 60),
                          Catch::Contains("of them for the model, a tenth kept free): at most 0 positions fit"));
    }
}
