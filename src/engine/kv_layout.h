#pragma once
// The KV cache layout, the one place that knows where a cached K or V row lives. Per layer, K and V are each
// [n_kv_heads][n_ctx][head_dim] (the [batch, heads, seq_len, head_dim] tensor of the literature with batch 1), and
// the layers follow each other: K is [n_layers][n_kv_heads][n_ctx][head_dim], V the same. The CPU cache, the CUDA
// kernels and the tests all index through this type; it is plain data, so kernels take it by value.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/hd.h"

namespace kvgen {

struct Config;

enum class KvType { F16, F32 };

// "f16", "f32": the names --kv-type and llama.cpp's -ctk/-ctv take.
const char* kv_type_name(KvType t);
// The type of a name above; throws kvgen::Error naming `option` and the valid names for anything else.
KvType kv_type_from_name(const std::string& name, const char* option);
// "f16, f32", for help texts and messages.
const char* kv_type_names();

struct KvLayout {
    int n_layers = 0;
    int n_kv_heads = 0;
    int n_ctx = 0;
    int head_dim = 0;
    KvType type = KvType::F16;

    static KvLayout of(const Config& c, int n_ctx, KvType type);

    // Elements of one layer's K (or V), and of all layers'.
    KVGEN_HD int64_t layer_elems() const { return int64_t(n_kv_heads) * n_ctx * head_dim; }
    KVGEN_HD int64_t elems() const { return int64_t(n_layers) * layer_elems(); }
    // Element offset of (KV head h, position t) inside one layer; of (layer l, h, t) in the whole K or V.
    KVGEN_HD int64_t row(int h, int t) const { return (int64_t(h) * n_ctx + t) * head_dim; }
    KVGEN_HD int64_t offset(int l, int h, int t) const { return int64_t(l) * layer_elems() + row(h, t); }

    int elem_bytes() const { return type == KvType::F16 ? 2 : 4; }
    // K and V bytes for one position across all layers, and for the whole cache.
    int64_t bytes_per_token() const { return 2 * int64_t(n_layers) * n_kv_heads * head_dim * elem_bytes(); }
    size_t bytes() const { return size_t(bytes_per_token()) * size_t(n_ctx); }
};

}  // namespace kvgen
