#include "cli/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/backend_select.h"
#include "cli/format.h"
#include "common/error.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvgen {

namespace {

// -log softmax(logits)[token], in double.
double neg_log_prob(const float* logits, int n_vocab, int32_t token) {
    float mx = logits[0];
    for (int j = 1; j < n_vocab; ++j) mx = std::max(mx, logits[j]);
    double sum = 0;
    for (int j = 0; j < n_vocab; ++j) sum += std::exp(double(logits[j]) - double(mx));
    return std::log(sum) - (double(logits[token]) - double(mx));
}

}  // namespace

PerplexityResult run_perplexity(const PerplexityOptions& opt) {
    if (!opt.json_path.empty()) check_writable(opt.json_path);
    resolve_device(opt.run.device);  // a missing device fails before the model loads
    const Model model = Model::load(opt.model_path);
    const Config& c = model.config;
    const Tokenizer tok = Tokenizer::from_gguf(model.file);
    if (tok.n_vocab() != c.n_vocab)
        throw Error(fmt::format("{}: the tokenizer has {} tokens but the model {}", opt.model_path, tok.n_vocab(),
                                c.n_vocab));
    const bool add_bos = tok.add_bos() && !opt.no_bos && tok.bos() >= 0;
    std::vector<int32_t> tokens = tok.encode(opt.text, add_bos);

    PerplexityResult r;
    r.n_ctx = opt.run.context_size(c);
    r.n_tokens = int(tokens.size());
    if (r.n_ctx < 2) throw Error(fmt::format("--perplexity: a context of {} tokens scores nothing (raise -c)", r.n_ctx));
    if (r.n_tokens < 2 * r.n_ctx)
        throw Error(fmt::format("--perplexity: {} has {} tokens; a context of {} needs at least {} (two chunks; lower "
                                "-c or give a longer text)",
                                opt.text_path, r.n_tokens, r.n_ctx, 2 * r.n_ctx));
    r.n_chunks = r.n_tokens / r.n_ctx;

    Settings run = opt.run;
    run.n_ctx = r.n_ctx;
    run.all_logits = true;
    SelectedBackend selected = make_backend(model, run);
    Backend& backend = *selected.backend;
    const int first = r.n_ctx / 2;
    std::fprintf(stderr,
                 "kvgen: perplexity of %s: %d tokens, %d chunks of %d (the last %d tokens of each scored), batch %d, "
                 "device %s, KV cache %s\n",
                 opt.text_path.c_str(), r.n_tokens, r.n_chunks, r.n_ctx, r.n_ctx - first - 1, backend.n_batch(),
                 selected.description.c_str(), kv_type_name(run.kv_type));

    const auto t0 = std::chrono::steady_clock::now();
    double nll = 0, nll2 = 0;
    for (int i = 0; i < r.n_chunks; ++i) {
        const int start = i * r.n_ctx;
        std::vector<int32_t> chunk(tokens.begin() + start, tokens.begin() + start + r.n_ctx);
        if (add_bos) chunk[0] = tok.bos();  // each chunk starts as a text does
        backend.kv_truncate(0);
        for (int b0 = 0; b0 < r.n_ctx; b0 += backend.n_batch()) {
            const int nb = std::min(backend.n_batch(), r.n_ctx - b0);
            const float* logits = backend.forward(chunk.data() + b0, nb, b0, true);
            // Row j of the chunk predicts token j + 1; rows first .. n_ctx - 2 are scored.
            for (int j = std::max(b0, first); j < std::min(b0 + nb, r.n_ctx - 1); ++j) {
                const double v = neg_log_prob(logits + int64_t(j - b0) * c.n_vocab, c.n_vocab, chunk[size_t(j + 1)]);
                nll += v;
                nll2 += v * v;
                ++r.n_scored;
            }
        }
        r.running.push_back(std::exp(nll / r.n_scored));
        std::printf("[%d]%.4f,", i + 1, r.running.back());
        std::fflush(stdout);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.nll = nll / r.n_scored;
    r.ppl = std::exp(r.nll);
    const double var = nll2 / r.n_scored - r.nll * r.nll;
    r.ppl_stderr = var > 0 && r.n_scored > 1 ? std::sqrt(var / (r.n_scored - 1)) * r.ppl : 0.0;
    std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_stderr);
    std::fflush(stdout);
    std::fprintf(stderr, "kvgen: perplexity: %.2f s for %d chunks (%.1f tokens/s)\n", secs, r.n_chunks,
                 double(r.n_chunks) * r.n_ctx / secs);

    if (!opt.json_path.empty()) {
        nlohmann::ordered_json j;
        j["model"] = opt.model_path;
        j["text"] = opt.text_path;
        j["device"] = selected.device;
        j["device_name"] = selected.description;
        j["kv_type"] = kv_type_name(run.kv_type);
        j["n_tokens"] = r.n_tokens;
        j["n_ctx"] = r.n_ctx;
        j["n_batch"] = backend.n_batch();
        j["n_chunks"] = r.n_chunks;
        j["n_scored"] = r.n_scored;
        j["ppl"] = r.ppl;
        j["ppl_stderr"] = r.ppl_stderr;
        j["mean_nll"] = r.nll;
        j["running_ppl"] = r.running;
        j["seconds"] = secs;
        write_text_file(opt.json_path, j.dump(2) + "\n");
    }
    return r;
}

}  // namespace kvgen
