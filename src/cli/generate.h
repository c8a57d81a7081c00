#pragma once
#include <string>
#include <vector>

#include "engine/generator.h"
#include "engine/settings.h"

namespace kvgen {

struct GenerateCliOptions {
    std::string model_path;
    std::string prompt;
    std::string system_prompt;                 // --chat: the system turn (empty: the template's default)
    std::vector<std::string> reverse_prompts;  // -r: stop when the output ends with one of these
    int n_predict = -1;
    Settings run;
    bool kv_cache = true;
    bool chat = false;
    bool display_prompt = false;  // print the prompt on stdout before the generated text
    bool special = false;
    bool no_bos = false;
    bool ignore_eos = false;
    bool verbose = false;
    bool no_perf = false;
    long long seed = -1;  // -1: random
    SamplerOptions sampler;
    std::string json_path;
    std::string dump_logits_path;
    std::string prompt_cache_path;  // --prompt-cache
    bool prompt_cache_all = false;  // also save the generated tokens' K/V
    bool prompt_cache_ro = false;   // never write the file
    bool context_shift = true;      // a full context drops half of the tokens after --keep and goes on
    int n_keep = -2;                // --keep: prompt tokens kept (after BOS) by a shift; -1: all; -2: not given
};

// Generates text: streamed to stdout; the model/cache summary and timings to stderr; reports to the named files.
// Returns the exit status: 0, or 130 when a SIGINT stopped the run (after the text, timings and report).
int run_generate(const GenerateCliOptions& opt);

}  // namespace kvgen
