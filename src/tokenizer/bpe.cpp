// Byte-level BPE, as GPT-2 and its descendants define it: the text is split into words by the model's
// pre-tokenizer regexes (PCRE2, with Unicode classes), each word's bytes are written as GPT-2's printable stand-in
// characters, and adjacent symbols are merged by rank (lowest first, leftmost on ties) from tokenizer.ggml.merges.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <queue>
#include <string>

#include <fmt/format.h>

#include "common/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace kvgen {

namespace {

const char* const kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const char* const kLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// DeepSeek's pre-tokenizers list scripts explicitly (from their tokenizer.json). Every non-ASCII code point is an
// escape: these classes once went through an editor that NFC-normalized the file, which replaced U+1F7D, U+1FBE,
// U+1FD3, U+1FDB, U+2126 and U+212A by their canonical equivalents and put a range out of order.
// The cased letters (Lu, Ll, Lt) as DeepSeek lists them, a subset of Unicode's.
const char* const kDeepseekLetters =
    "\\s?[A-Za-z\\x{00B5}\\x{00C0}-\\x{00D6}\\x{00D8}-\\x{00F6}\\x{00F8}-\\x{01BA}\\x{01BC}-\\x{01BF}"
    "\\x{01C4}-\\x{0293}\\x{0295}-\\x{02AF}\\x{0370}-\\x{0373}\\x{0376}\\x{0377}\\x{037B}-\\x{037D}\\x{037F}\\x{0386}"
    "\\x{0388}-\\x{038A}\\x{038C}\\x{038E}-\\x{03A1}\\x{03A3}-\\x{03F5}\\x{03F7}-\\x{0481}\\x{048A}-\\x{052F}"
    "\\x{0531}-\\x{0556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}"
    "\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}"
    "\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}"
    "\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}"
    "\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}"
    "\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}"
    "\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}"
    "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}"
    "\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}"
    "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+";
// note: llama.cpp turns every non-ASCII space into U+000B before it runs these classes, so a space inside their
// ranges (U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000) matches only \s: the ranges skip them.
// ASCII punctuation, fullwidth punctuation, curly quotes, U+3001-U+3002.
const char* const kDeepseekPunct =
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3001}-\\x{3002}]+";
// CJK ideographs, U+0800-U+4E00 (many scripts), Hangul; deepseek-coder uses it too.
const char* const kCjk =
    "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{167F}\\x{1681}-\\x{1FFF}\\x{200B}-\\x{2027}\\x{202A}-\\x{202E}"
    "\\x{2030}-\\x{205E}\\x{2060}-\\x{2FFF}\\x{3001}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+";

struct PreRules {
    std::vector<const char*> names;
    std::vector<const char*> regexes;
    bool ignore_merges;
};

const std::vector<PreRules>& pre_rules() {
    static const std::vector<PreRules> rules = {
        {{"default", "gpt-2", "gpt2", "mpt", "olmo", "jais", "trillion"}, {kGpt2}, false},
        {{"llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral"}, {kLlama3}, true},
        {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}, {"\\p{N}", kGpt2}, false},
        {{"qwen2", "stablelm2", "megrez", "hunyuan"}, {kQwen2}, false},
        {{"deepseek-llm"}, {"[\\r\\n]", kDeepseekLetters, kDeepseekPunct, "\\s+$", kCjk, "\\p{N}+"}, false},
        {{"deepseek-coder"}, {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", kCjk, "\\p{N}"}, false},
        {{"falcon"}, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2, "[0-9][0-9][0-9]"}, false},
    };
    return rules;
}

