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
#include "elementwise.cuh"
#include "flash_attention.cuh"
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

// --- The same product in one kernel (--cuda-gemm mma): weights decoded tile by tile into shared memory -------------
// A block of 8 warps computes out[tok0 .. tok0 + TOK][row0 .. row0 + 128] (64 rows of each weight with GLU, below;
// TOK = 128 or 64 tokens, gemm_mma_tokens in memory_plan.h): it walks the row in steps of 64 weights, each thread
// copying 16-byte pieces of the tokens' f16 activations and decoding one 32-weight chunk of one row (the type's
// decoder, rounded to f16 as the cuBLAS path rounds it), both into shared memory; then each warp multiplies its 32
// rows x TOK / 2 tokens with mma.sync m16n8k16 (flash_attention.cuh gives the fragment layout), f32 accumulators in
// registers for the whole row; with two stages of shared memory, the next step is filled while the other is read.
// Token tiles are the grid's x, so the blocks that read the same weight rows run together and share them through the
// L2 cache; DRAM sees the quantized bytes about once per call.
//
// Exactness: the operands are the cuBLAS path's (the same f16 weights and activations, f32 sums); only the order of
// the sums differs. Rows past the matrix re-read its last row and tokens past n read zeros; neither is stored.
//
// Two products folded into the one kernel, so that prefill reads its activations once where it makes several outputs
// of them: RowSplit sends the rows to up to three buffers (Q, K and V from their weights uploaded as one matrix), and
// with GLU a block owns kQgRows / 2 rows of a SwiGLU pair, gate rows [r, r + 16) in its warp's first m16 tile and the
// same up rows in its second, so that each thread holds both sums of its outputs and writes silu(gate) * up (the
// swiglu kernel's arithmetic, silu_mul) instead of two products and an element-wise pass.
constexpr int kQgThreads = 256;  // 8 warps: 4 along the rows x 2 along the tokens
// Floats of shared memory one stage of a block of TOK tokens needs (gemm_mma_stage_bytes; kQgRows, kQgStep,
// kQgStride, the tile choice, the stages and the grid: memory_plan.h).
template <int TOK>
constexpr int kQgShared = int(gemm_mma_stage_bytes(TOK) / 4);
// Output rows a block owns: kQgRows, or half of them of each weight with GLU.
template <bool GLU>
constexpr int kQgOutRows = GLU ? kQgRows / 2 : kQgRows;

// Step k0 of a block's tokens [tok0, tok0 + TOK) into one stage of shared memory, st: the activations, TOK tokens x
// 8 pieces of 8 halves (TOK / 32 pieces a thread, consecutive threads taking consecutive pieces), copied by
// ctx.copy16_async (cp.async on sm_80 and later: no registers held and the copy runs on under what the thread does
// next; ctx.wait_async before the barrier that publishes them), zeros past n or the row; and the thread's chunk of
// the weights, chunk dc of wrow's step (zeros past the row: cols may end half way through a step), decoded as f16.
#pragma nv_exec_check_disable
template <GgmlType T, int TOK, class Ctx>
KVGEN_HD void gemm_mma_fill(const Ctx& ctx, __half* st, const uint8_t* __restrict__ wrow, int64_t cols,
                            const __half* __restrict__ x, int n, int tok0, int64_t k0, int dr, int dc) {
    __half* const ws = st;                        // [kQgRows][kQgStride]: the step's weights
    __half* const xs = st + kQgRows * kQgStride;  // [TOK][kQgStride]: the step's activations
    const int t = ctx.thread();
#pragma unroll
    for (int j = 0; j < TOK / 32; ++j) {
        const int p = t + j * kQgThreads, tk = p >> 3, e = (p & 7) * 8;
        __half* const dst = xs + tk * kQgStride + e;
        check_aligned(dst, 16);
        if (tok0 + tk < n && k0 + e < cols) {
            const __half* src = x + int64_t(tok0 + tk) * cols + k0 + e;
            check_aligned(src, 16);
            ctx.copy16_async(dst, src);
        } else {
            *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
        }
    }
    const int64_t cpr = cols / 32, c = k0 / 32 + dc;
    uint32_t h[16];
    if (c < cpr) {
        float v[32];
        row_chunk<T>(wrow, c, cpr, v);
#pragma unroll
        for (int j = 0; j < 16; ++j) h[j] = pack_halves(v[2 * j], v[2 * j + 1]);
    } else {
#pragma unroll
        for (int j = 0; j < 16; ++j) h[j] = 0;
    }
    uint4* wdst = reinterpret_cast<uint4*>(ws + dr * kQgStride + dc * 32);
    check_aligned(wdst, 16);
#pragma unroll
    for (int j = 0; j < 4; ++j) wdst[j] = make_uint4(h[4 * j], h[4 * j + 1], h[4 * j + 2], h[4 * j + 3]);
}

