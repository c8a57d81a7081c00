#include <cmath>

#include "gguf/gguf.h"
#include "model/dequant.h"
#include "model/weights.h"
#include "synth/synth.h"
#include "test_util.h"

using namespace kvgen;

namespace {

SynthOptions small(const std::string& type) {
    SynthOptions o;
    o.shape = {"test", 256, 3, 4, 2, 512, 256, 10000.0f, false};
    o.type = type;
    o.seed = 42;
    return o;
}

std::vector<uint8_t> synth_bytes(const SynthOptions& o, const GgufFile& vocab) {
    const GgufWriter w = synth_layout(o, vocab);
    return w.to_bytes([&](size_t i, uint8_t* dst, uint64_t n) { synth_fill(o, w.tensor_info(i), i, dst, n); });
}

}  // namespace

TEST_CASE("synthetic models of every type load, and their weights have sane statistics", "[synth]") {
    const GgufFile vocab = GgufFile::open(test::shared("testdata/ref/open-gqa-Q8_0.gguf"));  // 4096 tokens
    for (const std::string& type : synth_types()) {
        INFO(type);
        const SynthOptions o = small(type);
        const GgufFile f = GgufFile::parse(synth_bytes(o, vocab), "synth-" + type);
        const Config c = Config::from_gguf(f);
        CHECK(c.n_vocab == 4096);
        CHECK(c.n_kv_heads == 2);
        const ModelWeights w = bind_weights(f, c);
        CHECK(f.find("tokenizer.ggml.tokens")->size() == 4096);
        CHECK(f.find("tokenizer.ggml.model")->as_string() == "llama");
        for (const GgufTensor& t : f.tensors()) {
            if (t.n_dims != 2) continue;
            INFO(t.name << " " << ggml_type_name(t.type));
            std::vector<float> y(static_cast<size_t>(t.n_elements()));
            dequantize_row(GgmlType(t.type), t.data, y.data(), t.n_elements());
            double sum = 0, sq = 0;
            for (float v : y) {
                REQUIRE(std::isfinite(v));
                sum += v;
                sq += double(v) * v;
            }
            const double mean = sum / double(y.size());
            const double sd = std::sqrt(sq / double(y.size()) - mean * mean);
            const double sigma = 1.0 / std::sqrt(double(t.ne[0]));
            CHECK(std::fabs(mean) < 0.1 * sigma);
            CHECK(sd == Approx(sigma).epsilon(0.25));
        }
    }
}

TEST_CASE("Q4_K_M mixes Q4_K and Q6_K like llama.cpp", "[synth]") {
    const GgufFile vocab = GgufFile::open(test::shared("testdata/ref/open-gqa-Q8_0.gguf"));
    const GgufFile f = GgufFile::parse(synth_bytes(small("Q4_K_M"), vocab));
    CHECK(ggml_type_name(f.tensor("token_embd.weight")->type) == "Q4_K");
    CHECK(ggml_type_name(f.tensor("output.weight")->type) == "Q6_K");
    CHECK(ggml_type_name(f.tensor("blk.0.attn_q.weight")->type) == "Q4_K");
    // With 3 layers only the last is in llama.cpp's "more bits" set (last eighth, and every third from the first).
    CHECK(ggml_type_name(f.tensor("blk.0.attn_v.weight")->type) == "Q4_K");
    CHECK(ggml_type_name(f.tensor("blk.2.attn_v.weight")->type) == "Q6_K");
    CHECK(ggml_type_name(f.tensor("blk.1.ffn_down.weight")->type) == "Q4_K");
    CHECK(ggml_type_name(f.tensor("blk.2.ffn_down.weight")->type) == "Q6_K");
    CHECK(ggml_type_name(f.tensor("blk.0.ffn_norm.weight")->type) == "F32");
}

TEST_CASE("a k-quant falls back where rows are not a multiple of 256", "[synth]") {
    const GgufFile vocab = GgufFile::open(test::shared("testdata/ref/open-gqa-Q8_0.gguf"));
    SynthOptions o = small("Q4_K");
    o.shape.n_embd = 288;  // 9 x 32: no 256-blocks
    o.shape.n_heads = 4;
    const GgufFile f = GgufFile::parse(synth_bytes(o, vocab));
    CHECK(ggml_type_name(f.tensor("blk.0.attn_q.weight")->type) == "Q5_0");
    CHECK(ggml_type_name(f.tensor("blk.0.ffn_down.weight")->type) == "Q4_K");  // rows of n_ff = 512
}

TEST_CASE("the same seed gives the same file and another seed another", "[synth]") {
    const GgufFile vocab = GgufFile::open(test::shared("testdata/ref/open-gqa-Q8_0.gguf"));
    SynthOptions o = small("Q6_K");
    const auto a = synth_bytes(o, vocab);
    CHECK(a == synth_bytes(o, vocab));
    o.seed = 43;
    CHECK(a != synth_bytes(o, vocab));
}

TEST_CASE("named shapes match the published models", "[synth]") {
    SynthShape s;
    REQUIRE(synth_shape("llama2-13b", &s));
    CHECK(s.n_embd == 5120);
    CHECK(s.n_layers == 40);
    CHECK(s.n_ff == 13824);
    REQUIRE(synth_shape("smollm2-135m", &s));
    CHECK(s.n_kv_heads == 3);
    CHECK(s.tied);
    CHECK_FALSE(synth_shape("gpt-5", &s));
}
