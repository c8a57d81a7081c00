// kvgen: the command line. Parses options, dispatches to a mode, and is the only place that prints errors.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "cli/backend_select.h"
#include "cli/bench.h"
#include "cli/bench_memory.h"
#include "cli/conversation.h"
#include "cli/format.h"
#include "cli/generate.h"
#include "cli/inspect.h"
#include "cli/llama_flags.h"
#include "cli/perplexity.h"
#include "cli/prompt.h"
#include "cli/signals.h"
#include "cli/tokenize.h"
#include "common/build_info.h"
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
    for (const auto& d : devices) {
        std::printf("  cuda%d: %s (compute %d.%d, %d SMs, %.1f GiB, %.1f GiB free", d.id, d.name.c_str(), d.cc_major,
                    d.cc_minor, d.sm_count, double(d.total_bytes) / (1 << 30), double(d.free_bytes) / (1 << 30));
        if (d.peak_gbs > 0) std::printf(", memory %.0f GB/s", d.peak_gbs);  // (scripts/gpu-check.sh reads it)
        std::printf(")\n");
    }
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

// A float option's check: finite (CLI11's Range lets NaN through: every comparison with it is false) and in range.
CLI::Validator finite_range(double lo, double hi) {
    return CLI::Validator(
        [lo, hi](std::string& s) -> std::string {
            double v = 0;
            if (!CLI::detail::lexical_cast(s, v) || !std::isfinite(v) || v < lo || v > hi)
                return fmt::format("value {} not a number in [{} - {}]", s, lo, hi);
            return {};
        },
        fmt::format("FLOAT in [{} - {}]", lo, hi));
}

// The arguments with llama.cpp's spellings rewritten (llama_flags.h), reversed as CLI11's parse() takes them.
std::vector<std::string> translated_args(const CLI::App& app, int argc, char** argv) {
    auto arity = [&app](const std::string& name) {
        const CLI::Option* o = name.size() > 1 && name[0] == '-' ? app.get_option_no_throw(name) : nullptr;
        return o == nullptr ? -1 : o->get_items_expected_min() > 0 ? 1 : 0;
    };
    std::vector<std::string> args =
        kvgen::translate_llama_flags(std::vector<std::string>(argv + 1, argv + argc), arity);
    std::reverse(args.begin(), args.end());
    return args;
}

// -t, -b or -n: a count from min to max, or with --bench a list of them ("1,2,4"); empty when not given. option and
// what name it in the message ("-t/--threads", "threads").
std::vector<int> count_list(const std::string& text, bool given, bool bench, const char* option, const char* what,
                            int min, int max) {
    if (!given) return {};
    std::vector<int> out;
    try {
        out = kvgen::parse_int_list(text, option, min);
    } catch (const kvgen::Error&) {
        out.clear();
    }
    const bool fits = !out.empty() && *std::max_element(out.begin(), out.end()) <= max;
    if (!fits || (!bench && out.size() > 1))
        throw kvgen::Error(fmt::format("{} '{}': expected a number of {} from {} to {}{}", option, text, what, min, max,
                                       bench                                     ? ", or a comma-separated list of them"
                                       : text.find(',') != std::string::npos ? " (a list of them is for --bench)"
                                                                                 : ""));
    return out;
}

bool has_comma(const std::string& text) {
    return text.find(',') != std::string::npos;
}

// "a,b" -> {"a", "b"}; an empty item throws kvgen::Error naming the option and what the list holds.
std::vector<std::string> split_list(const std::string& text, const char* option, const char* what) {
    std::vector<std::string> out;
    size_t start = 0;
    for (;;) {
        const size_t comma = text.find(',', start);
        out.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (out.back().empty())
            throw kvgen::Error(fmt::format("{} '{}': expected a comma-separated list of {}", option, text, what));
        if (comma == std::string::npos) return out;
        start = comma + 1;
    }
}

// The KV types --bench measures in turn: --kv-type A,B,C (each as --kv-type takes it, K/V for a pair), or -ctk and
// -ctv lists as llama-bench takes them (every K type with every V type); empty for a single type (one value, or none:
// the settings' own). Lists outside --bench, or with both spellings, are errors. The lists are taken out of *llama.
std::vector<std::pair<kvgen::KvType, kvgen::KvType>> bench_kv_types(const std::string& kv_type, bool kv_type_given,
                                                                     kvgen::LlamaSettings* llama, bool bench) {
    const bool listed = has_comma(kv_type), k_listed = has_comma(llama->cache_type_k),
               v_listed = has_comma(llama->cache_type_v);
    if (!listed && !k_listed && !v_listed) return {};
    if (!bench) throw kvgen::Error("a list of KV cache types (--kv-type, -ctk, -ctv) is for --bench");
    const auto split = [](const std::string& text, const char* option) {
        return split_list(text, option, "KV cache types");
    };
    std::vector<std::pair<kvgen::KvType, kvgen::KvType>> out;
    if (listed) {
        if (!llama->cache_type_k.empty() || !llama->cache_type_v.empty())
            throw kvgen::Error("--kv-type with a list and -ctk/-ctv: give the types one way");
        for (const std::string& name : split(kv_type, "--kv-type")) {
            kvgen::KvType k, v;
            kvgen::kv_types_from_name(name, "--kv-type", &k, &v);
            out.emplace_back(k, v);
        }
        return out;
    }
    if (kv_type_given) throw kvgen::Error("-ctk/-ctv lists and --kv-type: give the types one way");
    std::vector<kvgen::KvType> ks{kvgen::KvType::F16}, vs{kvgen::KvType::F16};
    auto types = [&](const std::string& text, const char* option) {
        std::vector<kvgen::KvType> t;
        for (std::string name : split(text, option)) {
            for (char& c : name) c = char(std::tolower(static_cast<unsigned char>(c)));
            t.push_back(kvgen::kv_type_from_name(name, option));
        }
        return t;
    };
    if (!llama->cache_type_k.empty()) ks = types(llama->cache_type_k, "-ctk");
    if (!llama->cache_type_v.empty()) vs = types(llama->cache_type_v, "-ctv");
    for (kvgen::KvType k : ks)
        for (kvgen::KvType v : vs) out.emplace_back(k, v);
    llama->cache_type_k.clear();
    llama->cache_type_v.clear();
    return out;
}

