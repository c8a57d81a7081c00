#include "cli/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/format.h"
#include "common/error.h"
#include "cli/backend_select.h"
#include "engine/generator.h"
#include "model/weights.h"

namespace kvgen {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Test {
    std::string name;  // pp512, tg128 @ d1024
    int n_prompt = 0, n_gen = 0, depth = 0;
    std::vector<double> tok_s;
};

// Fills the cache with `depth` tokens (untimed), in batches.
void fill(Backend& b, const std::vector<int32_t>& tokens, int depth) {
    b.kv_truncate(0);
    prefill(b, tokens.data(), 0, depth);
}

// Seconds for one repetition of a test.
double run_once(Backend& b, const std::vector<int32_t>& tokens, const Test& t, bool kv_cache) {
    fill(b, tokens, t.depth);
    if (t.n_prompt > 0) {
        const auto t0 = Clock::now();
        prefill(b, tokens.data(), t.depth, t.depth + t.n_prompt);
        return seconds_since(t0);
    }
    const auto t0 = Clock::now();
    for (int k = 0; k < t.n_gen; ++k) {
        const int pos = t.depth + k;
        if (kv_cache) {
            b.forward(tokens.data() + pos, 1, pos, Pass::Decode);
        } else {  // recompute the whole sequence through the prefill path, as --no-kv-cache generation does
            b.kv_truncate(0);
            prefill(b, tokens.data(), 0, pos + 1);
        }
    }
    return seconds_since(t0);
}

std::string model_label(const Model& m, int64_t* params, uint64_t* bytes) {
    std::map<std::string, uint64_t> by_type;
    *params = 0;
    *bytes = 0;
    for (const GgufTensor& t : m.file.tensors()) {
        *params += t.n_elements();
        *bytes += t.nbytes;
        if (t.n_dims == 2) by_type[ggml_type_name(t.type)] += t.nbytes;
    }
    std::string main_type;
    uint64_t most = 0;
    for (const auto& [name, b] : by_type)
        if (b > most) {
            most = b;
            main_type = name;
        }
    return fmt::format("llama {} {}", human_count(double(*params)), main_type);
}

// The markdown table's size and params as llama-bench prints them: "5.19 MiB", "3.56 GiB"; "5.11 M", "6.74 B".
std::string bench_size(uint64_t bytes) {
    const double mib = double(bytes) / (1024.0 * 1024.0);
    return mib < 1024.0 ? fmt::format("{:.2f} MiB", mib) : fmt::format("{:.2f} GiB", mib / 1024.0);
}
std::string bench_params(int64_t n) {
    return n < 1000000000 ? fmt::format("{:.2f} M", double(n) / 1e6) : fmt::format("{:.2f} B", double(n) / 1e9);
}

}  // namespace

