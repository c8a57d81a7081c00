#include "cli/tokenize.h"

#include <cstdio>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/chat.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace kvgen {

namespace {

// A piece as a quoted, escaped string: newlines, tabs and other control bytes stay visible.
// Bytes that are not whole UTF-8 characters (a byte-level piece of a longer character) print as \xNN.
std::string quoted(const std::string& s) {
    std::string out = "'";
    for (size_t i = 0; i < s.size();) {
        const char c = s[i];
        const size_t n = utf8::valid_at(s, i);
        if (n > 1) {
            out.append(s, i, n);
            i += n;
            continue;
        }
        if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else if (c == '\'') out += "\\'";
        else if (c == '\\') out += "\\\\";
        else if (n == 0 || static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
        else out += c;
        ++i;
    }
    return out + "'";
}

}  // namespace

void run_tokenize(const TokenizeOptions& opt) {
    const GgufFile file = GgufFile::open(opt.model_path);
    const Tokenizer tok = Tokenizer::from_gguf(file);
    if (tok.pre_fallback())
        spdlog::warn("unknown pre-tokenizer '{}': using GPT-2's rules, token ids may differ from the model's", tok.pre());
    const std::string text = opt.chat ? apply_chat_template(file, opt.text, opt.system_prompt) : opt.text;
    const auto ids = tok.encode(text, tok.add_bos() && !opt.no_bos, opt.parse_special || opt.chat);
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
    out += "\n";
    if (opt.verbose)
        for (int32_t id : ids) out += fmt::format("{:>7} -> {}\n", id, quoted(tok.piece(id, true)));
    // note: SIGPIPE is ignored (main), so a closed pipe is a failed write here, and there is nothing left to do.
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
}

}  // namespace kvgen
