#pragma once
// Tokenizers built from a GGUF's tokenizer.ggml.* metadata: SentencePiece BPE driven by scores (model "llama") and
// byte-level BPE driven by merges (model "gpt2"), behind one interface.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gguf/gguf.h"

namespace kvgen {

enum class TokenType : int32_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

class Tokenizer {
public:
    enum class Kind { Spm, Bpe };

    // Throws kvgen::Error when the file has no usable tokenizer.
    static Tokenizer from_gguf(const GgufFile& f);

    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;
    ~Tokenizer();

    // Token ids for text; BOS first when add_bos and the vocabulary has one (EOS last when the model asks for
    // it). Control-token text in `text` is plain text unless parse_special.
    std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special = false) const;

    // The bytes one token stands for (control and unknown tokens are empty unless render_special). May end inside a
    // UTF-8 sequence: use TextStream to print.
    std::string piece(int32_t id, bool render_special = false) const;
    // The text of a whole sequence: SentencePiece's leading space (added by encode) is removed.
    std::string decode(const std::vector<int32_t>& ids, bool render_special = false) const;

    Kind kind() const { return kind_; }
    const std::string& model_name() const { return model_; }  // "llama" or "gpt2"
    const std::string& pre() const { return pre_; }
    bool pre_fallback() const { return pre_fallback_; }  // pre-tokenizer unknown: GPT-2's rules were used
    int n_vocab() const { return int(tokens_.size()); }
    const std::string& token_text(int32_t id) const { return tokens_.at(size_t(id)); }
    // The file's type with llama.cpp's corrections: end-of-generation texts are control tokens (see tokenizer.cpp).
    TokenType token_type(int32_t id) const { return types_.at(size_t(id)); }
    int32_t find(std::string_view text) const;  // -1 when absent

    int32_t bos() const { return bos_; }  // -1 when none
    int32_t eos() const { return eos_; }
    bool add_bos() const { return add_bos_; }  // the model's default
    bool add_space_prefix() const { return add_space_prefix_; }
    bool is_eog(int32_t id) const;  // end of generation: EOS, EOT, EOM and the texts llama.cpp takes for it

    struct Impl;

private:
    Tokenizer();
    void encode_text(std::string_view text, bool space_prefix, std::vector<int32_t>& out) const;  // no specials
    void find_end_of_generation(const GgufFile& f);  // fills eog_; may turn tokens into control tokens
    void set_strip_rules(const GgufFile& f);         // fills strip_

    Kind kind_ = Kind::Spm;
    std::string model_, pre_;
    std::vector<std::string> tokens_;
    std::vector<TokenType> types_;
    std::vector<float> scores_;
    std::unordered_map<std::string_view, int32_t> index_;  // views into tokens_
    std::vector<int32_t> specials_;                        // control/user-defined tokens, longest text first
    std::vector<int32_t> eog_;
    std::vector<uint8_t> strip_;  // per token: kLstrip / kRstrip, whitespace a split-out special token takes along
    static constexpr uint8_t kLstrip = 1, kRstrip = 2;
    int32_t bos_ = -1, eos_ = -1, unk_ = -1;
    bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = true, pre_fallback_ = false;
    bool spm_split_words_ = false;  // see spm_words_independent
    std::unique_ptr<Impl> impl_;    // BPE merges and pre-tokenizer regexes
};

// Turns a stream of token ids into printable text: bytes that end inside a UTF-8 sequence are held back until
// the sequence completes, so a terminal never shows a broken character.
class TextStream {
public:
    explicit TextStream(const Tokenizer& tok, bool render_special = false) : tok_(tok), special_(render_special) {}
    std::string push(int32_t id);  // complete UTF-8 text now available (possibly empty)
    std::string finish();          // whatever is held back, at the end of the stream

private:
    const Tokenizer& tok_;
    bool special_;
    std::string pending_;
};

}  // namespace kvgen
