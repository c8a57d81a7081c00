// kvgen-synth: writes a random-weight LLaMA GGUF of a named or explicit shape, for tests and GPU benchmarks.
#include <chrono>
#include <cstdio>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/error.h"
#include "synth/synth.h"

int main(int argc, char** argv) {
    using namespace kvgen;
    CLI::App app{"kvgen-synth: write a random-weight LLaMA GGUF with a real vocabulary", "kvgen-synth"};
    std::string shape_name = "tiny", out, vocab_path;
    SynthOptions opt;
    SynthShape dims;
    int threads = int(std::max(1u, std::thread::hardware_concurrency()));
    bool list = false, tied = false, untied = false;
    std::string shapes_help;
    for (const auto& s : synth_shapes()) shapes_help += (shapes_help.empty() ? "" : ", ") + s.name;
    app.add_option("shape", shape_name, "shape: " + shapes_help + " (explicit --n-* options override it)");
    app.add_option("-t,--type", opt.type, fmt::format("weight type: {}", fmt::join(synth_types(), ", ")));
    app.add_option("--vocab", vocab_path, "GGUF file whose tokenizer.* metadata is copied (required)");
    app.add_option("-o,--output", out, "output GGUF path (required)");
    app.add_option("-s,--seed", opt.seed, "random seed");
    app.add_option("--threads", threads, "threads writing tensors")->check(CLI::Range(1, 1024));
    app.add_option("--n-embd", dims.n_embd)->check(CLI::Range(1, 1 << 16));
    app.add_option("--n-layers", dims.n_layers)->check(CLI::Range(1, 1024));
    app.add_option("--n-heads", dims.n_heads)->check(CLI::Range(1, 1024));
    app.add_option("--n-kv-heads", dims.n_kv_heads)->check(CLI::Range(1, 1024));
    app.add_option("--n-ff", dims.n_ff)->check(CLI::Range(1, 1 << 18));
    app.add_option("--n-ctx", dims.n_ctx)->check(CLI::Range(1, 1 << 24));
    app.add_option("--rope-base", dims.rope_base);
    std::vector<std::string> overrides;
    app.add_option("--tensor-type", overrides, "NAME=TYPE: store one tensor in another ggml type (repeatable)");
    app.add_flag("--tied", tied, "tie the output projection to the token embeddings");
    app.add_flag("--untied", untied, "write a separate output.weight");
    app.add_flag("--list", list, "list the named shapes and exit");
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::fprintf(stderr, "kvgen-synth: error: %s (see --help)\n", e.what());
        return 1;
    }
    try {
        if (list) {
            for (const auto& s : synth_shapes())
                std::printf("%-15s n_embd %5d  layers %2d  heads %2d/%2d  n_ff %5d  ctx %5d%s\n", s.name.c_str(),
                            s.n_embd, s.n_layers, s.n_heads, s.n_kv_heads, s.n_ff, s.n_ctx, s.tied ? "  tied" : "");
            return 0;
        }
        if (out.empty()) throw Error("-o/--output is required");
        if (vocab_path.empty()) throw Error("--vocab FILE is required (a GGUF whose vocabulary is copied)");
        if (!synth_shape(shape_name, &opt.shape))
            throw Error(fmt::format("unknown shape '{}' (one of: {})", shape_name, shapes_help));
        if (dims.n_embd) opt.shape.n_embd = dims.n_embd;
        if (dims.n_layers) opt.shape.n_layers = dims.n_layers;
        if (dims.n_heads) opt.shape.n_heads = dims.n_heads;
        if (dims.n_kv_heads) opt.shape.n_kv_heads = dims.n_kv_heads;
        if (dims.n_ff) opt.shape.n_ff = dims.n_ff;
        if (dims.n_ctx) opt.shape.n_ctx = dims.n_ctx;
        if (app.count("--rope-base")) opt.shape.rope_base = dims.rope_base;
        for (const std::string& o : overrides) {
            const size_t eq = o.find('=');
            if (eq == std::string::npos || eq == 0 || eq + 1 == o.size())
                throw Error(fmt::format("--tensor-type '{}': expected NAME=TYPE", o));
            opt.tensor_types.emplace_back(o.substr(0, eq), o.substr(eq + 1));
        }
        if (tied) opt.shape.tied = true;
        if (untied) opt.shape.tied = false;

        const auto t0 = std::chrono::steady_clock::now();
        const GgufFile vocab = GgufFile::open(vocab_path);
        const GgufWriter w = synth_layout(opt, vocab);
        w.write_file(
            out, [&](size_t i, uint8_t* dst, uint64_t n) { synth_fill(opt, w.tensor_info(i), i, dst, n); }, threads);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fprintf(stderr, "kvgen-synth: wrote %s (%s, %s, %zu tensors, %.2f GB) in %.1f s\n", out.c_str(),
                     shape_name.c_str(), opt.type.c_str(), w.n_tensors(), double(w.total_size()) / 1e9, s);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "kvgen-synth: error: %s\n", e.what());
        return 1;
    }
}
