#pragma once
// How a weight matrix lies in device memory. Most types keep their GGUF blocks, whose quants already sit at 16-byte
// multiples (Q5_K's 176-byte super-blocks) or are read in 4-byte words. Q4_0, Q8_0, Q4_K and Q6_K do not: their blocks
// are 18, 34, 144 and 210 bytes, so a Q4_0, Q8_0 or Q6_K block's quants start at an even address only (a kernel
// reading them is held to 2-byte loads), and a lane reading a unit of Q4_K quants needs its super-block's 16 header
// bytes beside them, most of which it does not use. Those four are stored in planes, a row at a time: the row's
// quants first, every block's at a 16-byte multiple from the row's start, then its scales; rows padded to 16 bytes.
// A lane then takes a block's quants in one or two 16-byte loads, and a warp's scales are one contiguous read.
//   Q4_0  [n_blocks][16] nibbles (byte j: weight j low, j + 16 high), then [n_blocks] f16 d
//   Q8_0  [n_blocks][32] int8, then [n_blocks] f16 d
//   Q4_K  [n_super][128] qs, then [n_super][4][4] the 6-bit scales and mins unpacked, a 32-bit word per pair of
//         sub-blocks (word p: sc[2p], sc[2p + 1], m[2p], m[2p + 1]), then [n_super] the f16 d and dmin (4 bytes)
//   Q6_K  [n_super][192] (the block's ql[128] then qh[64]), then [n_super][16] int8 scales, then [n_super] f16 d
// The bytes are the GGUF bytes moved, none changed, but for Q4_K's scales: its 12 packed bytes become 16, so that a
// lane's unit needs one 4-byte word of them and one of d and dmin (148 bytes a super-block instead of 144; the lanes
// of a warp read each super-block's 20 bytes of scales together). Host code (the memory plan, the upload, the tests)
// and the device decoders (quant.cuh, matvec_int.cuh) share these functions.
#include <cstdint>
#include <cstring>

#include "common/hd.h"
#include "gguf/ggml_types.h"
#include "model/quant_blocks.h"

namespace kvgen::cuda {

KVGEN_HD constexpr bool planar_type(GgmlType t) {
    return t == GgmlType::Q4_0 || t == GgmlType::Q8_0 || t == GgmlType::Q4_K || t == GgmlType::Q6_K;
}

// Of a planar type's GGUF block: its bytes, the quant bytes it keeps in the first plane (a multiple of 16), where
// they start in the block, the weights it holds, and its bytes on the device (all planes).
struct PlanarBlock {
    int bytes, quant_bytes, quant_at, weights, device_bytes;
};
KVGEN_HD constexpr PlanarBlock planar_block(GgmlType t) {
    if (t == GgmlType::Q4_0) return PlanarBlock{18, 16, 2, 32, 18};
    if (t == GgmlType::Q8_0) return PlanarBlock{34, 32, 2, 32, 34};
    if (t == GgmlType::Q4_K) return PlanarBlock{144, 128, 16, 256, 148};  // d, dmin and scales[12] lead the block
    return PlanarBlock{210, 192, 0, 256, 210};  // Q6_K: ql and qh lead the block; scales[16] and d follow
}

// Where a Q4_K row's planes start, for a row of n_super super-blocks: the scale words, and d and dmin.
KVGEN_HD constexpr int64_t q4k_scales_at(int64_t n_super) {
    return 128 * n_super;
}
KVGEN_HD constexpr int64_t q4k_d_at(int64_t n_super) {
    return 144 * n_super;
}

// A row's bytes on the device, without the padding, and from one row's start to the next (a multiple of 16 for the
// planar types).
inline int64_t device_row_payload(GgmlType t, int64_t cols) {
    if (!planar_type(t)) return ggml_row_bytes(*ggml_type_info(t), cols);
    const PlanarBlock b = planar_block(t);
    return cols / b.weights * b.device_bytes;
}
inline int64_t device_row_bytes(GgmlType t, int64_t cols) {
    const int64_t payload = device_row_payload(t, cols);
    return planar_type(t) ? (payload + 15) / 16 * 16 : payload;
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
        if constexpr (T == GgmlType::Q4_K) {
            uint8_t sc[8], m[8], words[16];
            k4_scales_mins(blk + 4, sc, m);
            for (int p = 0; p < 4; ++p) {
                words[4 * p] = sc[2 * p];
                words[4 * p + 1] = sc[2 * p + 1];
                words[4 * p + 2] = m[2 * p];
                words[4 * p + 3] = m[2 * p + 1];
            }
            std::memcpy(d + q4k_scales_at(nb) + k * 16, words, 16);
            std::memcpy(d + q4k_d_at(nb) + k * 4, blk, 4);
        } else if constexpr (T == GgmlType::Q6_K) {
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
    const int64_t gguf = ggml_row_bytes(*ggml_type_info(t), cols), payload = device_row_payload(t, cols);
    const int64_t dev = device_row_bytes(t, cols);
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
        else if (t == GgmlType::Q4_K)
            planar_row<GgmlType::Q4_K>(s, nb, d);
        else
            planar_row<GgmlType::Q6_K>(s, nb, d);
        std::memset(d + payload, 0, size_t(dev - payload));
    }
}

// Where the decode products' rings (matvec_ring, matvec_int.cuh) lie in a block's shared memory: each thread's slots
// of a step of weights of `slots` rows (slot m R + r for row r of matrix m) in each stage, n16 16-byte pieces and n4
// 4-byte words a slot (the step policy's: IntRing, F16Ring). Every 16-byte piece first, [stage][slot][piece][thread],
// then every 4-byte word, [stage][slot][word][thread]: a warp's 32 threads read one piece of theirs from 512 (or 128)
// consecutive bytes, no bank conflict.
struct RingLayout {
    int threads, slots, n16, n4, stages;
    KVGEN_HD int64_t bytes16() const { return int64_t(stages) * slots * n16 * threads * 16; }
    KVGEN_HD int64_t bytes() const { return bytes16() + int64_t(stages) * slots * n4 * threads * 4; }
    // (a ring is at most the 227 KiB a block may have: 32-bit offsets)
    KVGEN_HD int at16(int st, int slot, int k, int t) const {
        return (((st * slots + slot) * n16 + k) * threads + t) * 16;
    }
    KVGEN_HD int at4(int st, int slot, int j, int t) const {
        return int(bytes16()) + (((st * slots + slot) * n4 + j) * threads + t) * 4;
    }
};
// Stages a ring may have (--cuda-matvec-stages; 0 is the register path).
KVGEN_HD constexpr bool ring_stages_ok(int stages) {
    return stages >= 2 && stages <= 4;
}

}  // namespace kvgen::cuda
