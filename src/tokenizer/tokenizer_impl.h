#pragma once
// Internals shared by tokenizer.cpp, spm.cpp and bpe.cpp.
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;

namespace kvgen {

struct Tokenizer::Impl {
    // Byte-level BPE.
    std::unordered_map<std::string, int> merge_rank;  // "left right" -> rank (lower merges first)
    std::vector<pcre2_real_code_8*> regexes;          // the pre-tokenizer, applied in turn
    bool ignore_merges = false;                       // Llama 3: a word that is a token is taken whole
    std::string byte_to_unicode[256];                 // GPT-2's printable stand-in for each byte
    std::unordered_map<uint32_t, uint8_t> unicode_to_byte;

    ~Impl();
};

// SentencePiece BPE of one fragment (spaces already escaped to U+2581): appends token ids. With split_words the
// fragment is encoded word by word, which gives the same ids when spm_words_independent(vocabulary) holds.
void spm_encode(std::string_view text, const std::unordered_map<std::string_view, int32_t>& index,
                const std::vector<float>& scores, int32_t unk, bool split_words, std::vector<int32_t>& out);

// True when no token has U+2581 after another character, so no merge can join the end of one word to the
// U+2581 that starts the next.
bool spm_words_independent(const std::vector<std::string>& tokens);

// Byte-level BPE: pre-tokenize with the regexes, then merge each word by rank.
void bpe_encode(std::string_view text, const Tokenizer::Impl& impl,
                const std::unordered_map<std::string_view, int32_t>& index, std::vector<int32_t>& out);

// Builds the BPE tables and compiles the pre-tokenizer for `pre` (unknown names fall back to GPT-2's rules and
// set *unknown).
void bpe_init(Tokenizer::Impl& impl, const std::vector<std::string>& merges, const std::string& pre, bool* unknown);

// Every tokenizer.ggml.pre name bpe_init knows (exposed for tests).
std::vector<std::string> bpe_pre_names();

// Splits text into pre-tokenizer words (exposed for tests).
std::vector<std::string> bpe_pretokenize(std::string_view text, const Tokenizer::Impl& impl);

}  // namespace kvgen
