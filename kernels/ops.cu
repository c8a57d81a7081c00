#include "ops.cuh"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <mutex>
#include <utility>
#include <vector>

#include "attention.cuh"
#include "cuda_common.cuh"
#include "elementwise.cuh"
#include "engine/settings.h"
#include "flash_attention.cuh"
#include "kv_quant.cuh"
#include "matvec.cuh"
#include "matvec_int_mma.cuh"
#include "prefill_gemm.cuh"
#include "quant.cuh"

namespace kvgen::cuda {

namespace {

constexpr int kWarp = 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

unsigned grid_for(int64_t items, int block) {
    return unsigned((items + block - 1) / block);
}

// --- dequantization ---------------------------------------------------------------------------------------------

// Rows that are not whole 32-weight chunks (float types, cols % 32 != 0): one thread per weight.
template <typename Out>
__global__ void dequantize_ragged_kernel(GgmlType type, const uint8_t* __restrict__ w, int64_t row_bytes,
                                         int64_t cols, int64_t count, Out* __restrict__ out) {
    const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g >= count) return;
    const float v = float_weight(type, w + (g / cols) * row_bytes, g % cols);
    if constexpr (std::is_same<Out, float>::value)
        out[g] = v;
    else
        out[g] = __float2half_rn(v);
}

template <typename Out>
void dequantize_ragged(const DevWeight& w, Out* out, cudaStream_t s) {
    if (!is_float_type(w.type))
        throw Error(fmt::format("CUDA: {} rows of {} weights are not whole blocks", ggml_type_name(w.type), w.cols));
    const int64_t count = w.rows * w.cols;
    dequantize_ragged_kernel<Out><<<grid_for(count, 256), 256, 0, s>>>(w.type, w.data, w.row_bytes, w.cols, count, out);
    KVGEN_CUDA_LAUNCHED("dequantize_ragged");
}

__global__ void get_rows_ragged_kernel(GgmlType type, const uint8_t* __restrict__ w, int64_t row_bytes, int64_t cols,
                                       int64_t n_rows, const int32_t* __restrict__ tokens, int n,
                                       float* __restrict__ out) {
    const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g >= int64_t(n) * cols) return;
    int64_t row = tokens[g / cols];
    row = row < 0 ? 0 : (row >= n_rows ? n_rows - 1 : row);  // the host checked; never read out of bounds
    out[g] = float_weight(type, w + row * row_bytes, g % cols);
}

// A warp per row (matvec_ragged_lane).
__global__ void __launch_bounds__(kMvWarps* kWarp)
    matvec_ragged_kernel(GgmlType type, const uint8_t* __restrict__ w, int64_t row_bytes, int64_t cols, int64_t rows,
                         const float* __restrict__ x, RowSplit y, int accumulate) {
    const int lane = threadIdx.x % kWarp;
    const int64_t r = int64_t(blockIdx.x) * kMvWarps + threadIdx.x / kWarp;
    if (r >= rows) return;
    const float v = warp_sum(matvec_ragged_lane(type, w + r * row_bytes, cols, lane, x));
    if (lane == 0) {
        float* out = y.at(r);
        *out = accumulate ? *out + v : v;
    }
}

template <GgmlType T, typename Out>
__global__ void dequantize_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, int64_t chunks_per_row,
                                  int64_t n_chunks, Out* __restrict__ out) {
    const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g >= n_chunks) return;
    float v[32];
    row_chunk<T>(w + (g / chunks_per_row) * row_bytes, g % chunks_per_row, chunks_per_row, v);
    Out* o = out + g * 32;
    if constexpr (std::is_same<Out, float>::value) {
        float4* o4 = reinterpret_cast<float4*>(o);
#pragma unroll
        for (int k = 0; k < 8; ++k) o4[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
    } else {
        __half2* o2 = reinterpret_cast<__half2*>(o);
#pragma unroll
        for (int k = 0; k < 16; ++k) o2[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
    }
}

template <typename Out>
void dequantize_any(const DevWeight& w, Out* out, cudaStream_t s) {
    if (w.cols % 32 != 0) return dequantize_ragged(w, out, s);
    const int64_t cpr = w.cols / 32, n_chunks = w.rows * cpr;
    const bool ok = dispatch_type(w.type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        dequantize_kernel<T, Out><<<grid_for(n_chunks, 256), 256, 0, s>>>(w.data, w.row_bytes, cpr, n_chunks, out);
    });
    if (!ok) throw Error(fmt::format("CUDA: no device decoder for {}", ggml_type_name(w.type)));
    KVGEN_CUDA_LAUNCHED("dequantize");
}

template <GgmlType T>
__global__ void __launch_bounds__(kDqThreads)
    dequantize_rows_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, int64_t chunks_per_row, int64_t r0,
                           int64_t n_chunks, __half* __restrict__ out) {
    __shared__ float sm[kDqShared];
    dequantize_rows_body<T>(DeviceThread{sm}, w, row_bytes, chunks_per_row, r0, n_chunks, out);
}

// note: at most 128 registers, so that two blocks (16 warps) share a multiprocessor: while one decodes its next
// step's weights, the other's warps can be on the tensor cores. Shared memory: stages x kQgShared<TOK> floats,
// given at launch (up to 72 KiB, past the 48 a kernel gets without asking).
template <GgmlType T, int TOK, bool GLU>
__global__ void __launch_bounds__(kQgThreads, kQgBlocksPerSm)
    gemm_mma_kernel(const uint8_t* __restrict__ w, const uint8_t* __restrict__ up, int64_t row_bytes, int64_t rows,
                    int64_t cols, const __half* __restrict__ x, int n, RowSplit out, bool accumulate, int splits,
                    int stages) {
    extern __shared__ __align__(16) float gemm_mma_shared[];
    gemm_mma_body<T, TOK, GLU>(DeviceThread{gemm_mma_shared}, w, up, row_bytes, rows, cols, x, n, out, accumulate,
                               splits, stages);
}

__global__ void gemm_split_sum_kernel(const float* __restrict__ partials, int splits, int n, int64_t rows,
                                      RowSplit out, bool accumulate) {
    const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (j < int64_t(n) * rows) gemm_split_sum_item(j, partials, splits, n, rows, out, accumulate);
}

__global__ void f16_split_sum_kernel(const float* __restrict__ t, int n, int64_t rows, RowSplit out, bool accumulate,
                                     SplitSumTail tail) {
    const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (j < int64_t(n) * rows) f16_split_sum_item(j, t, n, rows, out, accumulate, tail);
}

__global__ void f16_split_sum_qkv_kernel(const float* __restrict__ t, int n, int64_t rows, RowSplit out, QkvStore st) {
    const int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (p < int64_t(n) * rows / 2) f16_split_sum_qkv_item(p, t, n, rows, out, st);
}

template <GgmlType T>
__global__ void get_rows_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, int64_t chunks_per_row,
                                int64_t n_rows, const int32_t* __restrict__ tokens, int n, float* __restrict__ out) {
    const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g < int64_t(n) * chunks_per_row) get_rows_item<T>(g, w, row_bytes, chunks_per_row, n_rows, tokens, out);
}

// --- decode matrix-vector product (matvec.cuh) -------------------------------------------------------------------

// The epilogue of the one-token products: each of the warp's rows summed over its lanes, lane 0 writing (or adding)
// it where the RowSplit puts it.
__device__ __forceinline__ void store_rows(const float (&acc)[kMvRows], int64_t r0, int64_t rows, int lane,
                                           const RowSplit& y, int accumulate) {
#pragma unroll
    for (int r = 0; r < kMvRows; ++r) {
        const float v = warp_sum(acc[r]);
        if (lane == 0 && r0 + r < rows) {
            float* out = y.at(r0 + r);
            *out = accumulate ? *out + v : v;
        }
    }
}

template <GgmlType T>
__global__ void __launch_bounds__(kMvWarps* kWarp)
    matvec_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, int64_t n_chunks, int64_t rows,
                  const float* __restrict__ x, RowSplit y, int accumulate) {
    const int lane = threadIdx.x % kWarp;
    const int64_t r0 = (int64_t(blockIdx.x) * kMvWarps + threadIdx.x / kWarp) * kMvRows;
    if (r0 >= rows) return;
    float acc[kMvRows];
    matvec_lane<T>(w, row_bytes, n_chunks, rows, r0, lane, x, acc);
    store_rows(acc, r0, rows, lane, y, accumulate);
}

// y[i][r] = W[r] . x[i] (+= when accumulate) for n <= NT tokens: each chunk of W decoded once (matvec.cuh).
template <GgmlType T, int NT>
__global__ void __launch_bounds__(kMvWarps* kWarp)
    matvec_batch_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, int64_t n_chunks, int64_t cols,
                        int64_t rows, const float* __restrict__ x, int n, float* __restrict__ y, int accumulate) {
    const int lane = threadIdx.x % kWarp;
    const int64_t r0 = (int64_t(blockIdx.x) * kMvWarps + threadIdx.x / kWarp) * kMvRows;
    if (r0 >= rows) return;
    float acc[kMvRows][NT];
    matvec_batch_lane<T, NT>(w, row_bytes, n_chunks, cols, rows, r0, lane, x, n, acc);
#pragma unroll
    for (int r = 0; r < kMvRows; ++r)
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            if (i >= n) break;  // the same for the whole warp
            const float v = warp_sum(acc[r][i]);
            if (lane == 0 && r0 + r < rows) {
                float* out = y + int64_t(i) * rows + r0 + r;
                *out = accumulate ? *out + v : v;
            }
        }
}

// --- decode products in integers (matvec_int.cuh) ------------------------------------------------------------------

// A warp per ActBlock, a lane per value (quantize_act_warp: coalesced loads, 10 shuffles a block).
__global__ void quantize_act_kernel(const float* __restrict__ x, int64_t n_blocks, ActBlock* __restrict__ out) {
    pdl_trigger();  // the product that reads out may start loading its weights
    pdl_wait();     // launched programmatically: x is read once the kernel that writes it has finished
    const int64_t b = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
    const int lane = int(threadIdx.x % kWarp);
    if (b < n_blocks) quantize_act_warp(DeviceThread{nullptr}, x[b * 32 + lane], lane, out[b]);  // whole warps
}

// Each of a block's R rows for each of NT tokens summed over its threads: a warp's lanes by the butterfly, then the
// warps in order (the host emulation, tests/cuda_support/host_emulation.cu, follows this order). Returns the sum of
// row t / NT for token t % NT in thread t < R NT.
template <int R, int NT>
__device__ __forceinline__ float block_rows_sum(const float (&acc)[R][NT], float (&part)[kMviMaxWarps][R * NT]) {
    const int t = threadIdx.x, warps = blockDim.x / kWarp;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            const float v = warp_sum(acc[r][i]);
            if (t % kWarp == 0) part[t / kWarp][r * NT + i] = v;
        }
    __syncthreads();
    float v = 0.0f;
    if (t < R * NT) {
        v = part[0][t];
        for (int k = 1; k < warps; ++k) v += part[k][t];
    }
    return v;
}

// A block's sums of a product of NM matrices for n <= NT tokens, its steps as policy P takes them (IntRing,
// F16Ring): with RING, its groups of R rows one after another through a ring of `stages` stages in dynamic shared
// memory (matvec_ring); without, its one group (blockIdx.x) through registers (P::thread). done(r0, gi, acc) at each
// group's end, in every thread.
template <class P, int NM, int R, int NT, bool RING, class Done>
__device__ __forceinline__ void product_block(const uint8_t* const (&ws)[NM], int64_t row_bytes, int n_units,
                                              int64_t rows, const typename P::Act* __restrict__ x, int n, int stages,
                                              Done&& done) {
    if constexpr (RING) {
        extern __shared__ uint4 ring[];
        matvec_ring<P, NM, R, NT>(DeviceThread{nullptr}, reinterpret_cast<uint8_t*>(ring), stages, ws, row_bytes,
                                  n_units, rows, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x, x, n, done);
    } else {
        float acc[NM][R][NT];
        P::template thread<NM, R, NT>(ws, row_bytes, n_units, rows, int64_t(blockIdx.x) * R, threadIdx.x, blockDim.x, x,
                                      n, acc);
        done(int64_t(blockIdx.x) * R, 0, acc);
    }
}

