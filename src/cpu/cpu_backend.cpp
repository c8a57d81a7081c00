#include "cpu/cpu_backend.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "cpu/matmul.h"
#include "cpu/ops.h"
#include "model/dequant.h"

namespace kvgen::cpu {

namespace {
std::vector<float> decode_vector(const WeightView& w) {
    std::vector<float> out(size_t(w.cols * w.rows));
    dequantize_row(w.type, w.data, out.data(), w.cols * w.rows);
    return out;
}
}  // namespace

CpuBackend::CpuBackend(const Model& model, const CpuOptions& opt)
    : model_(model),
      c_(model.config),
      n_batch_(std::max(1, std::min(opt.n_batch, opt.n_ctx))),
      pool_(opt.n_threads),
      kv_(model.config, opt.n_ctx, opt.kv_type) {
    const ModelWeights& w = model.weights;
    for (const LayerWeights& L : w.layers) {
        attn_norm_.push_back(decode_vector(L.attn_norm));
        ffn_norm_.push_back(decode_vector(L.ffn_norm));
    }
    output_norm_ = decode_vector(w.output_norm);
    if (w.rope_freqs.tensor) freq_factors_ = decode_vector(w.rope_freqs);

    const size_t nb = size_t(n_batch_);
    const size_t q_dim = size_t(c_.n_heads) * c_.head_dim, kv_dim = size_t(c_.n_kv_heads) * c_.head_dim;
    x_.resize(nb * c_.n_embd);
    xn_.resize(nb * c_.n_embd);
    q_.resize(nb * q_dim);
    att_.resize(nb * q_dim);
    k_.resize(nb * kv_dim);
    v_.resize(nb * kv_dim);
    gate_.resize(nb * c_.n_ff);
    up_.resize(nb * c_.n_ff);
    logits_.resize(size_t(c_.n_vocab));
    rope_cos_.resize(nb * size_t(c_.rope_dim / 2));
    rope_sin_.resize(nb * size_t(c_.rope_dim / 2));
    const size_t max_cols = size_t(std::max({c_.n_embd, c_.n_ff, int(q_dim)}));
    mm_scratch_.resize(size_t(pool_.size()) * size_t(matmul_scratch(int64_t(max_cols))));
    a32_.resize(nb * (max_cols / 32 + 1));
    a256_.resize(nb * (max_cols / 256 + 1));
    att_scratch_.resize(size_t(pool_.size()) * size_t(attention_scratch(c_, kv_.n_ctx())));
}

const float* CpuBackend::forward(const int32_t* tokens, int n, int pos0) {
    KVGEN_ASSERT(n >= 1 && n <= n_batch_ && pos0 >= 0 && pos0 + n <= kv_.n_ctx() && pos0 <= kv_.n_past());
    const ModelWeights& w = model_.weights;
    const int n_embd = c_.n_embd;
    const int64_t q_dim = int64_t(c_.n_heads) * c_.head_dim;
    for (int i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= c_.n_vocab)
            throw Error(fmt::format("token id {} is outside the vocabulary of {}", tokens[i], c_.n_vocab));

    float* x = x_.data();
    float* xn = xn_.data();
    get_rows(x, w.token_embd, tokens, n);  // x: [n][n_embd]
    rope_tables(rope_cos_.data(), rope_sin_.data(), pos0, n, c_,
                freq_factors_.empty() ? nullptr : freq_factors_.data());

    for (int l = 0; l < c_.n_layers; ++l) {
        const LayerWeights& L = w.layers[size_t(l)];
        // attention: normalize, project, rotate, write K/V into the cache, attend over the cache
        rmsnorm(xn, x, attn_norm_[size_t(l)].data(), n, n_embd, c_.rms_eps);
        Activations a_in(xn, n, n_embd, a32_.data(), a256_.data());
        matmul(q_.data(), a_in, L.wq, mm_scratch_.data(), pool_);
        matmul(k_.data(), a_in, L.wk, mm_scratch_.data(), pool_);
        matmul(v_.data(), a_in, L.wv, mm_scratch_.data(), pool_);
        rope(q_.data(), rope_cos_.data(), rope_sin_.data(), n, c_.n_heads, c_);
        rope(k_.data(), rope_cos_.data(), rope_sin_.data(), n, c_.n_kv_heads, c_);
        kv_.write(l, pos0, n, k_.data(), v_.data());
        attention(att_.data(), q_.data(), kv_, l, pos0, n, c_, att_scratch_.data(), pool_);
        Activations a_att(att_.data(), n, q_dim, a32_.data(), a256_.data());
        matmul(xn, a_att, L.wo, mm_scratch_.data(), pool_);
        add(x, xn, int64_t(n) * n_embd);  // residual
        // feed-forward: SwiGLU
        rmsnorm(xn, x, ffn_norm_[size_t(l)].data(), n, n_embd, c_.rms_eps);
        Activations a_ffn(xn, n, n_embd, a32_.data(), a256_.data());
        matmul(gate_.data(), a_ffn, L.w_gate, mm_scratch_.data(), pool_);
        matmul(up_.data(), a_ffn, L.w_up, mm_scratch_.data(), pool_);
        swiglu(gate_.data(), up_.data(), int64_t(n) * c_.n_ff);
        Activations a_down(gate_.data(), n, c_.n_ff, a32_.data(), a256_.data());
        matmul(xn, a_down, L.w_down, mm_scratch_.data(), pool_);
        add(x, xn, int64_t(n) * n_embd);
    }
    kv_.set_n_past(pos0 + n);

    // logits for the last position only
    const float* last = x + int64_t(n - 1) * n_embd;
    rmsnorm(xn, last, output_norm_.data(), 1, n_embd, c_.rms_eps);
    Activations a_out(xn, 1, n_embd, a32_.data(), a256_.data());
    matmul(logits_.data(), a_out, w.output, mm_scratch_.data(), pool_);
    return logits_.data();
}

}  // namespace kvgen::cpu
