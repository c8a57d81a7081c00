#pragma once
#include <string>
#include <vector>

#include "engine/kv_cache.h"

namespace kvgen {

struct BenchOptions {
    std::string model_path;
    std::vector<int> n_prompt = {512};  // prefill tests: pp<N>
    std::vector<int> n_gen = {128};     // decode tests: tg<N>
    std::vector<int> depths = {0};      // tokens already in the cache when a test starts
    int repetitions = 5;
    int n_threads = 0;  // 0: physical cores
    int n_batch = 512;
    KvType kv_type = KvType::F16;
    bool kv_cache = true;  // false: each decode step recomputes the whole sequence
    std::string output = "md";  // md, json, csv
    std::string device = "auto";  // cpu, cuda, auto
    bool cuda_graphs = true;
};

// `kvgen --bench`, as llama-bench: random tokens, a prefill test of each -p size and a decode test of each -n size
// at each depth, -r repetitions after a warm-up; avg +- stddev tokens/s as a markdown table, JSON or CSV on stdout.
void run_bench(const BenchOptions& opt);

// "512,1024" -> {512, 1024}; throws kvgen::Error naming the option for anything else.
std::vector<int> parse_int_list(const std::string& text, const char* option, int min_value);

}  // namespace kvgen