// What a block of matvec_int_kernel does with the sum v of row r0 + t / NT for token t % NT in thread t < R NT
// (block_rows_sum) of its group of R rows from r0: stores it (accumulate: adds it), or with st.kc rotates and stores
// Q, K and V (qkv_store_row), or with ns.xq adds it to the residual and makes the next norm's blocks
// (residual_norm_store).
template <int NT, int R>
__device__ __forceinline__ void int_store(float v, int64_t r0, int64_t rows, int n, const RowSplit& y, int i0,
                                          int accumulate, const QkvStore& st, const NormStore& ns) {
    const int r = threadIdx.x / NT, i = threadIdx.x % NT;
    const bool valid = r < R && i < n && r0 + r < rows;  // threads t < R NT: row r0 + t / NT, token t % NT
    if (st.kc) {
        static_assert(R % 2 == 0 && R * NT <= kWarp, "a block's RoPE pairs in its first warp");
        if (threadIdx.x < kWarp) qkv_store_row(DeviceThread{nullptr}, v, valid, r0 + r, i0 + i, NT, y, rows, st);
        return;
    }
    if constexpr (NT == 1) {
        if (ns.xq) {
            if (threadIdx.x >= kWarp) return;
            const float sum = valid ? y.y[0][r0 + r] + v : 0.0f;  // thread r < R: row r0 + r, with the residual
            float nv[R];
#pragma unroll
            for (int k = 0; k < R; ++k) nv[k] = __shfl_sync(0xffffffffu, sum, k);
            residual_norm_store(DeviceThread{nullptr}, int(threadIdx.x), nv, y.y[0], r0, rows, ns);
            return;
        }
    }
    if (valid) {
        float* out = y.at(r0 + r, i0 + i, rows);
        *out = accumulate ? *out + v : v;
    }
}

// Without RING: grid = rows / R, block = 32 mvi_warps(n_units) threads: the block's threads stride over the units of
// its R rows (matvec_int_thread) for n <= NT tokens, x the tokens' ActBlocks one after another. At most 128 registers
// (two blocks of up to 256 threads per SM), so that every row's loads are issued before the first is used. R:
// mvi_rows, or kMviWideRows for one token (--cuda-matvec-rows 8). With RING: as many blocks as the SMs hold, each
// taking its groups of R rows through a ring of `stages` stages in dynamic shared memory (matvec_ring), and
// storing each group's sums as it ends.
// With st.kc (accumulate 0), a Q|K|V product that rotates Q and K and stores K and V into an f16 cache itself
// (qkv_store_row) instead of writing k and v. With ns.xq (one token, accumulate 1, one buffer, rows a multiple of
// 32), a residual product with the next RMSNorm folded in (residual_norm_store).
template <GgmlType T, int NT, int R, int S, bool RING>
__global__ void __launch_bounds__(32 * kMviMaxWarps, 2)
    matvec_int_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, int n_units, int64_t rows,
                      const ActBlock* __restrict__ x, int n, RowSplit y, int i0, int accumulate, QkvStore st,
                      NormStore ns, int stages) {
    // The kernel after it may start loading its weights while this one's last blocks run: the next product (the
    // SwiGLU product after the output projection, the next layer's Q|K|V after the down projection, a prompt's next
    // launch over the same weight) or decode attention after Q|K|V. It waits for this grid to finish before it reads
    // what this one writes; this grid's blocks are all resident when it starts, so they never wait for room.
    pdl_trigger();
    __shared__ float part[RING ? 2 : 1][kMviMaxWarps][R * NT];  // a ring's groups take turns (one barrier a group)
    const uint8_t* const ws[1] = {w};
    const auto done = [&](int64_t r0, int gi, const float(&acc)[1][R][NT]) {
        const float v = block_rows_sum(acc[0], part[gi % 2 * RING]);
        int_store<NT, R>(v, r0, rows, n, y, i0, accumulate, st, ns);
    };
    product_block<IntRing<T, S>, 1, R, NT, RING>(ws, row_bytes, n_units, rows, x, n, stages, done);
}

// grid (groups, rows / (sets int_mma_block_rows(GLU))) (int_mma_plan), 32 kImWarps threads: n tokens' product on the
// tensor cores (matvec_int_mma_body) in groups of group_tokens <= 8 NTT, all in one launch: y (+)= W x through
// RowSplit, or with GLU (up) y[i][r] = silu(gate x) * (up x) into y.y[0], and with yq that quantized for the down
// projection too (int_mma_glu_quantize, on counters).
template <GgmlType T, bool GLU, int NTT>
__global__ void __launch_bounds__(32 * kImWarps, 2)
    matvec_int_mma_kernel(const uint8_t* __restrict__ w, const uint8_t* __restrict__ up, int64_t row_bytes, int n_units,
                          int64_t rows, const ActBlock* __restrict__ x, int n, int group_tokens, int sets, RowSplit y,
                          int accumulate, ActBlock* __restrict__ yq, int* __restrict__ counters) {
    pdl_trigger();  // the next product may start loading its weights
    pdl_wait();
    __shared__ float part[int_mma_shared(NTT)];
    matvec_int_mma_body<T, GLU, NTT>(DeviceThread{part}, w, up, row_bytes, n_units, rows, x, n, group_tokens, sets,
                                     [&](int64_t r, int i, float v) {
                                         if constexpr (GLU) {
                                             y.y[0][int64_t(i) * rows + r] = v;
                                         } else {
                                             float* out = y.at(r, i, rows);
                                             *out = accumulate ? *out + v : v;
                                         }
                                     });
    if constexpr (GLU) {
        if (yq) int_mma_glu_quantize(DeviceThread{part}, y.y[0], rows, n, group_tokens, sets, counters, yq);
    }
}

// A block of matvec_glu_int_kernel's output o of row r0 + t / NT for token t % NT in thread t < R NT: stored, or
// with yq also quantized by each 32-row group's last block (glu_store_quantized; a short prompt's tokens,
// glu_store_quantized_tokens).
template <int NT, int R>
__device__ __forceinline__ void glu_store(float o, int64_t r0, int64_t rows, int n, float* __restrict__ y,
                                          ActBlock* __restrict__ yq, int* __restrict__ counters) {
    if (yq) {
        if (threadIdx.x >= kWarp) return;
        if constexpr (NT == 1) {
            float v[R];
#pragma unroll
            for (int r = 0; r < R; ++r) v[r] = __shfl_sync(0xffffffffu, o, r);
            glu_store_quantized(DeviceThread{nullptr}, int(threadIdx.x), v, y, r0, counters, yq);
        } else {
            glu_store_quantized_tokens<R, NT>(DeviceThread{nullptr}, int(threadIdx.x), o, y, rows, r0, n, counters, yq);
        }
        return;
    }
    const int r = threadIdx.x / NT, i = threadIdx.x % NT;
    if (r < R && i < n && r0 + r < rows) y[int64_t(i) * rows + r0 + r] = o;
}

// Without RING: grid = rows / R: gate and up rows of a SwiGLU pair in one block, y[i][r] = silu(gate[r] . x[i]) *
// (up[r] . x[i]). R of each: mvi_rows, or half kMviWideRows for one token (--cuda-matvec-rows 8). With RING, the
// groups of R rows of each through a ring (matvec_int_kernel says how). With yq (one token; rows a multiple of 32;
// counters: rows / 32 ints, zero between launches), y is also written as ActBlocks by each 32-row group's last block
// (glu_store_quantized).
template <GgmlType T, int NT, int R, int S, bool RING>
__global__ void __launch_bounds__(32 * kMviMaxWarps, 2)
    matvec_glu_int_kernel(const uint8_t* __restrict__ gate, const uint8_t* __restrict__ up, int64_t row_bytes,
                          int n_units, int64_t rows, const ActBlock* __restrict__ x, int n, float* __restrict__ y,
                          ActBlock* __restrict__ yq, int* __restrict__ counters, int stages) {
    pdl_trigger();  // the down projection, which reads y or yq, may start loading its weights
    __shared__ float part[RING ? 2 : 1][2][kMviMaxWarps][R * NT];
    const uint8_t* const ws[2] = {gate, up};
    const auto done = [&](int64_t r0, int gi, const float(&acc)[2][R][NT]) {
        const int b = gi % 2 * RING;
        const float gs = block_rows_sum(acc[0], part[b][0]), us = block_rows_sum(acc[1], part[b][1]);
        glu_store<NT, R>(silu_mul(gs, us), r0, rows, n, y, yq, counters);
    };
    product_block<IntRing<T, S>, 2, R, NT, RING>(ws, row_bytes, n_units, rows, x, n, stages, done);
}

// Without RING: grid = rows / R, block = 32 mvi_warps(n_units) threads: one token's product of F16 or BF16 (T) rows
// (matvec_f16_thread), R rows of one matrix (y (+)= W x through RowSplit), or with up (NM = 2) R rows of each of gate
// and up, y = silu(gate x) * (up x). With RING, as many blocks as the SMs hold, each taking its groups of R rows
// through a ring (F16Ring; matvec_int_kernel says how).
template <GgmlType T, int NM, int R, bool RING>
__global__ void __launch_bounds__(32 * kMviMaxWarps, 2)
    matvec_f16_kernel(const uint8_t* __restrict__ w, const uint8_t* __restrict__ up, int64_t row_bytes, int n_units,
                      int64_t rows, const float* __restrict__ x, RowSplit y, int accumulate, int stages) {
    pdl_trigger();  // the next product (the down projection after gate and up) may start loading its weights
    __shared__ float part[RING ? 2 : 1][NM][kMviMaxWarps][R];
    const auto done = [&](int64_t r0, int gi, const float(&acc)[NM][R][1]) {
        const int b = gi % 2 * RING, r = int(threadIdx.x);
        if constexpr (NM == 1) {
            const float v = block_rows_sum(acc[0], part[b][0]);
            if (r < R && r0 + r < rows) {
                float* out = y.at(r0 + r);
                *out = accumulate ? *out + v : v;
            }
        } else {
            const float gs = block_rows_sum(acc[0], part[b][0]), us = block_rows_sum(acc[1], part[b][1]);
            if (r < R && r0 + r < rows) y.y[0][r0 + r] = silu_mul(gs, us);
        }
    };
    if constexpr (NM == 1) {
        const uint8_t* const ws[1] = {w};
        product_block<F16Ring<T>, 1, R, 1, RING>(ws, row_bytes, n_units, rows, x, 1, stages, done);
    } else {
        const uint8_t* const ws[2] = {w, up};
        product_block<F16Ring<T>, 2, R, 1, RING>(ws, row_bytes, n_units, rows, x, 1, stages, done);
    }
}