// One block of out (+)= x[n][cols] . W^T, out's row r of token i at out.at(r, i, rows), for W rows row_bytes apart
// (cols a multiple of 32; x 16-byte aligned). GLU: W is the gate, up the up weight of the same type and shape, and
// out = silu(x . gate^T) * (x . up^T) (accumulate false).
//
// splits > 1 (not with GLU; gemm_mma_splits in memory_plan.h), for grids with fewer blocks than SMs: the columns are
// cut into splits ranges of whole steps, block_y is split z's row tile (z = block_y / row tiles), and the block writes
// the partial sums of its range to out.y[0] + z n rows as [n][rows] (accumulate false); gemm_split_sum_item adds them
// up in split order and writes the product where it goes.
//
// stages (gemm_mma_stages, memory_plan.h): 1, shared memory holds one step (kQgShared<TOK> floats), which the block
// fills, multiplies and then waits on before filling again (two barriers a step); 2, it holds two, and the block fills
// the next step into one while its warps multiply the other (one barrier a step). The same sums in the same order.
#pragma nv_exec_check_disable
template <GgmlType T, int TOK, bool GLU, class Ctx>
KVGEN_HD void gemm_mma_body(const Ctx& ctx, const uint8_t* __restrict__ w, const uint8_t* __restrict__ up,
                            int64_t row_bytes, int64_t rows, int64_t cols, const __half* __restrict__ x, int n,
                            const RowSplit& dst, bool accumulate, int splits, int stages) {
    __half* const smem = reinterpret_cast<__half*>(ctx.shared());
    const int t = ctx.thread(), warp = t >> 5, lane = t & 31, gid = lane >> 2, tig = lane & 3;
    static_assert(TOK == 64 || TOK == 128, "two warps along the tokens, 4 or 8 n8 tiles each");
    constexpr int NT = TOK / 16;                         // n8 tiles a warp
    constexpr int kStage = 2 * kQgShared<TOK>;           // halves of one stage: weights, then activations
    const int tok0 = ctx.block_x() * TOK;
    int tile = ctx.block_y();
    int64_t k_begin = 0, k_end = cols;
    RowSplit out = dst;
    if (splits > 1) {
        const int row_tiles = int(gemm_mma_row_tiles(rows));
        const int z = tile / row_tiles;
        tile -= z * row_tiles;
        const int64_t per = ((cols + kQgStep - 1) / kQgStep + splits - 1) / splits * kQgStep;
        k_begin = z * per < cols ? z * per : cols;  // a range past the end: zeros
        k_end = k_begin + per < cols ? k_begin + per : cols;
        out = RowSplit::one(dst.y[0] + int64_t(z) * n * rows, rows);
    }
    const int64_t row0 = int64_t(tile) * kQgOutRows<GLU>;
    const int wm = (warp & 3) * 32, wn = (warp >> 2) * (TOK / 2);  // the warp's rows and tokens in the tile

    // The thread's chunk: row t / 2 of the tile, chunk t % 2 of each step. With GLU, tile row 32 g + j is gate row
    // row0 + 16 g + j for j < 16, up row row0 + 16 g + j - 16 after.
    const int dr = t >> 1, dc = t & 1;
    int64_t my_row = row0 + dr;
    const uint8_t* wbase = w;
    if constexpr (GLU) {
        my_row = row0 + (dr >> 5) * 16 + (dr & 15);
        if (dr & 16) wbase = up;
    }
    if (my_row >= rows) my_row = rows - 1;
    const uint8_t* wrow = wbase + my_row * row_bytes;

    float acc[2][NT][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < NT; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

    // Each pass multiplies step k0 (none in the first) and then fills step k0 + kQgStep: into the stage it read, behind
    // a barrier, with one stage; into the other with two (which every warp left at the barrier before the products).
    int cur = 0;  // the stage being multiplied
    for (int64_t k0 = k_begin - kQgStep; k0 < k_end; k0 += kQgStep) {
        if (k0 >= k_begin) {
            ctx.wait_async();
            ctx.sync();  // step k0 is in stage cur
            const __half* const ws = smem + cur * kStage;
            const __half* const xs = ws + kQgRows * kQgStride;
#pragma unroll
            for (int kk = 0; kk < kQgStep; kk += 16) {
                uint32_t a[2][4];
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    const __half* r = ws + (wm + mi * 16 + gid) * kQgStride + kk + 2 * tig;
                    a[mi][0] = load_u32(r);
                    a[mi][1] = load_u32(r + 8 * kQgStride);
                    a[mi][2] = load_u32(r + 8);
                    a[mi][3] = load_u32(r + 8 * kQgStride + 8);
                }
#pragma unroll
                for (int ni = 0; ni < NT; ++ni) {
                    const __half* col = xs + (wn + ni * 8 + gid) * kQgStride + kk + 2 * tig;
                    const uint32_t b[2] = {load_u32(col), load_u32(col + 8)};
#pragma unroll
                    for (int mi = 0; mi < 2; ++mi) ctx.mma(acc[mi][ni], a[mi], b);
                }
            }
        }
        const int64_t next = k0 + kQgStep;
        if (next < k_end) {
            if (k0 >= k_begin) {
                if (stages == 2)
                    cur ^= 1;
                else
                    ctx.sync();  // every warp done with the stage before it is filled again
            }
            gemm_mma_fill<T, TOK>(ctx, smem + cur * kStage, wrow, cols, x, n, tok0, next, dr, dc);
        }
    }

    // C fragments: rows gid and gid + 8 of each 16, tokens 2 tig and 2 tig + 1 of each 8.
    if constexpr (GLU) {  // m16 tile 0 holds the gate sums, tile 1 the up sums of the same outputs
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t r = row0 + (warp & 3) * 16 + gid + h * 8;
            if (r >= rows) continue;
            float* const o = out.at(r, 0, rows);
            const int64_t ld = out.width(r, rows);
#pragma unroll
            for (int ni = 0; ni < NT; ++ni)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int tk = tok0 + wn + ni * 8 + 2 * tig + e;
                    if (tk < n) o[tk * ld] = silu_mul(acc[0][ni][2 * h + e], acc[1][ni][2 * h + e]);
                }
        }
    } else {
        // Row by row (rows gid and gid + 8 of each m16 tile): when accumulating, the row's earlier values are all
        // loaded before the first store (note: in one loop the compiler, which cannot tell that no two elements share
        // an address, waits for each load-add-store in turn).
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int64_t r = row0 + wm + mi * 16 + gid + h * 8;
                if (r >= rows) continue;
                float* const o = out.at(r, 0, rows);
                const int64_t ld = out.width(r, rows);
                if (accumulate && splits <= 1) {  // a split block writes its partial sums
#pragma unroll
                    for (int ni = 0; ni < NT; ++ni)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int tk = tok0 + wn + ni * 8 + 2 * tig + e;
                            if (tk < n) acc[mi][ni][2 * h + e] += o[tk * ld];
                        }
                }
