#pragma once
#include <string>
#include <utility>
#include <vector>

#include "engine/kv_layout.h"
#include "engine/settings.h"

namespace kvgen {

// A device of --bench's list (-ngl 0,99 or --device cpu,cuda), as normalize_device gives it, and the flag that asked
// for it (for a device that is not there: "-ngl 99: no CUDA device").
struct BenchDevice {
    std::string device, asked_by;
};

struct BenchOptions {
    std::vector<std::string> model_paths;  // each measured in turn, as llama-bench's -m a -m b
    std::vector<int> threads;              // CPU thread counts, each in turn (empty: run.n_threads)
    std::vector<int> batches;              // -b batch sizes, each in turn (empty: run.n_batch)
    std::vector<std::pair<KvType, KvType>> kv_types;  // K and V cache types, each in turn (empty: run's)
    std::vector<BenchDevice> devices;      // each in turn (empty: run.device)
    std::vector<int> n_prompt = {512};     // prefill tests: pp<N>
    std::vector<int> n_gen = {128};        // decode tests: tg<N>
    std::vector<std::pair<int, int>> prompt_gen;  // -pg P,N: a prompt of P then N generated, timed together
    std::vector<int> depths = {0};         // tokens already in the cache when a test starts
    int repetitions = 5;
    bool kv_cache = true;                  // false: each decode step recomputes the whole sequence
    std::string output = "md";             // md, csv, json, jsonl, sql
    Settings run;                          // its n_ctx is set to what the tests need
};

// `kvgen --bench`, as llama-bench: for each model, device, batch size, KV types and thread count, random tokens, a
// prefill test of each -p size and a decode test of each -n size at each depth, -r repetitions after a warm-up; avg
// +- stddev tokens/s on stdout as a markdown table, or as csv, json, json lines or sql with llama-bench's field names
// (each row as its test ends, json at the end).
void run_bench(const BenchOptions& opt);

// "512,1024" -> {512, 1024}; throws kvgen::Error naming the option for anything else.
std::vector<int> parse_int_list(const std::string& text, const char* option, int min_value);

}  // namespace kvgen
