#pragma once
// llama.cpp's spellings on kvgen's command line. llama.cpp parses whole words, so its users type multi-letter flags
// with one dash (-ngl, -fa, -ctk, -sys, -cnv); CLI11 would read those as short flags with glued values (-ngl as
// "-n gl"). Before CLI11 sees the arguments, each is rewritten to kvgen's long name, or answered with one line
// naming the flag and kvgen's nearest option. `-r` follows the tool being imitated: with --bench it is
// llama-bench's repetition count, otherwise llama-completion's reverse prompt.
#include <functional>
#include <string>
#include <vector>

#include "engine/settings.h"

namespace kvgen {

// How many values an option of kvgen's parser takes: -1 when it is not an option, 0 for a flag, 1 otherwise.
using OptionArity = std::function<int(const std::string& name)>;

// The arguments (without argv[0]) with llama.cpp's spellings rewritten. Throws kvgen::Error, naming the flag, for a
// llama.cpp flag kvgen has no counterpart for and for an unknown multi-letter flag with one dash.
std::vector<std::string> translate_llama_flags(const std::vector<std::string>& args, const OptionArity& arity);

// "cpu", "auto", "cuda" or "cudaN" from what --device / -dev accept: those, llama.cpp's device names (CUDA0,
// case-insensitive) and "none" (llama.cpp: do not offload, i.e. the CPU). Throws for a list or an unknown name.
std::string normalize_device(const std::string& value);

// The llama.cpp settings that map onto kvgen's own, as given on the command line (empty / 0: not given).
struct LlamaSettings {
    std::string n_gpu_layers;                // -ngl: N, "auto" or "all"
    std::string flash_attn;                  // -fa: on, off, auto
    std::string cache_type_k, cache_type_v;  // -ctk / -ctv
    int threads_batch = 0;                   // -tb
};

// Folds the llama.cpp settings into kvgen's: -ngl into the device (N > 0 or "all": the GPU, 0: the CPU), -ctk/-ctv
// into the K and V cache types; -tb must equal -t. `run` holds what kvgen's own flags said (device "auto" and n_threads 0
// when not given; kv_type_given: --kv-type was); a contradiction, or a value kvgen cannot honour, is an error.
void apply_llama_settings(const LlamaSettings& s, Settings& run, bool kv_type_given);

}  // namespace kvgen
