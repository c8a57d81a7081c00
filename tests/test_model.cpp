#include <cstring>

#include "common/error.h"
#include "engine/kv_layout.h"
#include "gguf/gguf_writer.h"
#include "model/config.h"
#include "model/weights.h"
#include "test_util.h"

using namespace kvgen;

namespace {

struct MiniSpec {
    std::string arch = "llama";
    std::string omit;          // a tensor to leave out
    std::string reshape;       // a tensor to give a wrong shape
    std::string retype;        // a tensor to store as IQ4_NL (a type kvgen does not compute with)
    bool with_output = true;
    bool with_head_count = true;
    uint64_t n_heads = 2;
};

// A minimal LLaMA: n_embd 32, 1 layer, 2 heads of 16 (1 KV head), n_ff 64, vocab 16, F32 weights.
std::vector<uint8_t> mini_model(const MiniSpec& s) {
    GgufWriter w;
    auto u32 = [](uint64_t v) { return GgufValue::uint(GgufValueType::U32, v); };
    w.set("general.architecture", GgufValue::string(s.arch));
    w.set(s.arch + ".context_length", u32(128));
    w.set(s.arch + ".embedding_length", u32(32));
    w.set(s.arch + ".block_count", u32(1));
    w.set(s.arch + ".feed_forward_length", u32(64));
    if (s.with_head_count) w.set(s.arch + ".attention.head_count", u32(s.n_heads));
    w.set(s.arch + ".attention.head_count_kv", u32(1));
    w.set("tokenizer.ggml.tokens", GgufValue::string_array(std::vector<std::string>(16, "t")));
    auto add = [&](const std::string& name, std::vector<int64_t> ne) {
        if (name == s.omit) return;
        if (name == s.reshape) ne[0] *= 2;
        w.add_tensor(name, name == s.retype ? GgmlType(20) : GgmlType::F32, ne);
    };
    add("token_embd.weight", {32, 16});
    add("output_norm.weight", {32});
    if (s.with_output) add("output.weight", {32, 16});
    add("blk.0.attn_norm.weight", {32});
    add("blk.0.attn_q.weight", {32, 32});
    add("blk.0.attn_k.weight", {32, 16});
    add("blk.0.attn_v.weight", {32, 16});
    add("blk.0.attn_output.weight", {32, 32});
    add("blk.0.ffn_norm.weight", {32});
    add("blk.0.ffn_gate.weight", {32, 64});
    add("blk.0.ffn_up.weight", {32, 64});
    add("blk.0.ffn_down.weight", {64, 32});
    return w.to_bytes([](size_t, uint8_t* dst, uint64_t n) { std::memset(dst, 0, n); });
}

ModelWeights bind_mini(const MiniSpec& s) {
    const GgufFile f = GgufFile::parse(mini_model(s), "mini.gguf");
    return bind_weights(f, Config::from_gguf(f));
}

}  // namespace

TEST_CASE("config of the tiny model", "[model]") {
    const GgufFile f = GgufFile::open(test::shared("testdata/tiny/llama-2-tiny-random.gguf"));
    const Config c = Config::from_gguf(f);
    CHECK(c.n_embd == 8);
    CHECK(c.n_layers == 1);
    CHECK(c.n_heads == 2);
    CHECK(c.n_kv_heads == 2);
    CHECK(c.head_dim == 4);
    CHECK(c.rope_dim == 4);
    CHECK(c.n_ff == 32);
    CHECK(c.n_vocab == 32000);
    CHECK(c.n_ctx_train == 4096);
    CHECK(c.rope_base == 10000.0f);  // absent key: default
    const ModelWeights w = bind_weights(f, c);
    CHECK_FALSE(w.tied_output);
    CHECK(w.layers.size() == 1);
    CHECK(w.layers[0].w_down.cols == 32);
    CHECK(w.layers[0].w_down.rows == 8);
    CHECK(w.token_embd.row_bytes == 16);
}

