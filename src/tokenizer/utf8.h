#pragma once
// Minimal UTF-8 helpers for the tokenizers (Unicode classes come from PCRE2, not from here).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvgen::utf8 {

// Length of the sequence a lead byte starts (1 for ASCII and for stray continuation/invalid bytes).
inline size_t seq_len(unsigned char lead) {
    if (lead < 0x80) return 1;
    if ((lead & 0xe0) == 0xc0) return 2;
    if ((lead & 0xf0) == 0xe0) return 3;
    if ((lead & 0xf8) == 0xf0) return 4;
    return 1;
}

// Length of the valid UTF-8 sequence at s[i], or 0 when the bytes there are not one.
size_t valid_at(std::string_view s, size_t i);

// Bytes at the end of s that start a sequence still missing its continuation bytes (0 to 3).
size_t incomplete_tail(std::string_view s);

void append(std::string& out, uint32_t cp);

}  // namespace kvgen::utf8