// Whitespace as llama.cpp counts it. PCRE2's \s also takes U+180E (Mongolian vowel separator, a format character
// since Unicode 6.3), which llama.cpp does not, so every \s and \S is rewritten to this set before compiling.
const char* const kSpaceSet =
    "\\t-\\r \\x{0085}\\x{00A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string with_llama_spaces(std::string_view pattern) {
    std::string out;
    bool in_class = false;  // note: our patterns never open a class with ']' or use [:posix:] names
    for (size_t i = 0; i < pattern.size(); ++i) {
        const char c = pattern[i];
        if (c == '\\' && i + 1 < pattern.size()) {
            const char e = pattern[++i];
            if (e == 's') {
                out += in_class ? std::string(kSpaceSet) : std::string("[") + kSpaceSet + "]";
            } else if (e == 'S' && !in_class) {
                out += std::string("[^") + kSpaceSet + "]";
            } else if (e == 'S') {
                throw Error(fmt::format("tokenizer: pre-tokenizer regex '{}' has \\S inside a class", pattern));
            } else {
                out += c;
                out += e;
            }
            continue;
        }
        if (c == '[') in_class = true;
        if (c == ']') in_class = false;
        out += c;
    }
    return out;
}

pcre2_code* compile(const char* pattern) {
    const std::string rewritten = with_llama_spaces(pattern);
    int err = 0;
    PCRE2_SIZE at = 0;
    pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.c_str()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &at, nullptr);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof(msg));
        throw Error(fmt::format("tokenizer: pre-tokenizer regex does not compile at {} of '{}': {}", at, rewritten,
                                reinterpret_cast<const char*>(msg)));
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // falls back to the interpreter where JIT is unavailable
    return re;
}

struct Span {
    size_t start, len;
};

// Splits every span by one regex: matches and the gaps between them both become spans (as llama.cpp does).
std::vector<Span> split(std::string_view text, const std::vector<Span>& spans, pcre2_code* re, pcre2_match_data* md) {
    std::vector<Span> out;
    out.reserve(spans.size() * 2);
    for (const Span& s : spans) {
        const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + s.start);
        size_t pos = 0, last = 0;
        while (pos <= s.len) {
            const int rc = pcre2_match(re, subject, s.len, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
            if (rc < 0) break;
            const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
            size_t b = ov[0], e = ov[1];
            if (e == b) {  // an empty match: step over one character
                pos = b + utf8::seq_len(static_cast<unsigned char>(text[s.start + b]));
                continue;
            }
            if (b > last) out.push_back({s.start + last, b - last});
            out.push_back({s.start + b, e - b});
            last = pos = e;
        }
        if (last < s.len) out.push_back({s.start + last, s.len - last});
    }
    return out;
}

std::vector<Span> pretokenize(std::string_view text, const Tokenizer::Impl& impl) {
    // Valid UTF-8 runs go through the regexes; each invalid byte is a word of its own (its byte survives).
    std::vector<Span> valid, words;
    size_t i = 0;
    while (i < text.size()) {
        size_t j = i;
        size_t n;
        while (j < text.size() && (n = utf8::valid_at(text, j)) != 0) j += n;
        if (j > i) valid.push_back({i, j - i});
        if (j < text.size()) valid.push_back({j, 0});  // marker: one invalid byte at j
        i = j < text.size() ? j + 1 : j;
    }
    pcre2_match_data* md = pcre2_match_data_create(8, nullptr);
    for (const Span& v : valid) {
        if (v.len == 0) {
            words.push_back({v.start, 1});
            continue;
        }
        std::vector<Span> pieces{v};
        for (pcre2_code* re : impl.regexes) pieces = split(text, pieces, re, md);
        words.insert(words.end(), pieces.begin(), pieces.end());
    }
    pcre2_match_data_free(md);
    return words;
}

struct Symbol {
    int prev, next;
    size_t start, len;
};

struct Bigram {
    int left, right;
    int rank;
    size_t len;
    bool operator<(const Bigram& o) const { return rank > o.rank || (rank == o.rank && left > o.left); }
};

