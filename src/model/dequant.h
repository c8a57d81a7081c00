#pragma once
// CPU dequantization: the readable reference for every supported weight type.
#include <cstdint>

#include "gguf/ggml_types.h"

namespace kvgen {

// Writes n floats (n a multiple of the type's block size) decoded from the blocks at src.
// Throws kvgen::Error for a type kvgen does not compute with.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

}  // namespace kvgen
