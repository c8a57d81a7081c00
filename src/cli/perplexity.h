#pragma once
// `kvgen --perplexity -f FILE`: llama-perplexity's measurement, so the two compare directly on the same file, model
// and settings. The text is tokenized whole (BOS first when the model adds one) and cut into chunks of -c tokens;
// each chunk is evaluated from an empty KV cache (its first token replaced by BOS when the model adds one), and the
// second half of each chunk is scored: the negative log-likelihood of every token from position n_ctx / 2 + 1 on,
// given the tokens before it in the chunk. Output: a running `[i]ppl,` per chunk, then
// `Final estimate: PPL = X +/- E`, where E is the standard error (the standard deviation of the per-token
// negative log-likelihoods over sqrt(count - 1), times PPL).
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
};

struct PerplexityResult {
    int n_tokens = 0, n_ctx = 0, n_chunks = 0, n_scored = 0;
    double ppl = 0, ppl_stderr = 0, nll = 0;  // nll: the mean negative log-likelihood
    std::vector<double> running;              // the running perplexity after each chunk
};

// Prints the progress and the estimate on stdout, the setup and timing on stderr. Throws kvgen::Error for a text
// of fewer than 2 x n_ctx tokens.
PerplexityResult run_perplexity(const PerplexityOptions& opt);

}  // namespace kvgen
