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
// basis (a quantized row dequantized and rotated back). offset: null, or a key offset in the rotated basis
// (engine/kv_offset.h), taken from the rotated row before it is quantized and added back after it is decoded.
void kv_encode_row(KvType t, const float* x, void* dst, int head_dim, float* tmp, const float* offset = nullptr);
void kv_decode_row(KvType t, const void* src, float* out, int head_dim, const float* offset = nullptr);
// The key offset (rotated basis, head_dim values) of one head whose first kKvOffsetPositions K rows of quantized
// type t are rows[0 ..), row_bytes apart: kv_offset_from_sum of their decoded sum (zeros for dim0 >= head_dim).
void kv_offset_of_rows(KvType t, const void* rows, int64_t row_bytes, int head_dim, int dim0, float* offset);

class KvCache {
public:
    // Throws kvgen::Error giving the bytes needed when the memory cannot be had (with resident_bytes, what the run
    // keeps in memory besides the cache: the mapped weights), or for a quantized type on a head_dim that is not a
    // multiple of 32.
    KvCache(const Config& c, int n_ctx, KvType k_type, KvType v_type, uint64_t resident_bytes = 0);
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

    // The key offset of layer l, KV head h (rotated basis, head_dim values), or null when K carries none
    // (KvLayout::k_offsets). Set once the layer's first kKvOffsetPositions positions are written; the K rows from
    // there on are stored less it.
    const float* k_offset(int l, int h) const {
        return layout_.k_offsets() ? k_offset_.data() + (int64_t(l) * layout_.n_kv_heads + h) * layout_.head_dim
                                   : nullptr;
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
    // The key offsets of layer l from its first kKvOffsetPositions stored rows.
    void set_k_offsets(int l);

    std::vector<float> rotated_;   // [head_dim]: a row on its way into a quantized cache
    std::vector<float> k_offset_;  // [n_layers][n_kv_heads][head_dim] when K carries offsets
};

}  // namespace kvgen
