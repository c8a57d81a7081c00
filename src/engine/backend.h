#pragma once
// A backend: the model's forward pass, written once (backend.cpp), running on one set of operations (ops.h). It
// takes a batch of tokens at consecutive positions, appends their K/V to the cache and returns the logits of the
// last position. Prefill and decode are the same call: decode is a batch of one at pos0 = n_past.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/error.h"
#include "engine/ops.h"
#include "model/config.h"

namespace kvgen {

class Backend {
public:
    Backend(const Config& c, std::unique_ptr<Ops> ops);

    // Returns the logits of the batch's last position ([n_vocab], valid until the next call); with all_logits, of
    // every position ([n_tokens][n_vocab]; the backend must have been made with Settings::all_logits). pass: a
    // prompt's tokens or a generated one (ops.h). Throws kvgen::Error for a token outside the vocabulary.
    const float* forward(const int32_t* tokens, int n_tokens, int pos0, Pass pass, bool all_logits = false);
    // Forgets positions >= n_past (0 = clear); a cache cannot grow this way.
    void kv_truncate(int n_past) {
        KVGEN_ASSERT(n_past >= 0 && n_past <= n_past_);
        n_past_ = n_past;
    }
    int n_past() const { return n_past_; }
    int n_ctx() const { return ops_->kv_layout().n_ctx; }
    int n_batch() const { return ops_->n_batch(); }
    size_t kv_bytes() const { return ops_->kv_layout().bytes(); }
    const KvLayout& kv_layout() const { return ops_->kv_layout(); }
    // The cache rows of positions [0, n) out, or in (Ops::kv_read / kv_write); kv_write leaves n_past at n.
    void kv_read(void* k, void* v, int n) { ops_->kv_read(k, v, n); }
    void kv_write(const void* k, const void* v, int n) {
        ops_->kv_write(k, v, n);
        n_past_ = n;
    }
    std::string name() const { return ops_->name(); }
    bool decode_matches_prompt() const { return ops_->decode_matches_prompt(); }  // Ops::decode_matches_prompt

private:
    void layers(int n, int n_out);  // enqueues one step's ops; logits for the last n_out positions

    const Config& c_;
    std::unique_ptr<Ops> ops_;
    Buffers b_;
    int n_past_ = 0;
};

}  // namespace kvgen
