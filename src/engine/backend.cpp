#include "engine/backend.h"

#include <fmt/format.h>

#include "common/error.h"

namespace kvgen {

Backend::Backend(const Config& c, std::unique_ptr<Ops> ops) : c_(c), ops_(std::move(ops)), b_(ops_->buffers()) {}

const float* Backend::forward(const int32_t* tokens, int n, int pos0, Pass pass, bool all_logits) {
    KVGEN_ASSERT(n >= 1 && n <= n_batch() && pos0 >= 0 && pos0 + n <= n_ctx() && pos0 <= n_past_);
    const int n_out = all_logits ? n : 1;
    KVGEN_ASSERT(n_out <= ops_->n_logits());
    for (int i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= c_.n_vocab)
            throw Error(fmt::format("token id {} is outside the vocabulary of {}", tokens[i], c_.n_vocab));
    ops_->begin(tokens, n, pos0, pass);
    const float* logits = ops_->run(n, n_out, [this, n, n_out] { layers(n, n_out); });
    n_past_ = pos0 + n;
    return logits;
}

// The forward pass of a LLaMA-style model for n tokens, in the paper's order.
void Backend::layers(int n, int n_out) {
    Ops& ops = *ops_;
    ops.embed(b_.x, n);
    for (int l = 0; l < c_.n_layers; ++l) {
        // attention: normalize, project, rotate, write K/V into the cache, attend over the cache
        ops.norm_qkv(b_.q, b_.k, b_.v, b_.x, l, n);
        ops.rope_store_kv(b_.q, b_.k, b_.v, l, n);
        ops.attention(b_.att, b_.q, l, n);
        ops.out_proj_add(b_.x, b_.att, l, n);  // residual
        // feed-forward: SwiGLU
        ops.norm_swiglu(b_.ffn, b_.x, l, n);
        ops.down_proj_add(b_.x, b_.ffn, l, n);  // residual
    }
    // logits for the last n_out positions (usually the last one alone)
    ops.head(b_.logits, b_.x + int64_t(n - n_out) * c_.n_embd, n_out);
}

}  // namespace kvgen
