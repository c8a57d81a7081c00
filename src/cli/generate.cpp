#include "cli/generate.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "cli/backend_select.h"
#include "cli/chat.h"
#include "cli/format.h"
#include "cli/prompt_cache.h"
#include "cli/reverse_prompts.h"
#include "cli/signals.h"
#include "common/error.h"
#include "engine/context_shift.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvgen {

namespace {

size_t peak_rss_bytes() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return size_t(ru.ru_maxrss) * 1024;
}

size_t current_rss_bytes() {
    long pages = 0, resident = 0;
    if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        std::fclose(f);
    }
    return size_t(resident) * size_t(::sysconf(_SC_PAGESIZE));
}

// Raw float32 rows (--dump-logits), written whole or not at all (OutputFile).
class LogitsFile {
public:
    LogitsFile(const std::string& path, int n_vocab) : n_vocab_(n_vocab) {
        if (!path.empty()) f_ = std::make_unique<OutputFile>(path);
    }
    void row(const float* logits) {
        if (f_) f_->write(logits, size_t(n_vocab_) * sizeof(float));
    }
    void commit() {
        if (f_) f_->commit();
    }

private:
    int n_vocab_;
    std::unique_ptr<OutputFile> f_;
};

std::string timing_line(const char* label, double ms, int n, const char* unit) {
    const double per = n > 0 ? ms / n : 0.0;
    const double tps = ms > 0 ? 1000.0 * n / ms : 0.0;
    return fmt::format("kvgen: {:>16} = {:10.2f} ms / {:5d} {:<6} ({:8.2f} ms per token, {:8.2f} tokens per second)\n",
                       label, ms, n, unit, per, tps);
}

}  // namespace

