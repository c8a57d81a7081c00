#pragma once
// The CPU backend: the operations of the forward pass (engine/ops.h) on the host, threaded across matrix rows and
// attention heads, SIMD where it pays. The reference every other backend is compared with.
#include <memory>
#include <vector>

#include "cpu/matmul.h"
#include "cpu/thread_pool.h"
#include "cpu/vecdot.h"
#include "engine/backend.h"
#include "engine/kv_cache.h"
#include "engine/rope.h"
#include "engine/settings.h"
#include "model/weights.h"

namespace kvgen::cpu {

class CpuOps final : public Ops {
public:
    // n_threads 0: physical cores.
    CpuOps(const Model& model, const Settings& s);

    std::string name() const override { return "cpu"; }
    Buffers buffers() override;
    const KvLayout& kv_layout() const override { return kv_.layout(); }
    int n_batch() const override { return n_batch_; }
    int n_logits() const override { return n_logits_; }
    // True when every product's weight type gives a prompt's token and a generated one the same bits (matmul.h);
    // attention and the other steps compute a token the same way in either pass.
    bool decode_matches_prompt() const override { return same_bits_; }
    int n_threads() const { return pool_.size(); }
    void kv_read(void* k, void* v, int n) override { kv_.read(k, v, n); }
    void kv_write(const void* k, const void* v, int n) override { kv_.write_rows(k, v, n); }

    void begin(const int32_t* tokens, int n, int pos0, Pass pass) override;
    const float* run(int n, int n_out, const std::function<void()>& step) override;

    void embed(float* x, int n) override;
    void norm_qkv(float* q, float* k, float* v, const float* x, int l, int n) override;
    void rope_store_kv(float* q, float* k, const float* v, int l, int n) override;
    void attention(float* out, const float* q, int l, int n) override;
    void out_proj_add(float* x, const float* att, int l, int n) override;
    void norm_swiglu(float* h, const float* x, int l, int n) override;
    void down_proj_add(float* x, const float* h, int l, int n) override;
    void head(float* logits, const float* x, int n) override;

private:
    // y [n][w.rows] = x [n][cols] . W^T.
    void matmul(float* y, const float* x, int64_t cols, const WeightView& w, int n);
    // x += W in, through the scratch row xn_.
    void matmul_add(float* x, const float* in, int64_t cols, const WeightView& w, int n);

    const Model& model_;
    const Config& c_;
    int n_batch_, n_logits_;
    ThreadPool pool_;
    KvCache kv_;
    RopeFreqs rope_;
    // Norm weights decoded to f32 once.
    std::vector<std::vector<float>> attn_norm_, ffn_norm_;
    std::vector<float> output_norm_;
    // The step: its tokens, first position and kind.
    const int32_t* tokens_ = nullptr;
    int pos0_ = 0;
    bool same_bits_ = true;
    bool prefill_ = false;  // Pass::Prefill: products on f32 activations (matmul.h)
    // Activations, sized once for n_batch (see Buffers for the shared ones).
    std::vector<float> x_, q_, k_, v_, att_, ffn_, logits_;
    std::vector<float> xn_;                  // [n_batch][max(n_embd, ...)]: normalized input, projection output
    std::vector<float> up_;                  // [n_batch][n_ff]
    std::vector<float> rope_cos_, rope_sin_;  // [n_batch][rope_dim / 2]
    std::vector<float> mm_scratch_, att_scratch_;
    MathMode math_;
    std::vector<BlockA32> a32_;    // the integer forms of a matmul input: [n_batch][cols / 32]
    std::vector<BlockA256> a256_;  // and [n_batch][cols / 256] for k-quant weights
    std::vector<BlockT16> t16_;    // a prompt's A32 form, 16 tokens side by side: [n_batch / 16][cols / 32]
    std::vector<BlockT256> t256_;  // and its A256 form: [n_batch / 16][cols / 256]
    std::vector<BlockB32> b32_;    // the 8-bit forms likewise (MathMode::Fast only)
    std::vector<BlockB256> b256_;
    std::vector<BlockU16> u16_;
    std::vector<BlockU256> u256_;
    ActBuffers act_;  // the buffers above
};

// The forward pass on the CPU ops. Throws kvgen::Error when the KV cache does not fit in memory.
std::unique_ptr<Backend> make_backend(const Model& model, const Settings& s);

}  // namespace kvgen::cpu