// --bench compares devices in one run, as llama-bench's -ngl 0,99: --device cpu,cuda, or an -ngl list (each value as
// -ngl alone takes it: 0 the CPU, N > 0 or all the GPU, auto). The first goes to *device (and -ngl is cleared), so
// that the checks of a single device see one; returns the devices with the flag that asked for each, or nothing
// where neither is a list.
std::vector<kvgen::BenchDevice> bench_devices(std::string* device, kvgen::LlamaSettings* llama, bool bench) {
    const bool listed = has_comma(*device), ngl_listed = has_comma(llama->n_gpu_layers);
    if (!listed && !ngl_listed) return {};
    if (!bench)
        throw kvgen::Error(fmt::format("{} '{}': kvgen runs a model on one device (a list of them is for --bench)",
                                       listed ? "--device" : "-ngl", listed ? *device : llama->n_gpu_layers));
    if ((listed && !llama->n_gpu_layers.empty()) || (ngl_listed && *device != "auto"))
        throw kvgen::Error("--device and -ngl with a list: give the devices one way");
    std::vector<kvgen::BenchDevice> out;
    if (listed) {
        for (const std::string& d : split_list(*device, "--device", "devices"))
            out.push_back({kvgen::normalize_device(d), fmt::format("--device {}", d)});
    } else {
        for (const std::string& n : split_list(llama->n_gpu_layers, "-ngl/--n-gpu-layers", "layer counts")) {
            kvgen::Settings one;
            kvgen::LlamaSettings l;
            l.n_gpu_layers = n;
            kvgen::apply_llama_settings(l, one, false);
            out.push_back({one.device, fmt::format("-ngl {}", n)});
        }
        llama->n_gpu_layers.clear();
    }
    *device = out.front().device;
    return out;
}

// Refuses an option that only means something in another mode, rather than ignoring it.
void only_with(const CLI::App& app, const char* option, bool mode, const char* mode_name) {
    if (!mode && app.count(option) > 0) throw kvgen::Error(fmt::format("{} only applies to {}", option, mode_name));
}

// A CUDA option of two spelled values (--NAME A|B, in `values`' order): *on becomes whether the one given is on_value.
// The setting keeps its default when the option is not given.
void add_cuda_choice(CLI::App& app, const std::string& name, bool* on, const std::vector<std::string>& values,
                     const std::string& on_value, const std::string& help) {
    app.add_option_function<std::string>(
           name, [on, on_value](const std::string& v) { *on = v == on_value; }, help)
        ->check(CLI::IsMember(values));
}
// A whole decimal number, all of text, into *out.
bool parse_int(const std::string& text, int* out) {
    const char* end = text.data() + text.size();
    const auto r = std::from_chars(text.data(), end, *out);
    return !text.empty() && r.ec == std::errc() && r.ptr == end;
}

