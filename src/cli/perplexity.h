#pragma once
// `kvgen --perplexity -f FILE`: llama-perplexity's measurement, so the two compare directly on the same file, model
// and settings. The text is tokenized whole (BOS first when the model adds one) and cut into chunks of -c tokens;
// each chunk is evaluated from an empty KV cache (its first token replaced by BOS when the model adds one), and the
// second half of each chunk is scored: the negative log-likelihood of every token from position n_ctx / 2 + 1 on,
// given the tokens before it in the chunk. Output: a running `[i]ppl,` per chunk, then
// `Final estimate: PPL = X +/- E`, where E is the standard error (the standard deviation of the per-token
// negative log-likelihoods over sqrt(count - 1), times PPL).
//
// KL divergence against a base run (llama-perplexity's --kl-divergence-base / --kl-divergence, with a smaller file):
// the base run (--kl-divergence-base FILE, usually an f16 cache) saves, for every scored token, its kKlTop most
// likely tokens with their log-probabilities and the log of the probability left over; a later run on the same
// model and text (--kl-divergence FILE) compares its own distribution with them: KL(base || run) over those
// kKlTop + 1 outcomes (the tail merged into one), which is a lower bound on the full KL divergence and close to it
// when the tail carries little probability; the share of tokens whose most likely token agrees; and the change in
// perplexity.
#include <string>
#include <vector>

#include "engine/settings.h"

namespace kvgen {

struct PerplexityOptions {
    std::string model_path;
    std::string text_path;  // for messages
    std::string text;       // the file's contents
    bool no_bos = false;
    Settings run;           // n_ctx is the chunk size; all_logits is set here
    std::string json_path;  // a machine-readable report, when not empty
    std::string kl_base_path;  // write the base distributions here
    std::string kl_path;       // compare with the base distributions saved here
};

constexpr int kKlTop = 32;

struct PerplexityResult {
    int n_tokens = 0, n_ctx = 0, n_chunks = 0, n_scored = 0;
    double ppl = 0, ppl_stderr = 0, nll = 0;  // nll: the mean negative log-likelihood
    std::vector<double> running;              // the running perplexity after each chunk
    // With kl_path: mean KL divergence (and its standard error), top-1 agreement, the base run's perplexity.
    bool have_kl = false;
    double kl = 0, kl_stderr = 0, top1 = 0, base_ppl = 0;
};

// Prints the progress and the estimate on stdout, the setup and timing on stderr. Throws kvgen::Error for a text
// of fewer than 2 x n_ctx tokens, and for a KL base file from another model, vocabulary, text or -c.
PerplexityResult run_perplexity(const PerplexityOptions& opt);

}  // namespace kvgen
