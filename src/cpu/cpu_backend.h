#pragma once
// The CPU backend: the readable reference forward pass, threaded across matrix rows and attention heads.
#include <memory>
#include <vector>

#include "cpu/thread_pool.h"
#include "cpu/vecdot.h"
#include "engine/backend.h"
#include "engine/kv_cache.h"
#include "model/weights.h"

namespace kvgen::cpu {

struct CpuOptions {
    int n_ctx = 4096;
    int n_batch = 512;
    int n_threads = 1;
    KvType kv_type = KvType::F16;
};

class CpuBackend : public Backend {
public:
    CpuBackend(const Model& model, const CpuOptions& opt);

    const float* forward(const int32_t* tokens, int n_tokens, int pos0) override;
    void kv_truncate(int n_past) override { kv_.set_n_past(n_past); }
    int n_past() const override { return kv_.n_past(); }
    int n_ctx() const override { return kv_.n_ctx(); }
    int n_batch() const override { return n_batch_; }
    size_t kv_bytes() const override { return kv_.bytes(); }
    std::string name() const override { return "cpu"; }

private:
    const Model& model_;
    const Config& c_;
    int n_batch_;
    ThreadPool pool_;
    KvCache kv_;
    // Norm weights and rope factors decoded to f32 once.
    std::vector<std::vector<float>> attn_norm_, ffn_norm_;
    std::vector<float> output_norm_, freq_factors_;
    // Activations, sized once for n_batch: [n_batch][...].
    std::vector<float> x_, xn_, q_, k_, v_, att_, gate_, up_, logits_, rope_cos_, rope_sin_;
    std::vector<float> mm_scratch_, att_scratch_;
    std::vector<BlockA32> a32_;    // the integer forms of a matmul input: [n_batch][cols / 32]
    std::vector<BlockA256> a256_;  // and [n_batch][cols / 256] for k-quant weights
};

}  // namespace kvgen::cpu
