#include "model/dequant.h"

#include <fmt/format.h>

#include "common/error.h"
#include "model/dequant_impl.h"

namespace kvgen {

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
    const GgmlTypeInfo* info = ggml_type_info(type);
    KVGEN_ASSERT(info != nullptr && n % info->block_size == 0);
    if (detail::dequantize_any(type, src, dst, n, n / info->block_size)) return;
    throw Error(fmt::format("cannot dequantize type {} (supported: {})", info->name, ggml_supported_types()));
}

}  // namespace kvgen