// gate and up rows r of a SwiGLU pair in one warp: y[r] = silu(gate[r] . x) * (up[r] . x).
template <GgmlType T>
__global__ void __launch_bounds__(kMvWarps* kWarp)
    matvec_glu_kernel(const uint8_t* __restrict__ gate, const uint8_t* __restrict__ up, int64_t row_bytes,
                      int64_t n_chunks, int64_t rows, const float* __restrict__ x, float* __restrict__ y) {
    const int lane = threadIdx.x % kWarp;
    const int64_t r0 = (int64_t(blockIdx.x) * kMvWarps + threadIdx.x / kWarp) * kMvRows;
    if (r0 >= rows) return;
    float g[kMvRows], u[kMvRows];
    matvec_lane<T>(gate, row_bytes, n_chunks, rows, r0, lane, x, g);
    matvec_lane<T>(up, row_bytes, n_chunks, rows, r0, lane, x, u);
#pragma unroll
    for (int r = 0; r < kMvRows; ++r) {
        const float gs = warp_sum(g[r]), us = warp_sum(u[r]);
        if (lane == 0 && r0 + r < rows) y[r0 + r] = silu_mul(gs, us);
    }
}

// --- element-wise ops ---------------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                   ActBlock* __restrict__ xq, int dim, float eps, __half* __restrict__ xh) {
    pdl_trigger();  // the product that reads xq may start loading its weights
    // w depends on no kernel: under programmatic launch its lines (one a thread, 128 bytes) are on their way to L1
    // while the kernel that writes x still runs; x is read, and out, xq and xh written, only after pdl_wait
    for (int j = 32 * int(threadIdx.x); j < dim; j += 32 * int(blockDim.x)) prefetch_l1(w + j);
    pdl_wait();
    __shared__ float part[kNormWarps];
    rmsnorm_body(DeviceThread{part}, int(blockDim.x), x, w, out, xq, dim, eps, xh, int64_t(gridDim.x) * dim);
}

__global__ void rope_tables_kernel(const int* __restrict__ d_pos0, int n, int half,
                                   const double* __restrict__ inv_freq, const double* __restrict__ factors,
                                   double pos_div, float* __restrict__ cos_t, float* __restrict__ sin_t) {
    const int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g < n * half) rope_tables_item(g, d_pos0, half, inv_freq, factors, pos_div, cos_t, sin_t);
}

__global__ void rope_kernel(float* __restrict__ x, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                            int n, int n_heads, int head_dim, int half) {
    const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g < int64_t(n) * n_heads * half) rope_item(g, x, cos_t, sin_t, n_heads, head_dim, half);
}

// The query's RoPE, folded into a K/V store's launch: the grid's first `blocks` blocks rotate q (rope_item's pairs; q
// null: none; with turn, over a quantized K, a warp a row that also turns it into K's basis, rope_turn_q_row_warp),
// the rest store. n tokens of n_heads heads of head_dim.
struct QRope {
    float* q = nullptr;
    int n_heads = 0, head_dim = 0;
    unsigned blocks = 0;
    bool turn = false;  // store_kv_rows_kernel: a warp a row, turned into a quantized K's basis too
};
// Whether block b rotates q (done here), else b becomes the store's own block index.
__device__ __forceinline__ bool rope_q_block(const QRope& qr, unsigned* b, const float* __restrict__ cos_t,
                                             const float* __restrict__ sin_t, int n, int half_rope) {
    if (*b >= qr.blocks) {
        *b -= qr.blocks;
        return false;
    }
    const int64_t g = int64_t(*b) * blockDim.x + threadIdx.x;
    if (g < int64_t(n) * qr.n_heads * half_rope) rope_item(g, qr.q, cos_t, sin_t, qr.n_heads, qr.head_dim, half_rope);
    return true;
}

__global__ void store_kv_kernel(QRope qr, const float* __restrict__ k, const float* __restrict__ v,
                                const float* __restrict__ cos_t, const float* __restrict__ sin_t, int n,
                                const int* __restrict__ d_pos0, KvLayout kv, int half_rope, __half* __restrict__ kc,
                                __half* __restrict__ vc) {
    unsigned b = blockIdx.x;
    if (rope_q_block(qr, &b, cos_t, sin_t, n, half_rope)) return;
    const int64_t g = int64_t(b) * blockDim.x + threadIdx.x;
    if (g < int64_t(n) * kv.n_kv_heads * (kv.head_dim / 2))
        store_kv_item(g, k, v, cos_t, sin_t, d_pos0, kv, half_rope, kc, vc);
}

// A warp per row (store_kv_row_warp), kKvRowWarps rows a block; E = head_dim / 32.
constexpr int kKvRowWarps = 8;
template <int E>
__global__ void __launch_bounds__(kKvRowWarps* kWarp)
    store_kv_rows_kernel(QRope qr, const float* __restrict__ k, const float* __restrict__ v,
                         const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                         const float* __restrict__ k_offsets, const int* __restrict__ d_pos0, int i0, int n,
                         KvLayout kv, int half_rope, uint8_t* __restrict__ kc, uint8_t* __restrict__ vc) {
    unsigned b = blockIdx.x;
    if (qr.turn && b < qr.blocks) {  // q's rows, a warp each (the same for the whole warp)
        const int64_t r = int64_t(b) * kKvRowWarps + threadIdx.x / kWarp;
        if (r < int64_t(i0 + n) * qr.n_heads)
            rope_turn_q_row_warp<E>(DeviceThread{nullptr}, r, qr.q, cos_t, sin_t, qr.n_heads, half_rope);
        return;
    }
    if (qr.turn)
        b -= qr.blocks;
    else if (rope_q_block(qr, &b, cos_t, sin_t, i0 + n, half_rope))
        return;
    const int64_t g = int64_t(b) * kKvRowWarps + threadIdx.x / kWarp;
    if (g < int64_t(n) * kv.n_kv_heads * 2)  // the same for the whole warp
        store_kv_row_warp<E>(DeviceThread{nullptr}, g, k, v, cos_t, sin_t, k_offsets, d_pos0, i0, kv, half_rope, kc,
                             vc);
}

// A warp per layer and KV head (kv_offset_warp), kKvRowWarps a block; E = head_dim / 32.
template <int E>
__global__ void __launch_bounds__(kKvRowWarps* kWarp)
    kv_offsets_kernel(const uint8_t* __restrict__ kc, int64_t heads, KvLayout kv, float* __restrict__ k_offsets) {
    const int64_t g = int64_t(blockIdx.x) * kKvRowWarps + threadIdx.x / kWarp;
    if (g < heads) kv_offset_warp<E>(DeviceThread{nullptr}, g, kc, kv, k_offsets);  // the same for the whole warp
}

// A warp per row (kv_rotate_row_warp), kKvRowWarps rows a block; E = head_dim / 32. xq: null, or each row's E blocks.
template <int E>
__global__ void __launch_bounds__(kKvRowWarps* kWarp)
    kv_rotate_rows_kernel(float* __restrict__ x, int64_t rows, ActBlock* __restrict__ xq) {
    pdl_trigger();  // the kernel after it (attention, or the output projection) may be set up
    pdl_wait();     // launched programmatically: x is read once the kernel that writes it has finished
    const int64_t r = int64_t(blockIdx.x) * kKvRowWarps + threadIdx.x / kWarp;
    if (r < rows)  // the same for the whole warp
        kv_rotate_row_warp<E>(DeviceThread{nullptr}, x + r * 32 * E, xq ? xq + r * E : nullptr);
}

__global__ void swiglu_kernel(float* __restrict__ g, const float* __restrict__ u, int64_t count) {
    const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (j < count) swiglu_item(j, g, u);
}

__global__ void to_f16_kernel(const float* __restrict__ x, __half* __restrict__ y, int64_t count) {
    const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (j < count) to_f16_item(j, x, y);
}

__global__ void to_f16_split_kernel(const float* __restrict__ x, __half* __restrict__ y, int64_t count) {
    const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (j < count) to_f16_split_item(j, count, x, y);
}

// --- attention (attention.cuh) -----------------------------------------------------------------------------------

// This block's thread's pieces of pf (l2_prefetch_pieces) asked of the L2 cache, where the step's position is at most
// pf.max_pos (sm_90 and later with CUDA 12: cp.async.bulk.prefetch.L2; elsewhere nothing). The position is the
// step's copy into d_pos0, made before the step's first kernel, so it may be read before pdl_wait.
__device__ __forceinline__ void l2_prefetch_share(const L2Prefetch& pf, const int* d_pos0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && __CUDACC_VER_MAJOR__ >= 12
    if (pf.max_pos < 0 || *d_pos0 > pf.max_pos) return;
    l2_prefetch_pieces(pf, int(gridDim.x * gridDim.y), int(blockDim.x), int(blockIdx.y * gridDim.x + blockIdx.x),
                       int(threadIdx.x), [&](int r, int64_t off, int64_t bytes) {
                           asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(pf.range[r].data + off),
                                        "r"(uint32_t(bytes)));
                       });
#else
    (void)pf;
    (void)d_pos0;
#endif
}

template <int NQ, int E, AttnCache C>
__global__ void __launch_bounds__(kAttnThreads, kAttnMinBlocks<NQ, C>)
    attention_decode_kernel(const float* __restrict__ q, const uint8_t* __restrict__ kc, const uint8_t* __restrict__ vc,
                            const float* __restrict__ k_offsets, const int* __restrict__ d_pos0, int n_rep, KvLayout kv,
                            int splits, float scale, float* __restrict__ partials, int* __restrict__ counters,
                            float* __restrict__ out, ActBlock* __restrict__ xq, L2Prefetch prefetch) {
    pdl_trigger();  // the output projection, which reads xq, may start loading its weights
    // The next products' weights on their way into L2 while the memory bus would idle: what decode attention reads at
    // a shallow depth is a few rows a head, and before pdl_wait the kernel before it may still be streaming its last
    // weights.
    l2_prefetch_share(prefetch, d_pos0);
    // Launched as a programmatic dependent launch after the kernel that writes q and the step's cache rows (the
    // Q|K|V product, or the store or rotation), its blocks are set up while that kernel's last ones run; nothing is
    // read before it has finished but the position, which the step's copy wrote before its first kernel.
    pdl_wait();
    __shared__ float sm[kAttnDecodeShared<NQ, E>];
    attention_decode_body<NQ, E, C>(DeviceThread{sm}, q, kc, vc, k_offsets, d_pos0, n_rep, kv, splits, scale, partials,
                                    counters, out, xq);
}

__global__ void attention_generic_kernel(const float* __restrict__ q, const uint8_t* __restrict__ kc,
                                         const uint8_t* __restrict__ vc, const int* __restrict__ d_pos0, int n,
                                         int n_heads, int n_rep, KvLayout kv, float scale, float* __restrict__ out) {
    const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g < int64_t(n) * n_heads) attention_generic_item(g, q, kc, vc, d_pos0, n_heads, n_rep, kv, scale, out);
}

// Any head_dim without a specialised kernel: one thread per (query, head).
void attention_generic(float* out, const float* q, const uint8_t* k_cache, const uint8_t* v_cache, const int* d_pos0,
                       int n, int n_heads, const KvLayout& kv, cudaStream_t s) {
    if (!attention_head_dim_supported(kv.head_dim))
        throw Error(fmt::format("CUDA: head_dim {} has no attention kernel", kv.head_dim));
    KVGEN_ASSERT(!kv.k_offsets());  // a quantized cache's head_dims have warp kernels
    const float scale = 1.0f / std::sqrt(float(kv.head_dim));
    attention_generic_kernel<<<grid_for(int64_t(n) * n_heads, 64), 64, 0, s>>>(
        q, k_cache, v_cache, d_pos0, n, n_heads, n_heads / kv.n_kv_heads, kv, scale, out);
    KVGEN_CUDA_LAUNCHED("attention_generic");
}

__global__ void attention_combine_kernel(const float* __restrict__ partials, const int* __restrict__ d_pos0,
                                         int splits, int hd, float* __restrict__ out, ActBlock* __restrict__ xq) {
    pdl_trigger();
    attention_combine_body(DeviceThread{nullptr}, int(blockDim.x), partials, d_pos0, splits, hd, out, xq);
}