#pragma unroll
                for (int ni = 0; ni < NT; ++ni)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int tk = tok0 + wn + ni * 8 + 2 * tig + e;
                        if (tk < n) o[tk * ld] = acc[mi][ni][2 * h + e];
                    }
            }
    }
}

// Element j of [n][rows] (token j / rows, row j % rows) of a product split splits ways (gemm_mma_body): the partial
// sums, splits of [n][rows] one after the other, added in split order, then written (added when accumulate) where out
// says.
KVGEN_HD void gemm_split_sum_item(int64_t j, const float* __restrict__ partials, int splits, int n, int64_t rows,
                                  const RowSplit& out, bool accumulate) {
    const int64_t plane = int64_t(n) * rows;
    float s = partials[j];
    for (int z = 1; z < splits; ++z) s += partials[z * plane + j];
    float* const o = out.at(j % rows, j / rows, rows);
    *o = accumulate ? *o + s : s;
}

// Element j of [n][rows] of a product on split activations (to_f16_split_item): t holds [2n][rows], the n tokens'
// products with their high parts, then with their low parts; each token's two added (the low one divided by
// kF16SplitScale, exactly) and written (added when accumulate) where out says, then as tail says.
KVGEN_HD void f16_split_sum_item(int64_t j, const float* __restrict__ t, int n, int64_t rows, const RowSplit& out,
                                 bool accumulate, SplitSumTail tail = {}) {
    const float s = t[j] + t[int64_t(n) * rows + j] * (1.0f / kF16SplitScale);
    float* const o = out.at(j % rows, j / rows, rows);
    const float v = tail.glu ? silu_mul(*o, s) : accumulate ? *o + s : s;
    *o = v;
    if (tail.xh) f16_split_store(v, j, int64_t(n) * rows, tail.xh);
}

// Pair p of f16_split_sum with tail.qkv: elements 2p and 2p + 1 of [n][rows], one RoPE pair (rows, q_end and k_end
// even: heads start at even rows), each summed as f16_split_sum_item sums it, then as qkv_store_row: a query's pair
// turned (below half_rope) and written where out says, a key's turned and a value's as they are stored as f16 at
// position *d_pos0 + i (rope_item's and store_kv_item's arithmetic, so the bits of rope_store_kv's launch).
KVGEN_HD void f16_split_sum_qkv_item(int64_t p, const float* __restrict__ t, int n, int64_t rows, const RowSplit& out,
                                     const QkvStore& st) {
    const int64_t j = 2 * p, plane = int64_t(n) * rows;
    float a = t[j] + t[plane + j] * (1.0f / kF16SplitScale);
    float b = t[j + 1] + t[plane + j + 1] * (1.0f / kF16SplitScale);
    const int64_t row = j % rows;
    const int i = int(j / rows);
    const bool query = row < st.q_end, value = row >= st.k_end;
    const int64_t local = query ? row : row - (value ? st.k_end : st.q_end);
    const int hd = st.kv.head_dim, d = int(local % hd), pair = d / 2;
    if (!value && pair < st.half_rope)
        rope_pair(a, b, st.cos_t[int64_t(i) * st.half_rope + pair], st.sin_t[int64_t(i) * st.half_rope + pair]);
    if (query) {
        *out.at(row, i, rows) = a;
        *out.at(row + 1, i, rows) = b;
        return;
    }
    const int64_t dst = st.kv.row(int(local / hd), *st.d_pos0 + i) + d;
    *reinterpret_cast<__half2*>((value ? st.vc : st.kc) + dst) = __floats2half2_rn(a, b);
}

}  // namespace kvgen::cuda
