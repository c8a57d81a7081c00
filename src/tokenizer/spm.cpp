// SentencePiece BPE, as llama.cpp runs it for tokenizer.ggml.model = llama: start from single UTF-8 characters,
// repeatedly merge the adjacent pair whose concatenation is the highest-scoring token (leftmost on ties), then
// emit each symbol as a token, or as <0xNN> byte tokens when it is not one.
#include <queue>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace kvgen {

namespace {

struct Symbol {
    int prev, next;
    size_t start, len;  // bytes of the text
};

struct Bigram {
    int left, right;
    float score;
    size_t len;
    bool operator<(const Bigram& o) const {  // priority_queue top: highest score, then leftmost
        return score < o.score || (score == o.score && left > o.left);
    }
};

class Session {
public:
    Session(std::string_view text, const std::unordered_map<std::string_view, int32_t>& index,
            const std::vector<float>& scores, int32_t unk)
        : text_(text), index_(index), scores_(scores), unk_(unk) {}

    void run(std::vector<int32_t>& out) {
        for (size_t off = 0; off < text_.size();) {
            const size_t n = std::min(utf8::seq_len(static_cast<unsigned char>(text_[off])), text_.size() - off);
            const int i = int(symbols_.size());
            symbols_.push_back({i - 1, off + n == text_.size() ? -1 : i + 1, off, n});
            off += n;
        }
        for (int i = 1; i < int(symbols_.size()); ++i) try_add(i - 1, i);
        while (!queue_.empty()) {
            const Bigram b = queue_.top();
            queue_.pop();
            Symbol& l = symbols_[size_t(b.left)];
            Symbol& r = symbols_[size_t(b.right)];
            if (l.len == 0 || r.len == 0 || l.len + r.len != b.len) continue;  // stale: a side merged since
            l.len += r.len;
            r.len = 0;
            l.next = r.next;
            if (r.next >= 0) symbols_[size_t(r.next)].prev = b.left;
            try_add(l.prev, b.left);
            try_add(b.left, l.next);
        }
        for (int i = symbols_.empty() ? -1 : 0; i != -1; i = symbols_[size_t(i)].next) resegment(i, out);
    }

private:
    std::string_view view(const Symbol& s) const { return text_.substr(s.start, s.len); }

    void try_add(int left, int right) {
        if (left < 0 || right < 0) return;
        const std::string_view merged = text_.substr(symbols_[size_t(left)].start,
                                                     symbols_[size_t(left)].len + symbols_[size_t(right)].len);
        const auto it = index_.find(merged);
        if (it == index_.end()) return;
        queue_.push({left, right, scores_[size_t(it->second)], merged.size()});
    }

    // A symbol that merged is a token by construction; one that never merged is a single character, emitted as
    // its token or as <0xNN> byte tokens.
    void resegment(int i, std::vector<int32_t>& out) const {
        const std::string_view t = view(symbols_[size_t(i)]);
        if (const auto it = index_.find(t); it != index_.end()) {
            out.push_back(it->second);
            return;
        }
        byte_fallback(t, out);
    }

    void byte_fallback(std::string_view t, std::vector<int32_t>& out) const {
        static const char* const hex = "0123456789ABCDEF";
        for (unsigned char c : t) {
            const char name[7] = {'<', '0', 'x', hex[c >> 4], hex[c & 15], '>', '\0'};
            const auto it = index_.find(std::string_view(name, 6));
            if (it != index_.end()) {
                out.push_back(it->second);
            } else if (const auto raw = index_.find(std::string_view(reinterpret_cast<const char*>(&c), 1));
                       raw != index_.end()) {
                out.push_back(raw->second);
            } else if (unk_ >= 0) {
                out.push_back(unk_);
            }
        }
    }

    std::string_view text_;
    const std::unordered_map<std::string_view, int32_t>& index_;
    const std::vector<float>& scores_;
    int32_t unk_;
    std::vector<Symbol> symbols_;
    std::priority_queue<Bigram> queue_;
};

}  // namespace

bool spm_words_independent(const std::vector<std::string>& tokens) {
    const std::string_view space = "\xe2\x96\x81";
    for (const std::string& t : tokens) {
        for (size_t at = t.find(space, 1); at != std::string::npos; at = t.find(space, at + 1)) {
            if (at < 3 || std::string_view(t).substr(at - 3, 3) != space) return false;
        }
    }
    return true;
}

void spm_encode(std::string_view text, const std::unordered_map<std::string_view, int32_t>& index,
                const std::vector<float>& scores, int32_t unk, bool split_words, std::vector<int32_t>& out) {
    if (!split_words) {
        Session(text, index, scores, unk).run(out);
        return;
    }
    // Words (a run of U+2581 and what follows up to the next run) merge independently: encode each once.
    const std::string_view space = "\xe2\x96\x81";
    std::unordered_map<std::string_view, std::vector<int32_t>> seen;
    auto emit = [&](std::string_view word) {
        auto it = seen.find(word);
        if (it == seen.end()) {
            std::vector<int32_t> ids;
            Session(word, index, scores, unk).run(ids);
            it = seen.emplace(word, std::move(ids)).first;
        }
        out.insert(out.end(), it->second.begin(), it->second.end());
    };
    size_t start = 0;
    for (size_t at = text.find(space, 1); at != std::string_view::npos; at = text.find(space, at + 3)) {
        if (at > start && text.substr(at - 3, 3) != space) {
            emit(text.substr(start, at - start));
            start = at;
        }
    }
    if (start < text.size()) emit(text.substr(start));
}

}  // namespace kvgen