int run_generate(const GenerateCliOptions& opt) {
    if (!opt.json_path.empty()) check_writable(opt.json_path);
    if (!opt.dump_logits_path.empty()) check_writable(opt.dump_logits_path);
    const bool prompt_cache = !opt.prompt_cache_path.empty();
    if (prompt_cache && !opt.prompt_cache_ro) {
        check_writable(opt.prompt_cache_path);
        const std::string foreign = prompt_cache_foreign(opt.prompt_cache_path);
        if (!foreign.empty())
            throw Error(fmt::format("--prompt-cache {}: {}; it is not overwritten (name another file)",
                                    opt.prompt_cache_path, foreign));
    }
    resolve_device(opt.run.device);  // a missing device fails before the model loads

    const auto t_load = std::chrono::steady_clock::now();
    const Model model = Model::load(opt.model_path);
    const Config& c = model.config;
    const Tokenizer tok = tokenizer_for(model, opt.model_path);

    const std::string text = opt.chat ? apply_chat_template(model.file, opt.prompt, opt.system_prompt) : opt.prompt;
    const std::vector<int32_t> prompt = tok.encode(text, tok.add_bos() && !opt.no_bos, opt.special || opt.chat);

    const int n_ctx = opt.run.context_size(c);
    check_prompt_fits(int(prompt.size()), n_ctx);  // before a backend is built for it
    SelectedBackend selected = make_backend(model, opt.run);
    Backend& backend = *selected.backend;
    if (n_ctx > c.n_ctx_train) spdlog::warn("--ctx-size {} exceeds the model's trained context {}", n_ctx, c.n_ctx_train);
    const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load).count();

    const uint32_t seed = opt.seed >= 0 ? uint32_t(opt.seed) : std::random_device{}();
    std::string summary = fmt::format(
        "kvgen: model {} ({}, {} layers, {} heads / {} KV heads, head_dim {}, vocab {})\n"
        "kvgen: device {}, batch {}, KV cache {}: {}, {} for {} positions\n",
        opt.model_path, c.name, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.n_vocab, selected.description,
        backend.n_batch(), opt.kv_cache ? "on" : "off (every step recomputes the whole sequence)",
        kv_types_name(opt.run.kv_type_k, opt.run.kv_type_v), human_bytes(double(backend.kv_bytes())), backend.n_ctx());
    if (opt.verbose) summary += fmt::format("kvgen: prompt {} tokens, seed {}\n", prompt.size(), seed);
    if (opt.verbose && opt.chat) summary += fmt::format("kvgen: chat prompt:\n{}\n", text);
    std::fputs(summary.c_str(), stderr);

    GenerateOptions g;
    g.n_predict = opt.n_predict;
    g.kv_cache = opt.kv_cache;
    g.sampler = opt.sampler;
    g.sampler.seed = seed;
    const uint64_t fingerprint = prompt_cache ? model_fingerprint(model) : 0;
    PromptCacheLoad pc;
    if (prompt_cache) {
        pc = load_prompt_cache(opt.prompt_cache_path, backend, fingerprint, opt.run.math, prompt);
        if (!pc.problem.empty())
            spdlog::warn("--prompt-cache {}: {}; not used (the prompt is computed)", opt.prompt_cache_path, pc.problem);
        else if (opt.prompt_cache_ro && ::access(opt.prompt_cache_path.c_str(), F_OK) != 0)
            spdlog::warn("--prompt-cache {}: no such file, and --prompt-cache-ro writes none (the prompt is computed)",
                         opt.prompt_cache_path);
        g.n_reused = pc.n_reused;
    }
    // Context shift: --keep N prompt tokens after BOS (llama.cpp's rule; -1: the whole prompt); without --keep, the
    // chat format's system turn (--chat) or BOS alone.
    const RopeFreqs rope = RopeFreqs::of(model);
    if (opt.context_shift)
        g.shift_cache = [&](int n_keep, int n_discard) { shift_kv_cache(backend, c, rope, n_keep, n_discard); };
    const int n_bos = !prompt.empty() && prompt[0] == tok.bos() && tok.bos() >= 0 ? 1 : 0;
    if (opt.n_keep == -1) {
        g.n_keep = int(prompt.size());
    } else if (opt.n_keep >= 0) {
        g.n_keep = std::min(int(prompt.size()), opt.n_keep + n_bos);
    } else if (opt.chat) {
        g.n_keep = ChatFormat::of(model.file, opt.system_prompt).n_head_tokens(tok, tok.add_bos() && !opt.no_bos);
    } else {
        g.n_keep = n_bos;
    }
    // The file gets the rows a later run reuses exactly as a cold run would compute them: the prompt's, saved as
    // soon as they are computed; with --prompt-cache-all every position's, at the end or, when the context fills,
    // before the first shift moves them. A generated token's rows come from a decode pass, which only some backends
    // compute with a prompt's bits (Backend::decode_matches_prompt); elsewhere the prompt's alone are saved.
    const bool save_all = opt.prompt_cache_all && backend.decode_matches_prompt();
    if (opt.prompt_cache_all && !save_all)
        spdlog::warn("--prompt-cache-all: on {}, this model's weight types give a generated token's K/V other bits "
                     "than a prompt token's; only the prompt's are saved, so that a later run reuses exactly what a "
                     "cold run computes",
                     selected.device);
    int n_saved = 0;
    double save_ms = 0;
    auto save_rows = [&](const GenerateStats& s, int n_rows) {
        if (!prompt_cache || opt.prompt_cache_ro) return;
        // note: a file that holds these rows already is left as it is
        if (n_rows == s.n_prompt && pc.problem.empty() && pc.n_file == n_rows && pc.n_reused + 1 == n_rows) return;
        const auto ts = std::chrono::steady_clock::now();
        std::vector<int32_t> rows = prompt;
        rows.insert(rows.end(), s.tokens.begin(), s.tokens.end());
        rows.resize(size_t(n_rows));
        const double compute_ms = pc.saved_ms + s.prefill_ms + (n_rows > s.n_prompt ? s.decode_ms : 0.0);
        save_prompt_cache(opt.prompt_cache_path, backend, fingerprint, opt.run.math, rows, compute_ms);
        n_saved = n_rows;
        save_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ts).count();
    };
    if (!save_all) g.after_prefill = [&](const GenerateStats& s) { save_rows(s, s.n_prompt); };
    g.before_shift = [&](const GenerateStats& s) {
        if (save_all && s.n_shifts == 0) save_rows(s, backend.n_past());
    };
    LogitsFile dump(opt.dump_logits_path, c.n_vocab);
    TextStream stream(tok, opt.special);
    std::string generated;
    bool stdout_closed = false;  // the reader went away (kvgen ... | head): stop quietly
    int stdout_error = 0;        // or writing failed otherwise (a full disk): stop with an error
    char last_out = '\n';        // the last byte written to stdout
    auto write_out = [&](const std::string& s) {
        if (s.empty() || stdout_closed) return;
        stdout_closed = !write_stdout(s, &stdout_error);
        last_out = s.back();
    };
    auto emit = [&](const std::string& s) {
        generated += s;
        write_out(s);
    };
    if (opt.display_prompt) write_out(tok.decode(prompt, opt.special));
    auto is_eog = [&](int32_t id) { return !opt.ignore_eos && tok.is_eog(id); };
    const ReversePrompts reverse(tok, opt.reverse_prompts);
    bool reversed = false;
    // Resident memory after the first token and every 500th, to show it stays flat.
    std::vector<std::pair<int, size_t>> rss_samples;
    int n_tokens = 0;
    GenerateStats st = Generator(backend).run(
        prompt, g,
        [&](int32_t id, const float* logits) {
            dump.row(logits);
            if (!is_eog(id)) emit(stream.push(id));
            ++n_tokens;
            if (n_tokens == 1 || n_tokens % 500 == 0) rss_samples.emplace_back(n_tokens, current_rss_bytes());
            reversed = reverse.found(generated, id);
            return !interrupted() && !stdout_closed && !reversed;
        },
        is_eog, c.n_vocab);
    emit(stream.finish());
    if (stdout_error != 0) throw Error(fmt::format("standard output: write failed: {}", std::strerror(stdout_error)));
    dump.commit();
    const bool was_interrupted = interrupted();
    if (was_interrupted) st.stop = "interrupted";
    if (reversed && !was_interrupted) st.stop = "reverse_prompt";
    // On a terminal the shell's prompt then starts on a line of its own; a pipe gets exactly the generated text.
    if (::isatty(STDOUT_FILENO) && last_out != '\n') write_out("\n");
    const bool quiet = stdout_closed && !was_interrupted;  // the reader has gone: no timings, no warnings
    if (save_all && st.n_shifts == 0) save_rows(st, backend.n_past());
    if (st.stop == "context" && !quiet) {
        if (opt.context_shift && opt.n_predict >= 0)  // a shift was allowed, and would have freed no position
            spdlog::warn("stopped: the context of {} tokens is full, and a context shift that keeps {} frees none "
                         "(raise --ctx-size or lower --keep)",
                         backend.n_ctx(), g.n_keep);
        else
            spdlog::warn("stopped: the context of {} tokens is full (raise --ctx-size)", backend.n_ctx());
    }

    const int n_gen = int(st.tokens.size());
    const int n_decode = std::max(0, n_gen - 1);
    const double total_ms = load_ms + st.prefill_ms + st.decode_ms + st.sample_ms;
    if (!opt.no_perf && !quiet) {
        std::string t = "\n";
        t += fmt::format("kvgen: {:>16} = {:10.2f} ms\n", "load time", load_ms);
        t += timing_line("sampling time", st.sample_ms, n_gen, "runs");
        if (prompt_cache)
            t += fmt::format("kvgen: {:>16} = {:10.2f} ms / {:5d} tokens reused of {} in the file (computing them "
                             "took {:.2f} ms){}\n",
                             "prompt cache", pc.load_ms, st.n_reused, pc.n_file, pc.saved_ms,
                             n_saved > 0 ? fmt::format("; {} tokens saved in {:.2f} ms", n_saved, save_ms) : "");
        t += timing_line("prompt eval time", st.prefill_ms, st.n_prompt - st.n_reused, "tokens");
        t += timing_line("eval time", st.decode_ms, n_decode, "runs");
        t += fmt::format("kvgen: {:>16} = {:10.2f} ms / {:5d} tokens\n", "total time", total_ms, st.n_prompt + n_gen);
        if (st.n_shifts > 0)
            t += fmt::format("kvgen: {:>16} = {:5d} (each kept the first {} tokens and dropped half of the rest)\n",
                             "context shifts", st.n_shifts, g.n_keep);
        if (was_interrupted) t += "kvgen: interrupted\n";
        t += fmt::format("kvgen: mode: KV cache {}, KV cache {} bytes ({}), peak resident memory {}\n",
                         opt.kv_cache ? "on" : "off", backend.kv_bytes(), human_bytes(double(backend.kv_bytes())),
                         human_bytes(double(peak_rss_bytes())));
        std::fputs(t.c_str(), stderr);
    }

    if (!opt.json_path.empty()) {
        nlohmann::ordered_json j;
        j["model"] = opt.model_path;
        j["device"] = selected.device;
        j["device_name"] = selected.description;
        j["threads"] = selected.n_threads;
        j["kv_cache"] = opt.kv_cache;
        j["kv_type"] = kv_types_name(opt.run.kv_type_k, opt.run.kv_type_v);
        j["n_ctx"] = backend.n_ctx();
        j["n_batch"] = backend.n_batch();
        j["seed"] = seed;
        j["prompt_tokens"] = prompt;
        j["tokens"] = st.tokens;
        j["text"] = generated;  // invalid UTF-8 (a model can emit it) is replaced when dumped
        j["stop"] = st.stop;
        j["context_shifts"] = st.n_shifts;
        j["n_keep"] = g.n_keep;
        j["evaluated_tokens"] = st.n_evaluated;
        j["interrupted"] = was_interrupted;
        j["load_ms"] = load_ms;
        j["prefill_ms"] = st.prefill_ms;
        j["decode_ms"] = st.decode_ms;
        j["sample_ms"] = st.sample_ms;
        j["prefill_tok_s"] = st.prefill_ms > 0 ? 1000.0 * (st.n_prompt - st.n_reused) / st.prefill_ms : 0.0;
        if (prompt_cache)
            j["prompt_cache"] = {{"path", opt.prompt_cache_path}, {"problem", pc.problem},
                                 {"file_tokens", pc.n_file},      {"reused_tokens", st.n_reused},
                                 {"load_ms", pc.load_ms},         {"saved_compute_ms", pc.saved_ms},
                                 {"saved_tokens", n_saved}};
        j["decode_tok_s"] = st.decode_ms > 0 ? 1000.0 * n_decode / st.decode_ms : 0.0;
        j["token_ms"] = st.token_ms;
        j["kv_cache_bytes"] = backend.kv_bytes();
        j["peak_rss_bytes"] = peak_rss_bytes();
        j["rss_samples"] = rss_samples;  // [token index, resident bytes]
        write_text_file(opt.json_path, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    }
    return was_interrupted ? 130 : 0;
}

}  // namespace kvgen
