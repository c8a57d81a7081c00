#pragma once
// Random-weight LLaMA GGUF files of a named or explicit shape, in any supported weight type, with a real
// vocabulary copied from another GGUF. Blocks are written directly with sane scales (no quantization step).
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"

namespace kvgen {

struct SynthShape {
    std::string name;
    int n_embd = 0;
    int n_layers = 0;
    int n_heads = 0;
    int n_kv_heads = 0;
    int n_ff = 0;
    int n_ctx = 0;
    float rope_base = 10000.0f;
    bool tied = false;
};

// tiny, smollm2-135m, tinyllama-1.1b, llama2-7b, llama2-13b.
const std::vector<SynthShape>& synth_shapes();
bool synth_shape(const std::string& name, SynthShape* out);

struct SynthOptions {
    SynthShape shape;
    std::string type = "Q8_0";  // F32, F16, BF16, any supported quant, or Q4_K_M (a Q4_K + Q6_K mix)
    uint64_t seed = 1;
    // Per-tensor type overrides (name -> any ggml type name, also ones kvgen cannot compute with, whose blocks are
    // random bytes): makes files for error-path tests.
    std::vector<std::pair<std::string, std::string>> tensor_types;
};

// The weight types kvgen-synth writes, as accepted by SynthOptions::type.
std::vector<std::string> synth_types();

// Lays out the file: metadata (llama.* from the shape, tokenizer.* copied from vocab) and tensor infos.
// Throws kvgen::Error for an invalid shape or type.
GgufWriter synth_layout(const SynthOptions& opt, const GgufFile& vocab);

// Fills tensor i of a synth_layout writer with seeded random weights (deterministic for a given seed).
void synth_fill(const SynthOptions& opt, const GgufTensor& info, size_t i, uint8_t* dst, uint64_t nbytes);

// Random blocks of one type: rows of cols weights, standard deviation about sigma.
void synth_random_rows(GgmlType type, uint8_t* dst, int64_t rows, int64_t cols, float sigma, uint64_t seed);

}  // namespace kvgen
