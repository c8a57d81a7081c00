#pragma once
// The shared references (../shared/README.md): prompt ids exact, logits within max(1%, 1.5 x peer_nrmse) of the
// exact math at the saved steps, greedy tokens equal while the exact gap is clear. Used for every backend.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <memory>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "engine/generator.h"
#include "model/weights.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace kvgen::test {

inline double nrmse(const float* ours, const float* exact, int n) {
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

// Runs the reference case `stem` greedily on the backend that make() builds for its model (n_ctx 256). cap: a
// tighter bound on the logits' nRMSE than the rule's (kvgen's exact mode holds 0.5%).
inline void check_reference(const std::string& stem,
                            const std::function<std::unique_ptr<Backend>(const Model&)>& make, double cap = 1.0) {
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
    const double tol = std::min(cap, std::max(0.01, 1.5 * j["peer_nrmse"].get<double>()));
    const double gap = std::max(0.05, 4.0 * j["peer_rms_err"].get<double>());
    const int n_vocab = model.config.n_vocab;
    const auto exact_bytes = test::read_bytes(dir + stem + ".exact.f32");
    REQUIRE(exact_bytes.size() == rows.size() * size_t(n_vocab) * 4);

    const std::unique_ptr<Backend> made = make(model);
    Backend& backend = *made;
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
                const float* exact =
                    reinterpret_cast<const float*>(exact_bytes.data()) + size_t(r - rows.begin()) * size_t(n_vocab);
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

inline const char* const kRefStems[] = {"llama-2-tiny-random.p1", "open-gqa-Q8_0.p1", "open-gqa-Q8_0.p3",
                                        "open-gqa-Q4_0.p1",       "open-gqa-Q4_0.p3", "open-gqa-Q4_K_M.p1",
                                        "open-gqa-Q4_K_M.p3",     "open-gqa-Q6_K.p1", "open-gqa-Q6_K.p3",
                                        "open-mha-F16.p1",        "open-mha-F16.p3"};

}  // namespace kvgen::test
