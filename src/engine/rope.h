#pragma once
// RoPE's angles, shared by the CPU ops, the CUDA kernels and the tests: pair j (< rope_dim / 2) of a head at
// position pos turns by theta = pos / pos_div * base^(-2j / rope_dim) (/ factors[j]), computed in double.
#include <vector>

#include "common/hd.h"

namespace kvgen {

struct Config;
struct Model;

struct RopeFreqs {
    std::vector<double> inv_freq;  // [rope_dim / 2]: base^(-2j / rope_dim)
    std::vector<double> factors;   // [rope_dim / 2] divisors (Llama 3.1's rope_freqs tensor), or empty
    double pos_div = 1.0;          // linear scaling divides positions by this

    // factors: [rope_dim / 2] or empty.
    static RopeFreqs of(const Config& c, const std::vector<float>& factors);
    static RopeFreqs of(const Model& m);  // with the model's rope_freqs tensor when it has one
};

// factors may be null.
KVGEN_HD double rope_theta(int pos, int j, const double* inv_freq, const double* factors, double pos_div) {
    double theta = double(pos) / pos_div * inv_freq[j];
    if (factors) theta /= factors[j];
    return theta;
}

}  // namespace kvgen