template <int NQ, int E>
__global__ void __launch_bounds__(kAttnThreads)
    attention_prefill_kernel(const float* __restrict__ q, const uint8_t* __restrict__ kc, const uint8_t* __restrict__ vc,
                             const int* __restrict__ d_pos0, int n, int n_heads, int n_rep, KvLayout kv, float scale,
                             float* __restrict__ out) {
    attention_prefill_body<NQ, E>(DeviceThread{nullptr}, q, kc, vc, d_pos0, n, n_heads, n_rep, kv, scale, out);
}

// LO (a cache with a quantized half) or ASYNC (an f16 cache copied in two stages): kFaShared<HD, LO, ASYNC> floats of
// dynamic shared memory (over 48 KiB for head_dim 128); else the static kFaShared<HD>. WS: each tile's positions split
// among the warps (flash_warp_split).
template <int HD, int NQ, bool LO, bool ASYNC = false, bool WS = false>
__global__ void __launch_bounds__(kFaThreads)
    flash_prefill_kernel(const float* __restrict__ q, const uint8_t* __restrict__ kc, const uint8_t* __restrict__ vc,
                         const float* __restrict__ k_offsets, const int* __restrict__ d_pos0, int n, int n_heads,
                         int n_rep, KvLayout kv, float scale, float* __restrict__ out, int splits,
                         float* __restrict__ partials, __half* __restrict__ xh, ActBlock* __restrict__ xq) {
    if constexpr (LO || ASYNC) {
        extern __shared__ __align__(16) float flash_lo_shared[];
        flash_prefill_body<HD, NQ, LO, DeviceThread, ASYNC, WS>(DeviceThread{flash_lo_shared}, q, kc, vc, k_offsets,
                                                                d_pos0, n, n_heads, n_rep, kv, scale, out, splits,
                                                                partials, xh, xq);
    } else {
        __shared__ __align__(16) float sm[kFaShared<HD>];
        flash_prefill_body<HD, NQ, false, DeviceThread, false, WS>(DeviceThread{sm}, q, kc, vc, k_offsets, d_pos0, n,
                                                                   n_heads, n_rep, kv, scale, out, splits, partials, xh,
                                                                   xq);
    }
}

// grid n * n_heads: row block_x's splits of a split flash_prefill_kernel combined into out (and split into xh,
// quantized into xq).
__global__ void flash_combine_kernel(const float* __restrict__ partials, int splits, int hd, float* __restrict__ out,
                                     __half* __restrict__ xh, ActBlock* __restrict__ xq) {
    combine_head(DeviceThread{nullptr}, int(blockDim.x), partials, splits, splits, hd, int(blockIdx.x), out, xq, xh,
                 int64_t(gridDim.x) * hd);
}

}  // namespace

// --- launchers ----------------------------------------------------------------------------------------------------

bool device_type_supported(GgmlType t) {
    return dispatch_type(t, [](auto) {});
}

void dequantize_f32(float* out, const DevWeight& w, cudaStream_t s) {
    dequantize_any(w, out, s);
}
void dequantize_f16(__half* out, const DevWeight& w, cudaStream_t s) {
    dequantize_any(w, out, s);
}

void get_rows(float* out, const DevWeight& emb, const int32_t* d_tokens, int n, cudaStream_t s) {
    if (emb.cols % 32 != 0) {
        if (!is_float_type(emb.type))
            throw Error(fmt::format("CUDA: {} rows of {} weights are not whole blocks", ggml_type_name(emb.type),
                                    emb.cols));
        get_rows_ragged_kernel<<<grid_for(int64_t(n) * emb.cols, 128), 128, 0, s>>>(
            emb.type, emb.data, emb.row_bytes, emb.cols, emb.rows, d_tokens, n, out);
        KVGEN_CUDA_LAUNCHED("get_rows_ragged");
        return;
    }
    const int64_t cpr = emb.cols / 32;
    const bool ok = dispatch_type(emb.type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        get_rows_kernel<T>
            <<<grid_for(int64_t(n) * cpr, 128), 128, 0, s>>>(emb.data, emb.row_bytes, cpr, emb.rows, d_tokens, n, out);
    });
    if (!ok) throw Error(fmt::format("CUDA: no device decoder for {}", ggml_type_name(emb.type)));
    KVGEN_CUDA_LAUNCHED("get_rows");
}

namespace {
// F16 and BF16 rows of whole units through matvec_f16_kernel (up: SwiGLU's), launched after launch() below.
bool f16_block_ok(const DevWeight& w) {
    return (w.type == GgmlType::F16 || w.type == GgmlType::BF16) && w.cols % 32 == 0 &&
           w.row_bytes < (int64_t(1) << 31);
}
// stages: MviShape::stages (0: the register path).
void launch_f16(const RowSplit& y, const DevWeight& w, const DevWeight* up, const float* x, bool accumulate, bool pdl,
                cudaStream_t s, int stages);

// grid = rows / (kMvWarps * kMvRows), block = kMvWarps warps: each warp owns kMvRows rows (matvec.cuh).
void launch_matvec(const RowSplit& y, const DevWeight& w, const float* x, bool accumulate, cudaStream_t s,
                   bool f16_block, bool pdl, int stages) {
    if (f16_block && f16_block_ok(w)) {
        launch_f16(y, w, nullptr, x, accumulate, pdl, s, stages);
        return;
    }
    if (w.cols % 32 != 0) {
        if (!is_float_type(w.type))
            throw Error(
                fmt::format("CUDA: {} rows of {} weights are not whole blocks", ggml_type_name(w.type), w.cols));
        matvec_ragged_kernel<<<grid_for(w.rows, kMvWarps), kMvWarps * kWarp, 0, s>>>(
            w.type, w.data, w.row_bytes, w.cols, w.rows, x, y, accumulate ? 1 : 0);
        KVGEN_CUDA_LAUNCHED("matvec_ragged");
        return;
    }
    const int64_t rows_per_block = kMvWarps * kMvRows;
    const bool ok = dispatch_type(w.type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        matvec_kernel<T><<<grid_for(w.rows, int(rows_per_block)), kMvWarps * kWarp, 0, s>>>(
            w.data, w.row_bytes, w.cols / 32, w.rows, x, y, accumulate ? 1 : 0);
    });
    if (!ok) throw Error(fmt::format("CUDA: no device decoder for {}", ggml_type_name(w.type)));
    KVGEN_CUDA_LAUNCHED("matvec");
}
}  // namespace

void matvec(float* y, const DevWeight& w, const float* x, bool accumulate, cudaStream_t s, bool f16_block, bool pdl,
            int stages) {
    launch_matvec(RowSplit::one(y, w.rows), w, x, accumulate, s, f16_block, pdl, stages);
}

void matvec_split(const RowSplit& y, const DevWeight& w, const float* x, cudaStream_t s, bool f16_block, bool pdl,
                  int stages) {
    launch_matvec(y, w, x, false, s, f16_block, pdl, stages);
}

bool int_matvec_ok(const DevWeight& w) {
    return has_int_matvec(w.type) && w.cols % 32 == 0 && w.row_bytes < (int64_t(1) << 31);  // 32-bit offsets
}

bool int_mma_ok(const DevWeight& w, int n) {
    return int_matvec_ok(w) && int_mma_type(w.type) && n >= 1 && n <= kImBatchTokens;
}

namespace {
// Whether a launch can ask for its own carveout (cudaLaunchAttributePreferredSharedMemoryCarveout): builds with CUDA
// 12.6 or later, on a driver that knows it (12.6 or later; an older one would refuse the launch).
#if CUDART_VERSION >= 12060
bool launch_carveout_ok() {
    static const bool ok = [] {
        int v = 0;
        return cudaDriverGetVersion(&v) == cudaSuccess && v >= 12060;
    }();
    return ok;
}
#else
bool launch_carveout_ok() {
    return false;
}
#endif
// A kernel launch, with programmatic dependent launch when pdl (sm_90: the kernel may start before the one before it
// in the stream ends, and waits in pdl_wait; captured into graphs as a programmatic edge), and with `carveout` (0-100)
// as the launch's share of each SM's L1 as shared memory where it is at least 0 and launch_carveout_ok() (the
// kernel's own attribute otherwise; captured into graphs with the launch).
template <typename... Params, typename... Args>
void launch_carved(void (*kernel)(Params...), dim3 grid, unsigned block, size_t shared, bool pdl, int carveout,
                   cudaStream_t s, Args... args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = shared;
    cfg.stream = s;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
#if CUDART_VERSION >= 12060
    if (carveout >= 0 && launch_carveout_ok()) {
        attr[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
        attr[n++].val.sharedMemCarveout = unsigned(carveout);
    }
#else
    (void)carveout;
#endif
    cfg.attrs = attr;
    cfg.numAttrs = n;
    KVGEN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, Params(args)...));
}
template <typename... Params, typename... Args>
void launch_shared(void (*kernel)(Params...), dim3 grid, unsigned block, size_t shared, bool pdl, cudaStream_t s,
                   Args... args) {
    launch_carved(kernel, grid, block, shared, pdl, -1, s, args...);
}
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, unsigned block, bool pdl, cudaStream_t s, Args... args) {
    launch_shared(kernel, grid, block, 0, pdl, s, args...);
}

// Settings::cuda_ring_fit, for the whole process (set_ring_carveout).
std::atomic<bool> g_ring_fit{true};
}  // namespace

void set_ring_carveout(bool fit) {
    g_ring_fit = fit;
}

