#include "model/config.h"

#include <cmath>

#include <fmt/format.h>

#include "common/error.h"

namespace kvgen {

namespace {

constexpr int64_t kMaxDim = 1 << 20;  // bounds every size so later products stay far from overflow

class Keys {
public:
    Keys(const GgufFile& f, std::string prefix) : f_(f), prefix_(std::move(prefix)) {}

    const GgufValue* find(const std::string& key) const { return f_.find(prefix_ + key); }

    int integer(const std::string& key, int64_t lo, int64_t hi, const int* fallback = nullptr) const {
        const GgufValue* v = find(key);
        if (!v) {
            if (fallback) return *fallback;
            throw Error(fmt::format("{}: missing metadata key '{}{}'", f_.path(), prefix_, key));
        }
        int64_t x = 0;
        try {
            x = v->as_i64();
        } catch (const Error& e) {
            throw Error(fmt::format("{}: metadata key '{}{}': {}", f_.path(), prefix_, key, e.what()));
        }
        if (x < lo || x > hi)
            throw Error(fmt::format("{}: metadata key '{}{}' is {} (expected {} to {})", f_.path(), prefix_, key, x, lo,
                                    hi));
        return int(x);
    }

    float real(const std::string& key, float fallback, float lo, float hi) const {
        const GgufValue* v = find(key);
        if (!v) return fallback;
        double x = 0;
        try {
            x = v->as_f64();
        } catch (const Error& e) {
            throw Error(fmt::format("{}: metadata key '{}{}': {}", f_.path(), prefix_, key, e.what()));
        }
        if (!(x >= lo && x <= hi))
            throw Error(fmt::format("{}: metadata key '{}{}' is {} (expected {} to {})", f_.path(), prefix_, key, x, lo,
                                    hi));
        return float(x);
    }

    std::string string(const std::string& key) const {
        const GgufValue* v = find(key);
        if (!v || v->type() != GgufValueType::STRING) return "";
        return v->as_string();
    }

private:
    const GgufFile& f_;
    std::string prefix_;
};

}  // namespace

std::string gguf_architecture(const GgufFile& f) {
    const GgufValue* v = f.find("general.architecture");
    return v && v->type() == GgufValueType::STRING ? v->as_string() : "";
}

Config Config::from_gguf(const GgufFile& f) {
    const std::string arch = gguf_architecture(f);
    if (arch.empty()) {
        const GgufValue* v = f.find("general.architecture");
        throw Error(v ? fmt::format("{}: metadata key 'general.architecture' is not a non-empty string", f.path())
                      : fmt::format("{}: no general.architecture key", f.path()));
    }
    if (arch != "llama") {
        // note: printable ASCII only, so a name with control bytes or a NUL cannot cut or garble the line
        std::string shown;
        for (char ch : arch.substr(0, 64)) shown += ch >= 0x20 && ch < 0x7f ? ch : '?';
        throw Error(fmt::format("{}: unsupported architecture '{}' (kvgen runs 'llama' models)", f.path(), shown));
    }

    Config c;
    const Keys k(f, "llama.");
    c.name = Keys(f, "general.").string("name");
    if (c.name.empty()) c.name = f.path().substr(f.path().find_last_of('/') + 1);

    c.n_embd = k.integer("embedding_length", 1, kMaxDim);
    c.n_layers = k.integer("block_count", 1, 4096);
    c.n_ff = k.integer("feed_forward_length", 1, kMaxDim);
    c.n_heads = k.integer("attention.head_count", 1, 4096);
    c.n_kv_heads = k.integer("attention.head_count_kv", 1, 4096, &c.n_heads);
    c.n_ctx_train = k.integer("context_length", 1, 1 << 24);
    if (c.n_heads % c.n_kv_heads != 0)
        throw Error(fmt::format("{}: {} attention heads are not a multiple of {} KV heads", f.path(), c.n_heads,
                                c.n_kv_heads));
    if (k.find("attention.key_length")) {
        c.head_dim = k.integer("attention.key_length", 1, 4096);
    } else {
        if (c.n_embd % c.n_heads != 0)
            throw Error(fmt::format("{}: embedding length {} is not a multiple of {} heads", f.path(), c.n_embd,
                                    c.n_heads));
        c.head_dim = c.n_embd / c.n_heads;
    }
    if (c.head_dim < 2)
        throw Error(fmt::format("{}: a head dimension of {} (RoPE turns pairs of dimensions: at least 2)", f.path(),
                                c.head_dim));
    const int value_len = k.integer("attention.value_length", 1, 4096, &c.head_dim);
    if (value_len != c.head_dim)
        throw Error(fmt::format("{}: key length {} differs from value length {} (unsupported)", f.path(), c.head_dim,
                                value_len));
    c.rope_dim = k.integer("rope.dimension_count", 2, c.head_dim, &c.head_dim);
    if (c.rope_dim % 2 != 0) throw Error(fmt::format("{}: rope dimension count {} is odd", f.path(), c.rope_dim));
    c.rope_base = k.real("rope.freq_base", 10000.0f, 1.0f, 1e12f);
    c.rms_eps = k.real("attention.layer_norm_rms_epsilon", 1e-5f, 0.0f, 1.0f);

    // Vocabulary: llama.vocab_size, else the tokenizer's token list (the weights are checked against it later).
    if (k.find("vocab_size")) {
        c.n_vocab = k.integer("vocab_size", 1, 1 << 24);
    } else if (const GgufValue* toks = f.find("tokenizer.ggml.tokens"); toks && toks->is_array()) {
        c.n_vocab = int(std::min<uint64_t>(toks->size(), 1 << 24));
    } else if (const GgufTensor* emb = f.tensor("token_embd.weight"); emb && emb->n_dims == 2) {
        c.n_vocab = int(std::min<int64_t>(emb->ne[1], 1 << 24));
    } else {
        throw Error(fmt::format("{}: cannot tell the vocabulary size (no llama.vocab_size, tokens or token_embd)",
                                f.path()));
    }

    // RoPE scaling: linear (positions divided by the factor); Llama 3.1's per-frequency factors come as the
    // rope_freqs tensor, bound with the weights.
    std::string type = k.string("rope.scaling.type");
    float factor = k.real("rope.scaling.factor", 0.0f, 0.0f, 1e6f);
    if (type.empty() && k.find("rope.scale_linear")) {
        type = "linear";
        factor = k.real("rope.scale_linear", 1.0f, 0.0f, 1e6f);
    }
    if (type == "linear" && factor > 0.0f && factor != 1.0f) {
        c.rope_scaling = RopeScaling::Linear;
        c.rope_scale = factor;
    } else if (!type.empty() && type != "none" && type != "linear" && type != "llama3") {
        throw Error(fmt::format("{}: rope scaling '{}' is not supported (none, linear, or Llama 3 rope_freqs)",
                                f.path(), type));
    }
    return c;
}

}  // namespace kvgen
