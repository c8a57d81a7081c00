#include "cli/conversation.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <iostream>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/backend_select.h"
#include "cli/format.h"
#include "cli/reverse_prompts.h"
#include "cli/signals.h"
#include "common/error.h"
#include "engine/context_shift.h"
#include "model/weights.h"

namespace kvgen {

Conversation::Conversation(Backend& backend, const Tokenizer& tok, int n_vocab, ChatFormat format, GenerateOptions g,
                           bool add_bos)
    : backend_(backend), tok_(tok), n_vocab_(n_vocab), format_(std::move(format)), g_(std::move(g)), add_bos_(add_bos) {
    backend_.kv_truncate(0);
}

TurnResult Conversation::answer(const std::string& message, const std::function<bool(int32_t)>& on_token) {
    const std::string text = turns_ == 0 ? format_.first_turn(message) : format_.next_turn(message);
    const std::vector<int32_t> added = tok_.encode(text, turns_ == 0 && add_bos_, true);
    // note: the cache holds tokens_[0 .. n_past); what follows (the previous answer's end) is evaluated with the
    // new turn.
    TurnResult r;
    const int n_ctx = backend_.n_ctx();
    while (int(tokens_.size() + added.size()) >= n_ctx) {  // make room: shift as a full context would
        const int n_past = backend_.n_past(), n_keep = std::clamp(g_.n_keep, 0, n_past);
        const int n_discard = std::max(n_past - n_keep, 0) / 2;
        if (!g_.shift_cache || n_discard < 1)
            throw Error(fmt::format("the conversation with this message has {} tokens but the context holds {}{} "
                                    "(raise --ctx-size{})",
                                    tokens_.size() + added.size(), n_ctx,
                                    turns_ > 0 && g_.shift_cache ? fmt::format(", {} of them kept by a context shift",
                                                                               n_keep)
                                                                 : "",
                                    turns_ > 0 && g_.shift_cache ? " or lower --keep" : ""));
        g_.shift_cache(n_keep, n_discard);
        tokens_.erase(tokens_.begin() + n_keep, tokens_.begin() + n_keep + n_discard);
        prompt_rows_ = prompt_rows_ > n_keep + n_discard ? prompt_rows_ - n_discard : std::min(prompt_rows_, n_keep);
        ++r.n_shifts;
    }
    std::vector<int32_t> prompt = tokens_;
    prompt.insert(prompt.end(), added.begin(), added.end());
    GenerateOptions g = g_;
    g.n_reused = std::min(backend_.n_past(), prompt_rows_);
    const GenerateStats st = Generator(backend_).run(
        prompt, g, [&](int32_t id, const float*) { return on_token(id); },
        [this](int32_t id) { return tok_.is_eog(id); }, n_vocab_);
    ++turns_;
    r.tokens = st.tokens;
    r.n_reused = st.n_reused;
    r.n_prefilled = st.n_prompt - st.n_reused;
    r.n_added = int(added.size());
    // The answer's rows are a prompt's where the backend computes both passes alike (the CPU, for the common weight
    // types); otherwise they are evaluated again as prompt tokens next turn. A shift moved the rows (their keys
    // rotated): they match no single run any more, and are all reused.
    prompt_rows_ = st.n_shifts == 0 && !backend_.decode_matches_prompt() ? st.n_prompt : backend_.n_past();
    r.prefill_ms = st.prefill_ms;
    r.decode_ms = st.decode_ms;
    r.n_shifts += st.n_shifts;
    r.stop = st.stop;
    // The conversation as the cache holds it, then the sampled token that was not evaluated (unless it ends the
    // turn: the format's end text below brings it), then the end of the answer.
    tokens_ = st.cached;
    if (!st.tokens.empty() && !tok_.is_eog(st.tokens.back())) tokens_.push_back(st.tokens.back());
    const std::vector<int32_t> end = tok_.encode(format_.answer_end(), false, true);
    tokens_.insert(tokens_.end(), end.begin(), end.end());
    return r;
}

int run_conversation(const GenerateCliOptions& opt) {
    if (!opt.json_path.empty()) check_writable(opt.json_path);
    resolve_device(opt.run.device);
    const Model model = Model::load(opt.model_path);
    const Config& c = model.config;
    const Tokenizer tok = tokenizer_for(model, opt.model_path);
    // As llama.cpp's conversation mode: -p is the system message when -sys is not given.
    const std::string system = !opt.system_prompt.empty() ? opt.system_prompt : opt.prompt;
    const ChatFormat format = ChatFormat::of(model.file, system);
    SelectedBackend selected = make_backend(model, opt.run);
    Backend& backend = *selected.backend;

    GenerateOptions g;
    g.n_predict = opt.n_predict;
    g.sampler = opt.sampler;
    g.sampler.seed = opt.seed >= 0 ? uint32_t(opt.seed) : std::random_device{}();
    const RopeFreqs rope = RopeFreqs::of(model);
    if (opt.context_shift)
        g.shift_cache = [&](int n_keep, int n_discard) { shift_kv_cache(backend, c, rope, n_keep, n_discard); };
    const bool add_bos = tok.add_bos() && !opt.no_bos;
    // A shift keeps the system turn (and BOS) unless --keep says otherwise.
    g.n_keep = opt.n_keep >= 0 ? opt.n_keep + (add_bos ? 1 : 0) : format.n_head_tokens(tok, add_bos);

    std::fprintf(stderr,
                 "kvgen: model %s (%s), device %s, KV cache %s for %d positions\n"
                 "kvgen: conversation: one line per message; /exit or end of input ends it, Ctrl-C stops an answer\n",
                 opt.model_path.c_str(), c.name.c_str(), selected.description.c_str(),
                 kv_types_name(opt.run.kv_type_k, opt.run.kv_type_v).c_str(), backend.n_ctx());
    Conversation conv(backend, tok, c.n_vocab, format, g, add_bos);
    const ReversePrompts reverse(tok, opt.reverse_prompts);
    const bool terminal = ::isatty(STDIN_FILENO) != 0;
    nlohmann::ordered_json turns = nlohmann::json::array();
    // The report of the turns answered, also when an error ends the conversation (with the error in it).
    auto write_report = [&](const std::string& error) {
        if (opt.json_path.empty()) return;
        nlohmann::ordered_json j;
        j["model"] = opt.model_path;
        j["device"] = selected.device;
        j["n_ctx"] = backend.n_ctx();
        j["turns"] = turns;
        j["conversation_tokens"] = conv.tokens();
        if (!error.empty()) j["error"] = error;
        write_text_file(opt.json_path, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    };
    std::string line;
    for (int turn = 1;; ++turn) {
        if (terminal) {
            std::fputs("\n> ", stdout);
            std::fflush(stdout);
        }
        if (!std::getline(std::cin, line)) break;
        if (!line.empty() && line.back() == '\r') line.pop_back();  // a line typed or saved with CRLF
        const size_t first = line.find_first_not_of(" \t"), last = line.find_last_not_of(" \t");
        if (first == std::string::npos) {  // nothing to answer
            --turn;
            continue;
        }
        if (line.substr(first, last - first + 1) == "/exit") break;
        clear_interrupt();  // a Ctrl-C at the prompt (a line typed ahead was waiting) stopped no answer
        TextStream stream(tok, opt.special);
        std::string answer;
        bool stdout_closed = false, reversed = false;
        int stdout_error = 0;
        auto out = [&](const std::string& s) {
            if (s.empty() || stdout_closed) return;
            answer += s;
            stdout_closed = !write_stdout(s, &stdout_error);
        };
        TurnResult r;
        try {
            r = conv.answer(line, [&](int32_t id) {
                if (!tok.is_eog(id)) out(stream.push(id));
                reversed = reverse.found(answer, id);
                return !interrupted() && !stdout_closed && !reversed;
            });
        } catch (const Error& e) {
            if (terminal) std::fputs("\n", stdout);
            write_report(e.what());
            throw;  // one error line and exit status 1, as a prompt that does not fit the context
        }
        out(stream.finish());
        if (!answer.empty() && answer.back() != '\n') out("\n");
        if (stdout_error != 0) {
            const Error e(fmt::format("standard output: write failed: {}", std::strerror(stdout_error)));
            write_report(e.what());
            throw e;
        }
        const bool stopped = interrupted();
        const int n_gen = int(r.tokens.size());
        std::fprintf(stderr,
                     "kvgen: turn %d: %d tokens from the cache, %d prefilled (%d of the previous answer, %d new; "
                     "%.2f ms, %.2f tok/s), %d generated (%.2f ms, %.2f tok/s)%s%s\n",
                     turn, r.n_reused, r.n_prefilled, r.n_prefilled - r.n_added, r.n_added, r.prefill_ms,
                     r.prefill_ms > 0 ? 1000.0 * r.n_prefilled / r.prefill_ms : 0.0, n_gen, r.decode_ms,
                     r.decode_ms > 0 ? 1000.0 * std::max(0, n_gen - 1) / r.decode_ms : 0.0,
                     r.n_shifts > 0 ? fmt::format(", {} context shift(s)", r.n_shifts).c_str() : "",
                     stopped ? ", stopped by Ctrl-C" : "");
        turns.push_back({{"message", line},
                         {"answer", answer},
                         {"tokens", r.tokens},
                         {"reused_tokens", r.n_reused},
                         {"prefilled_tokens", r.n_prefilled},
                         {"new_tokens", r.n_added},
                         {"prefill_ms", r.prefill_ms},
                         {"decode_ms", r.decode_ms},
                         {"context_shifts", r.n_shifts},
                         {"stop", stopped ? "interrupted" : reversed ? "reverse_prompt" : r.stop}});
        if (stdout_closed) break;
        if (stopped) clear_interrupt();
    }
    if (terminal) std::fputs("\n", stdout);
    write_report("");
    return 0;
}

}  // namespace kvgen
