#pragma once
// Turns logits into the next token. The chain and defaults follow llama.cpp: repetition penalty over the last
// repeat_last_n tokens, then top-k, top-p, min-p on the distribution, then temperature and a seeded draw.
// temp <= 0 is greedy (argmax after the penalty).
#include <cstdint>
#include <random>
#include <vector>

namespace kvgen {

struct SamplerOptions {
    float temp = 0.8f;
    int top_k = 40;  // <= 0: off
    float top_p = 0.95f;
    float min_p = 0.05f;
    float repeat_penalty = 1.0f;  // 1: off
    int repeat_last_n = 64;
    uint32_t seed = 0;
};

class Sampler {
public:
    explicit Sampler(const SamplerOptions& opt);
    // history: every token so far (prompt and generated), for the penalty. Allocates nothing after the first call.
    int32_t sample(const float* logits, int n_vocab, const std::vector<int32_t>& history);

private:
    SamplerOptions opt_;
    std::mt19937 rng_;
    std::vector<float> work_;
    std::vector<std::pair<float, int32_t>> cand_;
    std::vector<double> probs_;
};

}  // namespace kvgen
