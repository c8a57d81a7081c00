#include "model/weights.h"

#include <fmt/format.h>

#include "common/error.h"

namespace kvgen {

namespace {

std::string shape_str(const std::vector<int64_t>& ne) {
    std::string s = "[";
    for (size_t d = 0; d < ne.size(); ++d) s += (d ? ", " : "") + std::to_string(ne[d]);
    return s + "]";
}

class Binder {
public:
    explicit Binder(const GgufFile& f) : f_(f) {}

    // expected: dims with ne[0] first, as GGUF stores them.
    WeightView bind(const std::string& name, const std::vector<int64_t>& expected, bool required = true) const {
        const GgufTensor* t = f_.tensor(name);
        if (!t) {
            if (!required) return {};
            throw Error(fmt::format("{}: missing tensor '{}' (expected shape {})", f_.path(), name,
                                    shape_str(expected)));
        }
        bool same = t->n_dims == int(expected.size());
        for (size_t d = 0; same && d < expected.size(); ++d) same = t->ne[d] == expected[d];
        if (!same)
            throw Error(fmt::format("{}: tensor '{}' has shape {} but the config needs {}", f_.path(), name,
                                    t->shape_string(), shape_str(expected)));
        if (!ggml_type_supported(t->type))
            throw Error(fmt::format("{}: tensor '{}' has type {} (supported: {})", f_.path(), name,
                                    ggml_type_name(t->type), ggml_supported_types()));
        WeightView w;
        w.tensor = t;
        w.type = GgmlType(t->type);
        w.cols = t->ne[0];
        w.rows = t->n_elements() / t->ne[0];
        w.row_bytes = ggml_row_bytes(*ggml_type_info(t->type), t->ne[0]);
        w.data = t->data;
        return w;
    }

private:
    const GgufFile& f_;
};

}  // namespace

ModelWeights bind_weights(const GgufFile& f, const Config& c) {
    const Binder b(f);
    const int64_t n_embd = c.n_embd, n_ff = c.n_ff, n_vocab = c.n_vocab;
    const int64_t q_dim = int64_t(c.n_heads) * c.head_dim, kv_dim = int64_t(c.n_kv_heads) * c.head_dim;

    ModelWeights w;
    w.token_embd = b.bind("token_embd.weight", {n_embd, n_vocab});
    w.output_norm = b.bind("output_norm.weight", {n_embd});
    w.output = b.bind("output.weight", {n_embd, n_vocab}, false);
    if (!w.output.tensor) {
        w.output = w.token_embd;
        w.tied_output = true;
    }
    w.rope_freqs = b.bind("rope_freqs.weight", {c.rope_dim / 2}, false);
    w.layers.resize(size_t(c.n_layers));
    for (int l = 0; l < c.n_layers; ++l) {
        const std::string p = fmt::format("blk.{}.", l);
        LayerWeights& L = w.layers[size_t(l)];
        L.attn_norm = b.bind(p + "attn_norm.weight", {n_embd});
        L.wq = b.bind(p + "attn_q.weight", {n_embd, q_dim});
        L.wk = b.bind(p + "attn_k.weight", {n_embd, kv_dim});
        L.wv = b.bind(p + "attn_v.weight", {n_embd, kv_dim});
        L.wo = b.bind(p + "attn_output.weight", {q_dim, n_embd});
        L.ffn_norm = b.bind(p + "ffn_norm.weight", {n_embd});
        L.w_gate = b.bind(p + "ffn_gate.weight", {n_embd, n_ff});
        L.w_up = b.bind(p + "ffn_up.weight", {n_embd, n_ff});
        L.w_down = b.bind(p + "ffn_down.weight", {n_ff, n_embd});
    }
    return w;
}

Model Model::load(const std::string& path) {
    Model m{GgufFile::open(path), Config{}, ModelWeights{}};
    m.config = Config::from_gguf(m.file);
    if (m.file.tensors().empty())
        throw Error(fmt::format("{}: holds no tensors (a vocabulary-only file cannot generate)", path));
    m.weights = bind_weights(m.file, m.config);
    return m;
}

}  // namespace kvgen
