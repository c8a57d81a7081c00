// libFuzzer: arbitrary text (any bytes, invalid UTF-8 included) through --tokenize's path: encode with and without
// special tokens under a SentencePiece and a byte-level BPE vocabulary, then decode. Byte-level BPE must give the
// bytes back exactly.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {
struct Vocabs {
    kvgen::Tokenizer spm, bpe;
};
const Vocabs& vocabs() {
    static const Vocabs v = [] {
        const char* dir = std::getenv("KVGEN_VOCAB_DIR");
        const std::string d = dir ? dir : KVGEN_SHARED_DIR "/testdata/vocab";
        return Vocabs{kvgen::Tokenizer::from_gguf(kvgen::GgufFile::open(d + "/ggml-vocab-llama-spm.gguf")),
                      kvgen::Tokenizer::from_gguf(kvgen::GgufFile::open(d + "/ggml-vocab-gpt-2.gguf"))};
    }();
    return v;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    for (bool special : {false, true}) {
        (void)vocabs().spm.decode(vocabs().spm.encode(text, true, special));
        const auto ids = vocabs().bpe.encode(text, false, special);
        if (!special && vocabs().bpe.decode(ids) != text) std::abort();  // byte-level BPE is lossless
    }
    return 0;
}
