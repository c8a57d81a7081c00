#pragma once
// The CPU backend's KV cache: K and V in host memory, laid out as KvLayout says, f16 by default. Allocated and
// touched once for n_ctx, so memory stays flat while positions fill.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/kv_layout.h"
#include "model/config.h"

namespace kvgen {

// One cached row of head_dim values in type t: encoded from floats as KvCache::write stores it (a quantized row in
// the rotated basis of kv_rotation.h; tmp: head_dim floats of scratch), and decoded back to floats in the model's
// basis (a quantized row dequantized and rotated back).
void kv_encode_row(KvType t, const float* x, void* dst, int head_dim, float* tmp);
void kv_decode_row(KvType t, const void* src, float* out, int head_dim);

class KvCache {
public:
    // Throws kvgen::Error giving the bytes needed when the memory cannot be had, or for a quantized type on a
    // head_dim that is not a multiple of 32.
    KvCache(const Config& c, int n_ctx, KvType k_type, KvType v_type);
    KvCache(const Config& c, int n_ctx, KvType type) : KvCache(c, n_ctx, type, type) {}

    const KvLayout& layout() const { return layout_; }
    KvType k_type() const { return layout_.k_type; }
    KvType v_type() const { return layout_.v_type; }
    int n_ctx() const { return layout_.n_ctx; }
    size_t bytes() const { return layout_.bytes(); }

    // The cached rows of layer l, KV head h: n_ctx rows of layout().k_row_bytes() (v_row_bytes()) bytes.
    const void* k(int l, int h) const {
        return static_cast<const char*>(k_.get()) + layout_.row_index(l, h, 0) * layout_.k_row_bytes();
    }
    const void* v(int l, int h) const {
        return static_cast<const char*>(v_.get()) + layout_.row_index(l, h, 0) * layout_.v_row_bytes();
    }

    // Stores n positions starting at pos0 for layer l (rounded to the cache's type; a quantized type stores each row
    // in the rotated basis of kv_rotation.h); k and v are [n][n_kv_heads * head_dim].
    void write(int l, int pos0, int n, const float* k, const float* v);

    // The stored rows of positions [0, n) of every layer and head, copied out or back in as they are: k is
    // [n_layers][n_kv_heads][n][k_row_bytes], v likewise.
    void read(void* k, void* v, int n) const;
    void write_rows(const void* k, const void* v, int n);

private:
    KvLayout layout_;
    struct Free {
        void operator()(void* p) const;
    };
    std::unique_ptr<void, Free> k_, v_;
    std::vector<float> rotated_;  // [head_dim]: a row on its way into a quantized cache
};

}  // namespace kvgen
