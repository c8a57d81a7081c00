#pragma once
// How a weight matrix lies in device memory. Most types keep their GGUF blocks, whose quants already sit at 16-byte
// multiples (Q4_K's 144-byte and Q5_K's 176-byte super-blocks) or are read in 4-byte words. Q4_0, Q8_0 and Q6_K do
// not: their blocks are 18, 34 and 210 bytes, so a block's quants start at an even address only, and a kernel
// reading them is held to 2-byte loads. Those three are stored in planes, a row at a time: the row's quants first,
// every block's at a 16-byte multiple from the row's start, then its scales; rows padded to 16 bytes. A lane then
// takes a block's quants in one or two 16-byte loads, and a warp's scales are one contiguous read.
//   Q4_0  [n_blocks][16] nibbles (byte j: weight j low, j + 16 high), then [n_blocks] f16 d
//   Q8_0  [n_blocks][32] int8, then [n_blocks] f16 d
//   Q6_K  [n_super][192] (the block's ql[128] then qh[64]), then [n_super][16] int8 scales, then [n_super] f16 d
// The bytes are the GGUF bytes moved, none changed, so a row keeps its size but for the padding. Host code (the
// memory plan, the upload, the tests) and the device decoders (quant.cuh) share these functions.
#include <cstdint>
#include <cstring>

#include "common/hd.h"
#include "gguf/ggml_types.h"

namespace kvgen::cuda {

KVGEN_HD constexpr bool planar_type(GgmlType t) {
    return t == GgmlType::Q4_0 || t == GgmlType::Q8_0 || t == GgmlType::Q6_K;
}

// Of a planar type's GGUF block: its bytes, the quant bytes it keeps in the first plane (a multiple of 16), where
// they start in the block, and the weights it holds.
struct PlanarBlock {
    int bytes, quant_bytes, quant_at, weights;
};
KVGEN_HD constexpr PlanarBlock planar_block(GgmlType t) {
    if (t == GgmlType::Q4_0) return PlanarBlock{18, 16, 2, 32};
    if (t == GgmlType::Q8_0) return PlanarBlock{34, 32, 2, 32};
    return PlanarBlock{210, 192, 0, 256};  // Q6_K: ql and qh lead the block; scales[16] and d follow
}

// The bytes from one row's start to the next on the device (a multiple of 16 for the planar types).
inline int64_t device_row_bytes(GgmlType t, int64_t cols) {
    const int64_t gguf = ggml_row_bytes(*ggml_type_info(t), cols);
    return planar_type(t) ? (gguf + 15) / 16 * 16 : gguf;
}

// One GGUF row of nb blocks of planar type T at s, as the device lays it out at d (without the padding). The block's
// sizes are constants, so that each copy is a move or two of registers, not a library call (two calls per 18-byte
// Q4_0 block held the upload of a 7B Q4_0 file to 0.5 GB/s on the H200's host).
template <GgmlType T>
inline void planar_row(const uint8_t* s, int64_t nb, uint8_t* d) {
    constexpr PlanarBlock b = planar_block(T);
    constexpr int rest = b.bytes - b.quant_bytes;  // the scale bytes of a block, in GGUF order
    for (int64_t k = 0; k < nb; ++k) {
        const uint8_t* blk = s + k * b.bytes;
        std::memcpy(d + k * b.quant_bytes, blk + b.quant_at, size_t(b.quant_bytes));
        if constexpr (T == GgmlType::Q6_K) {
            std::memcpy(d + nb * 192 + k * 16, blk + 192, 16);
            std::memcpy(d + nb * 208 + k * 2, blk + 208, 2);
        } else {
            std::memcpy(d + nb * b.quant_bytes + k * rest, blk, size_t(rest));
        }
    }
}

// rows GGUF rows of cols weights at src, laid out for the device at dst (rows * device_row_bytes bytes; the padding
// zeroed).
inline void to_device_rows(GgmlType t, const uint8_t* src, int64_t rows, int64_t cols, uint8_t* dst) {
    const int64_t gguf = ggml_row_bytes(*ggml_type_info(t), cols), dev = device_row_bytes(t, cols);
    if (!planar_type(t)) {
        std::memcpy(dst, src, size_t(rows * gguf));
        return;
    }
    const int64_t nb = cols / planar_block(t).weights;
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* s = src + r * gguf;
        uint8_t* d = dst + r * dev;
        if (t == GgmlType::Q4_0)
            planar_row<GgmlType::Q4_0>(s, nb, d);
        else if (t == GgmlType::Q8_0)
            planar_row<GgmlType::Q8_0>(s, nb, d);
        else
            planar_row<GgmlType::Q6_K>(s, nb, d);
        std::memset(d + gguf, 0, size_t(dev - gguf));
    }
}

}  // namespace kvgen::cuda
