#include "tokenizer/tokenizer.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace kvgen {

namespace {

const char* const kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's visible space

// DeepSeek's end of sentence (U+FF5C bars, U+2581 spaces), in octal escapes: a hex escape would run on.
const char* const kDeepseekEnd = "<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234>";

// Texts llama.cpp takes for end of generation in any vocabulary. It also makes each such token a control token
// whatever the file says (Phi-3 marks </s> user-defined): its text is then plain text unless special tokens are
// parsed, and it prints nothing unless they are rendered. We do the same, so a prompt tokenizes as llama.cpp's does.
const char* const kEndOfGeneration[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", kDeepseekEnd, "[e~["};

struct FimToken {
    const char* key;
    std::vector<const char*> texts;
};
const FimToken kFimTokens[] = {
    {"tokenizer.ggml.fim_pad_token_id", {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}},
    {"tokenizer.ggml.fim_rep_token_id", {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}},
    {"tokenizer.ggml.fim_sep_token_id", {"<|file_sep|>"}},
};

int32_t id_key(const GgufFile& f, const char* key, int n_vocab, int32_t fallback) {
    const GgufValue* v = f.find(key);
    if (!v || !v->is_integer()) return fallback;
    const int64_t id = v->as_i64();
    return (id >= 0 && id < n_vocab) ? int32_t(id) : -1;
}

bool bool_key(const GgufFile& f, const char* key, bool fallback) {
    const GgufValue* v = f.find(key);
    return (v && v->type() == GgufValueType::BOOL) ? v->as_bool() : fallback;
}

std::string string_key(const GgufFile& f, const char* key) {
    const GgufValue* v = f.find(key);
    return (v && v->type() == GgufValueType::STRING) ? v->as_string() : std::string();
}

// The space test llama.cpp strips with: C's isspace in the "C" locale.
bool is_c_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
    Tokenizer t;
    const GgufValue* model = f.find("tokenizer.ggml.model");
    if (!model || model->type() != GgufValueType::STRING)
        throw Error(fmt::format("{}: no tokenizer (tokenizer.ggml.model is missing)", f.path()));
    t.model_ = model->as_string();
    if (t.model_ == "llama") {
        t.kind_ = Kind::Spm;
    } else if (t.model_ == "gpt2") {
        t.kind_ = Kind::Bpe;
    } else {
        throw Error(fmt::format("{}: tokenizer model '{}' is not supported (llama, gpt2)", f.path(), t.model_));
    }
    if (const GgufValue* pre = f.find("tokenizer.ggml.pre"); pre && pre->type() == GgufValueType::STRING)
        t.pre_ = pre->as_string();

    const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
    if (!tokens || tokens->elem_type() != GgufValueType::STRING || tokens->size() == 0)
        throw Error(fmt::format("{}: tokenizer.ggml.tokens is missing or not a list of strings", f.path()));
    t.tokens_ = tokens->strings();
    const size_t n = t.tokens_.size();
    t.scores_.assign(n, 0.0f);
    if (const GgufValue* s = f.find("tokenizer.ggml.scores"); s && s->is_array() && s->size() == n && !s->raw().empty())
        for (size_t i = 0; i < n; ++i) t.scores_[i] = float(s->number_at(i));
    t.types_.assign(n, TokenType::Normal);
    if (const GgufValue* ty = f.find("tokenizer.ggml.token_type");
        ty && ty->is_array() && ty->size() == n && !ty->raw().empty() && ty->elem_type() != GgufValueType::F32 &&
        ty->elem_type() != GgufValueType::F64) {  // note: types that are not integers are ignored, as a missing key
        for (size_t i = 0; i < n; ++i) {
            const int64_t v = ty->integer_at(i);
            t.types_[i] = (v >= 1 && v <= 6) ? TokenType(v) : TokenType::Normal;
        }
    }
    // note: like llama.cpp, a text that appears twice maps to its last id.
    t.index_.reserve(n);
    for (size_t i = 0; i < n; ++i) t.index_[t.tokens_[i]] = int32_t(i);

    const int nv = int(n);
    const bool spm = t.kind_ == Kind::Spm;
    t.bos_ = id_key(f, "tokenizer.ggml.bos_token_id", nv, spm ? 1 : -1);
    t.eos_ = id_key(f, "tokenizer.ggml.eos_token_id", nv, spm ? 2 : -1);
    t.unk_ = id_key(f, "tokenizer.ggml.unknown_token_id", nv, spm ? 0 : -1);
    t.add_bos_ = bool_key(f, "tokenizer.ggml.add_bos_token", spm);
    t.add_eos_ = bool_key(f, "tokenizer.ggml.add_eos_token", false);
    t.add_space_prefix_ = bool_key(f, "tokenizer.ggml.add_space_prefix", spm);

    t.find_end_of_generation(f);
    for (size_t i = 0; i < n; ++i) {
        const TokenType ty = t.types_[i];
        if ((ty == TokenType::Control || ty == TokenType::UserDefined || ty == TokenType::Unknown) &&
            !t.tokens_[i].empty())
            t.specials_.push_back(int32_t(i));
    }
    std::stable_sort(t.specials_.begin(), t.specials_.end(), [&t](int32_t a, int32_t b) {
        return t.tokens_[size_t(a)].size() > t.tokens_[size_t(b)].size();
    });
    t.set_strip_rules(f);

    if (spm) t.spm_split_words_ = spm_words_independent(t.tokens_);
    t.impl_ = std::make_unique<Impl>();
    if (t.kind_ == Kind::Bpe) {
        const GgufValue* merges = f.find("tokenizer.ggml.merges");
        if (!merges || merges->elem_type() != GgufValueType::STRING)
            throw Error(fmt::format("{}: a gpt2 tokenizer needs tokenizer.ggml.merges", f.path()));
        bool unknown_pre = false;
        bpe_init(*t.impl_, merges->strings(), t.pre_, &unknown_pre);
        t.pre_fallback_ = unknown_pre;
    }
    return t;
}

void Tokenizer::find_end_of_generation(const GgufFile& f) {
    const int nv = n_vocab();
    auto add = [this](int32_t id) {
        if (id >= 0 && !is_eog(id)) eog_.push_back(id);
    };
    for (const char* text : kEndOfGeneration) {
        const int32_t id = find(text);
        if (id < 0) continue;
        add(id);
        types_[size_t(id)] = TokenType::Control;
    }
    for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) add(id_key(f, key, nv, -1));
    add(eos_);
    // The fill-in-the-middle pad, repository and file-separator tokens end generation too (SmolLM2's <reponame>):
    // the file's id when it names one, else the first of llama.cpp's texts for it, which becomes a control token.
    for (const FimToken& fim : kFimTokens) {
        if (const int32_t id = id_key(f, fim.key, nv, -1); id >= 0) {
            add(id);
            continue;
        }
        for (const char* text : fim.texts) {
            const int32_t id = find(text);
            if (id < 0) continue;
            add(id);
            types_[size_t(id)] = TokenType::Control;
            break;
        }
    }

    // llama.cpp's two exceptions, by the other texts present: gpt-oss (<|return|>, <|call|>) and Solar Open
    // (<|calls|>, <|flush|>) end a message, not the generation, with <|end|>, which stays user-defined text there;
    // Gemma 4 (<|tool_response>) and PLaMo (<|plamo:eos|>) have an ordinary </s>.
    auto has = [this](const char* text) {
        const int32_t id = find(text);
        return id >= 0 && is_eog(id);
    };
    auto demote = [this](const char* text, TokenType type) {
        const int32_t id = find(text);
        eog_.erase(std::remove(eog_.begin(), eog_.end(), id), eog_.end());
        types_[size_t(id)] = type;
    };
    if (has("<|end|>") && ((has("<|return|>") && has("<|call|>")) || (has("<|calls|>") && has("<|flush|>"))))
        demote("<|end|>", TokenType::UserDefined);
    if (has("</s>") && (has("<|tool_response>") || has("<|plamo:eos|>"))) demote("</s>", TokenType::Normal);
}

void Tokenizer::set_strip_rules(const GgufFile& f) {
    // llama.cpp keys these on general.name (lower-cased), tokenizer.ggml.pre and general.architecture, the first
    // rule that applies only; the GGUF itself carries no per-token strip attributes.
    strip_.assign(tokens_.size(), 0);
    auto set = [this](const char* text, uint8_t bit, bool on) {
        const int32_t id = find(text);
        if (id < 0) return;
        strip_[size_t(id)] = on ? uint8_t(strip_[size_t(id)] | bit) : uint8_t(strip_[size_t(id)] & ~bit);
    };
    auto contains_any = [](const std::string& s, std::initializer_list<const char*> parts) {
        return std::any_of(parts.begin(), parts.end(), [&s](const char* p) { return s.find(p) != std::string::npos; });
    };
    std::string name = string_key(f, "general.name");
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    const std::string arch = string_key(f, "general.architecture");
    if (contains_any(pre_, {"jina-v2-de", "jina-v2-es", "jina-v2-code"}) ||
        contains_any(arch, {"nomic-bert-moe", "jina-bert-v3"})) {
        set("<mask>", kLstrip, true);
    } else if (contains_any(name, {"phi-3", "phi3"})) {
        // Phi-3: every special token eats the whitespace after it, except <unk>, <s> and <|endoftext|>.
        for (int32_t id : specials_) strip_[size_t(id)] |= kRstrip;
        set("</s>", kRstrip, true);
        for (const char* text : {"<unk>", "<s>", "<|endoftext|>"}) set(text, kRstrip, false);
    } else if (contains_any(name, {"modern-bert"})) {
        set("[MASK]", kLstrip, true);
    }
}

int32_t Tokenizer::find(std::string_view text) const {
    const auto it = index_.find(text);
    return it == index_.end() ? -1 : it->second;
}

bool Tokenizer::is_eog(int32_t id) const { return std::find(eog_.begin(), eog_.end(), id) != eog_.end(); }

void Tokenizer::encode_text(std::string_view text, bool space_prefix, std::vector<int32_t>& out) const {
    if (kind_ == Kind::Bpe) {
        bpe_encode(text, *impl_, index_, out);
        return;
    }
    std::string escaped;
    escaped.reserve(text.size() + 8);
    if (space_prefix) escaped += kSpace;
    for (char c : text) {
        if (c == ' ') escaped += kSpace;
        else escaped += c;
    }
    spm_encode(escaped, index_, scores_, unk_, spm_split_words_, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
    std::vector<int32_t> out;
    if (add_bos && bos_ >= 0) out.push_back(bos_);

    // Split out special tokens, longest text first; control and unknown tokens only when parse_special
    // (user-defined tokens always, as llama.cpp does). A token with a strip rule takes the ASCII whitespace next
    // to it in the same fragment along with it.
    struct Fragment {
        size_t start, len;
        int32_t token;  // -1: raw text
    };
    std::vector<Fragment> frags;
    if (!text.empty()) frags.push_back({0, text.size(), -1});
    for (int32_t id : specials_) {
        if (!parse_special && types_[size_t(id)] != TokenType::UserDefined) continue;
        const std::string& st = tokens_[size_t(id)];
        const uint8_t strip = strip_[size_t(id)];
        std::vector<Fragment> next;
        for (const Fragment& fr : frags) {
            if (fr.token >= 0) {
                next.push_back(fr);
                continue;
            }
            size_t pos = fr.start;
            const size_t end = fr.start + fr.len;
            while (pos < end) {
                const size_t hit = text.substr(0, end).find(st, pos);
                if (hit == std::string_view::npos) break;
                size_t left_end = hit;
                if (strip & kLstrip)
                    while (left_end > pos && is_c_space(text[left_end - 1])) --left_end;
                if (left_end > pos) next.push_back({pos, left_end - pos, -1});
                next.push_back({hit, st.size(), id});
                pos = hit + st.size();
                if (strip & kRstrip)
                    while (pos < end && is_c_space(text[pos])) ++pos;
            }
            if (pos < end) next.push_back({pos, end - pos, -1});
        }
        frags.swap(next);
    }

    bool prev_special = true;  // SentencePiece prefixes a space at the start and after each special token
    for (const Fragment& fr : frags) {
        if (fr.token >= 0) {
            out.push_back(fr.token);
            prev_special = true;
        } else {
            encode_text(text.substr(fr.start, fr.len), add_space_prefix_ && prev_special, out);
            prev_special = false;
        }
    }
    if (add_eos_ && add_bos && eos_ >= 0) out.push_back(eos_);
    return out;
}

std::string Tokenizer::piece(int32_t id, bool render_special) const {
    if (id < 0 || id >= n_vocab()) return "";
    const std::string& text = tokens_[size_t(id)];
    const TokenType type = types_[size_t(id)];
    // note: like llama.cpp, unknown tokens print as nothing unless special tokens are rendered.
    if (type == TokenType::Control || type == TokenType::Unknown) return render_special ? text : "";
    if (type == TokenType::UserDefined) return text;
    if (kind_ == Kind::Spm) {
        if (type == TokenType::Byte && text.size() == 6 && text.compare(0, 3, "<0x") == 0) {
            return std::string(1, char(std::stoi(text.substr(3, 2), nullptr, 16)));
        }
        std::string out;
        for (size_t i = 0; i < text.size();) {
            if (text.compare(i, 3, kSpace) == 0) {
                out += ' ';
                i += 3;
            } else {
                out += text[i++];
            }
        }
        return out;
    }
    // Byte-level BPE: each character stands for one byte.
    std::string out;
    for (size_t i = 0; i < text.size();) {
        const size_t n = utf8::valid_at(text, i);
        if (n == 0) {
            out += text[i++];
            continue;
        }
        uint32_t cp = static_cast<unsigned char>(text[i]) & (0x7f >> (n == 1 ? 0 : n));
        for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3f);
        const auto it = impl_->unicode_to_byte.find(cp);
        if (it != impl_->unicode_to_byte.end()) out += char(it->second);
        else out.append(text, i, n);
        i += n;
    }
    return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool render_special) const {
    std::string out;
    for (int32_t id : ids) out += piece(id, render_special);
    if (kind_ == Kind::Spm && add_space_prefix_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
}

std::string TextStream::push(int32_t id) {
    pending_ += tok_.piece(id, special_);
    const size_t hold = utf8::incomplete_tail(pending_);
    std::string ready = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    return ready;
}

std::string TextStream::finish() {
    std::string rest;
    rest.swap(pending_);
    return rest;
}

}  // namespace kvgen