namespace {
// A ring launch's grid and share of each SM's L1 as shared memory (its carveout, percent; -1: the kernel's own).
struct RingGrid {
    int64_t blocks = 0;
    int carveout = -1;
};
// The blocks of a ring launch (matvec_ring) of `kernel` with blocks of `threads` threads and `bytes` of dynamic
// shared memory: as many as the device's SMs hold at once (its registers, shared memory and threads, asked of the
// runtime once per kernel, size and device), at most `groups`; 0 where not one block fits (the caller then takes the
// register path). The first time for a kernel and device, its blocks may take all the shared memory a block may have
// (less its static part), and the kernel's own carveout is all of each SM's L1 that may be shared memory (228 KiB of
// an H200's 256, leaving 28 KiB of L1): --cuda-ring-carveout max. With fit (the default; where launch_carveout_ok)
// each launch asks for the least that holds as many blocks (ring_carveout_percent, checked against the runtime's
// occupancy, which ring_grid asks by setting the kernel's own attribute there and back: one thread launches rings;
// on an H200 82% for five Q4_K blocks of 36 KiB, which the driver makes 196 KiB, leaving 60 KiB; eight Q4_0 blocks of
// 27 KiB take all 228; 13B's Q4_0 down projection, two blocks of 95 KiB, 196). The rest is L1, where a block's groups
// read the tokens' activations again and again (the integer products' 80 bytes a block of 32 values): 10 KiB for 4,096
// columns, 26.9 for 11,008 (LLaMA-2-7B's down projection), 33.8 for 13,824 (13B's), which 28 KiB holds barely or not at
// all, and 8 times that for 8 tokens.
RingGrid ring_grid(const void* kernel, unsigned threads, size_t bytes, int64_t groups) {
    struct Known {
        const void* kernel;
        int device;
        unsigned threads;
        size_t bytes;
        int64_t blocks;
        int fit;  // the least carveout that holds them
    };
    static std::mutex mutex;
    static std::vector<Known> known;
    static std::vector<std::pair<const void*, int>> set_up;  // the kernels and devices whose attributes are set
    int device = 0;
    KVGEN_CUDA_CHECK(cudaGetDevice(&device));
    const std::lock_guard<std::mutex> lock(mutex);
    const auto answer = [&](const Known& k) {
        RingGrid g;
        g.blocks = std::min(k.blocks, groups);
        g.carveout = g_ring_fit && k.fit < int(cudaSharedmemCarveoutMaxShared) ? k.fit : -1;
        return g;
    };
    for (const Known& k : known)
        if (k.kernel == kernel && k.device == device && k.threads == threads && k.bytes == bytes) return answer(k);
    const GemmMmaDevice d = gemm_mma_device(device);
    cudaFuncAttributes a{};
    KVGEN_CUDA_CHECK(cudaFuncGetAttributes(&a, kernel));
    const int64_t dynamic_max = d.shared_per_block - int64_t(a.sharedSizeBytes);  // what its static part leaves
    Known k{kernel, device, threads, bytes, 0, int(cudaSharedmemCarveoutMaxShared)};
    if (int64_t(bytes) <= dynamic_max) {
        if (std::find(set_up.begin(), set_up.end(), std::make_pair(kernel, device)) == set_up.end()) {
            KVGEN_CUDA_CHECK(
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dynamic_max)));
            set_up.emplace_back(kernel, device);
        }
        const auto blocks_at = [&](int carveout) {
            KVGEN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, carveout));
            int per_sm = 0;
            KVGEN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, int(threads), bytes));
            return int64_t(per_sm);
        };
        const int64_t per_sm = blocks_at(int(cudaSharedmemCarveoutMaxShared));
        if (per_sm > 0) {
            // (the runtime's count at the least share, where it counts one; the kernel's own share back to all)
            const int fit = ring_carveout_percent(per_sm, int64_t(a.sharedSizeBytes) + int64_t(bytes), d.shared_per_sm);
            if (fit < int(cudaSharedmemCarveoutMaxShared) && blocks_at(fit) == per_sm) k.fit = fit;
            blocks_at(int(cudaSharedmemCarveoutMaxShared));
        }
        k.blocks = per_sm * d.sm_count;
    }
    known.push_back(k);
    return answer(k);
}
// A ring launch (matvec_ring) of `kernel` over `rows` rows in groups of R, each group's items `slots` rows of the step
// policy Ring, in blocks of `threads` threads and `stages` stages: as many blocks as ring_grid says, with its
// carveout; false (nothing launched) where not one fits, and the caller takes the register path.
template <typename Ring, typename... Params, typename... Args>
bool launch_ring(void (*kernel)(Params...), unsigned threads, int slots, int stages, int64_t rows, int R, bool pdl,
                 cudaStream_t s, Args... args) {
    const size_t bytes = size_t(ring_layout<Ring>(int(threads), slots, stages).bytes());
    const RingGrid g = ring_grid(reinterpret_cast<const void*>(kernel), threads, bytes, (rows + R - 1) / R);
    if (g.blocks == 0) return false;
    launch_carved(kernel, dim3(unsigned(g.blocks)), threads, bytes, pdl, g.carveout, s, args...);
    return true;
}

void launch_f16(const RowSplit& y, const DevWeight& w, const DevWeight* up, const float* x, bool accumulate, bool pdl,
                cudaStream_t s, int stages) {
    KVGEN_ASSERT(stages == 0 || ring_stages_ok(stages));  // (ring_wait knows 2-4)
    const int n_units = int(w.cols / 32);
    const unsigned threads = unsigned(32 * mvi_warps(n_units));
    const uint8_t* u = up ? up->data : nullptr;
    const int acc = up || !accumulate ? 0 : 1;
    const auto go = [&](auto type, auto nm) {
        constexpr GgmlType T = decltype(type)::value;
        constexpr int NM = decltype(nm)::value, R = kMvF16Rows / NM;
        if (stages > 0 && launch_ring<F16Ring<T>>(matvec_f16_kernel<T, NM, R, true>, threads, NM * R, stages, w.rows, R,
                                                  pdl, s, w.data, u, w.row_bytes, n_units, w.rows, x, y, acc, stages))
            return;
        launch(matvec_f16_kernel<T, NM, R, false>, grid_for(w.rows, R), threads, pdl, s, w.data, u, w.row_bytes,
               n_units, w.rows, x, y, acc, 0);
    };
    const auto of = [&](auto type) {
        if (up)
            go(type, std::integral_constant<int, 2>{});
        else
            go(type, std::integral_constant<int, 1>{});
    };
    KVGEN_ASSERT(f16_block_ok(w) && (!up || up->type == w.type));
    with_half_type(w.type, of);
    KVGEN_CUDA_LAUNCHED("matvec_f16");
}
// An n-token product (2 to kImBatchTokens) on the tensor cores where shape.mma and the type allow it (int_mma_ok):
// true when launched, false where the caller takes the CUDA-core kernels. yq, counters: with up, the output also
// quantized (matvec_glu_int's).
bool launch_int_mma(const RowSplit& y, const DevWeight& w, const DevWeight* up, const ActBlock* x, int n,
                    bool accumulate, bool pdl, cudaStream_t s, MviShape shape, ActBlock* yq = nullptr,
                    int* counters = nullptr) {
    if (!shape.mma || n < 2 || !int_mma_ok(w, n)) return false;
    KVGEN_ASSERT(!yq || (up && counters && w.rows % 32 == 0));
    const int n_units = int(w.cols / 32);
    const uint8_t* u = up ? up->data : nullptr;
    dispatch_int_type(w.type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        if constexpr (int_mma_type(T)) {
            const auto go = [&](auto glu) {
                constexpr bool GLU = decltype(glu)::value;
                int_mma_launch_of<T>(n, [&](auto ntt, ImPlan p) {
                    const int64_t block_rows = int64_t(p.sets) * int_mma_block_rows(GLU);
                    const int64_t row_blocks = (w.rows + block_rows - 1) / block_rows;
                    KVGEN_ASSERT(row_blocks <= 65535 && p.groups <= kImMaxGroups);  // the grid's y, yq's counters
                    launch(matvec_int_mma_kernel<T, GLU, decltype(ntt)::value>,
                           dim3(unsigned(p.groups), unsigned(row_blocks)), 32 * kImWarps, pdl, s, w.data, u,
                           w.row_bytes, n_units, w.rows, x, n, p.group_tokens, p.sets, y, accumulate ? 1 : 0, yq,
                           counters);
                });
            };
            if (up)
                go(std::true_type{});
            else
                go(std::false_type{});
        }
    });
    KVGEN_CUDA_LAUNCHED("matvec_int_mma");
    return true;
}
}  // namespace

void quantize_act(ActBlock* out, const float* x, int64_t count, cudaStream_t s, bool pdl) {
    KVGEN_ASSERT(count % 32 == 0);
    launch(quantize_act_kernel, grid_for(count, 128), 128, pdl, s, x, count / 32, out);
    KVGEN_CUDA_LAUNCHED("quantize_act");
}

void matvec_int(const RowSplit& y, const DevWeight& w, const ActBlock* x, int n, bool accumulate, bool pdl,
                cudaStream_t s, const QkvStore* store, MviShape shape, const NormStore* norm) {
    KVGEN_ASSERT(n >= 1 && (n <= kMvMaxTokens || (shape.mma && !store && int_mma_ok(w, n))) &&
                 (shape.stages == 0 || ring_stages_ok(shape.stages)));
    KVGEN_ASSERT(!store || (store->kc && store->vc && !accumulate && w.rows % 2 == 0 && store->kv.head_dim % 2 == 0));
    KVGEN_ASSERT(!norm || (norm->xq && norm->w && norm->sums && norm->counters && !store && n == 1 && accumulate &&
                           w.rows % 32 == 0 && y.end[0] == w.rows));
    if (!store && launch_int_mma(y, w, nullptr, x, n, accumulate, pdl, s, shape)) return;
    const bool ok = int_matvec_ok(w) && dispatch_int_type(w.type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        const int n_units = int(w.cols / 32);
        int_launches(n, [&](auto nt, int i0, int m) {
            constexpr int NT = decltype(nt)::value;
            const QkvStore st = store ? *store : QkvStore{};
            const NormStore ns = norm ? *norm : NormStore{};
            const ActBlock* xi = x + int64_t(i0) * n_units;
            bool ringed = false;
            if (shape.stages > 0)
                with_ring_shape<T, 1, NT>(shape, [&](auto r, auto step) {
                    constexpr int R = decltype(r)::value, S = decltype(step)::value;
                    const unsigned threads = unsigned(32 * mvi_warps(mvi_steps(n_units, S)));
                    ringed = launch_ring<IntRing<T, S>>(matvec_int_kernel<T, NT, R, S, true>, threads, R, shape.stages,
                                                        w.rows, R, pdl, s, w.data, w.row_bytes, n_units, w.rows, xi, m,
                                                        y, i0, accumulate ? 1 : 0, st, ns, shape.stages);
                });
            if (!ringed)
                with_mvi_shape<T, 1, NT>(shape, [&](auto r, auto step) {
                    constexpr int R = decltype(r)::value, S = decltype(step)::value;
                    const unsigned threads = unsigned(32 * mvi_warps(mvi_steps(n_units, S)));
                    launch(matvec_int_kernel<T, NT, R, S, false>, grid_for(w.rows, R), threads, pdl, s, w.data,
                           w.row_bytes, n_units, w.rows, xi, m, y, i0, accumulate ? 1 : 0, st, ns, 0);
                });
        });
    });
    if (!ok) throw Error(fmt::format("CUDA: no integer product for {}", ggml_type_name(w.type)));
    KVGEN_CUDA_LAUNCHED("matvec_int");
}

void matvec_glu_int(float* y, ActBlock* yq, int* counters, const DevWeight& gate, const DevWeight& up,
                    const ActBlock* x, int n, bool pdl, cudaStream_t s, MviShape shape) {
    KVGEN_ASSERT(n >= 1 && (n <= kMvMaxTokens || (shape.mma && int_mma_ok(gate, n))) &&
                 (shape.stages == 0 || ring_stages_ok(shape.stages)));
    KVGEN_ASSERT(!yq || (gate.rows % 32 == 0 && counters));
    if (glu_fusable(gate, up) &&
        launch_int_mma(RowSplit::one(y, gate.rows), gate, &up, x, n, false, pdl, s, shape, yq, counters))
        return;
    const bool ok = glu_fusable(gate, up) && int_matvec_ok(gate) && dispatch_int_type(gate.type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        const int n_units = int(gate.cols / 32);
        int_launches(n, [&](auto nt, int i0, int m) {
            constexpr int NT = decltype(nt)::value;
            const ActBlock* xi = x + int64_t(i0) * n_units;
            float* yi = y + int64_t(i0) * gate.rows;
            ActBlock* yqi = yq ? yq + int64_t(i0) * (gate.rows / 32) : nullptr;
            bool ringed = false;
            if (shape.stages > 0)
                with_ring_shape<T, 2, NT>(shape, [&](auto r, auto step) {
                    constexpr int R = decltype(r)::value, S = decltype(step)::value;
                    const unsigned threads = unsigned(32 * mvi_warps(mvi_steps(n_units, S)));
                    ringed = launch_ring<IntRing<T, S>>(
                        matvec_glu_int_kernel<T, NT, R, S, true>, threads, 2 * R, shape.stages, gate.rows, R, pdl, s,
                        gate.data, up.data, gate.row_bytes, n_units, gate.rows, xi, m, yi, yqi, counters, shape.stages);
                });
            if (!ringed)
                with_mvi_shape<T, 2, NT>(shape, [&](auto r, auto step) {
                    constexpr int R = decltype(r)::value, S = decltype(step)::value;
                    const unsigned threads = unsigned(32 * mvi_warps(mvi_steps(n_units, S)));
                    launch(matvec_glu_int_kernel<T, NT, R, S, false>, grid_for(gate.rows, R), threads, pdl, s,
                           gate.data, up.data, gate.row_bytes, n_units, gate.rows, xi, m, yi, yqi, counters, 0);
                });
        });
    });
    if (!ok) throw Error(fmt::format("CUDA: no fused integer SwiGLU for {}", ggml_type_name(gate.type)));
    KVGEN_CUDA_LAUNCHED("matvec_glu_int");
}

