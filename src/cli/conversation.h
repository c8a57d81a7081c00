#pragma once
// Conversation mode (-cnv, --conversation, -i): user turns in the model's chat format, one KV cache kept across
// them. Each turn prefills what the cache does not hold yet: the previous answer's last token and end-of-turn text,
// and the new message with the format's text around it. The answer's other tokens were written to the cache by
// decode steps; where the backend gives a generated token the same bits as a prompt token
// (Backend::decode_matches_prompt: the CPU backend, for the usual weight types) they are reused as they are, and
// elsewhere they are evaluated again as prompt tokens, in one batch. Either way the conversation's cache is exactly
// a single run's over the same transcript where prompt tokens get the same bits in any batch (the CPU); the GPU picks
// its kernels by the batch size, so there it is within rounding of one.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cli/chat.h"
#include "cli/generate.h"
#include "engine/backend.h"
#include "engine/generator.h"
#include "tokenizer/tokenizer.h"

namespace kvgen {

struct TurnResult {
    std::vector<int32_t> tokens;  // the answer's ids, as sampled (an end-of-turn token included)
    int n_reused = 0;             // conversation tokens whose K/V came from the cache
    int n_prefilled = 0;          // tokens evaluated before answering: of the previous answer and this turn's
    int n_added = 0;              // of them, this turn's message and the format's text
    double prefill_ms = 0, decode_ms = 0;
    int n_shifts = 0;             // context shifts during this turn
    std::string stop;             // as GenerateStats::stop
};

class Conversation {
public:
    // g: sampling, answer length (n_predict), context shift; its n_reused is set per turn.
    Conversation(Backend& backend, const Tokenizer& tok, int n_vocab, ChatFormat format, GenerateOptions g,
                 bool add_bos);

    // Answers one user message. on_token(id) is called for each sampled id and returns false to stop the answer.
    // Throws kvgen::Error when the message cannot fit in the context.
    TurnResult answer(const std::string& message, const std::function<bool(int32_t)>& on_token);

    // The conversation so far as ids, position 0 first: what the cache holds, then the answer's end.
    const std::vector<int32_t>& tokens() const { return tokens_; }

private:
    Backend& backend_;
    const Tokenizer& tok_;
    int n_vocab_;
    ChatFormat format_;
    GenerateOptions g_;
    bool add_bos_;
    int turns_ = 0;
    std::vector<int32_t> tokens_;
    int prompt_rows_ = 0;  // leading cache rows a prompt would have (the rest: decode rows to evaluate again)
};

// The terminal front end: reads a line per turn (from the terminal, or stdin when it is not one), prints each answer
// as it comes and one stderr line after it (tokens from the cache, prefilled, speeds). /exit or end of input ends
// it; Ctrl-C stops the answer in progress. Returns the exit status.
int run_conversation(const GenerateCliOptions& opt);

}  // namespace kvgen