std::vector<int> parse_int_list(const std::string& text, const char* option, int min_value) {
    std::vector<int> out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        size_t used = 0;
        int v = 0;
        try {
            v = std::stoi(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (item.empty() || used != item.size() || v < min_value)
            throw Error(fmt::format("{} '{}': expected a comma-separated list of integers >= {}", option, text,
                                    min_value));
        out.push_back(v);
    }
    if (out.empty()) throw Error(fmt::format("{}: empty list", option));
    return out;
}

void run_bench(const BenchOptions& opt) {
    if (opt.output != "md" && opt.output != "json" && opt.output != "csv")
        throw Error(fmt::format("-o '{}': expected md, json or csv", opt.output));
    std::vector<Test> tests;
    for (int d : opt.depths) {
        const std::string at = d > 0 ? fmt::format(" @ d{}", d) : "";
        for (int p : opt.n_prompt)
            if (p > 0) tests.push_back({fmt::format("pp{}{}", p, at), p, 0, d, {}});
        for (int n : opt.n_gen)
            if (n > 0) tests.push_back({fmt::format("tg{}{}", n, at), 0, n, d, {}});
    }
    if (tests.empty()) throw Error("--bench: every -p and -n is 0, so there is nothing to measure");
    int need = 1;
    for (const Test& t : tests) {
        const int64_t positions = int64_t(t.depth) + t.n_prompt + t.n_gen;
        if (positions > kMaxCtx)
            throw Error(fmt::format("{} needs {} positions, more than a context holds ({})", t.name, positions,
                                    kMaxCtx));
        need = std::max(need, int(positions));
    }
    resolve_device(opt.run.device);  // a missing device fails before the model loads
    const Model model = Model::load(opt.model_path);
    const Config& c = model.config;

    Settings run = opt.run;
    run.n_ctx = need;
    SelectedBackend selected = make_backend(model, run);
    Backend& backend = *selected.backend;
    const bool cuda = selected.device == "cuda";
    std::fprintf(stderr, "kvgen: bench on %s\n", selected.description.c_str());

    std::mt19937 rng(1234);
    std::uniform_int_distribution<int32_t> dist(0, c.n_vocab - 1);
    std::vector<int32_t> tokens(static_cast<size_t>(need));
    for (int32_t& t : tokens) t = dist(rng);

    for (Test& t : tests) {
        std::fprintf(stderr, "kvgen: bench %s: warm-up + %d runs\n", t.name.c_str(), opt.repetitions);
        run_once(backend, tokens, t, opt.kv_cache);
        const int n = t.n_prompt > 0 ? t.n_prompt : t.n_gen;
        for (int r = 0; r < opt.repetitions; ++r) t.tok_s.push_back(n / run_once(backend, tokens, t, opt.kv_cache));
    }

    int64_t params = 0;
    uint64_t bytes = 0;
    const std::string label = model_label(model, &params, &bytes);
    const std::string backend_base = cuda ? "CUDA" : "CPU";
    std::string backend_name = opt.kv_cache ? backend_base : backend_base + " (no KV cache)";
    if (run.math != MathMode::Exact) backend_name += fmt::format(" --math {}", math_mode_name(run.math));
    auto stats = [](const std::vector<double>& v, double* avg, double* sd) {
        *avg = 0;
        for (double x : v) *avg += x;
        *avg /= double(v.size());
        *sd = 0;
        for (double x : v) *sd += (x - *avg) * (x - *avg);
        *sd = v.size() > 1 ? std::sqrt(*sd / double(v.size() - 1)) : 0.0;
    };

    // The KV cache's element types, as llama-bench names them (the markdown table shows them when not f16).
    const std::string type_k = kv_type_name(run.kv_type_k), type_v = kv_type_name(run.kv_type_v);
    const bool kv_types = run.kv_type_k != KvType::F16 || run.kv_type_v != KvType::F16;
    std::string out;
    if (opt.output == "md") {
        out += kv_types ? "| model | size | params | backend | threads | type_k | type_v | test | t/s |\n"
                        : "| model | size | params | backend | threads | test | t/s |\n";
        out += kv_types ? "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n"
                        : "| --- | ---: | ---: | --- | ---: | ---: | ---: |\n";
        for (const Test& t : tests) {
            double avg, sd;
            stats(t.tok_s, &avg, &sd);
            out += fmt::format("| {} | {} | {} | {} | {} | {}{} | {:.2f} ± {:.2f} |\n", label, bench_size(bytes),
                               bench_params(params), backend_name, selected.n_threads,
                               kv_types ? fmt::format("{} | {} | ", type_k, type_v) : "", t.name, avg, sd);
        }
    } else if (opt.output == "csv") {
        out += "model,size,params,backend,threads,kv_cache,math,type_k,type_v,test,n_prompt,n_gen,n_depth,avg_ts,"
               "stddev_ts\n";
        for (const Test& t : tests) {
            double avg, sd;
            stats(t.tok_s, &avg, &sd);
            out += fmt::format("\"{}\",{},{},{},{},{},{},{},{},{},{},{},{},{:.4f},{:.4f}\n", label, bytes, params,
                               backend_base, selected.n_threads, opt.kv_cache ? 1 : 0, math_mode_name(run.math), type_k,
                               type_v, t.name, t.n_prompt, t.n_gen, t.depth, avg, sd);
        }
    } else {
        nlohmann::ordered_json arr = nlohmann::ordered_json::array();
        for (const Test& t : tests) {
            double avg, sd;
            stats(t.tok_s, &avg, &sd);
            arr.push_back({{"model", label},         {"model_file", opt.model_path}, {"size", bytes},
                           {"params", params},       {"backend", backend_base},      {"threads", selected.n_threads},
                           {"kv_cache", opt.kv_cache}, {"math", math_mode_name(run.math)},
                           {"type_k", type_k},       {"type_v", type_v},
                           {"test", t.name},             {"n_prompt", t.n_prompt},
                           {"n_gen", t.n_gen},       {"n_depth", t.depth},          {"avg_ts", avg},
                           {"stddev_ts", sd},        {"samples_ts", t.tok_s},      {"device", selected.description}});
        }
        out = arr.dump(2) + "\n";
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
}

}  // namespace kvgen
