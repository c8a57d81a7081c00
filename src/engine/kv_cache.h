#pragma once
// The KV cache: per layer, K and V are each [n_kv_heads][n_ctx][head_dim] (the [batch, heads, seq_len, head_dim]
// tensor of the literature with batch 1), f16 by default. Allocated once for n_ctx; all index arithmetic is here.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "model/config.h"

namespace kvgen {

enum class KvType { F16, F32 };

class KvCache {
public:
    // Throws kvgen::Error giving the bytes needed when the memory cannot be had.
    KvCache(const Config& c, int n_ctx, KvType type);

    static size_t bytes_needed(const Config& c, int n_ctx, KvType type) {
        return size_t(c.kv_bytes_per_token(type == KvType::F16 ? 2 : 4)) * size_t(n_ctx);
    }

    KvType type() const { return type_; }
    int n_ctx() const { return n_ctx_; }
    int n_kv_heads() const { return n_kv_heads_; }
    int head_dim() const { return head_dim_; }
    size_t bytes() const { return bytes_; }
    size_t elem_bytes() const { return type_ == KvType::F16 ? 2 : 4; }

    int n_past() const { return n_past_; }       // positions 0 .. n_past - 1 hold valid K/V
    void set_n_past(int n) { n_past_ = n; }      // forget positions >= n (0 = clear)

    // Element offset of (layer l, KV head h, position t) in the K or V storage.
    int64_t offset(int l, int h, int t) const {
        return ((int64_t(l) * n_kv_heads_ + h) * n_ctx_ + t) * head_dim_;
    }
    const void* k(int l, int h) const { return base(k_.get(), offset(l, h, 0)); }
    const void* v(int l, int h) const { return base(v_.get(), offset(l, h, 0)); }

    // Stores n positions starting at pos0 for layer l; k and v are [n][n_kv_heads * head_dim].
    void write(int l, int pos0, int n, const float* k, const float* v);

private:
    const void* base(const void* p, int64_t off) const {
        return static_cast<const char*>(p) + off * int64_t(elem_bytes());
    }

    KvType type_;
    int n_layers_, n_kv_heads_, head_dim_, n_ctx_;
    size_t bytes_;
    int n_past_ = 0;
    struct Free {
        void operator()(void* p) const;
    };
    std::unique_ptr<void, Free> k_, v_;
};

}  // namespace kvgen
