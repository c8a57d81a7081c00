#pragma once
#include <string>

namespace kvgen {

struct TokenizeOptions {
    std::string model_path;
    std::string text;
    bool no_bos = false;
    bool parse_special = false;
    bool verbose = false;
};

// `kvgen --tokenize`: the prompt's token ids on one line (BOS first when the model adds it); verbose adds one
// line per token with its piece. Works on vocabulary-only files.
void run_tokenize(const TokenizeOptions& opt);

}  // namespace kvgen
