#pragma once
// The prefill product of a quantized weight, out[n][rows] = x[n][cols] . W^T: the weight is decoded to f16 a chunk of
// rows at a time into a scratch buffer sized to stay in the L2 cache, and each chunk goes to cuBLAS on the tensor
// cores. The whole matrix is never written out in f16, and DRAM sees the quantized bytes once per call.
//
// The decoding body is written against a thread context (attention.cuh's DeviceThread on the GPU, the tests' fibers on
// the host): each thread decodes one 32-weight chunk into shared memory, then the block writes its chunks out as
// 16-byte stores of consecutive addresses (a thread per chunk writing its own 64 bytes would leave each store
// instruction touching 32 scattered 16-byte pieces).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "common/hd.h"
#include "memory_plan.h"
#include "quant.cuh"

namespace kvgen::cuda {

constexpr int kDqThreads = 256;            // chunks per block of the decoding kernel
constexpr int kDqStride = 34;              // halves per chunk in shared memory: 17 words, so no two lanes share a bank
constexpr int kDqShared = kDqThreads * kDqStride / 2;  // floats of shared memory a block needs

// Block block_x of the kernel that decodes n_chunks chunks (32 weights each) starting at row r0 of a weight with
// chunks_per_row chunks per row: out[i * 32 ..] = chunk i counted from the first weight of row r0 (so the output is
// the rows [r0, r0 + n_chunks / chunks_per_row) as f16, row-major). out must be 16-byte aligned.
#pragma nv_exec_check_disable
template <GgmlType T, class Ctx>
KVGEN_HD void dequantize_rows_body(const Ctx& ctx, const uint8_t* __restrict__ w, int64_t row_bytes,
                                   int64_t chunks_per_row, int64_t r0, int64_t n_chunks, __half* __restrict__ out) {
    __half* sm = reinterpret_cast<__half*>(ctx.shared());
    const int t = ctx.thread();
    const int64_t g0 = int64_t(ctx.block_x()) * kDqThreads;
    const int64_t left = n_chunks - g0;
    const int count = left < kDqThreads ? int(left) : kDqThreads;
    if (t < count) {
        const int64_t g = g0 + t;
        float v[32];
        row_chunk<T>(w + (r0 + g / chunks_per_row) * row_bytes, g % chunks_per_row, chunks_per_row, v);
        __half2* dst = reinterpret_cast<__half2*>(sm + t * kDqStride);
#pragma unroll
        for (int k = 0; k < 16; ++k) dst[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
    }
    ctx.sync();
    // 16-byte pieces: piece u is quarter u % 4 of chunk u / 4; consecutive threads write consecutive pieces.
    for (int u = t; u < 4 * count; u += kDqThreads) {
        const __half2* src = reinterpret_cast<const __half2*>(sm + (u >> 2) * kDqStride + (u & 3) * 8);
        uint4 piece;
        __half2 h[4] = {src[0], src[1], src[2], src[3]};
        static_assert(sizeof(h) == sizeof(piece), "four half2 make one 16-byte store");
        memcpy(&piece, h, sizeof(piece));
        reinterpret_cast<uint4*>(out + (g0 << 5))[u] = piece;
    }
}

}  // namespace kvgen::cuda