TEST_CASE("config and weights of the default model (SmolLM2-135M)", "[model][default-model]") {
    if (!test::file_exists(KVGEN_DEFAULT_MODEL)) FAIL("default model missing: run models/fetch-default.sh");
    const Model m = Model::load(KVGEN_DEFAULT_MODEL);
    const Config& c = m.config;
    CHECK(c.n_layers == 30);
    CHECK(c.n_heads == 9);
    CHECK(c.n_kv_heads == 3);
    CHECK(c.head_dim == 64);
    CHECK(c.n_embd == 576);
    CHECK(c.n_ff == 1536);
    CHECK(c.n_vocab == 49152);
    CHECK(c.n_ctx_train == 8192);
    CHECK(c.rope_base == 100000.0f);
    CHECK(m.weights.tied_output);
    CHECK(m.weights.output.data == m.weights.token_embd.data);
    CHECK(m.weights.token_embd.type == GgmlType::Q8_0);
    CHECK(m.weights.layers[29].wq.type == GgmlType::Q4_1);
    CHECK(KvLayout::of(c, 1, KvType::F16).bytes_per_token() == 23040);  // 2 x 30 layers x 3 KV heads x 64 x 2 bytes
}

TEST_CASE("every reference model binds", "[model]") {
    for (const char* name : {"open-gqa-Q8_0", "open-gqa-Q4_0", "open-gqa-Q4_K_M", "open-gqa-Q6_K", "open-mha-F16"}) {
        INFO(name);
        const Model m = Model::load(test::shared(std::string("testdata/ref/") + name + ".gguf"));
        CHECK(m.config.n_embd == 256);
        CHECK(m.config.n_vocab == 4096);
        CHECK_FALSE(m.weights.tied_output);
    }
}

TEST_CASE("a minimal model binds, and ties its output when output.weight is absent", "[model]") {
    MiniSpec s;
    CHECK_FALSE(bind_mini(s).tied_output);
    s.with_output = false;
    CHECK(bind_mini(s).tied_output);
}

TEST_CASE("model errors name what is wrong", "[model]") {
    MiniSpec s;
    s.arch = "gpt2";
    CHECK_THROWS_WITH(bind_mini(s), Catch::Contains("unsupported architecture 'gpt2'"));
    s.arch = std::string("gp\0t\x01x", 6);  // control bytes and a NUL cannot cut or garble the message
    CHECK_THROWS_WITH(bind_mini(s), Catch::Contains("unsupported architecture 'gp?t?x' (kvgen runs 'llama' models)"));

    s = MiniSpec{};
    s.n_heads = 32;  // n_embd 32: heads of one dimension, which RoPE cannot turn
    CHECK_THROWS_WITH(bind_mini(s), Catch::Contains("a head dimension of 1 (RoPE turns pairs"));

    s = MiniSpec{};
    s.omit = "blk.0.ffn_up.weight";
    CHECK_THROWS_WITH(bind_mini(s), Catch::Contains("missing tensor 'blk.0.ffn_up.weight' (expected shape [32, 64])"));

    s = MiniSpec{};
    s.reshape = "blk.0.attn_k.weight";
    CHECK_THROWS_WITH(bind_mini(s),
                      Catch::Contains("tensor 'blk.0.attn_k.weight' has shape [64, 16] but the config needs [32, 16]"));

    s = MiniSpec{};
    s.retype = "blk.0.attn_q.weight";
    CHECK_THROWS_WITH(bind_mini(s), Catch::Contains("tensor 'blk.0.attn_q.weight' has type IQ4_NL (supported: F32"));

    s = MiniSpec{};
    s.with_head_count = false;
    CHECK_THROWS_WITH(bind_mini(s), Catch::Contains("missing metadata key 'llama.attention.head_count'"));
}

TEST_CASE("a vocabulary-only file cannot be loaded as a model", "[model]") {
    CHECK_THROWS_WITH(Model::load(test::shared("testdata/vocab/ggml-vocab-llama-spm.gguf")),
                      Catch::Contains("vocabulary-only"));
}
