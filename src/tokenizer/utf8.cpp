#include "tokenizer/utf8.h"

namespace kvgen::utf8 {

size_t valid_at(std::string_view s, size_t i) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    const size_t n = seq_len(b0);
    if (n == 1) return b0 < 0x80 ? 1 : 0;
    if (i + n > s.size()) return 0;
    uint32_t cp = b0 & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) {
        const auto b = static_cast<unsigned char>(s[i + k]);
        if ((b & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (b & 0x3f);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;  // overlong, range, surrogate
    return n;
}

size_t incomplete_tail(std::string_view s) {
    // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
    for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
        const auto b = static_cast<unsigned char>(s[s.size() - back]);
        if ((b & 0xc0) == 0x80) continue;  // continuation byte: keep looking for the lead
        const size_t n = seq_len(b);
        return (n > back) ? back : 0;
    }
    return 0;
}

void append(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xc0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        out += char(0xe0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3f));
        out += char(0x80 | (cp & 0x3f));
    } else {
        out += char(0xf0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3f));
        out += char(0x80 | ((cp >> 6) & 0x3f));
        out += char(0x80 | (cp & 0x3f));
    }
}

}  // namespace kvgen::utf8
