#include "cpu/cpu_backend.h"

#include <algorithm>

#include "cpu/cpu_features.h"
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

CpuOps::CpuOps(const Model& model, const Settings& s)
    : model_(model),
      c_(model.config),
      n_batch_(s.batch_size(s.context_size(model.config))),
      n_logits_(s.logits_rows(s.context_size(model.config))),
      pool_(s.n_threads > 0 ? s.n_threads : ThreadPool::physical_cores()),
      kv_(model.config, s.context_size(model.config), s.kv_type_k, s.kv_type_v, model.file.file_size()),
      rope_(RopeFreqs::of(model)),
      math_(s.math) {
    const ModelWeights& w = model.weights;
    bool a32_t16 = false;  // a weight whose prompts take 16-bit tokens side by side in 32-column blocks in either
                           // mode (prompt_integer, no 8-bit form: Q5_0, Q5_1, Q2_K, Q3_K on AVX2 and AVX-512 VNNI)
    const auto note = [&](GgmlType t) {
        same_bits_ = same_bits_ && prompt_matches_decode(t);
        a32_t16 = a32_t16 || (prompt_integer(t) && !fast_type(t));
    };
    for (const LayerWeights& L : w.layers) {
        attn_norm_.push_back(decode_vector(L.attn_norm));
        ffn_norm_.push_back(decode_vector(L.ffn_norm));
        for (const WeightView* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) note(m->type);
    }
    note(w.output.type);
    output_norm_ = decode_vector(w.output_norm);

    const size_t nb = size_t(n_batch_);
    const size_t q_dim = size_t(c_.n_heads) * c_.head_dim, kv_dim = size_t(c_.n_kv_heads) * c_.head_dim;
    x_.resize(nb * c_.n_embd);
    xn_.resize(nb * c_.n_embd);
    q_.resize(nb * q_dim);
    att_.resize(nb * q_dim);
    k_.resize(nb * kv_dim);
    v_.resize(nb * kv_dim);
    ffn_.resize(nb * c_.n_ff);
    up_.resize(nb * c_.n_ff);
    logits_.resize(size_t(n_logits_) * size_t(c_.n_vocab));
    rope_cos_.resize(nb * size_t(c_.rope_dim / 2));
    rope_sin_.resize(nb * size_t(c_.rope_dim / 2));
    const size_t max_cols = size_t(std::max({c_.n_embd, c_.n_ff, int(q_dim)}));
    mm_scratch_.resize(size_t(pool_.size()) * size_t(matmul_scratch(int64_t(max_cols))));
    // The activation forms this mode's products take (matmul.cpp): 16-bit ones (--math fast still gives them to the
    // types without 8-bit kernels, and 16-bit tokens side by side to those among them with prompt kernels), 8-bit ones
    // for --math fast, and 16 tokens side by side only where the prompt kernels for them run (AVX-512 VNNI; AVX2 for
    // k-quants, Q5_0, Q5_1, Q2_K, Q3_K and the 8-bit forms); --math f32 none.
    const size_t blocks32 = nb * (max_cols / 32 + 1), blocks256 = nb * (max_cols / 256 + 1);
    const size_t groups32 = (nb + 15) / 16 * (max_cols / 32 + 1), groups256 = (nb + 15) / 16 * (max_cols / 256 + 1);
    const bool side_by_side = has_avx2();  // the prompt kernels for tokens side by side (AVX2, AVX-512 VNNI)
    if (math_ != MathMode::F32) a32_.resize(blocks32);
    if (math_ == MathMode::Exact) {
        a256_.resize(blocks256);
        if (side_by_side) t256_.resize(groups256);
        // AVX2 keeps the decode kernels for Q8_0, Q4_0 and Q4_1
        if (has_avx512_vnni() || a32_t16) t16_.resize(groups32);
    }
    if (math_ == MathMode::Fast) {
        b32_.resize(blocks32);
        b256_.resize(blocks256);
        if (side_by_side) u16_.resize(groups32), u256_.resize(groups256);
        if (a32_t16) t16_.resize(groups32);
    }
    const auto at = [](auto& v) { return v.empty() ? nullptr : v.data(); };
    act_ = ActBuffers{at(a32_), at(a256_), at(t16_), at(t256_), at(b32_), at(b256_), at(u16_), at(u256_)};
    att_scratch_.resize(size_t(pool_.size()) * size_t(attention_scratch(c_, kv_.n_ctx())));
}

