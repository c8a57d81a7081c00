#pragma once
#include <string>
#include <vector>

#include "engine/settings.h"

namespace kvgen {

struct BenchOptions {
    std::string model_path;
    std::vector<int> n_prompt = {512};  // prefill tests: pp<N>
    std::vector<int> n_gen = {128};     // decode tests: tg<N>
    std::vector<int> depths = {0};      // tokens already in the cache when a test starts
    int repetitions = 5;
    bool kv_cache = true;       // false: each decode step recomputes the whole sequence
    std::string output = "md";  // md, csv, json, jsonl, sql
    Settings run;               // its n_ctx is set to what the tests need
};

// `kvgen --bench`, as llama-bench: random tokens, a prefill test of each -p size and a decode test of each -n size
// at each depth, -r repetitions after a warm-up; avg +- stddev tokens/s as a markdown table, JSON or CSV on stdout.
void run_bench(const BenchOptions& opt);

// "512,1024" -> {512, 1024}; throws kvgen::Error naming the option for anything else.
std::vector<int> parse_int_list(const std::string& text, const char* option, int min_value);

}  // namespace kvgen
