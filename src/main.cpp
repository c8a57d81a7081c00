// kvgen: the command line. Parses options, dispatches to a mode, and is the only place that prints errors.
#include <cstdio>
#include <algorithm>
#include <string>
#include <thread>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli/bench.h"
#include "cli/bench_memory.h"
#include "cli/format.h"
#include "cli/inspect.h"
#include "cli/generate.h"
#include "cli/signals.h"
#include "cli/tokenize.h"
#include "common/error.h"
#include "cpu/thread_pool.h"

#ifdef KVGEN_HAVE_CUDA
#include "device.h"
#endif

namespace {

// `--list-devices`, as llama.cpp: the CPU, then each CUDA device this build can use.
void list_devices() {
    std::printf("Available devices:\n  cpu: %u hardware threads\n", std::thread::hardware_concurrency());
#ifdef KVGEN_HAVE_CUDA
    std::string why;
    const auto devices = kvgen::cuda::list_devices(&why);
    for (const auto& d : devices)
        std::printf("  cuda%d: %s (compute %d.%d, %d SMs, %.1f GiB, %.1f GiB free)\n", d.id, d.name.c_str(), d.cc_major,
                    d.cc_minor, d.sm_count, double(d.total_bytes) / (1 << 30), double(d.free_bytes) / (1 << 30));
    if (devices.empty()) std::printf("  cuda: %s\n", why.c_str());
#else
    std::printf("  cuda: this build has no CUDA backend (configure with -DKVGEN_CUDA=ON)\n");
#endif
}

constexpr const char* kDefaultModel = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

// The default model: models/... under the working directory, else beside the build directory of this binary.
std::string default_model_path() {
    if (::access(kDefaultModel, F_OK) == 0) return kDefaultModel;
    char exe[4096];
    const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = '\0';
        std::string dir(exe);
        for (int up = 0; up < 3; ++up) {
            dir = dir.substr(0, dir.find_last_of('/'));
            const std::string candidate = dir + "/" + kDefaultModel;
            if (::access(candidate.c_str(), F_OK) == 0) return candidate;
        }
    }
    return kDefaultModel;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"kvgen: text generation for LLaMA-style GGUF models, built around the KV cache", "kvgen"};
    app.set_version_flag("--version", "kvgen 0.1.0");

    std::string model;
    std::string json_path;
    bool inspect = false;
    bool verbose = false;
    bool devices = false;
    bool bench_memory = false;
    bool bench = false;
    int repetitions = 5;
    std::string depths = "0", output_format = "md";
    bool tokenize = false;
    std::string prompt, prompt_file;
    kvgen::TokenizeOptions tok_opt;
    app.add_option("-m,--model", model, fmt::format("GGUF model file (default: {})", kDefaultModel));
    app.add_flag("--inspect", inspect, "print the model's architecture, tensor types and KV cache cost, then exit");
    app.add_option("--json", json_path, "write a machine-readable report to this file ('-' for stdout with --inspect)");
    app.add_option("-p,--prompt", prompt, "prompt text");
    app.add_option("-f,--file", prompt_file, "read the prompt from a file");
    app.add_flag("--tokenize", tokenize, "print the prompt's token ids on one line (-v: one piece per line), then exit");
    app.add_flag("--no-bos", tok_opt.no_bos, "do not add the BOS token even when the model asks for it");
    app.add_flag("--special", tok_opt.parse_special, "parse control-token text in the prompt (e.g. <|im_start|>)");
    kvgen::GenerateCliOptions gen;
    std::string kv_type = "f16";
    app.add_option("-n,--n-predict", gen.n_predict, "tokens to generate (-1: until end of generation or full context)")
        ->check(CLI::Range(-1, 1 << 30));
    app.add_option("-c,--ctx-size", gen.n_ctx, "context size in tokens (default: min(model context, 4096))")
        ->check(CLI::Range(1, 1 << 24));
    app.add_option("-b,--batch-size", gen.n_batch, "prompt tokens per forward pass")->check(CLI::Range(1, 1 << 16));
    app.add_option("-t,--threads", gen.n_threads, "threads (default: physical cores)")->check(CLI::Range(1, 1024));
    app.add_option("--temp", gen.sampler.temp, "temperature (0: greedy)")->check(CLI::Range(0.0, 100.0));
    app.add_option("--top-k", gen.sampler.top_k, "top-k sampling (0: off)")->check(CLI::Range(0, 1 << 24));
    app.add_option("--top-p", gen.sampler.top_p, "top-p sampling (1: off)")->check(CLI::Range(0.0, 1.0));
    app.add_option("--min-p", gen.sampler.min_p, "min-p sampling (0: off)")->check(CLI::Range(0.0, 1.0));
    app.add_option("--repeat-penalty", gen.sampler.repeat_penalty, "penalty for repeated tokens (1: off)")
        ->check(CLI::Range(0.0, 100.0));
    app.add_option("--repeat-last-n", gen.sampler.repeat_last_n, "tokens the penalty looks back (-1: all)")
        ->check(CLI::Range(-1, 1 << 24));
    app.add_option("-s,--seed", gen.seed, "random seed (-1: random)")->check(CLI::Range(-1LL, 4294967295LL));
    app.add_flag("--no-kv-cache", [&gen](int64_t) { gen.kv_cache = false; },
                 "recompute the whole sequence every step (to measure what the cache buys)");
    app.add_option("--kv-type", kv_type, "KV cache element type")->check(CLI::IsMember({"f16", "f32"}));
    app.add_option("--device", gen.device, "where to run (auto: the GPU when this build and machine have one)")
        ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    app.add_flag("--no-cuda-graphs", [&gen](int64_t) { gen.cuda_graphs = false; },
                 "CUDA: launch the decode step kernel by kernel instead of replaying a captured graph");
    app.add_flag("--chat", gen.chat, "wrap the prompt in the model's chat format");
    app.add_flag("--ignore-eos", gen.ignore_eos, "keep generating past end-of-generation tokens");
    app.add_option("--dump-logits", gen.dump_logits_path, "write each step's logits (float32 rows of n_vocab)");
    app.add_flag("--no-perf", gen.no_perf, "do not print the timing lines");
    app.add_flag("--bench", bench,
                 "benchmark like llama-bench: prefill of -p N[,N..] and decode of -n N random tokens at -d depths");
    app.add_option("-r,--repetitions", repetitions, "--bench: timed runs per test (after a warm-up)")
        ->check(CLI::Range(1, 1000));
    app.add_option("-d,--n-depth", depths, "--bench: tokens already in the KV cache, e.g. 0,1024,4096");
    app.add_option("-o,--output-format", output_format, "--bench: md, json or csv")
        ->check(CLI::IsMember({"md", "json", "csv"}));
    app.add_flag("--bench-memory", bench_memory, "measure memory read bandwidth (the ceiling for decode), then exit");
    app.add_flag("--list-devices", devices, "list the devices kvgen can run on, then exit");
    app.add_flag("-v,--verbose", verbose, "more detail (--inspect: every metadata key)");

    spdlog::set_default_logger(spdlog::stderr_color_st("kvgen"));
    spdlog::set_pattern("kvgen: %l: %v");
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::fprintf(stderr, "kvgen: error: %s (see --help)\n", e.what());
        return 1;
    }

    try {
        if (bench_memory) {
            kvgen::run_bench_memory(gen.n_threads > 0 ? gen.n_threads : kvgen::cpu::ThreadPool::physical_cores());
            return 0;
        }
        if (devices) {
            list_devices();
            return 0;
        }
        if (model.empty()) model = default_model_path();
        if (!json_path.empty()) kvgen::check_writable(json_path);
        if (bench) {
            kvgen::BenchOptions b;
            b.model_path = model;
            if (!prompt.empty()) b.n_prompt = kvgen::parse_int_list(prompt, "-p", 0);
            if (app.count("-n")) b.n_gen = {std::max(0, gen.n_predict)};
            b.depths = kvgen::parse_int_list(depths, "-d", 0);
            b.repetitions = repetitions;
            b.n_threads = gen.n_threads;
            b.n_batch = gen.n_batch;
            b.kv_type = kv_type == "f32" ? kvgen::KvType::F32 : kvgen::KvType::F16;
            b.kv_cache = gen.kv_cache;
            b.output = output_format;
            b.device = gen.device;
            b.cuda_graphs = gen.cuda_graphs;
            kvgen::run_bench(b);
            return 0;
        }
        if (!prompt_file.empty()) {
            if (!prompt.empty()) throw kvgen::Error("give the prompt with -p or -f, not both");
            prompt = kvgen::read_text_file(prompt_file);
        }
        if (tokenize) {
            tok_opt.model_path = model;
            tok_opt.text = prompt;
            tok_opt.verbose = verbose;
            kvgen::run_tokenize(tok_opt);
            return 0;
        }
        if (inspect) {
            kvgen::run_inspect(model, json_path, verbose);
            return 0;
        }
        if (prompt.empty() && prompt_file.empty())
            throw kvgen::Error("no prompt: give -p TEXT or -f FILE (or --inspect / --tokenize)");
        if (json_path == "-") throw kvgen::Error("--json -: stdout carries the generated text; give a file name");
        gen.model_path = model;
        gen.prompt = prompt;
        gen.kv_type = kv_type == "f32" ? kvgen::KvType::F32 : kvgen::KvType::F16;
        gen.special = tok_opt.parse_special;
        gen.no_bos = tok_opt.no_bos;
        gen.verbose = verbose;
        gen.json_path = json_path;
        kvgen::install_signal_handlers();
        return kvgen::run_generate(gen);
    } catch (const kvgen::Error& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "kvgen: error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        std::fflush(stdout);
        std::fprintf(stderr, "kvgen: error: out of memory\n");
        return 1;
    } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "kvgen: error: %s\n", e.what());
        return 1;
    }
}
