#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace kvgen {

Sampler::Sampler(const SamplerOptions& opt) : opt_(opt), rng_(opt.seed) {}

int32_t Sampler::sample(const float* logits, int n_vocab, const std::vector<int32_t>& history) {
    work_.assign(logits, logits + n_vocab);
    if (opt_.repeat_penalty != 1.0f && opt_.repeat_last_n != 0) {
        const size_t n = opt_.repeat_last_n < 0 ? history.size()
                                                : std::min(history.size(), size_t(opt_.repeat_last_n));
        for (size_t k = history.size() - n; k < history.size(); ++k) {
            const int32_t id = history[k];
            if (id < 0 || id >= n_vocab) continue;
            // note: each distinct token is penalized once, as llama.cpp does.
            bool earlier = false;
            for (size_t m = history.size() - n; m < k; ++m) earlier |= history[m] == id;
            if (earlier) continue;
            float& v = work_[size_t(id)];
            v = v > 0 ? v / opt_.repeat_penalty : v * opt_.repeat_penalty;
        }
    }
    if (opt_.temp <= 0.0f) {
        // greedy: the first maximum, so ties resolve the same way every run
        return int32_t(std::max_element(work_.begin(), work_.end()) - work_.begin());
    }
    cand_.clear();
    for (int32_t i = 0; i < n_vocab; ++i) cand_.emplace_back(work_[size_t(i)], i);
    auto by_logit = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    size_t keep = cand_.size();
    if (opt_.top_k > 0 && size_t(opt_.top_k) < keep) keep = size_t(opt_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + long(keep), cand_.end(), by_logit);
    cand_.resize(keep);
    // Probabilities of the survivors (before temperature, as llama.cpp's top-p and min-p see them).
    const float mx = cand_[0].first;
    double sum = 0.0;
    std::vector<double>& p = probs_;
    p.resize(keep);
    for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp(double(cand_[i].first - mx));
    if (opt_.top_p < 1.0f) {
        double cum = 0.0;
        size_t last = keep;
        for (size_t i = 0; i < keep; ++i) {
            cum += p[i] / sum;
            if (cum >= double(opt_.top_p)) {
                last = i + 1;
                break;
            }
        }
        keep = last;
    }
    if (opt_.min_p > 0.0f) {
        size_t last = 1;
        while (last < keep && p[last] >= double(opt_.min_p) * p[0]) ++last;
        keep = last;
    }
    // temperature, then draw
    double total = 0.0;
    for (size_t i = 0; i < keep; ++i) total += p[i] = std::exp(double(cand_[i].first - mx) / double(opt_.temp));
    std::uniform_real_distribution<double> u(0.0, total);
    const double r = u(rng_);
    double cum = 0.0;
    for (size_t i = 0; i < keep; ++i) {
        cum += p[i];
        if (r < cum) return cand_[i].second;
    }
    return cand_[keep - 1].second;
}

}  // namespace kvgen
