// libFuzzer: arbitrary bytes through the GGUF parser, and whatever parses through the config, the weight binding and
// the tokenizer. Every rejection must be a kvgen::Error; anything else (a crash, a sanitizer report, an unexpected
// exception, a hang) is a finding.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/error.h"
#include "gguf/gguf.h"
#include "model/config.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        const kvgen::GgufFile f = kvgen::GgufFile::parse(std::vector<uint8_t>(data, data + size), "fuzz.gguf");
        try {
            const kvgen::Config c = kvgen::Config::from_gguf(f);
            if (!f.tensors().empty()) kvgen::bind_weights(f, c);
        } catch (const kvgen::Error&) {
        }
        try {
            const kvgen::Tokenizer tok = kvgen::Tokenizer::from_gguf(f);
            const auto ids = tok.encode("Hello, world! 안녕 123", true, true);
            (void)tok.decode(ids);
        } catch (const kvgen::Error&) {
        }
    } catch (const kvgen::Error&) {
    }
    return 0;
}
