#pragma once
// A small synthetic model in memory (kvgen-synth's writer): 256 columns, 4 heads over 2 KV heads, a 512-wide
// feed-forward, the shared reference file's vocabulary, every matrix in `type` (as kvgen-synth --type takes it).
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf.h"
#include "model/weights.h"
#include "synth/synth.h"
#include "test_util.h"

namespace kvgen::test {

inline Model model_from_bytes(std::vector<uint8_t> bytes, const std::string& name) {
    Model m{GgufFile::parse(std::move(bytes), name), Config{}, ModelWeights{}};
    m.config = Config::from_gguf(m.file);
    m.weights = bind_weights(m.file, m.config);
    return m;
}

inline Model synth_model(const std::string& type, int n_layers = 3) {
    static const GgufFile vocab = GgufFile::open(shared("testdata/ref/open-gqa-Q8_0.gguf"));
    SynthOptions o;
    o.shape = {"test", 256, n_layers, 4, 2, 512, 512, 10000.0f, false};
    o.type = type;
    o.seed = 42;
    const GgufWriter w = synth_layout(o, vocab);
    return model_from_bytes(
        w.to_bytes([&](size_t i, uint8_t* dst, uint64_t n) { synth_fill(o, w.tensor_info(i), i, dst, n); }),
        "synth-" + type);
}

}  // namespace kvgen::test
