#include "cli/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/backend_select.h"
#include "cli/format.h"
#include "common/error.h"
#include "common/hash.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvgen {

namespace {

// A row's softmax normalizer: log p(i) = logits[i] - mx - log(sum), in double.
struct LogSoftmax {
    double mx = 0, log_sum = 0, sum = 0;
    int32_t argmax = 0;
    LogSoftmax(const float* logits, int n_vocab) {
        float m = logits[0];
        for (int j = 1; j < n_vocab; ++j)
            if (logits[j] > m) {
                m = logits[j];
                argmax = j;
            }
        mx = m;
        for (int j = 0; j < n_vocab; ++j) sum += std::exp(double(logits[j]) - mx);
        log_sum = std::log(sum);
    }
    double lp(const float* logits, int32_t i) const { return double(logits[i]) - mx - log_sum; }
};

// The KL base file: a header, then per scored token kKlTop (id, log p) pairs, most likely first, and log p of the
// rest. Written whole or not at all.
constexpr char kKlMagic[8] = {'K', 'V', 'G', 'K', 'L', 'D', '0', '1'};
struct KlHeader {
    char magic[8];
    uint32_t n_vocab, n_ctx, top, pad;
    uint64_t vocab_hash, tokens_hash, n_records;
    double base_ppl;
};
struct KlRecord {
    int32_t id[kKlTop];
    float lp[kKlTop];
    float lp_rest;
};

KlRecord top_of(const float* logits, int n_vocab, const LogSoftmax& ls, std::vector<int32_t>& idx) {
    KlRecord r{};
    std::iota(idx.begin(), idx.end(), 0);
    const int k = std::min(kKlTop, n_vocab);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [logits](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    double top_sum = 0;
    for (int i = 0; i < kKlTop; ++i) {
        r.id[i] = i < k ? idx[size_t(i)] : idx[0];
        r.lp[i] = i < k ? float(ls.lp(logits, r.id[i])) : -INFINITY;
        if (i < k) top_sum += std::exp(double(logits[r.id[i]]) - ls.mx);
    }
    r.lp_rest = float(std::log(std::max(ls.sum - top_sum, ls.sum * 1e-30)) - ls.log_sum);
    return r;
}

}  // namespace

PerplexityResult run_perplexity(const PerplexityOptions& opt) {
    if (!opt.json_path.empty()) check_writable(opt.json_path);
    resolve_device(opt.run.device);  // a missing device fails before the model loads
    const Model model = Model::load(opt.model_path);
    const Config& c = model.config;
    const Tokenizer tok = tokenizer_for(model, opt.model_path);
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
    const int first = r.n_ctx / 2;  // each chunk's rows first .. n_ctx - 2 are scored

    // The KL base: what identifies the vocabulary and the scored text.
    uint64_t vocab_hash = fnv1a(&c.n_vocab, sizeof(c.n_vocab));
    for (int32_t id = 0; id < c.n_vocab; ++id) {
        const std::string piece = tok.piece(id, true);
        vocab_hash = fnv1a(piece.data(), piece.size(), fnv1a("\n", 1, vocab_hash));
    }
    const uint64_t tokens_hash = fnv1a(tokens.data(), size_t(r.n_chunks) * size_t(r.n_ctx) * sizeof(int32_t),
                                     fnv1a(&r.n_ctx, sizeof(r.n_ctx)));
    std::vector<KlRecord> base, out;  // read (kl_path); written (kl_base_path): both may be given
    KlHeader head{};
    if (!opt.kl_path.empty()) {
        const std::string bytes = read_text_file(opt.kl_path);
        auto bad = [&](const std::string& why) {
            return Error(fmt::format("--kl-divergence {}: {}", opt.kl_path, why));
        };
        if (bytes.size() < sizeof(KlHeader)) throw bad("not a kvgen KL base file (too short)");
        std::memcpy(&head, bytes.data(), sizeof(head));
        if (std::memcmp(head.magic, kKlMagic, sizeof(kKlMagic)) != 0 || head.top != kKlTop)
            throw bad("not a kvgen KL base file (written by --kl-divergence-base)");
        if (head.n_vocab != uint32_t(c.n_vocab) || head.vocab_hash != vocab_hash)
            throw bad(fmt::format("made with another vocabulary ({} tokens; this model has {})", head.n_vocab,
                                  c.n_vocab));
        if (head.n_ctx != uint32_t(r.n_ctx))
            throw bad(fmt::format("made with -c {}, this run has -c {}", head.n_ctx, r.n_ctx));
        if (head.tokens_hash != tokens_hash) throw bad(fmt::format("made from another text than {}", opt.text_path));
        // note: the text and -c fix how many tokens are scored, and so how many records the file holds
        const uint64_t n_scored = uint64_t(r.n_chunks) * uint64_t(r.n_ctx - first - 1);
        if (head.n_records != n_scored || bytes.size() != sizeof(KlHeader) + n_scored * sizeof(KlRecord))
            throw bad("truncated or damaged (its size does not match its header)");
        base.resize(size_t(n_scored));
        std::memcpy(base.data(), bytes.data() + sizeof(KlHeader), base.size() * sizeof(KlRecord));
        for (const KlRecord& rec : base)
            for (int32_t id : rec.id)
                if (id < 0 || id >= c.n_vocab) throw bad("damaged (a token id outside the vocabulary)");
    }
    if (!opt.kl_base_path.empty()) check_writable(opt.kl_base_path);

    Settings run = opt.run;
    run.n_ctx = r.n_ctx;
    run.all_logits = true;
    SelectedBackend selected = make_backend(model, run);
    Backend& backend = *selected.backend;
    std::fprintf(stderr,
                 "kvgen: perplexity of %s: %d tokens, %d chunks of %d (the last %d tokens of each scored), batch %d, "
                 "device %s, KV cache %s\n",
                 opt.text_path.c_str(), r.n_tokens, r.n_chunks, r.n_ctx, r.n_ctx - first - 1, backend.n_batch(),
                 selected.description.c_str(), kv_types_name(run.kv_type_k, run.kv_type_v).c_str());

    const auto t0 = std::chrono::steady_clock::now();
    double nll = 0, nll2 = 0, kl = 0, kl2 = 0;
    int64_t agree = 0;
    std::vector<int32_t> idx(size_t(c.n_vocab));
    for (int i = 0; i < r.n_chunks; ++i) {
        const int start = i * r.n_ctx;
        std::vector<int32_t> chunk(tokens.begin() + start, tokens.begin() + start + r.n_ctx);
        if (add_bos) chunk[0] = tok.bos();  // each chunk starts as a text does
        backend.kv_truncate(0);
        for (int b0 = 0; b0 < r.n_ctx; b0 += backend.n_batch()) {
            const int nb = std::min(backend.n_batch(), r.n_ctx - b0);
            const float* logits = backend.forward(chunk.data() + b0, nb, b0, Pass::Prefill, true);
            // Row j of the chunk predicts token j + 1; rows first .. n_ctx - 2 are scored.
            for (int j = std::max(b0, first); j < std::min(b0 + nb, r.n_ctx - 1); ++j) {
                const float* row = logits + int64_t(j - b0) * c.n_vocab;
                const LogSoftmax ls(row, c.n_vocab);
                const double v = -ls.lp(row, chunk[size_t(j + 1)]);
                nll += v;
                nll2 += v * v;
                if (!opt.kl_base_path.empty()) out.push_back(top_of(row, c.n_vocab, ls, idx));
                if (!opt.kl_path.empty()) {
                    const KlRecord& b = base[size_t(r.n_scored)];
                    double d = 0, q_top = 0;
                    for (int k = 0; k < kKlTop && k < c.n_vocab; ++k) {
                        const double p = std::exp(double(b.lp[k]));
                        d += p * (double(b.lp[k]) - ls.lp(row, b.id[k]));
                        q_top += std::exp(double(row[b.id[k]]) - ls.mx);
                    }
                    const double q_rest = std::log(std::max(ls.sum - q_top, ls.sum * 1e-30)) - ls.log_sum;
                    d += std::exp(double(b.lp_rest)) * (double(b.lp_rest) - q_rest);
                    kl += d;
                    kl2 += d * d;
                    agree += ls.argmax == b.id[0];
                }
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
    if (!opt.kl_path.empty()) {
        r.have_kl = true;
        r.kl = kl / r.n_scored;
        r.kl_stderr = std::sqrt(std::max(0.0, kl2 / r.n_scored - r.kl * r.kl) / std::max(1, r.n_scored - 1));
        r.top1 = double(agree) / r.n_scored;
        r.base_ppl = head.base_ppl;
        std::printf("Mean KL divergence: %.6f +/- %.6f (base: %s; top %d + the rest, a lower bound)\n", r.kl,
                    r.kl_stderr, opt.kl_path.c_str(), kKlTop);
        std::printf("Same top token: %.3f%%\n", 100.0 * r.top1);
        std::printf("PPL: %.4f, base %.4f, difference %+.4f (%+.3f%%)\n", r.ppl, r.base_ppl, r.ppl - r.base_ppl,
                    100.0 * (r.ppl - r.base_ppl) / r.base_ppl);
    }
    std::fflush(stdout);
    std::fprintf(stderr, "kvgen: perplexity: %.2f s for %d chunks (%.1f tokens/s)\n", secs, r.n_chunks,
                 double(r.n_chunks) * r.n_ctx / secs);

    if (!opt.kl_base_path.empty()) {
        KlHeader h{};
        std::memcpy(h.magic, kKlMagic, sizeof(kKlMagic));
        h.n_vocab = uint32_t(c.n_vocab);
        h.n_ctx = uint32_t(r.n_ctx);
        h.top = kKlTop;
        h.vocab_hash = vocab_hash;
        h.tokens_hash = tokens_hash;
        h.n_records = out.size();
        h.base_ppl = r.ppl;
        std::string bytes(reinterpret_cast<const char*>(&h), sizeof(h));
        bytes.append(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(KlRecord));
        write_text_file(opt.kl_base_path, bytes);
        std::fprintf(stderr, "kvgen: perplexity: the distributions of %zu tokens saved to %s for --kl-divergence\n",
                     out.size(), opt.kl_base_path.c_str());
    }

    if (!opt.json_path.empty()) {
        nlohmann::ordered_json j;
        j["model"] = opt.model_path;
        j["text"] = opt.text_path;
        j["device"] = selected.device;
        j["device_name"] = selected.description;
        j["kv_type"] = kv_types_name(run.kv_type_k, run.kv_type_v);
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
        if (r.have_kl) {
            j["kl_divergence"] = r.kl;
            j["kl_divergence_stderr"] = r.kl_stderr;
            j["same_top_token"] = r.top1;
            j["base_ppl"] = r.base_ppl;
        }
        write_text_file(opt.json_path, j.dump(2) + "\n");
    }
    return r;
}

}  // namespace kvgen
