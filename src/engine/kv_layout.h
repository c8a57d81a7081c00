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

// f16 and f32 store each element; q8_0 and q4_0 store each row of head_dim values as ggml's Q8_0 / Q4_0 blocks of 32
// (34 / 18 bytes: a scale and 8- / 4-bit values), quantized as a row is written, in the rotated basis of
// kv_rotation.h. K and V may have different types (llama.cpp's -ctk / -ctv).
enum class KvType { F16, F32, Q8_0, Q4_0 };

// "f16", "f32", "q8_0", "q4_0": the names --kv-type and llama.cpp's -ctk/-ctv take.
const char* kv_type_name(KvType t);
// The type of a name above; throws kvgen::Error naming `option` and the valid names for anything else.
KvType kv_type_from_name(const std::string& name, const char* option);
// "f16, f32, q8_0, q4_0", for help texts and messages.
const char* kv_type_names();
// "q8_0" when K and V share the type, else "K/V" ("q8_0/q4_0").
std::string kv_types_name(KvType k, KvType v);
// The K and V types of "TYPE" (both) or "K/V"; throws like kv_type_from_name.
void kv_types_from_name(const std::string& name, const char* option, KvType* k, KvType* v);
// Whether rows are stored as blocks of 32 (head_dim must then be a multiple of 32).
KVGEN_HD bool kv_type_quantized(KvType t) { return t == KvType::Q8_0 || t == KvType::Q4_0; }

struct KvLayout {
    int n_layers = 0;
    int n_kv_heads = 0;
    int n_ctx = 0;
    int head_dim = 0;
    KvType k_type = KvType::F16;
    KvType v_type = KvType::F16;
    // A quantized K stores rows past the first kKvOffsetPositions less an offset on dimensions [k_offset_dim0,
    // head_dim) (engine/kv_offset.h); head_dim or more (the default), or any other K type, means none.
    int k_offset_dim0 = 1 << 30;

    // With the key offsets of a quantized K: the dimensions whose RoPE pair turns by at most one radian over n_ctx
    // positions (the model's frequencies without any rope_freqs factors, which only slow them down).
    static KvLayout of(const Config& c, int n_ctx, KvType k_type, KvType v_type);
    static KvLayout of(const Config& c, int n_ctx, KvType type) { return of(c, n_ctx, type, type); }

    // Elements of one layer's K (or V), and of all layers'.
    KVGEN_HD int64_t layer_elems() const { return int64_t(n_kv_heads) * n_ctx * head_dim; }
    KVGEN_HD int64_t elems() const { return int64_t(n_layers) * layer_elems(); }
    // Element offset of (KV head h, position t) inside one layer; of (layer l, h, t) in the whole K or V.
    KVGEN_HD int64_t row(int h, int t) const { return (int64_t(h) * n_ctx + t) * head_dim; }
    KVGEN_HD int64_t offset(int l, int h, int t) const { return int64_t(l) * layer_elems() + row(h, t); }
    // The same place counted in rows, for any type: its bytes start at row_index(l, h, t) * k_row_bytes() in K,
    // * v_row_bytes() in V.
    KVGEN_HD int64_t row_index(int l, int h, int t) const { return (int64_t(l) * n_kv_heads + h) * n_ctx + t; }

    // Whether K rows past the first kKvOffsetPositions carry an offset.
    KVGEN_HD bool k_offsets() const { return kv_type_quantized(k_type) && k_offset_dim0 < head_dim; }

    // Bytes of one cached row of head_dim values in type t; in K, in V.
    KVGEN_HD static int64_t row_bytes(KvType t, int head_dim) {
        switch (t) {
            case KvType::F16: return int64_t(head_dim) * 2;
            case KvType::F32: return int64_t(head_dim) * 4;
            case KvType::Q8_0: return int64_t(head_dim) / 32 * 34;
            case KvType::Q4_0: return int64_t(head_dim) / 32 * 18;
        }
        return 0;
    }
    KVGEN_HD int64_t k_row_bytes() const { return row_bytes(k_type, head_dim); }
    KVGEN_HD int64_t v_row_bytes() const { return row_bytes(v_type, head_dim); }
    // K and V bytes for one position across all layers; all of K, all of V, the whole cache.
    int64_t bytes_per_token() const { return int64_t(n_layers) * n_kv_heads * (k_row_bytes() + v_row_bytes()); }
    size_t k_bytes() const { return size_t(int64_t(n_layers) * n_kv_heads * n_ctx) * size_t(k_row_bytes()); }
    size_t v_bytes() const { return size_t(int64_t(n_layers) * n_kv_heads * n_ctx) * size_t(v_row_bytes()); }
    size_t bytes() const { return k_bytes() + v_bytes(); }
    // Whether K or V is stored as blocks of 32 (head_dim must then be a multiple of 32).
    bool quantized() const { return kv_type_quantized(k_type) || kv_type_quantized(v_type); }
    std::string types_name() const { return kv_types_name(k_type, v_type); }
};

}  // namespace kvgen
