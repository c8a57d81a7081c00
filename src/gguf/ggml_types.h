#pragma once
// The ggml tensor type table: ids as stored in GGUF tensor infos, block geometry, and which types kvgen computes with.
#include <cstdint>
#include <string>

namespace kvgen {

enum class GgmlType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    BF16 = 30,
};

struct GgmlTypeInfo {
    const char* name;
    int block_size;  // weights per block
    int type_size;   // bytes per block
    bool supported;  // kvgen can dequantize and compute with it
};

// Every type id ggml has defined (removed ids are unknown); nullptr for an unknown id.
const GgmlTypeInfo* ggml_type_info(uint32_t id);
inline const GgmlTypeInfo* ggml_type_info(GgmlType t) { return ggml_type_info(uint32_t(t)); }

// "Q4_K", or "type 77" for an unknown id.
std::string ggml_type_name(uint32_t id);
inline std::string ggml_type_name(GgmlType t) { return ggml_type_name(uint32_t(t)); }

bool ggml_type_supported(uint32_t id);
std::string ggml_supported_types();  // "F32, F16, BF16, Q4_0, ..."

// Parses a type name ("q4_k" or "Q4_K"); returns false when unknown.
bool ggml_type_from_name(const std::string& name, GgmlType* out);

// The name of a general.file_type value (what a GGUF file is "mostly", as llama.cpp's quantizer records it):
// 15 -> "Q4_K - Medium", 2 -> "Q4_0"; nullptr for a value without one.
const char* gguf_file_type_name(int64_t file_type);

// Bytes of one row of ne0 weights; ne0 must be a multiple of the block size.
inline int64_t ggml_row_bytes(const GgmlTypeInfo& info, int64_t ne0) {
    return ne0 / info.block_size * info.type_size;
}

}  // namespace kvgen
