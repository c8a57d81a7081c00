#pragma once
#include <string>

namespace kvgen {

struct TokenizeOptions {
    std::string model_path;
    std::string text;
    bool no_bos = false;
    bool parse_special = false;
    bool verbose = false;
    bool chat = false;          // tokenize the prompt as --chat formats it
    std::string system_prompt;  // --chat: the system turn (empty: the template's default)
};

// `kvgen --tokenize`: the prompt's token ids on one line (BOS first when the model adds it); verbose adds one
// line per token with its piece. Works on vocabulary-only files. Output to a reader that has gone (| head) stops
// quietly.
void run_tokenize(const TokenizeOptions& opt);

}  // namespace kvgen
