#pragma once
// Prompt-cache files (--prompt-cache FILE): the tokens a run evaluated and the K/V the model wrote for them, so that a
// later run whose prompt starts with the same tokens loads their cache rows instead of computing them again.
//
// A file is a header, the tokens (int32), K as [n_layers][n_kv_heads][n_tokens][k_row_bytes] and V likewise (the
// rows exactly as the KV cache holds them, so a file from the CPU loads on the GPU and back when the types match),
// then an FNV-1a of everything before it. The header names the format version, the model (a fingerprint of its
// metadata, tokenizer, tensor shapes and samples of every tensor's bytes), the KV types, the head layout and the
// --math mode; a file that differs in any of them, or is damaged, is not used. Files are written whole or not at
// all.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/settings.h"
#include "model/weights.h"

namespace kvgen {

// What identifies a model for its cache rows: every metadata key and value (the tokenizer included), every tensor's
// name, type and shape, and 3 x 64 bytes from the start, middle and end of its data.
uint64_t model_fingerprint(const Model& model);

struct PromptCacheLoad {
    int n_file = 0;       // tokens in the file (0 when it was not used)
    int n_reused = 0;     // leading prompt tokens whose K/V came from it
    double load_ms = 0;   // reading the file and writing the rows into the cache
    double saved_ms = 0;  // what computing those rows took in the run(s) that wrote them
    std::string problem;  // why the file was not used ("" when it was, or when it does not exist)
};

// Why `path` is not to be replaced by a prompt-cache file: it exists and is not one (nor one cut short), as a model
// given by mistake, a directory or a FIFO; "" when it may be written.
std::string prompt_cache_foreign(const std::string& path);

// Loads `path` into the backend's cache: the K/V of the longest common prefix of the file's tokens and `prompt`, at
// most prompt.size() - 1 tokens (the last prompt token is always evaluated, for its logits); the backend's n_past
// becomes n_reused. A missing file is no problem; one from another model, KV type or layout, or damaged, is reported
// in `problem` and leaves the cache empty. math: the run's --math (rows computed in another mode are not used).
PromptCacheLoad load_prompt_cache(const std::string& path, Backend& backend, uint64_t model, MathMode math,
                                  const std::vector<int32_t>& prompt);

// Writes `tokens` (positions 0 .. tokens.size() of the backend's cache hold their K/V) to `path`, atomically;
// compute_ms: what computing those rows took (carried into later loads' saved_ms). Throws kvgen::Error when the
// file cannot be written.
void save_prompt_cache(const std::string& path, Backend& backend, uint64_t model, MathMode math,
                       const std::vector<int32_t>& tokens, double compute_ms);

}  // namespace kvgen