void merge_word(const std::string& word, const Tokenizer::Impl& impl,
                const std::unordered_map<std::string_view, int32_t>& index, std::vector<int32_t>& out) {
    if (impl.ignore_merges) {
        if (const auto it = index.find(word); it != index.end()) {
            out.push_back(it->second);
            return;
        }
    }
    std::vector<Symbol> sym;
    for (size_t off = 0; off < word.size();) {
        const size_t n = std::min(utf8::seq_len(static_cast<unsigned char>(word[off])), word.size() - off);
        const int i = int(sym.size());
        sym.push_back({i - 1, off + n == word.size() ? -1 : i + 1, off, n});
        off += n;
    }
    std::priority_queue<Bigram> queue;
    std::string key;
    auto try_add = [&](int l, int r) {
        if (l < 0 || r < 0) return;
        key.assign(word, sym[size_t(l)].start, sym[size_t(l)].len);
        key += ' ';
        key.append(word, sym[size_t(r)].start, sym[size_t(r)].len);
        const auto it = impl.merge_rank.find(key);
        if (it != impl.merge_rank.end()) queue.push({l, r, it->second, sym[size_t(l)].len + sym[size_t(r)].len});
    };
    for (int i = 1; i < int(sym.size()); ++i) try_add(i - 1, i);
    while (!queue.empty()) {
        const Bigram b = queue.top();
        queue.pop();
        Symbol& l = sym[size_t(b.left)];
        Symbol& r = sym[size_t(b.right)];
        if (l.len == 0 || r.len == 0 || l.len + r.len != b.len || l.next != b.right) continue;
        l.len += r.len;
        r.len = 0;
        l.next = r.next;
        if (r.next >= 0) sym[size_t(r.next)].prev = b.left;
        try_add(l.prev, b.left);
        try_add(b.left, l.next);
    }
    for (int i = sym.empty() ? -1 : 0; i != -1; i = sym[size_t(i)].next) {
        const std::string_view s(word.data() + sym[size_t(i)].start, sym[size_t(i)].len);
        if (const auto it = index.find(s); it != index.end()) {
            out.push_back(it->second);
            continue;
        }
        for (char c : s) {  // not a token: each byte's stand-in character on its own, where the vocabulary has it
            if (const auto it = index.find(std::string_view(&c, 1)); it != index.end()) out.push_back(it->second);
        }
    }
}

}  // namespace

Tokenizer::Impl::~Impl() {
    for (pcre2_code* re : regexes) pcre2_code_free(re);
}

void bpe_init(Tokenizer::Impl& impl, const std::vector<std::string>& merges, const std::string& pre, bool* unknown) {
    // GPT-2's byte stand-ins: printable Latin-1 bytes stand for themselves, the rest map to U+0100 onwards.
    int next = 0;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + next++);
        utf8::append(impl.byte_to_unicode[b], cp);
        impl.unicode_to_byte[cp] = uint8_t(b);
    }
    impl.merge_rank.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) impl.merge_rank.emplace(merges[i], int(i));

    const PreRules* chosen = nullptr;
    for (const PreRules& r : pre_rules())
        for (const char* name : r.names)
            if (pre == name) chosen = &r;
    *unknown = chosen == nullptr && !pre.empty();
    if (!chosen) chosen = &pre_rules()[0];
    for (const char* pattern : chosen->regexes) impl.regexes.push_back(compile(pattern));
    impl.ignore_merges = chosen->ignore_merges;
}

std::vector<std::string> bpe_pre_names() {
    std::vector<std::string> names;
    for (const PreRules& r : pre_rules()) names.insert(names.end(), r.names.begin(), r.names.end());
    return names;
}

std::vector<std::string> bpe_pretokenize(std::string_view text, const Tokenizer::Impl& impl) {
    std::vector<std::string> out;
    for (const Span& s : pretokenize(text, impl)) out.emplace_back(text.substr(s.start, s.len));
    return out;
}

void bpe_encode(std::string_view text, const Tokenizer::Impl& impl,
                const std::unordered_map<std::string_view, int32_t>& index, std::vector<int32_t>& out) {
    std::string word;
    for (const Span& s : pretokenize(text, impl)) {
        word.clear();
        for (size_t k = 0; k < s.len; ++k) word += impl.byte_to_unicode[static_cast<unsigned char>(text[s.start + k])];
        merge_word(word, impl, index, out);
    }
}

}  // namespace kvgen
