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
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace kvgen;

namespace {

double nrmse(const float* ours, const float* exact, int n) {
    double mean = 0;
    for (int j = 0; j < n; ++j) mean += exact[j];
    mean /= n;
    double err = 0, var = 0;
    for (int j = 0; j < n; ++j) {
        err += (double(ours[j]) - exact[j]) * (double(ours[j]) - exact[j]);
        var += (exact[j] - mean) * (exact[j] - mean);
    }
    return std::sqrt(err / var);
}

void check_reference(const std::string& stem, KvType kv_type, int threads, int n_batch) {
    const std::string dir = test::shared("testdata/ref/");
    std::ifstream jf(dir + stem + ".json");
    REQUIRE(jf.good());
    const nlohmann::json j = nlohmann::json::parse(jf);
    const std::string model_file = j["model"].get<std::string>();
    const std::string model_path =
        model_file == "llama-2-tiny-random.gguf" ? test::shared("testdata/tiny/" + model_file) : dir + model_file;
    const Model model = Model::load(model_path);
    const Tokenizer tok = Tokenizer::from_gguf(model.file);

    const auto prompt = tok.encode(j["prompt"].get<std::string>(), tok.add_bos());
    CHECK(prompt == j["prompt_ids"].get<std::vector<int32_t>>());

    const auto exact_ids = j["ids"].get<std::vector<int32_t>>();
    const auto margins = j["margins"].get<std::vector<double>>();
    const auto rows = j["rows"].get<std::vector<int>>();
    const double tol = std::max(0.01, 1.5 * j["peer_nrmse"].get<double>());
    const double gap = std::max(0.05, 4.0 * j["peer_rms_err"].get<double>());
    const int n_vocab = model.config.n_vocab;
    const auto exact_bytes = test::read_bytes(dir + stem + ".exact.f32");
    REQUIRE(exact_bytes.size() == rows.size() * size_t(n_vocab) * 4);

    cpu::CpuOptions opt;
    opt.n_ctx = 256;
    opt.n_threads = threads;
    opt.kv_type = kv_type;
    opt.n_batch = n_batch;
    cpu::CpuBackend backend(model, opt);
    GenerateOptions gopt;
    gopt.n_predict = int(exact_ids.size());
    gopt.sampler.temp = 0.0f;
    int step = 0, compared = 0;
    bool on_path = true;
    Generator(backend).run(
        prompt, gopt,
        [&](int32_t id, const float* logits) {
            const auto r = std::find(rows.begin(), rows.end(), step);
            if (on_path && r != rows.end()) {
                const float* exact = reinterpret_cast<const float*>(exact_bytes.data()) +
                                     size_t(r - rows.begin()) * size_t(n_vocab);
                const double e = nrmse(logits, exact, n_vocab);
                INFO(stem << " step " << step << " nrmse " << e << " tolerance " << tol);
                CHECK(e <= tol);
                ++compared;
            }
            if (on_path && margins[size_t(step)] > gap) {
                INFO(stem << " step " << step << " margin " << margins[size_t(step)]);
                CHECK(id == exact_ids[size_t(step)]);
            }
            if (id != exact_ids[size_t(step)]) on_path = false;
            ++step;
            return true;
        },
        nullptr, n_vocab);
    CHECK(compared >= 1);
}

const char* const kRefStems[] = {"llama-2-tiny-random.p1", "open-gqa-Q8_0.p1",   "open-gqa-Q8_0.p3",
                                 "open-gqa-Q4_0.p1",       "open-gqa-Q4_0.p3",   "open-gqa-Q4_K_M.p1",
                                 "open-gqa-Q4_K_M.p3",     "open-gqa-Q6_K.p1",   "open-gqa-Q6_K.p3",
                                 "open-mha-F16.p1",        "open-mha-F16.p3"};

}  // namespace

TEST_CASE("every reference case passes the fidelity rules (f16 cache)", "[engine][fidelity]") {
    for (const char* stem : kRefStems) {
        INFO(stem);
        check_reference(stem, KvType::F16, 2, 512);
    }
}

TEST_CASE("every reference case passes the fidelity rules (f32 cache, one thread, batches of 7)",
          "[engine][fidelity]") {
    for (const char* stem : kRefStems) {
        INFO(stem);
        check_reference(stem, KvType::F32, 1, 7);
    }
}

TEST_CASE("one prefill of N tokens gives the logits of N single-token steps", "[engine][invariant]") {
    const Model model = Model::load(test::shared("testdata/ref/open-gqa-Q4_K_M.gguf"));
    std::vector<int32_t> tokens;
    for (int i = 0; i < 40; ++i) tokens.push_back(int32_t(1 + (i * 97) % 4000));
    cpu::CpuOptions opt;
    opt.n_ctx = 64;
    opt.n_threads = 2;
    opt.kv_type = KvType::F32;
    cpu::CpuBackend batched(model, opt), stepped(model, opt);
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
        cpu::CpuOptions opt;
        opt.n_ctx = 128;
        opt.n_threads = threads;
        cpu::CpuBackend backend(model, opt);
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
    cpu::CpuOptions opt;
    opt.n_ctx = 256;
    opt.n_threads = 2;
    cpu::CpuBackend backend(model, opt);
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
