#pragma once
// Typed views of a model's weights inside the mapped GGUF file, bound by name and checked against the Config.
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/config.h"

namespace kvgen {

// A matrix of `rows` rows of `cols` weights (cols contiguous, = ne[0]), in its GGUF type, read in place.
struct WeightView {
    const GgufTensor* tensor = nullptr;
    GgmlType type = GgmlType::F32;
    int64_t cols = 0;
    int64_t rows = 0;
    int64_t row_bytes = 0;
    const uint8_t* data = nullptr;

    const uint8_t* row(int64_t r) const { return data + r * row_bytes; }
};

struct LayerWeights {
    WeightView attn_norm;  // [n_embd]
    WeightView wq;         // [n_heads * head_dim] rows of n_embd
    WeightView wk;         // [n_kv_heads * head_dim] rows of n_embd
    WeightView wv;         // [n_kv_heads * head_dim] rows of n_embd
    WeightView wo;         // [n_embd] rows of n_heads * head_dim
    WeightView ffn_norm;   // [n_embd]
    WeightView w_gate;     // [n_ff] rows of n_embd
    WeightView w_up;       // [n_ff] rows of n_embd
    WeightView w_down;     // [n_embd] rows of n_ff
};

struct ModelWeights {
    WeightView token_embd;   // [n_vocab] rows of n_embd
    WeightView output_norm;  // [n_embd]
    WeightView output;       // [n_vocab] rows of n_embd; the token_embd view when tied
    bool tied_output = false;
    WeightView rope_freqs;   // [rope_dim / 2] frequency divisors (Llama 3.1), absent: tensor == nullptr
    std::vector<LayerWeights> layers;
};

// Binds every tensor the forward pass reads. A missing tensor, a wrong shape or an unsupported type is a
// kvgen::Error naming the tensor, what it has and what was expected.
ModelWeights bind_weights(const GgufFile& f, const Config& c);

// One loaded model: the mapped file, its config and the weight views into it.
struct Model {
    GgufFile file;
    Config config;
    ModelWeights weights;

    static Model load(const std::string& path);
};

}  // namespace kvgen