void matvec_batch(float* y, const DevWeight& w, const float* x, int n, bool accumulate, cudaStream_t s) {
    KVGEN_ASSERT(n >= 1 && n <= kMvMaxTokens);
    if (w.cols % 32 != 0) {  // float rows that are not whole chunks (tiny models): token by token
        for (int i = 0; i < n; ++i) matvec(y + int64_t(i) * w.rows, w, x + int64_t(i) * w.cols, accumulate, s);
        return;
    }
    const int64_t rows_per_block = kMvWarps * kMvRows;
    const bool ok = dispatch_type(w.type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        auto launch = [&](auto nt) {
            constexpr int NT = decltype(nt)::value;
            matvec_batch_kernel<T, NT><<<grid_for(w.rows, int(rows_per_block)), kMvWarps * kWarp, 0, s>>>(
                w.data, w.row_bytes, w.cols / 32, w.cols, w.rows, x, n, y, accumulate ? 1 : 0);
        };
        if (n <= 4)
            launch(std::integral_constant<int, 4>{});
        else if (n <= 8)
            launch(std::integral_constant<int, 8>{});
        else
            launch(std::integral_constant<int, kMvMaxTokens>{});
    });
    if (!ok) throw Error(fmt::format("CUDA: no device decoder for {}", ggml_type_name(w.type)));
    KVGEN_CUDA_LAUNCHED("matvec_batch");
}

bool glu_fusable(const DevWeight& gate, const DevWeight& up) {
    return gate.type == up.type && gate.rows == up.rows && gate.cols == up.cols && gate.row_bytes == up.row_bytes &&
           gate.cols % 32 == 0;
}

void matvec_glu(float* y, const DevWeight& gate, const DevWeight& up, const float* x, cudaStream_t s, bool f16_block,
                bool pdl, int stages) {
    if (!glu_fusable(gate, up)) throw Error("CUDA: matvec_glu needs gate and up of one type and shape");
    if (f16_block && f16_block_ok(gate)) {
        launch_f16(RowSplit::one(y, gate.rows), gate, &up, x, false, pdl, s, stages);
        return;
    }
    const bool ok = dispatch_type(gate.type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        matvec_glu_kernel<T><<<grid_for(gate.rows, kMvWarps * kMvRows), kMvWarps * kWarp, 0, s>>>(
            gate.data, up.data, gate.row_bytes, gate.cols / 32, gate.rows, x, y);
    });
    if (!ok) throw Error(fmt::format("CUDA: no device decoder for {}", ggml_type_name(gate.type)));
    KVGEN_CUDA_LAUNCHED("matvec_glu");
}

void rmsnorm(float* out, ActBlock* xq, const float* x, const float* w, int n, int dim, float eps, bool pdl,
             cudaStream_t s, __half* xh) {
    KVGEN_ASSERT(xq == nullptr || dim % 32 == 0);
    launch(rmsnorm_kernel, unsigned(n), unsigned(kNormThreads), pdl, s, x, w, out, xq, dim, eps, xh);
    KVGEN_CUDA_LAUNCHED("rmsnorm");
}

void rope_tables(float* cos_t, float* sin_t, const int* d_pos0, int n, int half, const double* inv_freq,
                 const double* factors, double pos_div, cudaStream_t s) {
    rope_tables_kernel<<<grid_for(int64_t(n) * half, 128), 128, 0, s>>>(d_pos0, n, half, inv_freq, factors, pos_div,
                                                                         cos_t, sin_t);
    KVGEN_CUDA_LAUNCHED("rope_tables");
}

void rope(float* x, const float* cos_t, const float* sin_t, int n, int n_heads, int head_dim, int rope_dim,
          cudaStream_t s) {
    const int half = rope_dim / 2;
    rope_kernel<<<grid_for(int64_t(n) * n_heads * half, 256), 256, 0, s>>>(x, cos_t, sin_t, n, n_heads, head_dim, half);
    KVGEN_CUDA_LAUNCHED("rope");
}

bool kv_cache_supported(const KvLayout& kv) {
    auto ok = [&](KvType t) {
        return t == KvType::F16 || (kv_type_quantized(t) && kv_quantized_head_dim(kv.head_dim));
    };
    return ok(kv.k_type) && ok(kv.v_type);
}

namespace {
// store_kv, with q's RoPE in the same launch when qr.q is set (qr.blocks are filled in here).
void store_kv_launch(QRope qr, uint8_t* k_cache, uint8_t* v_cache, const float* k, const float* v,
                     const float* cos_t, const float* sin_t, const float* k_offsets, const int* d_pos0, int i0, int i1,
                     const KvLayout& kv, int rope_dim, cudaStream_t s) {
    KVGEN_ASSERT(kv_cache_supported(kv) && 0 <= i0 && i0 <= i1);
    KVGEN_ASSERT((k_offsets != nullptr) == kv.k_offsets());
    const int n = i1 - i0;
    if (n == 0 && !qr.q) return;  // with q: the step's rows were all stored in a first part, q still turns here
    const int threads = 256;
    // note: q is rotated for all i1 tokens, in the launch that stores the last part; over a quantized K a warp a row
    // also turns it into the basis K is stored in (rope_turn_q_row_warp), which attention reads it in
    if (qr.q) {
        qr.turn = kv_type_quantized(kv.k_type);
        qr.blocks = qr.turn ? grid_for(int64_t(i1) * qr.n_heads, kKvRowWarps)
                            : grid_for(int64_t(i1) * qr.n_heads * (rope_dim / 2), threads);
    }
    if (kv.quantized()) {  // a warp per row: RoPE, the rotation of kv_rotation.h, the key offset, the blocks
        static_assert(kKvRowWarps * kWarp == threads, "one block size for q's RoPE and the rows");
        const unsigned blocks = qr.blocks + grid_for(int64_t(n) * kv.n_kv_heads * 2, kKvRowWarps);
        const bool ok = dispatch_kv_rows(kv.head_dim, [&](auto e) {
            store_kv_rows_kernel<decltype(e)::value><<<blocks, threads, 0, s>>>(
                qr, k, v, cos_t, sin_t, k_offsets, d_pos0, i0, n, kv, rope_dim / 2, k_cache, v_cache);
        });
        KVGEN_ASSERT(ok);  // kv_cache_supported
        KVGEN_CUDA_LAUNCHED("store_kv_rows");
        return;
    }
    KVGEN_ASSERT(i0 == 0);  // only a step over K with offsets is stored in parts
    const int64_t items = int64_t(n) * kv.n_kv_heads * (kv.head_dim / 2);
    store_kv_kernel<<<qr.blocks + grid_for(items, threads), threads, 0, s>>>(
        qr, k, v, cos_t, sin_t, n, d_pos0, kv, rope_dim / 2, reinterpret_cast<__half*>(k_cache),
        reinterpret_cast<__half*>(v_cache));
    KVGEN_CUDA_LAUNCHED("store_kv");
}
}  // namespace

void store_kv(uint8_t* k_cache, uint8_t* v_cache, const float* k, const float* v, const float* cos_t,
              const float* sin_t, const float* k_offsets, const int* d_pos0, int i0, int i1, const KvLayout& kv,
              int rope_dim, cudaStream_t s) {
    store_kv_launch(QRope{}, k_cache, v_cache, k, v, cos_t, sin_t, k_offsets, d_pos0, i0, i1, kv, rope_dim, s);
}

void rope_store_kv(float* q, uint8_t* k_cache, uint8_t* v_cache, const float* k, const float* v, const float* cos_t,
                   const float* sin_t, const float* k_offsets, const int* d_pos0, int i0, int i1, int n_heads,
                   const KvLayout& kv, int rope_dim, cudaStream_t s) {
    KVGEN_ASSERT(cos_t != nullptr);
    store_kv_launch(QRope{q, n_heads, kv.head_dim, 0}, k_cache, v_cache, k, v, cos_t, sin_t, k_offsets, d_pos0, i0,
                    i1, kv, rope_dim, s);
}

void kv_offsets(float* k_offsets, const uint8_t* k_cache, int n_layers, const KvLayout& kv, cudaStream_t s) {
    KVGEN_ASSERT(kv.k_offsets());
    const int64_t heads = int64_t(n_layers) * kv.n_kv_heads;
    const bool ok = dispatch_kv_rows(kv.head_dim, [&](auto e) {
        kv_offsets_kernel<decltype(e)::value>
            <<<grid_for(heads, kKvRowWarps), kKvRowWarps * kWarp, 0, s>>>(k_cache, heads, kv, k_offsets);
    });
    KVGEN_ASSERT(ok);  // only a quantized cache's head_dims come here
    KVGEN_CUDA_LAUNCHED("kv_offsets");
}

void kv_rotate_rows(float* x, int64_t rows, int head_dim, cudaStream_t s, bool pdl, ActBlock* xq) {
    if (rows == 0) return;
    const bool ok = dispatch_kv_rows(head_dim, [&](auto e) {
        launch(kv_rotate_rows_kernel<decltype(e)::value>, grid_for(rows, kKvRowWarps), kKvRowWarps * kWarp, pdl, s, x,
               rows, xq);
    });
    KVGEN_ASSERT(ok);  // only a quantized cache's head_dims come here
    KVGEN_CUDA_LAUNCHED("kv_rotate_rows");
}

void swiglu(float* gate, const float* up, int64_t count, cudaStream_t s) {
    swiglu_kernel<<<grid_for(count, 256), 256, 0, s>>>(gate, up, count);
    KVGEN_CUDA_LAUNCHED("swiglu");
}

void to_f16(__half* y, const float* x, int64_t count, cudaStream_t s) {
    to_f16_kernel<<<grid_for(count, 256), 256, 0, s>>>(x, y, count);
    KVGEN_CUDA_LAUNCHED("to_f16");
}

void check_cublas(cublasStatus_t st, const char* what) {
    if (st != CUBLAS_STATUS_SUCCESS) throw Error(fmt::format("cuBLAS: {} failed: {}", what, cublasGetStatusString(st)));
}

namespace {
// out[n][ldo] columns [0, rows) = x[n][cols] . W^T for W = w[rows][cols] (f16, row-major; += when accumulate): f16
// operands, f32 accumulation on the tensor cores (cuBLAS, on the handle's stream).
void gemm_f16_rows(cublasHandle_t h, float* out, int64_t ldo, const __half* w, const __half* x, int64_t rows, int n,
                   int64_t cols, bool accumulate) {
    // Column-major, cuBLAS sees W as a cols x rows matrix to transpose and x as cols x n; out is rows x n, ldo apart.
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    check_cublas(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), n, int(cols), &alpha, w, CUDA_R_16F, int(cols), x,
                              CUDA_R_16F, int(cols), &beta, out, CUDA_R_32F, int(ldo), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
}
}  // namespace

void dequantize_rows_f16(__half* out, const DevWeight& w, int64_t r0, int64_t n_rows, cudaStream_t s) {
    KVGEN_ASSERT(w.cols % 32 == 0 && r0 >= 0 && r0 + n_rows <= w.rows);
    const int64_t cpr = w.cols / 32, n_chunks = n_rows * cpr;
    if (n_chunks == 0) return;
    const bool ok = dispatch_type(w.type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        dequantize_rows_kernel<T>
            <<<grid_for(n_chunks, kDqThreads), kDqThreads, 0, s>>>(w.data, w.row_bytes, cpr, r0, n_chunks, out);
    });
    if (!ok) throw Error(fmt::format("CUDA: no device decoder for {}", ggml_type_name(w.type)));
    KVGEN_CUDA_LAUNCHED("dequantize_rows");
}

