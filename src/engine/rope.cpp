#include "engine/rope.h"

#include <cmath>

#include "model/dequant.h"
#include "model/weights.h"

namespace kvgen {

RopeFreqs RopeFreqs::of(const Config& c, const std::vector<float>& factors) {
    RopeFreqs r;
    const int half = c.rope_dim / 2;
    r.inv_freq.resize(size_t(half));
    for (int j = 0; j < half; ++j) r.inv_freq[size_t(j)] = std::pow(double(c.rope_base), -2.0 * j / double(c.rope_dim));
    r.factors.assign(factors.begin(), factors.end());
    r.pos_div = c.rope_scaling == RopeScaling::Linear ? double(c.rope_scale) : 1.0;
    return r;
}

RopeFreqs RopeFreqs::of(const Model& m) {
    const WeightView& w = m.weights.rope_freqs;
    std::vector<float> factors;
    if (w.tensor) {
        factors.resize(size_t(m.config.rope_dim / 2));
        dequantize_row(w.type, w.data, factors.data(), int64_t(factors.size()));
    }
    return of(m.config, factors);
}

}  // namespace kvgen
