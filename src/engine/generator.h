#pragma once
// The generation loop: prefill the prompt in batches, then decode one token per step through the cache, or (with
// the cache off) clear it and recompute the whole sequence every step with the same prefill path.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/sampler.h"

namespace kvgen {

struct GenerateStats {
    int n_prompt = 0;
    int n_reused = 0;             // prompt tokens taken from the cache, not evaluated (GenerateOptions::n_reused)
    std::vector<int32_t> tokens;  // generated ids
    double prefill_ms = 0;        // the prompt's forward pass (its n_prompt - n_reused evaluated tokens)
    double decode_ms = 0;         // every later forward pass
    double sample_ms = 0;
    std::vector<double> token_ms;  // latency of each generated token (forward + sampling)
    std::string stop;              // "eog", "n_predict", "context", "stopped"
    int n_shifts = 0;              // context shifts
    int n_evaluated = 0;           // tokens run through the forward pass (every one again at each --no-kv-cache step)
    std::vector<int32_t> cached;   // the tokens whose K/V the cache holds at the end, position 0 first
};

struct GenerateOptions {
    int n_predict = -1;  // -1: until end of generation or a full context
    bool kv_cache = true;
    int n_reused = 0;  // leading prompt tokens whose K/V the backend's cache already holds (a prompt-cache hit)
    SamplerOptions sampler;
    // Context shift: when the context is full before n_predict tokens (n_predict >= 0), shift_cache(n_keep,
    // n_discard) drops cache positions [n_keep, n_keep + n_discard) (shift_kv_cache, context_shift.h), with n_discard
    // half of the positions after n_keep, and generation goes on. Null, or n_predict -1: stop with "context".
    std::function<void(int n_keep, int n_discard)> shift_cache;
    int n_keep = 0;
    // Called once the prompt's K/V are in the cache (the stats so far: n_prompt, n_reused, prefill_ms).
    std::function<void(const GenerateStats&)> after_prefill;
    // Called before each context shift, outside the step's time. Before the first (stats.n_shifts 0), cache
    // positions [0, n_past) hold the first n_past tokens of prompt + stats.tokens as they were computed; later ones
    // find the rows after n_keep moved already.
    std::function<void(const GenerateStats&)> before_shift;
};

// Throws kvgen::Error when a prompt of n_prompt tokens leaves no room in a context of n_ctx to generate.
void check_prompt_fits(int n_prompt, int n_ctx);

// Runs tokens[from .. to) through the backend in batches of its batch size, appending their K/V to the cache;
// returns the logits of the last one.
const float* prefill(Backend& backend, const int32_t* tokens, int from, int to);

class Generator {
public:
    explicit Generator(Backend& backend) : backend_(backend) {}

    // on_token(id, logits that chose it) returns false to stop. is_eog decides end of generation (null: never).
    GenerateStats run(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                      const std::function<bool(int32_t, const float*)>& on_token,
                      const std::function<bool(int32_t)>& is_eog, int n_vocab);

private:
    Backend& backend_;
};

}  // namespace kvgen