namespace {
std::array<cudaEvent_t*, 5> overlap_events(GemmOverlap& o) {
    return {&o.start, &o.decoded[0], &o.decoded[1], &o.multiplied[0], &o.multiplied[1]};
}
}  // namespace

void make_gemm_overlap(GemmOverlap& o) {
    KVGEN_CUDA_CHECK(cudaStreamCreateWithFlags(&o.side, cudaStreamNonBlocking));
    for (cudaEvent_t* e : overlap_events(o)) KVGEN_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
}

void release_gemm_overlap(GemmOverlap& o) {
    for (cudaEvent_t* e : overlap_events(o)) {
        if (*e) cudaEventDestroy(*e);
        *e = nullptr;
    }
    if (o.side) cudaStreamDestroy(o.side);
    o.side = nullptr;
    o.ahead = DevWeight{};
}

void set_gemm_overlap_buffers(GemmOverlap& o, __half* scratch, int64_t elems) {
    // note: halves of a multiple of 16 bytes, so the second buffer starts aligned for the decoder's 16-byte stores
    o.buf_elems = elems / 2 / 8 * 8;
    o.buf[0] = scratch;
    o.buf[1] = scratch + o.buf_elems;
    o.ahead = DevWeight{};
}

void gemm_overlap_join(GemmOverlap* o, cudaStream_t s) {
    if (!o || !o->ahead.data) return;
    KVGEN_CUDA_CHECK(cudaStreamWaitEvent(s, o->decoded[o->ahead_buf], 0));
    o->ahead = DevWeight{};
}

bool f16_split_ok(const DevWeight& w) {
    return w.type == GgmlType::F16;
}

void to_f16_split(__half* xh, const float* x, int n, int64_t cols, cudaStream_t s) {
    const int64_t count = int64_t(n) * cols;
    to_f16_split_kernel<<<grid_for(count, 256), 256, 0, s>>>(x, xh, count);
    KVGEN_CUDA_LAUNCHED("to_f16_split");
}

void f16_split_product(cublasHandle_t h, const RowSplit& out, const DevWeight& w, const __half* xh, int n,
                       bool accumulate, float* t, cudaStream_t s, SplitSumTail tail) {
    KVGEN_ASSERT(f16_split_ok(w) && n >= 1 && t);
    // the high parts' products are t's first n rows, the low parts' the next n
    gemm_f16_rows(h, t, w.rows, reinterpret_cast<const __half*>(w.data), xh, w.rows, 2 * n, w.cols, false);
    f16_split_sum(out, t, n, w.rows, accumulate, s, tail);
}

void f16_split_sum(const RowSplit& out, const float* t, int n, int64_t rows, bool accumulate, cudaStream_t s,
                   SplitSumTail tail) {
    KVGEN_ASSERT(!tail.glu || (out.end[0] == rows && !accumulate));  // SwiGLU: one buffer, the gate's sums
    const int64_t count = int64_t(n) * rows;
    if (tail.qkv.kc) {  // RoPE and the K/V store: a thread a pair
        const QkvStore& st = tail.qkv;
        KVGEN_ASSERT(!tail.glu && !tail.xh && !accumulate && st.vc && rows % 2 == 0 && st.q_end % 2 == 0 &&
                     st.k_end % 2 == 0 && st.kv.head_dim % 2 == 0);
        f16_split_sum_qkv_kernel<<<grid_for(count / 2, 256), 256, 0, s>>>(t, n, rows, out, st);
        KVGEN_CUDA_LAUNCHED("f16_split_sum_qkv");
        return;
    }
    f16_split_sum_kernel<<<grid_for(count, 256), 256, 0, s>>>(t, n, rows, out, accumulate, tail);
    KVGEN_CUDA_LAUNCHED("f16_split_sum");
}

bool gemm_decodes_chunks(const DevWeight& w) {
    return w.type != GgmlType::F16 && w.cols % 32 == 0 && device_type_supported(w.type);
}

namespace {
int64_t gemm_step(const DevWeight& w, int n, int64_t chunk_elems, int sm_count) {
    return gemm_chunk_rows(w.rows, w.cols, gemm_chunk_elems_for(chunk_elems, w.rows, w.cols, n, sm_count));
}

bool same_weight(const DevWeight& a, const DevWeight& b) {
    return a.data == b.data && a.type == b.type && a.rows == b.rows && a.cols == b.cols && a.row_bytes == b.row_bytes;
}

// Rows [r0, r0 + nr) of w decoded on o's side stream into buffer b, once the main stream's work recorded in `after`
// (null: nothing more than the side stream has waited for) is done; recorded as decoded[b].
void decode_on_side(GemmOverlap& o, const DevWeight& w, int64_t r0, int64_t nr, int b, cudaEvent_t after) {
    KVGEN_ASSERT(nr * w.cols <= o.buf_elems);
    if (after) KVGEN_CUDA_CHECK(cudaStreamWaitEvent(o.side, after, 0));
    dequantize_rows_f16(o.buf[b], w, r0, nr, o.side);
    KVGEN_CUDA_CHECK(cudaEventRecord(o.decoded[b], o.side));
}
}  // namespace

void gemm_weight(cublasHandle_t h, float* out, const DevWeight& w, const __half* x, int n, bool accumulate,
                 __half* scratch, cudaStream_t s, int64_t chunk_elems, int sm_count, GemmOverlap* overlap,
                 const DevWeight* next) {
    const bool ahead = overlap && next && gemm_decodes_chunks(*next);
    if (w.type == GgmlType::F16) {  // used in place
        if (ahead) {                // next's first chunk decoded while this one is multiplied
            gemm_overlap_join(overlap, s);
            KVGEN_CUDA_CHECK(cudaEventRecord(overlap->start, s));
            const int64_t nr = std::min(gemm_step(*next, n, chunk_elems, sm_count), next->rows);
            decode_on_side(*overlap, *next, 0, nr, 0, overlap->start);
            overlap->ahead = *next;
            overlap->ahead_rows = nr;
            overlap->ahead_buf = 0;
        }
        gemm_f16_rows(h, out, w.rows, reinterpret_cast<const __half*>(w.data), x, w.rows, n, w.cols, accumulate);
        return;
    }
    if (w.cols % 32 != 0) {  // float rows that are not whole chunks (a tiny model): decoded whole, they are small
        gemm_overlap_join(overlap, s);
        dequantize_f16(scratch, w, s);
        gemm_f16_rows(h, out, w.rows, scratch, x, w.rows, n, w.cols, accumulate);
        return;
    }
    const int64_t step = gemm_step(w, n, chunk_elems, sm_count);
    if (!overlap) {
        // note: one stream orders each chunk's decode after the previous chunk's GEMM, which read the same scratch.
        for (int64_t r0 = 0; r0 < w.rows; r0 += step) {
            const int64_t nr = std::min(step, w.rows - r0);
            dequantize_rows_f16(scratch, w, r0, nr, s);
            gemm_f16_rows(h, out + r0, w.rows, scratch, x, nr, n, w.cols, accumulate);
        }
        return;
    }
    // Chunk k is in buffer (b0 + k) % 2. The first may be there already, decoded ahead by the call before. The side
    // stream's decoding of chunk 1 on waits for everything before on s (the last product's GEMMs read the buffers);
    // chunk k + 2's for chunk k's GEMM; s waits for each chunk's decoding before its GEMM, so it has joined the side
    // stream when the loop ends, but for next's first chunk (joined by the call that takes it, or gemm_overlap_join).
    const bool have_first = overlap->ahead.data && same_weight(overlap->ahead, w) && overlap->ahead_rows == step;
    const int b0 = have_first ? overlap->ahead_buf : 0;
    overlap->ahead = DevWeight{};
    overlap->taken += have_first ? 1 : 0;
    KVGEN_CUDA_CHECK(cudaEventRecord(overlap->start, s));
    KVGEN_CUDA_CHECK(cudaStreamWaitEvent(overlap->side, overlap->start, 0));
    const int64_t chunks = (w.rows + step - 1) / step;
    for (int64_t k = 0; k < chunks; ++k) {
        const int b = int((b0 + k) % 2);
        const int64_t r0 = k * step, nr = std::min(step, w.rows - r0);
        if (k > 0 || !have_first) decode_on_side(*overlap, w, r0, nr, b, k >= 2 ? overlap->multiplied[b] : nullptr);
        KVGEN_CUDA_CHECK(cudaStreamWaitEvent(s, overlap->decoded[b], 0));
        gemm_f16_rows(h, out + r0, w.rows, overlap->buf[b], x, nr, n, w.cols, accumulate);
        KVGEN_CUDA_CHECK(cudaEventRecord(overlap->multiplied[b], s));
    }
    if (!ahead) return;
    // Next's first chunk into the buffer the last GEMM does not read, once the GEMM before it that read that buffer
    // is done (with one chunk, the last product's: the side stream waited for it at entry).
    const int b = int((b0 + chunks) % 2);
    const int64_t nr = std::min(gemm_step(*next, n, chunk_elems, sm_count), next->rows);
    decode_on_side(*overlap, *next, 0, nr, b, chunks >= 2 ? overlap->multiplied[b] : nullptr);
    overlap->ahead = *next;
    overlap->ahead_rows = nr;
    overlap->ahead_buf = b;
}

bool gemm_mma_ok(const DevWeight& w) {
    return gemm_decodes_chunks(w);  // the weights decoded in chunks for cuBLAS are those decoded in tiles here
}

namespace {
// Sets up `kernel`'s shared memory on the current device, d (null: its facts asked for here, the first time only), for
// blocks of `bytes`: the dynamic shared memory a block may ask for (past the 48 KiB a kernel gets without asking) and,
// as a hint, the share of each SM's unified L1 and shared memory that holds blocks_per_sm of them (the driver would
// otherwise pick one itself, possibly for fewer blocks). Once per device, kernel and size: the attributes stay set.
void set_up_shared(const void* kernel, size_t bytes, const GemmMmaDevice* d, int blocks_per_sm) {
    struct Done {
        const void* kernel;
        int device;
        size_t bytes;
    };
    static std::mutex mutex;
    static std::vector<Done> done;
    int device = 0;
    KVGEN_CUDA_CHECK(cudaGetDevice(&device));
    const std::lock_guard<std::mutex> lock(mutex);
    for (const Done& e : done)
        if (e.kernel == kernel && e.device == device && e.bytes == bytes) return;
    if (bytes > size_t(48) << 10)
        KVGEN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    const int64_t per_sm = d ? d->shared_per_sm : gemm_mma_device(device).shared_per_sm;
    if (per_sm > 0) {
        const int64_t need = blocks_per_sm * (int64_t(bytes) + kSharedReservePerBlock);
        const int64_t percent = std::min<int64_t>(100, (100 * need + per_sm - 1) / per_sm);
        KVGEN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, int(percent)));
    }
    done.push_back({kernel, device, bytes});
}

