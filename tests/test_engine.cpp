// The CPU engine against the shared references (../shared/README.md: prompt ids exact, logits within
// max(1%, 1.5 x peer_nrmse) of the exact math, greedy tokens equal while the exact gap is clear), and the
// invariants that catch KV-cache bugs: batched prefill equals token-by-token decode, cached equals recomputed.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cpu/cpu_backend.h"
#include "engine/generator.h"
#include "model/weights.h"
#include "reference_check.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace kvgen;
using test::check_reference;
using test::kRefStems;

namespace {

std::function<std::unique_ptr<Backend>(const Model&)> cpu_backend(KvType kv_type, int threads, int n_batch) {
    return [=](const Model& model) -> std::unique_ptr<Backend> {
        Settings s;
        s.n_ctx = 256;
        s.n_threads = threads;
        s.kv_type = kv_type;
        s.n_batch = n_batch;
        return cpu::make_backend(model, s);
    };
}

}  // namespace

TEST_CASE("every reference case passes the fidelity rules (f16 cache)", "[engine][fidelity]") {
    for (const char* stem : kRefStems) {
        INFO(stem);
        check_reference(stem, cpu_backend(KvType::F16, 2, 512));
    }
}

TEST_CASE("every reference case passes the fidelity rules (f32 cache, one thread, batches of 7)",
          "[engine][fidelity]") {
    for (const char* stem : kRefStems) {
        INFO(stem);
        check_reference(stem, cpu_backend(KvType::F32, 1, 7));
    }
}

TEST_CASE("one prefill of N tokens gives the logits of N single-token steps", "[engine][invariant]") {
    const Model model = Model::load(test::shared("testdata/ref/open-gqa-Q4_K_M.gguf"));
    std::vector<int32_t> tokens;
    for (int i = 0; i < 40; ++i) tokens.push_back(int32_t(1 + (i * 97) % 4000));
    Settings opt;
    opt.n_ctx = 64;
    opt.n_threads = 2;
    opt.kv_type = KvType::F32;
    const std::unique_ptr<Backend> batched_backend = cpu::make_backend(model, opt);
    const std::unique_ptr<Backend> stepped_backend = cpu::make_backend(model, opt);
    Backend& batched = *batched_backend;
    Backend& stepped = *stepped_backend;
    const int n_vocab = model.config.n_vocab;
    const float* a = batched.forward(tokens.data(), int(tokens.size()), 0);
    std::vector<float> la(a, a + n_vocab);
    const float* b = nullptr;
    for (int i = 0; i < int(tokens.size()); ++i) b = stepped.forward(&tokens[size_t(i)], 1, i);
    // Relative to the logits' scale (their largest magnitude): single elements near zero have no meaningful
    // relative error.
    double max_diff = 0, max_mag = 0;
    for (int j = 0; j < n_vocab; ++j) {
        max_diff = std::max(max_diff, std::fabs(double(la[size_t(j)]) - b[j]));
        max_mag = std::max(max_mag, std::fabs(double(b[j])));
    }
    INFO("max difference " << max_diff << " of logits up to " << max_mag);
    CHECK(max_diff <= 1e-3 * max_mag);
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
