#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kvgen {

// -r: llama-completion's reverse prompts. Generation stops when the text ends with one (searched, as llama.cpp does
// when not interactive, in the last length + 2 bytes: the token that completes it may bring a little more), or when
// the sampled token is the single token a reverse prompt encodes to (e.g. -r "<|im_end|>").
class ReversePrompts {
public:
    ReversePrompts(const Tokenizer& tok, const std::vector<std::string>& texts) {
        for (const std::string& t : texts) {
            if (t.empty()) continue;
            texts_.push_back(t);
            const std::vector<int32_t> ids = tok.encode(t, false, true);
            if (ids.size() == 1) ids_.push_back(ids[0]);
        }
    }
    bool found(const std::string& text, int32_t id) const {
        if (std::find(ids_.begin(), ids_.end(), id) != ids_.end()) return true;
        for (const std::string& t : texts_) {
            const size_t from = text.size() > t.size() + 2 ? text.size() - t.size() - 2 : 0;
            if (text.find(t, from) != std::string::npos) return true;
        }
        return false;
    }

private:
    std::vector<std::string> texts_;
    std::vector<int32_t> ids_;
};

}  // namespace kvgen
