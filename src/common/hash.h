#pragma once
// FNV-1a, 64-bit: a fast, stable hash for recognising what a saved file was made from (a model, a vocabulary, a
// text). Not for security: it only has to tell honest mistakes apart.
#include <cstddef>
#include <cstdint>

namespace kvgen {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;

// h extended by n bytes at p.
inline uint64_t fnv1a(const void* p, size_t n, uint64_t h = kFnvOffset) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

}  // namespace kvgen