Buffers CpuOps::buffers() {
    return Buffers{x_.data(), q_.data(), k_.data(), v_.data(), att_.data(), ffn_.data(), logits_.data()};
}

void CpuOps::begin(const int32_t* tokens, int n, int pos0, Pass pass) {
    tokens_ = tokens;
    pos0_ = pos0;
    prefill_ = pass == Pass::Prefill;
    rope_tables(rope_cos_.data(), rope_sin_.data(), pos0, n, rope_);
}

const float* CpuOps::run(int, int, const std::function<void()>& step) {
    step();
    return logits_.data();
}

void CpuOps::matmul(float* y, const float* x, int64_t cols, const WeightView& w, int n) {
    Activations a(x, n, cols, act_, prefill_, math_);
    cpu::matmul(y, a, w, mm_scratch_.data(), pool_);
}

void CpuOps::matmul_add(float* x, const float* in, int64_t cols, const WeightView& w, int n) {
    matmul(xn_.data(), in, cols, w, n);
    add(x, xn_.data(), int64_t(n) * c_.n_embd);
}

void CpuOps::embed(float* x, int n) { get_rows(x, model_.weights.token_embd, tokens_, n); }

void CpuOps::norm_qkv(float* q, float* k, float* v, const float* x, int l, int n) {
    const LayerWeights& L = model_.weights.layers[size_t(l)];
    float* xn = xn_.data();
    rmsnorm(xn, x, attn_norm_[size_t(l)].data(), n, c_.n_embd, c_.rms_eps);
    // note: one Activations for the three products, so the input is quantized once.
    Activations a(xn, n, c_.n_embd, act_, prefill_, math_);
    float* const ys[] = {q, k, v};
    const WeightView* const ws[] = {&L.wq, &L.wk, &L.wv};
    cpu::matmul_many(ys, a, ws, 3, mm_scratch_.data(), pool_);
}

void CpuOps::rope_store_kv(float* q, float* k, const float* v, int l, int n) {
    rope(q, rope_cos_.data(), rope_sin_.data(), n, c_.n_heads, c_);
    rope(k, rope_cos_.data(), rope_sin_.data(), n, c_.n_kv_heads, c_);
    kv_.write(l, pos0_, n, k, v);
}

void CpuOps::attention(float* out, const float* q, int l, int n) {
    cpu::attention(out, q, kv_, l, pos0_, n, c_, att_scratch_.data(), pool_);
}

void CpuOps::out_proj_add(float* x, const float* att, int l, int n) {
    matmul_add(x, att, int64_t(c_.n_heads) * c_.head_dim, model_.weights.layers[size_t(l)].wo, n);
}

void CpuOps::norm_swiglu(float* h, const float* x, int l, int n) {
    const LayerWeights& L = model_.weights.layers[size_t(l)];
    float* xn = xn_.data();
    rmsnorm(xn, x, ffn_norm_[size_t(l)].data(), n, c_.n_embd, c_.rms_eps);
    Activations a(xn, n, c_.n_embd, act_, prefill_, math_);  // shared by gate and up
    cpu::matmul_glu(h, up_.data(), a, L.w_gate, L.w_up, mm_scratch_.data(), pool_);
}

void CpuOps::down_proj_add(float* x, const float* h, int l, int n) {
    matmul_add(x, h, c_.n_ff, model_.weights.layers[size_t(l)].w_down, n);
}

void CpuOps::head(float* logits, const float* x, int n) {
    rmsnorm(xn_.data(), x, output_norm_.data(), n, c_.n_embd, c_.rms_eps);
    matmul(logits, xn_.data(), c_.n_embd, model_.weights.output, n);
}

std::unique_ptr<Backend> make_backend(const Model& model, const Settings& s) {
    return std::make_unique<Backend>(model.config, std::make_unique<CpuOps>(model, s));
}

}  // namespace kvgen::cpu