// up: null, or the up weight of a SwiGLU pair whose gate is w (the GLU kernels). splits > 1 (not with up): the
// columns split among blocks, their partial sums in `partials` (splits x n x w.rows floats), then summed into out.
void gemm_mma_launch(const RowSplit& out, const DevWeight& w, const DevWeight* up, const __half* x, int n,
                     bool accumulate, const GemmMmaDevice& dev, int splits, float* partials, cudaStream_t s) {
    KVGEN_ASSERT(gemm_mma_ok(w) && n > 0 && !(up && accumulate) && splits >= 1 && !(up && splits > 1) &&
                 (splits == 1 || partials));
    const int64_t tile_rows = up ? 2 * w.rows : w.rows;  // a GLU block owns half as many rows of each weight
    const int tok = gemm_mma_tokens(n, tile_rows, dev);
    const int stages = gemm_mma_stages(tok, dev);
    const size_t bytes = size_t(stages) * size_t(gemm_mma_stage_bytes(tok));
    const dim3 grid(unsigned(gemm_mma_token_tiles(n, tok)), unsigned(gemm_mma_row_tiles(tile_rows) * splits));
    KVGEN_ASSERT(grid.y <= 65535u);
    const RowSplit dst = splits > 1 ? RowSplit::one(partials, w.rows) : out;
    const uint8_t* const u = up ? up->data : nullptr;
    dispatch_type(w.type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        if constexpr (T != GgmlType::F16) {  // F16 goes to cuBLAS in place (gemm_mma_ok): no kernel built for it
            const auto launch = [&](auto kernel) {
                set_up_shared(reinterpret_cast<const void*>(kernel), bytes, &dev, kQgBlocksPerSm);
                kernel<<<grid, kQgThreads, bytes, s>>>(w.data, u, w.row_bytes, w.rows, w.cols, x, n, dst, accumulate,
                                                       splits, stages);
            };
            if (tok == 128)
                up ? launch(gemm_mma_kernel<T, 128, true>) : launch(gemm_mma_kernel<T, 128, false>);
            else
                up ? launch(gemm_mma_kernel<T, 64, true>) : launch(gemm_mma_kernel<T, 64, false>);
        }
    });
    if (up)
        KVGEN_CUDA_LAUNCHED("gemm_glu_mma");
    else
        KVGEN_CUDA_LAUNCHED("gemm_mma");
    if (splits > 1) {
        const int64_t count = int64_t(n) * w.rows;
        gemm_split_sum_kernel<<<grid_for(count, 256), 256, 0, s>>>(partials, splits, n, w.rows, out, accumulate);
        KVGEN_CUDA_LAUNCHED("gemm_split_sum");
    }
}
}  // namespace

GemmMmaDevice gemm_mma_device(int device) {
    GemmMmaDevice d;
    int per_sm = 0, per_block = 0;
    KVGEN_CUDA_CHECK(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device));
    KVGEN_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
    KVGEN_CUDA_CHECK(cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    d.shared_per_sm = per_sm;
    d.shared_per_block = per_block;
    return d;
}

void gemm_weight_mma(const RowSplit& out, const DevWeight& w, const __half* x, int n, bool accumulate,
                     const GemmMmaDevice& dev, float* scratch, int64_t scratch_floats, cudaStream_t s) {
    const int splits = gemm_mma_splits(n, w.rows, w.cols, dev, scratch ? scratch_floats : 0);
    gemm_mma_launch(out, w, nullptr, x, n, accumulate, dev, splits, scratch, s);
}

void gemm_glu_mma(float* y, const DevWeight& gate, const DevWeight& up, const __half* x, int n,
                  const GemmMmaDevice& dev, cudaStream_t s) {
    KVGEN_ASSERT(glu_fusable(gate, up));
    gemm_mma_launch(RowSplit::one(y, gate.rows), gate, &up, x, n, false, dev, 1, nullptr, s);
}

bool attention_head_dim_supported(int hd) {
    return hd > 0 && hd % 2 == 0 && hd <= kAttnGenericMaxHd;
}

int attention_splits(int n_heads, const KvLayout& kv, int sm_count) {
    // note: enough blocks to give every multiprocessor about four at a depth that uses them all; a shallower cache
    // uses the first attention_active_splits of them and the others exit at once.
    const int groups = n_heads / decode_heads_per_block(n_heads / kv.n_kv_heads, kv);
    const int want = (4 * sm_count + groups - 1) / groups;
    return std::max(1, std::min(want, attention_max_splits(kv)));
}

int attention_max_splits(const KvLayout& kv) {
    return std::max(1, std::min(kMaxAttnSplits, (kv.n_ctx + kAttnSplitPositions - 1) / kAttnSplitPositions));
}

int64_t attention_partials(int n_heads, int head_dim, int splits, int n_batch) {
    const int64_t decode = int64_t(n_heads) * splits * (head_dim + 2);
    const int64_t prefill = n_batch > 1 && flash_head_dim(head_dim) ? flash_partials(n_batch, n_heads, head_dim) : 0;
    return std::max(decode, prefill);
}

int attention_prefill_splits(int n_heads, const KvLayout& kv, int n, int pos0, int sm_count) {
    return flash_head_dim(kv.head_dim) ? flash_splits(n_heads, n_heads / kv.n_kv_heads, n, pos0, sm_count) : 1;
}

int attention_counters(int n_heads, const KvLayout& kv) {
    return n_heads / decode_heads_per_block(n_heads / kv.n_kv_heads, kv);
}

void attention_decode(float* out, ActBlock* xq, float* partials, int* counters, const float* q, const uint8_t* k_cache,
                      const uint8_t* v_cache, const float* k_offsets, const int* d_pos0, int n_heads,
                      const KvLayout& kv, int splits, cudaStream_t s, bool pdl, const L2Prefetch& prefetch) {
    KVGEN_ASSERT(kv_cache_supported(kv));
    for (const L2Range& r : prefetch.range)
        KVGEN_ASSERT(r.bytes % 16 == 0 && reinterpret_cast<uintptr_t>(r.data) % 16 == 0);
    KVGEN_ASSERT(!xq || kv.head_dim % 32 == 0);
    KVGEN_ASSERT((k_offsets != nullptr) == kv.k_offsets());
    const int n_rep = n_heads / kv.n_kv_heads;
    const float scale = 1.0f / std::sqrt(float(kv.head_dim));
    const bool ok = dispatch_decode_attention(n_rep, kv, [&](auto nq, auto e) {
        constexpr int NQ = decltype(nq)::value, E = decltype(e)::value;
        const dim3 grid(unsigned(n_heads / NQ), unsigned(splits));
        dispatch_attention_cache<NQ, E>(kv, [&](auto cache) {
            launch(attention_decode_kernel<NQ, E, decltype(cache)::value>, grid, kAttnThreads, pdl, s, q, k_cache,
                   v_cache, k_offsets, d_pos0, n_rep, kv, splits, scale, partials, counters, out, xq, prefetch);
        });
    });
    if (!ok) {
        attention_generic(out, q, k_cache, v_cache, d_pos0, 1, n_heads, kv, s);
        if (xq) quantize_act(xq, out, int64_t(n_heads) * kv.head_dim, s);
        return;
    }
    KVGEN_CUDA_LAUNCHED("attention_decode");
    if (counters) return;  // combined by each head group's last block
    attention_combine_kernel<<<n_heads, 128, 0, s>>>(partials, d_pos0, splits, kv.head_dim, out, xq);
    KVGEN_CUDA_LAUNCHED("attention_combine");
}

// The largest batch fits the prefill grids' rows (at most 65535): a row per kAttnWarps queries in the warp kernel, per
// kFaRows / 8 in flash attention (8 heads a block; splits only for short prompts, at most 512 blocks).
static_assert((kMaxBatch + kAttnWarps - 1) / kAttnWarps <= 65535, "the warp prefill grid's rows");
static_assert((kMaxBatch + kFaRows / 8 - 1) / (kFaRows / 8) <= 65535, "the flash prefill grid's rows");

static_assert(kFlashAsyncBytes == int64_t(sizeof(float)) * kFaShared<128, false, true> &&
                  kFlashAsyncBlocksPerSm == kFaBlocksPerSm,
              "the memory plan's facts of the two-stage flash kernel");
static_assert(flash_quantized_bytes(128) == int64_t(sizeof(float)) * kFaShared<128, true> &&
                  flash_quantized_bytes(64) == int64_t(sizeof(float)) * kFaShared<64, true>,
              "the memory plan's shared memory of flash attention over a quantized cache");

bool attention_prefill(float* out, const float* q, const uint8_t* k_cache, const uint8_t* v_cache,
                       const float* k_offsets, const int* d_pos0, int n, int n_heads, const KvLayout& kv,
                       bool tensor_cores, bool flash_async, bool warp_split, int splits, float* partials,
                       cudaStream_t s, __half* xh, ActBlock* xq) {
    KVGEN_ASSERT(kv_cache_supported(kv));
    KVGEN_ASSERT((k_offsets != nullptr) == kv.k_offsets());
    const int n_rep = n_heads / kv.n_kv_heads;
    const float scale = 1.0f / std::sqrt(float(kv.head_dim));
    // note: a quantized cache is read by flash attention alone (kv_quantized_head_dim: its head_dims).
    if ((tensor_cores || kv.quantized()) && dispatch_flash(n_rep, kv.head_dim, [&](auto hd, auto nq) {
            constexpr int HD = decltype(hd)::value, NQ = decltype(nq)::value;
            KVGEN_ASSERT(splits >= 1 && (splits == 1 || partials));
            const dim3 grid(unsigned(n_heads / NQ), unsigned((n + kFaRows / NQ - 1) / (kFaRows / NQ) * splits));
            // note: the two-stage kernel is built for head_dim 128 alone (flash_async_fits, memory_plan.h)
            constexpr bool kAsyncBuilt = HD == 128;
            const bool async = kAsyncBuilt && flash_async && !kv.quantized();
            const auto go = [&](auto ws) {
                constexpr bool WS = decltype(ws)::value;
                if (kv.quantized() || async) {
                    KVGEN_ASSERT(!async || (kv.k_type == KvType::F16 && kv.v_type == KvType::F16 && !k_offsets));
                    const auto kernel = kv.quantized() ? flash_prefill_kernel<HD, NQ, true, false, WS>
                                                       : flash_prefill_kernel<HD, NQ, false, kAsyncBuilt, WS>;
                    const size_t bytes = sizeof(float) * size_t(kv.quantized() ? kFaShared<HD, true>
                                                                               : kFaShared<HD, false, kAsyncBuilt>);
                    set_up_shared(reinterpret_cast<const void*>(kernel), bytes, nullptr, kFaBlocksPerSm);
                    kernel<<<grid, kFaThreads, bytes, s>>>(q, k_cache, v_cache, k_offsets, d_pos0, n, n_heads, n_rep,
                                                           kv, scale, out, splits, partials, splits > 1 ? nullptr : xh,
                                                           splits > 1 ? nullptr : xq);
                } else {
                    flash_prefill_kernel<HD, NQ, false, false, WS><<<grid, kFaThreads, 0, s>>>(
                        q, k_cache, v_cache, k_offsets, d_pos0, n, n_heads, n_rep, kv, scale, out, splits, partials,
                        splits > 1 ? nullptr : xh, splits > 1 ? nullptr : xq);
                }
            };
            if (warp_split && flash_warp_split(n, NQ))
                go(std::true_type{});
            else
                go(std::false_type{});
        })) {
        KVGEN_CUDA_LAUNCHED("flash_prefill");
        if (splits > 1) {
            flash_combine_kernel<<<unsigned(n * n_heads), 128, 0, s>>>(partials, splits, kv.head_dim, out, xh, xq);
            KVGEN_CUDA_LAUNCHED("flash_combine");
        }
        return xh || xq;
    }
    const bool ok = dispatch_attention(n_rep, kv.head_dim, [&](auto nq, auto e) {
        constexpr int NQ = decltype(nq)::value, E = decltype(e)::value;
        const dim3 grid(unsigned(n_heads / NQ), unsigned((n + kAttnWarps - 1) / kAttnWarps));
        attention_prefill_kernel<NQ, E>
            <<<grid, kAttnThreads, 0, s>>>(q, k_cache, v_cache, d_pos0, n, n_heads, n_rep, kv, scale, out);
    });
    if (!ok) {
        attention_generic(out, q, k_cache, v_cache, d_pos0, n, n_heads, kv, s);
        return false;
    }
    KVGEN_CUDA_LAUNCHED("attention_prefill");
    return false;
}

}  // namespace kvgen::cuda
