#pragma once
// Model hyper-parameters from a GGUF's `llama.*` metadata, with llama.cpp's documented defaults.
#include <cstdint>
#include <string>

#include "gguf/gguf.h"

namespace kvgen {

enum class RopeScaling { None, Linear };

struct Config {
    std::string name;  // general.name, or the file name
    int n_vocab = 0;
    int n_embd = 0;
    int n_ff = 0;
    int n_layers = 0;
    int n_heads = 0;
    int n_kv_heads = 0;
    int head_dim = 0;
    int rope_dim = 0;  // leading dimensions of each head that RoPE rotates
    int n_ctx_train = 0;
    float rope_base = 10000.0f;
    float rms_eps = 1e-5f;
    RopeScaling rope_scaling = RopeScaling::None;
    float rope_scale = 1.0f;  // linear scaling: positions are divided by this factor

    // Reads and validates the config; throws kvgen::Error naming the file and key.
    static Config from_gguf(const GgufFile& f);

    int n_rep() const { return n_heads / n_kv_heads; }  // query heads per KV head
};

// "llama" or whatever general.architecture says ("" when absent).
std::string gguf_architecture(const GgufFile& f);

}  // namespace kvgen
