#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "common/error.h"

namespace kvgen {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void check_prompt_fits(int n_prompt, int n_ctx) {
    if (n_prompt >= n_ctx)
        throw Error(fmt::format("prompt has {} tokens and the context holds {}, which leaves no room to generate "
                                "(raise --ctx-size)",
                                n_prompt, n_ctx));
}

const float* prefill(Backend& backend, const int32_t* tokens, int from, int to) {
    const float* logits = nullptr;
    for (int pos = from; pos < to; pos += backend.n_batch()) {
        const int n = std::min(backend.n_batch(), to - pos);
        logits = backend.forward(tokens + pos, n, pos, Pass::Prefill);
    }
    return logits;
}

GenerateStats Generator::run(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                             const std::function<bool(int32_t, const float*)>& on_token,
                             const std::function<bool(int32_t)>& is_eog, int n_vocab) {
    GenerateStats st;
    st.n_prompt = int(prompt.size());
    if (prompt.empty()) throw Error("the prompt is empty (give -p TEXT; a model without BOS needs some text)");
    check_prompt_fits(int(prompt.size()), backend_.n_ctx());
    Sampler sampler(opt.sampler);
    std::vector<int32_t> seq = prompt;  // every token so far: the sampler's history
    std::vector<int32_t> ctx = prompt;  // the tokens at cache positions 0.. (fewer than seq after a context shift)

    // note: the last prompt token is always evaluated, for the logits that choose the first new one.
    st.n_reused = opt.kv_cache ? std::clamp(opt.n_reused, 0, int(seq.size()) - 1) : 0;
    backend_.kv_truncate(st.n_reused);
    auto t0 = std::chrono::steady_clock::now();
    const float* logits = prefill(backend_, seq.data(), st.n_reused, int(seq.size()));
    st.prefill_ms = ms_since(t0);
    st.n_evaluated = int(seq.size()) - st.n_reused;
    if (opt.after_prefill) opt.after_prefill(st);
    double step_ms = st.prefill_ms;
    if (opt.n_predict == 0) {  // the prompt alone: its K/V are in the cache, nothing is sampled
        st.stop = "n_predict";
        st.cached = seq;
        return st;
    }

    for (;;) {
        auto ts = std::chrono::steady_clock::now();
        const int32_t id = sampler.sample(logits, n_vocab, seq);
        const double sms = ms_since(ts);
        st.sample_ms += sms;
        st.token_ms.push_back(step_ms + sms);
        st.tokens.push_back(id);
        seq.push_back(id);
        ctx.push_back(id);
        if (!on_token(id, logits)) {
            st.stop = "stopped";
            break;
        }
        if (is_eog && is_eog(id)) {
            st.stop = "eog";
            break;
        }
        if (opt.n_predict >= 0 && int(st.tokens.size()) >= opt.n_predict) {
            st.stop = "n_predict";
            break;
        }
        const bool full = int(ctx.size()) >= backend_.n_ctx();
        const int n_keep = std::clamp(opt.n_keep, 0, int(ctx.size()) - 1);
        const int n_discard = (int(ctx.size()) - 1 - n_keep) / 2;
        if (full) {
            // Full: shift (keep n_keep, drop half of the rest), or stop.
            // note: only a run with a length to reach shifts; -n -1 means "until the end of generation or a full
            // context", and a model that never ends its text would otherwise run forever.
            if (!opt.shift_cache || opt.n_predict < 0 || n_discard < 1) {
                st.stop = "context";
                break;
            }
            if (opt.before_shift) opt.before_shift(st);  // outside the step's time
        }
        t0 = std::chrono::steady_clock::now();
        if (full) {
            if (opt.kv_cache) opt.shift_cache(n_keep, n_discard);
            ctx.erase(ctx.begin() + n_keep, ctx.begin() + n_keep + n_discard);
            ++st.n_shifts;
        }
        if (opt.kv_cache) {
            logits = backend_.forward(&ctx.back(), 1, int(ctx.size()) - 1, Pass::Decode);
            st.n_evaluated += 1;
        } else {
            backend_.kv_truncate(0);  // recompute everything: the comparison the cache is measured against
            logits = prefill(backend_, ctx.data(), 0, int(ctx.size()));
            st.n_evaluated += int(ctx.size());
        }
        step_ms = ms_since(t0);
        st.decode_ms += step_ms;
    }
    if (opt.kv_cache) st.cached.assign(ctx.begin(), ctx.begin() + std::min<int>(int(ctx.size()), backend_.n_past()));
    return st;
}

}  // namespace kvgen
