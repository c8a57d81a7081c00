#pragma once
// A backend runs the model's forward pass over a batch of tokens at consecutive positions, appending their K/V to
// its cache. Prefill and decode are the same call: decode is a batch of one at pos0 = n_past.
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvgen {

class Backend {
public:
    virtual ~Backend() = default;
    // Returns the logits of the batch's last position ([n_vocab], valid until the next call).
    virtual const float* forward(const int32_t* tokens, int n_tokens, int pos0) = 0;
    virtual void kv_truncate(int n_past) = 0;  // forget positions >= n_past (0 = clear)
    virtual int n_past() const = 0;
    virtual int n_ctx() const = 0;
    virtual int n_batch() const = 0;
    virtual size_t kv_bytes() const = 0;
    virtual std::string name() const = 0;
};

}  // namespace kvgen