// A CUDA option that takes one of a few numbers, straight into its setting (which keeps its default when not given).
void add_cuda_number(CLI::App& app, const std::string& name, int* value, const std::vector<int>& values,
                     const std::string& help) {
    app.add_option(name, *value, help)->check(CLI::IsMember(values));
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"kvgen: text generation for LLaMA-style GGUF models, built around the KV cache", "kvgen"};
    app.set_version_flag("--version", fmt::format("kvgen {} (build {}, commit {})", kvgen::version(),
                                                   kvgen::build_number(), kvgen::build_commit()));
    app.footer(
        "llama.cpp spellings are accepted: -ngl N (0: CPU, N > 0: GPU), -dev, -fa, -ctk/-ctv, -tb, -sys, -sysf, -st, "
        "-no-cnv, -sp, -pg.\n-r is the reverse prompt when generating and the repetition count with --bench (as in "
        "llama-completion and llama-bench).");

    std::string model;
    std::vector<std::string> models;  // -m, given once (or several times with --bench)
    std::string threads;              // -t: a count (a list with --bench)
    std::string json_path;
    bool inspect = false;
    bool verbose = false;
    bool devices = false;
    bool bench_memory = false;
    bool bench = false;
    bool perplexity = false;
    int repetitions = 5;
    std::string depths = "0", output_format = "md";
    bool tokenize = false;
    bool escape = true;
    std::string prompt, prompt_file, system_file;
    kvgen::TokenizeOptions tok_opt;
    kvgen::LlamaSettings llama;
    app.add_option("-m,--model", models,
                   fmt::format("GGUF model file (default: {}; --bench: -m again, or a list a,b, for each model "
                               "to measure)",
                               kDefaultModel))
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->allow_extra_args(false)
        ->type_name("FILE");
    app.add_flag("--inspect", inspect, "print the model's architecture, tensor types and KV cache cost, then exit");
    app.add_option("--json", json_path, "write a machine-readable report to this file ('-' for stdout with --inspect)");
    // note: -p, -n, -b, -t and -d are lists with --bench, where, as in llama-bench, each repeat adds to its list
    // (bench_list, below); elsewhere each is given once
    std::vector<std::string> prompt_args, n_predict_args, batch_args, threads_args, depth_args;
    const auto repeatable = [](CLI::Option* o) {
        return o->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->allow_extra_args(false);
    };
    repeatable(app.add_option("-p,--prompt", prompt_args, "prompt text (--bench: prompt sizes, a list)"))
        ->type_name("TEXT");
    app.add_option("-f,--file", prompt_file,
                   "read the prompt from a file ('-': standard input; without -p or -f a piped input is read)");
    app.add_flag("-e,--escape,!--no-escape", escape,
                 "process \\n \\r \\t \\' \\\" \\\\ \\xHH in -p, -f, -sys and -r text (default: on, as llama.cpp)");
    app.add_flag("--tokenize", tokenize,
                 "print the prompt's token ids on one line (-v: one piece per line), then exit");
    app.add_flag("--no-bos", tok_opt.no_bos, "do not add the BOS token even when the model asks for it");
    app.add_flag("--special", tok_opt.parse_special,
                 "control tokens: parse their text in the prompt (e.g. <|im_start|>) and print them in the output");
    kvgen::GenerateCliOptions gen;
    std::string kv_type = kvgen::kv_types_name(gen.run.kv_type_k, gen.run.kv_type_v);
    std::string n_predict;  // -n: a count (a list with --bench)
    repeatable(app.add_option("-n,--n-predict", n_predict_args,
                              "tokens to generate, -1 to 1073741824 (-1: until end of generation or full context; "
                              "--bench: the decode tests, a list)"))
        ->type_name("INT");
    app.add_option("-c,--ctx-size", gen.run.n_ctx,
                   fmt::format("context size in tokens (default: min(model context, {}))", kvgen::kDefaultCtx))
        ->check(CLI::Range(1, kvgen::kMaxCtx));
    std::string batch;  // -b: a count (a list with --bench)
    repeatable(app.add_option("-b,--batch-size", batch_args,
                              fmt::format("prompt tokens per forward pass, 1 to {} (default: {}; --bench: a list)",
                                          kvgen::kMaxBatch, gen.run.n_batch)))
        ->type_name("INT");
    repeatable(app.add_option("-t,--threads", threads_args,
                              "threads, 1 to 1024 (default: physical cores; --bench: a list, e.g. 1,2,4)"))
        ->type_name("INT");
    app.add_option("--threads-batch", llama.threads_batch, "llama.cpp's -tb: kvgen uses -t for prompt and generation")
        ->check(CLI::Range(1, 1024));
    app.add_option("--temp", gen.sampler.temp, "temperature (0: greedy)")->check(finite_range(0.0, 100.0));
    app.add_option("--top-k", gen.sampler.top_k, "top-k sampling (0: off)")->check(CLI::Range(0, 1 << 24));
    app.add_option("--top-p", gen.sampler.top_p, "top-p sampling (1: off)")->check(finite_range(0.0, 1.0));
    app.add_option("--min-p", gen.sampler.min_p, "min-p sampling (0: off)")->check(finite_range(0.0, 1.0));
    app.add_option("--repeat-penalty", gen.sampler.repeat_penalty, "penalty for repeated tokens (1: off)")
        ->check(finite_range(0.0, 100.0));
    app.add_option("--repeat-last-n", gen.sampler.repeat_last_n, "tokens the penalty looks back (-1: all)")
        ->check(CLI::Range(-1, 1 << 24));
    app.add_option("-s,--seed", gen.seed, "random seed (-1: random)")->check(CLI::Range(-1LL, 4294967295LL));
    app.add_option("--reverse-prompt", gen.reverse_prompts,
                   "-r TEXT: stop when the output ends with TEXT (repeatable; llama-completion's -r)")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    app.add_flag(
        "--no-kv-cache", [&gen](int64_t) { gen.kv_cache = false; },
        "recompute the whole sequence every step (to measure what the cache buys)");
    app.add_option(
        "--kv-type", kv_type,
        fmt::format("KV cache element type: {}; K/V gives each its own (q8_0/q4_0); --bench: a list",
                    kvgen::kv_type_names()));
    app.add_option("--cache-type-k", llama.cache_type_k,
                   "llama.cpp's -ctk: the K cache's type (as --kv-type; --bench: a list)");
    app.add_option("--cache-type-v", llama.cache_type_v,
                   "llama.cpp's -ctv: the V cache's type (as --kv-type; --bench: a list)");
    app.add_option("--device", gen.run.device,
                   "-dev: cpu, cuda, cudaN or auto (the GPU when this build and machine have one); llama.cpp's CUDA0 "
                   "and none are understood; --bench: a list, e.g. cpu,cuda");
    app.add_option("--n-gpu-layers", llama.n_gpu_layers,
                   "-ngl N: 0 runs on the CPU, N > 0 (or all) the whole model on the GPU, auto as --device auto; "
                   "--bench: a list, e.g. 0,99");
    app.add_option("--flash-attn", llama.flash_attn, "-fa on|auto: accepted (kvgen's attention is always fused)");
    app.add_flag(
        "--no-cuda-graphs", [&gen](int64_t) { gen.run.cuda_graphs = false; },
        "CUDA: launch the decode step kernel by kernel instead of replaying a captured graph");
    add_cuda_choice(app, "--cuda-matvec", &gen.run.cuda_int_matvec, {"int16", "f32"}, "int16",
                    "CUDA products of one token or a prompt of up to 16 (64 with --cuda-matvec-mma on) for Q4_0, "
                    "Q8_0, Q4_K, Q5_K (where its short prompt's products do not take split activations), Q6_K: int16 "
                    "(integer dot products on 16-bit activations, the "
                    "default) or f32 (float "
                    "activations, to compare)");
    add_cuda_choice(
        app, "--cuda-matvec-mma", &gen.run.cuda_int_mma, {"on", "off"}, "on",
        "CUDA, sm_80 and later: on multiplies a prompt of 2 to 64 tokens by Q4_0, Q8_0, Q4_K and Q6_K weights on the "
        "tensor cores in one launch (8-bit mma on each 16-bit activation's two bytes: the same integer dots as "
        "int16, summed in another order); off (the default) takes the CUDA cores up to 16 tokens, 8 a launch, and "
        "the f16 GEMM above");
    add_cuda_choice(app, "--cuda-attention", &gen.run.cuda_flash_attention, {"mma", "warp"}, "mma",
                    "CUDA prefill attention: mma (flash attention on the tensor cores for head_dim 64 and 128, the "
                    "default) or warp (a warp per query on the CUDA cores, to compare; an f16 cache only)");
    add_cuda_choice(
        app, "--cuda-flash-pipeline", &gen.run.cuda_flash_pipeline, {"on", "off"}, "on",
        "CUDA prefill flash attention over an f16 cache, head_dim 128: on (the default) copies each tile of the cache "
        "into shared memory by cp.async while the tile before is multiplied, and reads its fragments by "
        "ldmatrix; off loads each tile through registers and then multiplies it, to compare; the same "
        "results");
    add_cuda_choice(app, "--cuda-flash-warps", &gen.run.cuda_flash_warp_split, {"positions", "rows"}, "positions",
                    "CUDA prefill flash attention where a block's (query, head) rows are 16 at most (a prompt of up "
                    "to 16 tokens with one query head a KV head, up to 4 with four): positions (the default) gives "
                    "each of the block's "
                    "4 warps a quarter of every tile's positions and combines their results; rows leaves the rows "
                    "to one warp over whole tiles, as for longer prompts, to compare");
    add_cuda_choice(app, "--cuda-pdl", &gen.run.cuda_pdl, {"on", "off"}, "on",
                    "CUDA, sm_90 and later with CUDA 12.3 or later: on (the default) lets each integer product start "
                    "loading its weights while the kernel before it drains (programmatic dependent launch); off "
                    "launches it after");
    add_cuda_number(
        app, "--cuda-matvec-rows", &gen.run.cuda_matvec_rows, {4, 8},
        "CUDA, with --cuda-matvec-stages 0: rows of a matrix one block of one token's Q4_0, Q8_0 and Q4_K integer "
        "products takes: 8 (the default: twice the weight loads in flight a thread, half the blocks) or 4, to "
        "compare; the same results");
    add_cuda_number(app, "--cuda-matvec-unit", &gen.run.cuda_matvec_unit, {32, 64},
                    "CUDA: weights of a row a lane of Q4_0 integer products takes a step: 64 (the default: 32 bytes of "
                    "quants a row in flight, as Q8_0's 32 weights) or 32, to compare; sums in another order, within "
                    "f32 rounding");
    add_cuda_number(app, "--cuda-matvec-stages", &gen.run.cuda_matvec_stages, {0, 2, 3, 4},
                    "CUDA, sm_80 and later: stages of shared memory the integer and F16 decode products copy their "
                    "weights into by cp.async ahead of use, in blocks that each take many row groups: 3 (the default), "
                    "2 or 4; 0 "
                    "loads them through registers, a block a row group (--cuda-matvec-rows), to compare; the same "
                    "results");
    add_cuda_choice(app, "--cuda-ring-carveout", &gen.run.cuda_ring_fit, {"fit", "max"}, "fit",
                    "CUDA, with the rings of --cuda-matvec-stages: how much of each SM's L1 they take as shared "
                    "memory: fit (the default: each launch what its blocks need, the rest stays L1 and holds the "
                    "activations, which every row group reads; CUDA 12.6 and later) or max (all an SM allows: "
                    "228 of 256 KiB on an H100 or H200), to compare; the same results");
    add_cuda_choice(
        app, "--cuda-kv-store", &gen.run.cuda_qkv_store, {"product", "kernel"}, "product",
        "CUDA with an f16 KV cache: product (the Q|K|V products of up to 16 tokens, integer or on split "
        "activations, rotate Q and K and store K and V themselves, the default) or kernel (a launch of its own "
        "after them, to compare; the same results)");
    add_cuda_choice(app, "--cuda-norm", &gen.run.cuda_norm_fold, {"product", "kernel"}, "product",
                    "CUDA, one token: product (each RMSNorm after the first folded into the integer product that adds "
                    "to the residual before it, the default) or kernel (a launch of its own, to compare; results "
                    "within a rounding step of the activations)");
    add_cuda_choice(
        app, "--cuda-f16-matvec", &gen.run.cuda_f16_block, {"block", "warp"}, "block",
        "CUDA, one token of F16 or BF16 weights: block (a block of warps over 4 rows, 16-byte loads, the default) "
        "or warp (a warp over 2 rows, the kernel of every other type's f32 product, to compare; sums within "
        "f32 rounding of each other)");
    app.add_option_function<std::string>(
           "--cuda-short-prompt",
           [&gen](const std::string& v) { gen.run.cuda_prompt_split = v == "auto"    ? -1
                                                                      : v == "split" ? 1
                                                                                     : 0; },
           "CUDA, 2 to 16 tokens of F16, BF16, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K or Q5_K weights: split (the activations "
           "split into f16 high and low parts, each weight read once on the tensor cores: F16 by cuBLAS, the others "
           "decoded to f16 tile by tile in shared memory), lanes (the f32 kernel whose lanes reload each token's "
           "activations for every weight; Q5_K: the integer kernel), or auto (the default: split for products of at "
           "least 4M weights, where reading them costs more than the split's extra launches); F16 within f32 "
           "rounding of the lanes, the others within the f16 rounding of their weights")
        ->check(CLI::IsMember({"auto", "split", "lanes"}));
    add_cuda_choice(app, "--cuda-gemm", &gen.run.cuda_mma_gemm, {"cublas", "mma"}, "mma",
                    "CUDA prefill products (over 16 tokens; with --cuda-matvec-mma on, over 64 for Q4_0, Q8_0, Q4_K "
                    "and Q6_K) of quantized weights: cublas (the weight decoded to f16 a "
                    "chunk of rows at a time, --cuda-gemm-chunk, each chunk multiplied by cuBLAS, the default) or mma "
                    "(one kernel that decodes each weight tile into shared memory and multiplies it "
                    "there on the tensor cores, to compare)");
    std::string cuda_gemm_chunk = "auto";
    app.add_option("--cuda-gemm-chunk", cuda_gemm_chunk,
                   "CUDA, --cuda-gemm cublas: MiB of f16 a quantized weight is decoded into at a time: auto (the "
                   "default: from the prompt's tokens and the GPU's SMs, enough rows a chunk for cuBLAS to fill the "
                   "GPU twice over where the matrix has them, 16 to 128 MiB), a number (16: a chunk the L2 cache "
                   "holds), or 0 for the whole matrix at once; the same operands, sums within f32 rounding")
        ->check([](const std::string& v) -> std::string {
            if (v == "auto") return "";
            int mib = -1;
            if (!parse_int(v, &mib) || mib < 0 || mib > 4096) return "must be auto or a number from 0 to 4096";
            return "";
        })
        ->type_name("auto|MIB");
    add_cuda_choice(app, "--cuda-gemm-overlap", &gen.run.cuda_gemm_overlap, {"on", "off"}, "on",
                    "CUDA, --cuda-gemm cublas: on (the default) decodes a weight's next chunk, or the next "
                    "product's first, on a second stream while cuBLAS multiplies the one before, into the other of "
                    "two buffers; off decodes and multiplies in turn on one stream, to compare; the same results");
    add_cuda_choice(app, "--cuda-prefetch", &gen.run.cuda_l2_prefetch, {"on", "off"}, "on",
                    "CUDA, sm_90 and later, one token: on (the default) has decode attention ask the L2 cache for the "
                    "output projection's weight and the first rows of gate's and up's while it runs, at depths where "
                    "the layer's cache rows leave room, so that those products read them from L2; off leaves them to "
                    "read from memory, to compare; the same results");
    std::string math = "exact";
    app.add_option("--math", math,
                   "CPU products of quantized weights: exact (activations rounded to 16 bits, the default), fast "
                   "(8 bits, as llama.cpp: faster, further from the exact math) or f32 (the exact math itself, slow)")
        ->check(CLI::IsMember({"exact", "fast", "f32"}));
    app.add_flag("--chat", gen.chat, "wrap the prompt in the model's chat format");
    app.add_flag("--single-turn", gen.chat, "-st: llama.cpp's one-turn conversation, the same as --chat");
    app.add_option("--system-prompt", gen.system_prompt,
                   "-sys TEXT: the chat format's system turn, replacing the template's default (implies --chat)");
    app.add_option("--system-prompt-file", system_file, "-sysf FILE: the system turn from a file (implies --chat)");
    app.add_flag("--no-conversation", "-no-cnv: accepted; kvgen answers the prompt and exits (the default)");
    bool conversation = false;
    app.add_flag("-i,--conversation,--interactive", conversation,
                 "-cnv: a conversation in the model's chat format, one message per line from the terminal (or stdin), "
                 "the KV cache kept across turns; -p or -sys is the system message; /exit or Ctrl-D ends it");
    app.add_flag("--display-prompt,!--no-display-prompt", gen.display_prompt,
                 "print the prompt on stdout before the generated text (default: off)");
    app.add_flag("--ignore-eos", gen.ignore_eos, "keep generating past end-of-generation tokens");
    app.add_option("--dump-logits", gen.dump_logits_path, "write each step's logits (float32 rows of n_vocab)");
    app.add_option("--prompt-cache", gen.prompt_cache_path,
                   "reuse the K/V of this file's tokens for a prompt that starts with them, and save the prompt's "
                   "K/V to it afterwards");
    app.add_flag("--prompt-cache-all", gen.prompt_cache_all, "--prompt-cache: save the generated tokens' K/V too");
    app.add_flag("--prompt-cache-ro", gen.prompt_cache_ro, "--prompt-cache: read the file, never write it");
    app.add_flag("--context-shift,!--no-context-shift", gen.context_shift,
                 "when the context is full, keep --keep tokens, drop half of the rest and go on (default: on); "
                 "--no-context-shift stops");
    app.add_option("--keep", gen.n_keep,
                   "tokens of the prompt a context shift keeps, after BOS (-1: all; default: the system turn with "
                   "--chat, else none)")
        ->check(CLI::Range(-1, 1 << 30));
    app.add_flag("--no-perf", gen.no_perf, "do not print the timing lines");
    app.add_flag("--bench", bench,
                 "benchmark like llama-bench: prefill of -p N[,N..], decode of -n N[,N..] and -pg P,N random tokens at "
                 "-d depths, for each -m, -b, KV type and -t given (lists)");
    app.add_option("--repetitions", repetitions, "--bench: -r N timed runs per test (after a warm-up)")
        ->check(CLI::Range(1, 1000));
    repeatable(app.add_option("-d,--n-depth", depth_args, "--bench: tokens already in the KV cache, e.g. 0,1024,4096"))
        ->type_name("TEXT");
    std::vector<std::string> prompt_gen;
    app.add_option("--prompt-gen", prompt_gen,
                   "-pg P,N (llama-bench's): --bench a prompt of P tokens then N generated, timed together (ppP+tgN)")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->allow_extra_args(false)
        ->type_name("P,N");
    app.add_option("-o,--output-format", output_format,
                   "--bench: md (the table), csv, json, jsonl or sql (llama-bench's fields, then kvgen's own)")
        ->check(CLI::IsMember({"md", "csv", "json", "jsonl", "sql"}));
    app.add_flag("--perplexity", perplexity,
                 "measure perplexity on the text of -f FILE as llama-perplexity does: chunks of -c tokens, the second "
                 "half of each scored");
    std::string kl_base, kl;
    app.add_option("--kl-divergence-base", kl_base,
                   "--perplexity: save each scored token's distribution (top 32 + the rest) to this file");
    app.add_option("--kl-divergence", kl,
                   "--perplexity: compare with a --kl-divergence-base file of the same model's vocabulary, text and -c "
                   "(mean KL divergence, same top token, PPL change)");
    app.add_flag("--bench-memory", bench_memory, "measure memory read bandwidth (the ceiling for decode), then exit");
    app.add_flag("--list-devices", devices, "list the devices kvgen can run on, then exit");
    app.add_flag("-v,--verbose", verbose, "more detail (--inspect: every metadata key; --chat: the formatted prompt)");

    spdlog::set_default_logger(spdlog::stderr_color_st("kvgen"));
    spdlog::set_pattern("kvgen: %l: %v");
    // A reader that goes away (kvgen ... | head) makes writes fail instead of killing the process; each mode stops
    // quietly when its output is gone.
    std::signal(SIGPIPE, SIG_IGN);
    kvgen::install_cleanup_handlers();  // no half-written file left behind by SIGTERM, SIGHUP or SIGINT
    try {
        app.parse(translated_args(app, argc, argv));
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::fprintf(stderr, "kvgen: error: %s (see --help)\n", e.what());
        return 1;
    } catch (const kvgen::Error& e) {  // a llama.cpp flag answered, or an unknown one
        std::fprintf(stderr, "kvgen: error: %s\n", e.what());
        return 1;
    }

    try {
        // note: one mode a run; a second would otherwise be dropped without a word
        std::vector<std::string> modes;
        for (const char* m : {"--bench", "--perplexity", "--inspect", "--tokenize", "--bench-memory", "--list-devices",
                              "--conversation"})
            if (app.count(m) > 0) modes.push_back(m);
        if (modes.size() > 1)
            throw kvgen::Error(fmt::format("{} and {} are different modes: give one", modes[0], modes[1]));
        // llama-bench's lists: a repeat adds to the list (-p 64 -p 512 is -p 64,512); elsewhere one value
        const auto bench_list = [&](const std::vector<std::string>& given, const char* name, std::string* out) {
            if (given.size() > 1 && !bench)
                throw kvgen::Error(fmt::format("{} given {} times (only --bench takes it again, to add to its list)",
                                               name, given.size()));
            if (given.empty()) return;
            *out = given[0];
            for (size_t i = 1; i < given.size(); ++i) *out += "," + given[i];
        };
        bench_list(prompt_args, "-p/--prompt", &prompt);
        bench_list(n_predict_args, "-n/--n-predict", &n_predict);
        bench_list(batch_args, "-b/--batch-size", &batch);
        bench_list(threads_args, "-t/--threads", &threads);
        bench_list(depth_args, "-d/--n-depth", &depths);
        only_with(app, "--json", !bench && !bench_memory && !devices && !tokenize,
                  "generation, --inspect and --perplexity (--bench prints json with -o json)");
        // Options of generation alone, refused by --bench and --perplexity rather than ignored
        for (const char* name : {"--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--repeat-last-n",
                                 "--seed", "--chat", "--single-turn", "--system-prompt", "--system-prompt-file",
                                 "--display-prompt", "--ignore-eos", "--dump-logits", "--context-shift"})
            only_with(app, name, !bench && !perplexity, "generation");
        // --bench makes its own random tokens and sizes the context to its tests
        for (const char* name : {"--file", "--ctx-size", "--no-bos", "--special"})
            only_with(app, name, !bench, "generation and --perplexity (--bench times random tokens)");
        only_with(app, "--n-predict", !perplexity, "generation and --bench");
        for (const char* name : {"--cache-type-k", "--cache-type-v", "--n-gpu-layers"})
            if (app.count(name) > 0 && app.get_option(name)->as<std::string>().empty())
                throw kvgen::Error(fmt::format("{}: an empty value", name));
        if (bench && app.count("--prompt") > 0 && prompt.empty())
            throw kvgen::Error("-p '': expected a comma-separated list of prompt sizes");
        only_with(app, "--repetitions", bench, "--bench (-r is the reverse prompt when generating)");
        only_with(app, "--n-depth", bench, "--bench");
        only_with(app, "--prompt-gen", bench, "--bench");
        // -n: the tokens to generate (-1: until the end), or --bench's decode tests
        const std::vector<int> gen_counts =
            count_list(n_predict, app.count("--n-predict") > 0, bench, "-n/--n-predict", "tokens", bench ? 0 : -1,
                       1 << 30);
        if (!gen_counts.empty()) gen.n_predict = gen_counts.front();
        only_with(app, "--output-format", bench, "--bench");
        only_with(app, "--kl-divergence-base", perplexity, "--perplexity");
        only_with(app, "--kl-divergence", perplexity, "--perplexity");
        const bool generating = !bench && !perplexity && !inspect && !tokenize && !bench_memory && !devices;
        only_with(app, "--prompt-cache", generating, "generation");
        only_with(app, "--keep", generating, "generation");
        only_with(app, "--prompt-cache-all", app.count("--prompt-cache") > 0, "--prompt-cache");
        only_with(app, "--prompt-cache-ro", app.count("--prompt-cache") > 0, "--prompt-cache");
        if (bench) {  // as llama-bench, -m a,b is two models (a file whose name has a comma is one)
            std::vector<std::string> listed;
            for (const std::string& m : models) {
                std::error_code ec;
                if (has_comma(m) && !std::filesystem::exists(m, ec)) {
                    for (const std::string& one : split_list(m, "-m/--model", "model files")) listed.push_back(one);
                } else {
                    listed.push_back(m);
                }
            }
            models = listed;
        }
        if (models.size() > 1 && !bench)
            throw kvgen::Error(fmt::format("-m given {} times: only --bench measures several models", models.size()));
        for (const std::string& m : models)
            if (m.empty()) throw kvgen::Error("--model: the file name is empty");
        if (!models.empty()) model = models.front();
        const std::vector<int> thread_counts =
            count_list(threads, app.count("--threads") > 0, bench, "-t/--threads", "threads", 1, 1024);
        const std::vector<int> batch_sizes =
            count_list(batch, app.count("--batch-size") > 0, bench, "-b/--batch-size", "tokens", 1, kvgen::kMaxBatch);
        if (!batch_sizes.empty()) gen.run.n_batch = batch_sizes.front();
        if (thread_counts.size() > 1 && llama.threads_batch > 0)
            throw kvgen::Error("-tb/--threads-batch with a -t list: kvgen runs prompt processing and generation on "
                               "the same threads, so each count of -t is both");
        if (!thread_counts.empty()) gen.run.n_threads = thread_counts.front();
        for (const char* name : {"--json", "--file", "--system-prompt-file", "--dump-logits",
                                 "--prompt-cache", "--kl-divergence-base", "--kl-divergence"})
            if (app.count(name) && app.get_option(name)->as<std::string>().empty())
                throw kvgen::Error(fmt::format("{}: the file name is empty", name));
        for (const char* name : {"--dump-logits", "--prompt-cache", "--kl-divergence-base"})
            if (app.count(name) && app.get_option(name)->as<std::string>() == "-")
                throw kvgen::Error(fmt::format("{} -: its data is binary; name a file, not standard output", name));
        if (!gen.prompt_cache_path.empty() && !gen.kv_cache)
            throw kvgen::Error("--prompt-cache reuses the KV cache, which --no-kv-cache turns off");
        if (gen.prompt_cache_all && gen.prompt_cache_ro)
            throw kvgen::Error("--prompt-cache-all saves to the file and --prompt-cache-ro never does (give one)");
        if (bench && !gen.reverse_prompts.empty())
            throw kvgen::Error(
                "--reverse-prompt applies to generation, not --bench (where -r is the repetition count)");
        std::vector<kvgen::BenchDevice> bench_devs = bench_devices(&gen.run.device, &llama, bench);
        gen.run.device = kvgen::normalize_device(gen.run.device);
        // --bench compares KV types in one run: --kv-type f16,q8_0,q8_0/q4_0, or -ctk and -ctv lists (every pair)
        const std::vector<std::pair<kvgen::KvType, kvgen::KvType>> kv_types =
            bench_kv_types(kv_type, app.count("--kv-type") > 0, &llama, bench);
        if (!kv_types.empty()) kv_type = kvgen::kv_types_name(kv_types[0].first, kv_types[0].second);
        kvgen::kv_types_from_name(kv_type, "--kv-type", &gen.run.kv_type_k, &gen.run.kv_type_v);
        kvgen::math_mode_from_name(math, &gen.run.math);
        if (cuda_gemm_chunk != "auto") parse_int(cuda_gemm_chunk, &gen.run.cuda_gemm_chunk_mib);
        kvgen::apply_llama_settings(llama, gen.run, app.count("--kv-type") > 0);
        if (!llama.n_gpu_layers.empty() && gen.run.device != "cpu" && gen.run.device != "auto")
            kvgen::resolve_device(gen.run.device, fmt::format("-ngl {}", llama.n_gpu_layers));
        if (gen.run.math != kvgen::MathMode::Exact) {  // the CPU's modes: auto means the CPU, a GPU is refused
            if (gen.run.device == "auto") gen.run.device = "cpu";
            for (kvgen::BenchDevice& d : bench_devs)
                if (d.device == "auto") d.device = "cpu";
            bool gpu = gen.run.device != "cpu";
            for (const kvgen::BenchDevice& d : bench_devs) gpu = gpu || d.device != "cpu";
            if (gpu)
                throw kvgen::Error(fmt::format(
                    "--math {}: the CUDA backend computes in the exact mode only (use --device cpu)", math));
        }

        if (bench_memory) {
            kvgen::run_bench_memory(gen.run.n_threads > 0 ? gen.run.n_threads
                                                          : kvgen::cpu::ThreadPool::physical_cores());
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
            b.model_paths = models.empty() ? std::vector<std::string>{model} : models;
            b.threads = thread_counts;
            b.batches = batch_sizes;
            b.kv_types = kv_types;
            b.devices = bench_devs;
            if (!prompt.empty()) b.n_prompt = kvgen::parse_int_list(prompt, "-p", 0);
            if (!gen_counts.empty()) b.n_gen = gen_counts;
            for (const std::string& pg : prompt_gen) {
                std::vector<int> v;
                try {
                    v = kvgen::parse_int_list(pg, "-pg", 1);
                } catch (const kvgen::Error&) {
                    v.clear();
                }
                if (v.size() != 2)
                    throw kvgen::Error(
                        fmt::format("-pg '{}': expected P,N (two numbers of tokens, each at least 1)", pg));
                b.prompt_gen.emplace_back(v[0], v[1]);
            }
            b.depths = kvgen::parse_int_list(depths, "-d", 0);
            b.repetitions = repetitions;
            b.kv_cache = gen.kv_cache;
            b.output = output_format;
            b.run = gen.run;
            kvgen::run_bench(b);
            return 0;
        }
        if (inspect) {
            kvgen::run_inspect(model, json_path, verbose, gen.run.kv_type_k, gen.run.kv_type_v);
            return 0;
        }

        if (conversation) {
            if (bench || perplexity || tokenize || inspect || !prompt_file.empty() || !gen.prompt_cache_path.empty() ||
                !gen.kv_cache)
                throw kvgen::Error("--conversation reads its messages from the terminal; it takes -p/-sys as the "
                                   "system message and no -f, --prompt-cache, --no-kv-cache or other mode");
            if (!gen.dump_logits_path.empty() || gen.ignore_eos || gen.display_prompt)
                throw kvgen::Error("--conversation ends each answer at its end-of-turn token and prints only the "
                                   "answers: it takes no --dump-logits, --ignore-eos or --display-prompt");
            if (app.count("-p") && (app.count("--system-prompt") || !system_file.empty()))
                throw kvgen::Error("--conversation takes its system message from -p or from -sys/-sysf, not both");
            if (!system_file.empty()) gen.system_prompt = kvgen::read_prompt_file(system_file);
            gen.model_path = model;
            gen.prompt = escape ? kvgen::process_escapes(prompt) : prompt;
            gen.system_prompt = escape ? kvgen::process_escapes(gen.system_prompt) : gen.system_prompt;
            for (std::string& r : gen.reverse_prompts) r = escape ? kvgen::process_escapes(r) : r;
            gen.special = tok_opt.parse_special;
            gen.no_bos = tok_opt.no_bos;
            gen.json_path = json_path;
            kvgen::install_signal_handlers();
            return kvgen::run_conversation(gen);
        }
        // The prompt: -p, -f FILE, -f - (standard input), or a piped standard input when neither is given.
        if (!prompt_file.empty()) {
            if (app.count("-p")) throw kvgen::Error("give the prompt with -p or -f, not both");
            prompt = kvgen::read_prompt_file(prompt_file);
        } else if (!app.count("-p") && kvgen::stdin_is_piped()) {
            prompt = kvgen::read_prompt_file("-");
        }
        if (!system_file.empty()) {
            if (app.count("--system-prompt")) throw kvgen::Error("give the system prompt with -sys or -sysf, not both");
            gen.system_prompt = kvgen::read_prompt_file(system_file);
        }
        if (escape) {
            prompt = kvgen::process_escapes(prompt);
            gen.system_prompt = kvgen::process_escapes(gen.system_prompt);
            for (std::string& r : gen.reverse_prompts) r = kvgen::process_escapes(r);
        }
        if (app.count("--system-prompt") || !system_file.empty()) gen.chat = true;

        if (perplexity) {
            if (prompt_file.empty()) throw kvgen::Error("--perplexity needs the text as -f FILE");
            kvgen::PerplexityOptions p;
            p.model_path = model;
            p.text_path = prompt_file;
            p.text = prompt;
            p.no_bos = tok_opt.no_bos;
            p.run = gen.run;
            p.json_path = json_path;
            p.kl_base_path = kl_base;
            p.kl_path = kl;
            if (json_path == "-") throw kvgen::Error("--json -: stdout carries the perplexity; give a file name");
            kvgen::run_perplexity(p);
            return 0;
        }

        if (tokenize) {
            tok_opt.model_path = model;
            tok_opt.text = prompt;
            tok_opt.verbose = verbose;
            tok_opt.chat = gen.chat;
            tok_opt.system_prompt = gen.system_prompt;
            kvgen::run_tokenize(tok_opt);
            return 0;
        }
        if (prompt.empty()) throw kvgen::Error("no prompt: give -p TEXT or -f FILE (or --inspect / --tokenize)");
        if (json_path == "-") throw kvgen::Error("--json -: stdout carries the generated text; give a file name");
        gen.model_path = model;
        gen.prompt = prompt;
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
