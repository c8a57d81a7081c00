#include "cli/prompt.h"

#include <unistd.h>

#include <cerrno>

#include "cli/format.h"

namespace kvgen {

namespace {

int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

}  // namespace

std::string process_escapes(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '\\' || i + 1 == text.size()) {
            out += text[i];
            continue;
        }
        const char c = text[++i];
        switch (c) {
            case 'n':
                out += '\n';
                break;
            case 'r':
                out += '\r';
                break;
            case 't':
                out += '\t';
                break;
            case '\'':
            case '"':
            case '\\':
                out += c;
                break;
            case 'x':
                if (i + 2 < text.size() && hex_digit(text[i + 1]) >= 0 && hex_digit(text[i + 2]) >= 0) {
                    out += char(hex_digit(text[i + 1]) * 16 + hex_digit(text[i + 2]));
                    i += 2;
                    break;
                }
                [[fallthrough]];
            default:
                out += '\\';
                out += c;
        }
    }
    return out;
}

std::string read_prompt_file(const std::string& path) {
    std::string text = read_text_file(path);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    return text;
}

bool stdin_is_piped() {
    if (::isatty(STDIN_FILENO)) return false;
    return errno != EBADF;  // closed standard input: nothing to read
}

}  // namespace kvgen
