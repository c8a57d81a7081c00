#pragma once
// The attention kernels' bodies, written against a thread context so that the same source runs on the GPU
// (DeviceThread, ops.cu) and on the host (HostThread, tests/cuda_support/host_emulation.cu: each CUDA thread a
// fiber, shuffles and barriers emulated), which lets the CPU-only CI execute them against cpu::attention.
//
// A warp attends NQ query heads of one KV group (they read the same K/V rows) over a range of positions: lane l
// holds elements [E l, E l + E) of each head_dim = 32 E vector, a position costs one shuffle reduction per query
// head, and softmax is online (running max m, sum l, unnormalized output o).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/error.h"
#include "common/hd.h"
#include "engine/kv_layout.h"
#include "kv_quant.cuh"
#include "matvec_int.cuh"

namespace kvgen::cuda {

constexpr int kAttnWarps = 4;
constexpr int kAttnThreads = 32 * kAttnWarps;

#if defined(__CUDACC__)
struct DeviceThread {
    float* smem;
    __device__ __forceinline__ int thread() const { return int(threadIdx.x); }
    __device__ __forceinline__ int block_x() const { return int(blockIdx.x); }
    __device__ __forceinline__ int block_y() const { return int(blockIdx.y); }
    __device__ __forceinline__ float warp_sum(float v) const {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        return v;
    }
    __device__ __forceinline__ float warp_max(float v) const {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        return v;
    }
    __device__ __forceinline__ float shfl_xor(float v, int o) const {
        return __shfl_xor_sync(0xffffffffu, v, o);
    }
    __device__ __forceinline__ float shfl(float v, int src_lane) const {
        return __shfl_sync(0xffffffffu, v, src_lane);
    }
    // A barrier of the warp's lanes that also orders their memory accesses (a shuffle does not).
    __device__ __forceinline__ void sync_warp() const {
        __syncwarp();
    }
    __device__ __forceinline__ void sync() const {
        __syncthreads();
    }
    __device__ __forceinline__ float* shared() const {
        return smem;
    }
    // Another block's results: read past this multiprocessor's L1, which does not see other blocks' writes.
    __device__ __forceinline__ float load_other(const float* p) const {
        return __ldcg(p);
    }
    __device__ __forceinline__ void fence() const {
        __threadfence();
    }
    __device__ __forceinline__ int atomic_add(int* p, int v) const {
        return atomicAdd(p, v);
    }
    // Reductions over the four lanes of a quad (lanes 4 k .. 4 k + 3), xor 2 then xor 1.
    __device__ __forceinline__ float quad_max(float v) const {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
        return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    }
    __device__ __forceinline__ float quad_sum(float v) const {
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        return v + __shfl_xor_sync(0xffffffffu, v, 1);
    }
    // c += A B for one warp's 16 x 16 f16 A and 16 x 8 f16 B fragments, f32 C (flash_attention.cuh gives the layout).
    __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) const {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
        // sm_75 has the k = 8 shape: columns 0-7 of A are a[0], a[1] with b[0], columns 8-15 a[2], a[3] with b[1]
        asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(b[0]));
        asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[2]), "r"(a[3]), "r"(b[1]));
#endif
    }
    // c += A B for one warp's 16 x 32 8-bit A and 32 x 8 8-bit B fragments, s32 C (mma.sync m16n8k32, sm_80 and later;
    // AU, BU: A's, B's bytes unsigned, else signed). Lane 4 gid + tig: a[0] row gid, columns 4 tig .. + 3 (byte j
    // column 4 tig + j), a[1] row gid + 8, a[2] and a[3] the same rows at columns 16 + 4 tig ..; b[0] rows 4 tig .. + 3
    // of column gid, b[1] rows 16 + 4 tig ..; c as mma's (rows gid, gid + 8, columns 2 tig + {0, 1}). Exact: integers.
    template <bool AU, bool BU>
    __device__ __forceinline__ void mma_i8(int (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) const {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define KVGEN_MMA_I8(TA, TB)                                  \
    asm("mma.sync.aligned.m16n8k32.row.col.s32." TA "." TB    \
        ".s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, " \
        "{%0, %1, %2, %3};"                                   \
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])      \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
        if constexpr (AU && BU)
            KVGEN_MMA_I8("u8", "u8");
        else if constexpr (AU)
            KVGEN_MMA_I8("u8", "s8");
        else if constexpr (BU)
            KVGEN_MMA_I8("s8", "u8");
        else
            KVGEN_MMA_I8("s8", "s8");
#undef KVGEN_MMA_I8
#else
        __trap();  // launched on sm_80 and later only (CudaOps sets MviShape::mma there)
#endif
    }
    // 16 bytes from global src to shared dst (both 16-byte aligned), which the block may read after wait_async and a
    // barrier: cp.async on sm_80 and later (the copy goes on while the thread does other work, through no register),
    // a load and a store before.
    __device__ __forceinline__ void copy16_async(void* dst, const void* src) const {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(unsigned(__cvta_generic_to_shared(dst))),
                     "l"(src)
                     : "memory");
#else
        *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
#endif
    }
    // 4 bytes the same way (both 4-byte aligned; cp.async.ca: kept in L1 too, as 4-byte copies must).
    __device__ __forceinline__ void copy4_async(void* dst, const void* src) const {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(unsigned(__cvta_generic_to_shared(dst))), "l"(src)
                     : "memory");
#else
        *static_cast<uint32_t*>(dst) = *static_cast<const uint32_t*>(src);
#endif
    }
    // Waits for the thread's copy16_async and copy4_async copies.
    __device__ __forceinline__ void wait_async() const {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
        asm volatile("cp.async.wait_all;" ::: "memory");
#endif
    }
    // The thread's copies since the last commit become a group (cp.async.commit_group) ...
    __device__ __forceinline__ void commit_async() const {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
        asm volatile("cp.async.commit_group;" ::: "memory");
#endif
    }
    // ... and wait_async_group<N> waits for all of its groups but the N committed last (cp.async.wait_group N).
    template <int N>
    __device__ __forceinline__ void wait_async_group() const {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
        asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
    }
    // ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: four 8 x 8 matrices of 16-bit values from shared memory, lane
    // 8 m + i giving the address of row i of matrix m (16 bytes, 16-byte aligned); r[m] is lane 4 i + j's word j of
    // row i of matrix m (values 2 j, 2 j + 1), or with trans its values at rows 2 j and 2 j + 1 of column i: a B
    // fragment of mma.m16n8k16 (flash_attention.cuh) from a [k][n] tile. Every lane of the warp takes part.
    template <bool Trans>
    __device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __half* p) const {
        const unsigned a = unsigned(__cvta_generic_to_shared(p));
        if constexpr (Trans)
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                         : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                         : "r"(a)
                         : "memory");
        else
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                         : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                         : "r"(a)
                         : "memory");
    }
};
#endif

// Positions are taken P at a time: their K and V rows are loaded before any is used, so several loads are in
// flight per warp (a long cache is a stream of small rows), then folded into the softmax in order. kb and vb point
// at one KV head's f16 rows, 2 head_dim bytes apart (a cache with a quantized half is read by warp_attend_wide).
#pragma nv_exec_check_disable
template <int NQ, int E, class Ctx>
KVGEN_HD void warp_attend_typed(const Ctx& ctx, const float (&q)[NQ][E], const uint8_t* kb, const uint8_t* vb, int t0,
                                int t1, int step, float (&m)[NQ], float (&l)[NQ], float (&o)[NQ][E]) {
    constexpr int P = E <= 4 ? 4 : 2;  // positions per batch (registers: 2 P E floats)
    constexpr int64_t rb = 64 * E;     // bytes a row
    const int lane = ctx.thread() % 32;
    for (int t = t0; t < t1; t += P * step) {
        float kr[P][E], vv[P][E];
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int tp = t + p * step;  // the same for the whole warp
            load_halves_or_zero(tp < t1, kb, int64_t(tp) * rb, lane * E, kr[p]);
            load_halves_or_zero(tp < t1, vb, int64_t(tp) * rb, lane * E, vv[p]);
        }
#pragma unroll
        for (int r = 0; r < NQ; ++r) {
            float s[P];
#pragma unroll
            for (int p = 0; p < P; ++p) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < E; ++e) d = fmaf(q[r][e], kr[p][e], d);
                s[p] = ctx.warp_sum(d);
            }
#pragma unroll
            for (int p = 0; p < P; ++p) {
                if (t + p * step >= t1) break;
                const float mn = fmaxf(m[r], s[p]);
                const float corr = expf(m[r] - mn), pr = expf(s[p] - mn);
                l[r] = l[r] * corr + pr;
#pragma unroll
                for (int e = 0; e < E; ++e) o[r][e] = fmaf(o[r][e], corr, pr * vv[p][e]);
                m[r] = mn;
            }
        }
    }
}

// An f16 cache read 16 bytes a lane (head_dim 32 E, E 1, 2 or 4, at most 4 query heads): a row's halves are held by
// G = 4 E lanes, 8 each, so a warp reads R = 8 / E rows at once. Subgroup s = lane / G takes positions tw + s,
// tw + s + step, ... (tw and the loop warp-uniform; step = R x the warps sharing the range), with an online softmax
// of its own; merge_subgroups folds the R states into every lane at the end. A position's score is reduced over G
// lanes only (log2 G shuffles, against 5 per position in warp_attend_typed), and each lane has P positions' 32 bytes
// in flight before the first is used. note: 8 query heads would hold 128 floats of q and o a lane, and the registers
// left would allow fewer bytes in flight per multiprocessor than warp_attend_typed's (measured with ptxas: 188
// registers, one position a subgroup).
// KB (VB): K (V) in q8_0 / q4_0 blocks (E 2 or 4), the same lanes and columns, each row's 8 values a lane read as
// its block's scale and three 4-byte words (kv_block_load, no branch on the type, so P positions' loads are in flight
// before the first is decoded). koff (KB; null: none): the head's key offset, added back to the K rows from
// kKvOffsetPositions on, which hold k - offset (engine/kv_offset.h). Either half may be in blocks with the other f16
// (a q8_0 K beside an f16 V, say).
template <int NQ, int E>
constexpr bool kAttnWide = (E == 1 || E == 2 || E == 4) && NQ <= 4;

// The cache a decode kernel is built for: f16 K and V; K and V both in blocks (q8_0 or q4_0, head_dim 64 or 128); K
// in blocks and V f16; K f16 and V in blocks.
enum class AttnCache { F16, Blocks, KBlocks, VBlocks };

constexpr bool attn_k_blocks(AttnCache c) {
    return c == AttnCache::Blocks || c == AttnCache::KBlocks;
}
constexpr bool attn_v_blocks(AttnCache c) {
    return c == AttnCache::Blocks || c == AttnCache::VBlocks;
}

// Whether decode over cache C with NQ query heads a block and head_dim 32 E reads rows wide (warp_attend_wide), else
// a lane per E columns (warp_attend_typed).
template <AttnCache C, int NQ, int E>
constexpr bool attention_wide() {
    return kAttnWide<NQ, E> && (C == AttnCache::F16 || E == 2 || E == 4);
}

// The decode kernel's cache for kv (any cache kv_cache_supported allows).
inline AttnCache attention_cache(const KvLayout& kv) {
    const bool kq = kv_type_quantized(kv.k_type), vq = kv_type_quantized(kv.v_type);
    return kq && vq ? AttnCache::Blocks : kq ? AttnCache::KBlocks : vq ? AttnCache::VBlocks : AttnCache::F16;
}

// Calls f(std::integral_constant<AttnCache, C>{}) with C = attention_cache(kv), for NQ query heads a block and
// head_dim 32 E. A cache with a quantized half has only the wide kernels (decode_heads_per_block keeps its blocks to
// 4 query heads, kv_quantized_head_dim its head_dims to 64 and 128), so f is instantiated with those where they read
// wide, and anything else is refused.
template <int NQ, int E, typename F>
void dispatch_attention_cache(const KvLayout& kv, F&& f) {
    const AttnCache c = attention_cache(kv);
    if constexpr (attention_wide<AttnCache::Blocks, NQ, E>()) {  // (the same for KBlocks and VBlocks)
        switch (c) {
            case AttnCache::F16:
                f(std::integral_constant<AttnCache, AttnCache::F16>{});
                return;
            case AttnCache::Blocks:
                f(std::integral_constant<AttnCache, AttnCache::Blocks>{});
                return;
            case AttnCache::KBlocks:
                f(std::integral_constant<AttnCache, AttnCache::KBlocks>{});
                return;
            case AttnCache::VBlocks:
                f(std::integral_constant<AttnCache, AttnCache::VBlocks>{});
                return;
        }
    } else {
        KVGEN_ASSERT(c == AttnCache::F16);  // (decode_heads_per_block and kv_cache_supported see to it)
        f(std::integral_constant<AttnCache, AttnCache::F16>{});
    }
}

#pragma nv_exec_check_disable
template <int NQ, int E, bool KB, bool VB, class Ctx>
KVGEN_HD void warp_attend_wide(const Ctx& ctx, const float (&q)[NQ][8], const uint8_t* kb, const uint8_t* vb,
                               const float* koff, const KvLayout& kv, int tw, int t1, int step, float (&m)[NQ],
                               float (&l)[NQ], float (&o)[NQ][8]) {
    constexpr int G = 4 * E, P = NQ <= 2 ? 4 : 2;  // registers: 16 P floats of K and V
    const int lane = ctx.thread() % 32, s = lane / G, c0 = (lane % G) * 8;
    const int64_t krb = KB ? kv.k_row_bytes() : 64 * E, vrb = VB ? kv.v_row_bytes() : 64 * E;  // f16: 2 hd bytes
    KvBlockCols kcols{}, vcols{};
    float kc[KB ? 8 : 1];  // the lane's columns of koff (zeros without)
    if constexpr (KB) {
        kcols = kv_block_cols(kv.k_type, c0);
#pragma unroll
        for (int e = 0; e < 8; ++e) kc[e] = koff ? koff[c0 + e] : 0.0f;
    }
    if constexpr (VB) vcols = kv_block_cols(kv.v_type, c0);
    // V rows stay raw until their position is folded in, where a half is in blocks (fewer registers than P rows of
    // floats; an f16 V beside a K in blocks as its 16 bytes, VH: with P rows of floats, K's decoding spills)
    constexpr bool VH = KB && !VB;
    for (int t = tw; t < t1; t += P * step) {
        float kr[P][8], vv[VB || VH ? 1 : P][8];
        KvBlockRaw kw[KB ? P : 1], vw[VB ? P : 1];
        uint4 vh[VH ? P : 1];
        // every load of the P positions first, then the K rows decoded: no load waits for another row's values
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int tp = t + s + p * step;
            if constexpr (KB)
                kw[p] = tp < t1 ? kv_block_load(kcols, kb + int64_t(tp) * krb) : kv_block_zero();
            else
                load_halves_or_zero(tp < t1, kb, int64_t(tp) * krb, c0, kr[p]);
            if constexpr (VB)
                vw[p] = tp < t1 ? kv_block_load(vcols, vb + int64_t(tp) * vrb) : kv_block_zero();
            else if constexpr (VH)
                vh[p] = tp < t1 ? ld16(vb + int64_t(tp) * vrb + 2 * c0) : make_uint4(0, 0, 0, 0);
            else
                load_halves_or_zero(tp < t1, vb, int64_t(tp) * vrb, c0, vv[p]);
        }
        if constexpr (KB) {
#pragma unroll
            for (int p = 0; p < P; ++p) {
                kv_block_decode(kcols, kw[p], kr[p]);
                if (t + s + p * step >= kKvOffsetPositions)
#pragma unroll
                    for (int e = 0; e < 8; ++e) kr[p][e] += kc[e];
            }
        }
#pragma unroll
        for (int r = 0; r < NQ; ++r) {
            float sc[P];
#pragma unroll
            for (int p = 0; p < P; ++p) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; ++e) d = fmaf(q[r][e], kr[p][e], d);
#pragma unroll
                for (int x = G / 2; x > 0; x >>= 1) d += ctx.shfl_xor(d, x);  // every lane, valid or not
                sc[p] = d;
            }
#pragma unroll
            for (int p = 0; p < P; ++p) {
                if (t + s + p * step >= t1) break;  // per subgroup: no shuffles follow in this loop
                const float mn = fmaxf(m[r], sc[p]);
                const float corr = expf(m[r] - mn), pr = expf(sc[p] - mn);
                l[r] = l[r] * corr + pr;
                float x[8];
                if constexpr (VB) kv_block_decode(vcols, vw[p], x);  // (again for each query head)
                if constexpr (VH) halves_of(vh[p], x);
#pragma unroll
                for (int e = 0; e < 8; ++e) o[r][e] = fmaf(o[r][e], corr, pr * (VB || VH ? x[e] : vv[p][e]));
                m[r] = mn;
            }
        }
    }
}

// The R subgroup states of warp_attend_wide (G lanes each) merged, every lane ending with the warp's (m, l, o) for
// its 8 columns. A subgroup that saw no position has m = -inf and weighs nothing.
#pragma nv_exec_check_disable
template <int NQ, int E, class Ctx>
KVGEN_HD void merge_subgroups(const Ctx& ctx, float (&m)[NQ], float (&l)[NQ], float (&o)[NQ][8]) {
#pragma unroll
    for (int x = 4 * E; x < 32; x <<= 1) {
#pragma unroll
        for (int r = 0; r < NQ; ++r) {
            const float m2 = ctx.shfl_xor(m[r], x), l2 = ctx.shfl_xor(l[r], x);
            const float mn = fmaxf(m[r], m2);
            const float a = m[r] == -INFINITY ? 0.0f : expf(m[r] - mn), b = m2 == -INFINITY ? 0.0f : expf(m2 - mn);
            l[r] = l[r] * a + l2 * b;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const float o2 = ctx.shfl_xor(o[r][e], x);
                o[r][e] = o[r][e] * a + o2 * b;
            }
            m[r] = mn;
        }
    }
}

#pragma nv_exec_check_disable
template <int NQ, int W>
KVGEN_HD void load_query(const float* q, int hd, int c0, float scale, float (&qr)[NQ][W], float (&m)[NQ],
                         float (&l)[NQ], float (&o)[NQ][W]) {
#pragma unroll
    for (int r = 0; r < NQ; ++r) {
#pragma unroll
        for (int e = 0; e < W; ++e) {
            qr[r][e] = q[r * hd + c0 + e] * scale;
            o[r][e] = 0.0f;
        }
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
}

// Of a decode launch's splits, the first attention_active_splits(n_pos, splits) take the positions, at least
// kAttnSplitPositions each, and the rest exit at once: the grid, fixed in a captured graph, is sized for the deepest
// cache (attention_splits), while a shallow one costs a few blocks and a short combine.
constexpr int kAttnSplitPositions = 64;

KVGEN_HD int attention_active_splits(int n_pos, int splits) {
    const int need = (n_pos + kAttnSplitPositions - 1) / kAttnSplitPositions;
    return need < 1 ? 1 : need < splits ? need : splits;
}

// Head h's output from its splits' partials (the first `active` of `splits`): out[h] = sum of o_s e^(m_s - M) / sum
// of l_s e^(m_s - M), the splits taken in order (so the result does not depend on which block runs it). xq: also
// quantized for one token's integer product; xh: also split (f16_split_store) into xh [2][xh_count] for a short
// prompt's product on split activations.
#pragma nv_exec_check_disable
template <class Ctx>
KVGEN_HD void combine_head(const Ctx& ctx, int block_threads, const float* __restrict__ partials, int splits,
                           int active, int hd, int h, float* __restrict__ out, ActBlock* __restrict__ xq,
                           __half* __restrict__ xh = nullptr, int64_t xh_count = 0) {
    const float* p = partials + int64_t(h) * splits * (hd + 2);
    float mx = -INFINITY;
    for (int s = 0; s < active; ++s) mx = fmaxf(mx, ctx.load_other(p + int64_t(s) * (hd + 2) + hd));
    float sum = 0.0f;
    for (int s = 0; s < active; ++s) {
        const float* ps = p + int64_t(s) * (hd + 2);
        const float ms = ctx.load_other(ps + hd);
        if (ms != -INFINITY) sum += ctx.load_other(ps + hd + 1) * expf(ms - mx);
    }
    for (int j = ctx.thread(); j < hd; j += block_threads) {
        float acc = 0.0f;
        for (int s = 0; s < active; ++s) {
            const float* ps = p + int64_t(s) * (hd + 2);
            const float ms = ctx.load_other(ps + hd);
            if (ms != -INFINITY) acc += ctx.load_other(ps + j) * expf(ms - mx);
        }
        out[int64_t(h) * hd + j] = acc / sum;
        if (xh) f16_split_store(acc / sum, int64_t(h) * hd + j, xh_count, xh);
        // note: hd and block_threads are multiples of 32 with xq, so a warp holds one whole block of the output
        if (xq) quantize_act_warp(ctx, acc / sum, j % 32, xq[(int64_t(h) * hd + j) / 32]);
    }
}

// grid n_heads, any block size: head block_x's combine, for the decode kernel launched without counters.
#pragma nv_exec_check_disable
template <class Ctx>
KVGEN_HD void attention_combine_body(const Ctx& ctx, int block_threads, const float* __restrict__ partials,
                                     const int* __restrict__ d_pos0, int splits, int hd, float* __restrict__ out,
                                     ActBlock* __restrict__ xq) {
    const int active = attention_active_splits(*d_pos0 + 1, splits);
    combine_head(ctx, block_threads, partials, splits, active, hd, ctx.block_x(), out, xq);
}

// Shared floats the decode body needs: [warp][NQ][hd + 2].
template <int NQ, int E>
constexpr int kAttnDecodeShared = kAttnWarps* NQ*(32 * E + 2);

// Blocks of a decode kernel a multiprocessor must hold (its __launch_bounds__): attention_splits makes the grid just
// over 4 blocks a multiprocessor (544 for 7B's 32 heads on 132), so a kernel that fits only 4 runs a few blocks in a
// second wave. The wide kernel over blocks (K, V or both) is held to 5 for one query head and 4 for 2 or 3 (ptxas of
// CUDA 13 for sm_90: 95-96 and 127-128 registers, no spills; K and V in blocks 115 and 144-158 unbounded; sm_75-89 16
// bytes of stack for one or two query heads); for 4 query heads 128 registers would spill, so it keeps 148-166 (3
// blocks). The f16 one fits 5 for one query head (95 registers) as it is.
template <int NQ, AttnCache C>
constexpr int kAttnMinBlocks = !attn_k_blocks(C) && !attn_v_blocks(C) ? 1
                               : NQ == 1                              ? 5
                               : NQ <= 3                              ? 4
                                                                      : 1;

// grid (n_heads / NQ, splits), kAttnThreads threads; partials [n_heads][splits][hd + 2] = (o unnormalized, m, l).
// With counters ([n_heads / NQ] ints, zero between launches), the combine is folded in: each block counts itself
// done on its head group's counter after a fence, and the group's last block combines the splits into out and sets
// the counter back to zero; and where one split is active (a cache of up to kAttnSplitPositions positions) its block
// writes out itself, without the partials, the fence, the count and the combine's reads of them (four round trips
// to L2 of the chain a head's block waits on; combine_head of one split is the same bits: its factor is e^0 = 1).
// Without counters, attention_combine_body runs as a kernel of its own. C: the cache the kernel is built for
// (AttnCache), so each kernel holds one loop and only its registers. k_offsets: the layer's key offsets
// [n_kv_heads][hd] where K carries them (KvLayout::k_offsets), else null.
#pragma nv_exec_check_disable
template <int NQ, int E, AttnCache C, class Ctx>
KVGEN_HD void attention_decode_body(const Ctx& ctx, const float* __restrict__ q, const uint8_t* __restrict__ kc,
                                    const uint8_t* __restrict__ vc, const float* __restrict__ k_offsets,
                                    const int* __restrict__ d_pos0, int n_rep, const KvLayout& kv, int splits,
                                    float scale, float* __restrict__ partials, int* __restrict__ counters,
                                    float* __restrict__ out, ActBlock* __restrict__ xq) {
    constexpr int hd = 32 * E;
    const int h0 = ctx.block_x() * NQ, g = h0 / n_rep, sp = ctx.block_y();
    const int warp = ctx.thread() / 32, lane = ctx.thread() % 32;
    const int n_pos = *d_pos0 + 1, active = attention_active_splits(n_pos, splits);
    if (sp >= active) return;  // the whole block, before it counts: the active splits combine
    const int len = (n_pos + active - 1) / active;
    const int t0 = n_pos < sp * len ? n_pos : sp * len;
    const int t1 = n_pos < t0 + len ? n_pos : t0 + len;

    const int64_t base = kv.row_index(0, g, 0);
    const uint8_t *kb = kc + base * kv.k_row_bytes(), *vb = vc + base * kv.v_row_bytes();
    const float* koff = k_offsets ? k_offsets + int64_t(g) * hd : nullptr;
    constexpr bool wide = attention_wide<C, NQ, E>();
    constexpr int W = wide ? 8 : E;  // columns a lane holds
    const int c0 = wide ? (lane % (4 * E)) * 8 : lane * E;
    float qr[NQ][W], m[NQ], l[NQ], o[NQ][W];
    load_query<NQ, W>(q + int64_t(h0) * hd, hd, c0, scale, qr, m, l, o);
    if constexpr (wide) {
        constexpr int R = 8 / E;
        warp_attend_wide<NQ, E, attn_k_blocks(C), attn_v_blocks(C)>(ctx, qr, kb, vb, koff, kv, t0 + warp * R, t1,
                                                                    kAttnWarps * R, m, l, o);
        merge_subgroups<NQ, E>(ctx, m, l, o);
    } else {
        static_assert(C == AttnCache::F16, "a cache with a quantized half is read wide");
        warp_attend_typed<NQ, E>(ctx, qr, kb, vb, t0 + warp, t1, kAttnWarps, m, l, o);
    }

    // combine the block's warps through shared memory [warp][NQ][hd + 2]
    float* sm = ctx.shared();
    auto at = [&](int w, int r, int j) -> float& { return sm[(w * NQ + r) * (hd + 2) + j]; };
#pragma unroll
    for (int r = 0; r < NQ; ++r) {
        if (!wide || lane < 4 * E) {  // wide: every subgroup holds the merged state; the first writes it
#pragma unroll
            for (int e = 0; e < W; ++e) at(warp, r, c0 + e) = o[r][e];
        }
        if (lane == 0) {
            at(warp, r, hd) = m[r];
            at(warp, r, hd + 1) = l[r];
        }
    }
    ctx.sync();
    const bool direct = counters && active == 1;
    for (int idx = ctx.thread(); idx < NQ * hd; idx += kAttnThreads) {
        const int r = idx / hd, j = idx % hd;
        float mx = -INFINITY;
        for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, at(w, r, hd));
        float acc = 0.0f, sum = 0.0f;
        if (mx != -INFINITY) {
            for (int w = 0; w < kAttnWarps; ++w) {
                const float f = expf(at(w, r, hd) - mx);
                acc += at(w, r, j) * f;
                sum += at(w, r, hd + 1) * f;
            }
        }
        if (direct) {  // as combine_head: NQ * hd is whole warps with xq, so a warp holds one block of the output
            const int64_t at_out = int64_t(h0 + r) * hd + j;
            out[at_out] = acc / sum;
            if (xq) quantize_act_warp(ctx, acc / sum, j % 32, xq[at_out / 32]);
            continue;
        }
        float* dst = partials + (int64_t(h0 + r) * splits + sp) * (hd + 2);
        dst[j] = acc;
        if (j == 0) {
            dst[hd] = mx;
            dst[hd + 1] = sum;
        }
    }
    if (!counters || direct) return;
    ctx.sync();  // the block's partials are written, and sm is free
    int* last = reinterpret_cast<int*>(sm);
    if (ctx.thread() == 0) {
        ctx.fence();  // the partials are visible to every block before the count says so
        last[0] = ctx.atomic_add(&counters[ctx.block_x()], 1) == active - 1;
        if (last[0]) counters[ctx.block_x()] = 0;  // every split has counted: ready for the next launch
    }
    ctx.sync();
    if (!last[0]) return;
    ctx.fence();
#pragma unroll
    for (int r = 0; r < NQ; ++r) combine_head(ctx, kAttnThreads, partials, splits, active, hd, h0 + r, out, xq);
}

// grid (n_heads / NQ, ceil(n / kAttnWarps)): warp w takes query i = block_y * kAttnWarps + w over positions
// 0 ..= pos0 + i; the block's warps are consecutive queries of one head group and share their K/V reads. An f16
// cache only.
#pragma nv_exec_check_disable
template <int NQ, int E, class Ctx>
KVGEN_HD void attention_prefill_body(const Ctx& ctx, const float* __restrict__ q, const uint8_t* __restrict__ kc,
                                     const uint8_t* __restrict__ vc, const int* __restrict__ d_pos0, int n, int n_heads,
                                     int n_rep, const KvLayout& kv, float scale, float* __restrict__ out) {
    constexpr int hd = 32 * E;
    const int h0 = ctx.block_x() * NQ, g = h0 / n_rep;
    const int i = ctx.block_y() * kAttnWarps + ctx.thread() / 32, lane = ctx.thread() % 32;
    if (i >= n) return;  // the whole warp
    float qr[NQ][E], m[NQ], l[NQ], o[NQ][E];
    const int64_t row = (int64_t(i) * n_heads + h0) * hd;
    load_query<NQ, E>(q + row, hd, lane * E, scale, qr, m, l, o);
    const int64_t base = kv.row_index(0, g, 0);
    // note: f16 only (a quantized cache prefills through flash_attention.cuh).
    warp_attend_typed<NQ, E>(ctx, qr, kc + base * kv.k_row_bytes(), vc + base * kv.v_row_bytes(), 0, *d_pos0 + i + 1, 1,
                             m, l, o);
#pragma unroll
    for (int r = 0; r < NQ; ++r) {
        const float inv = 1.0f / l[r];
#pragma unroll
        for (int e = 0; e < E; ++e) out[row + int64_t(r) * hd + lane * E + e] = o[r][e] * inv;
    }
}

// Any even head_dim up to kAttnGenericMaxHd, for shapes the warp kernels above are not built for (a tiny model's 4):
// item g = (query i, head h) of n x n_heads, one thread walking positions 0 ..= *d_pos0 + i with an online softmax.
// Slow, and only used where nothing else runs. note: never over a quantized cache (kv_quantized_head_dim's head_dims
// have warp kernels), so it knows no key offsets.
constexpr int kAttnGenericMaxHd = 256;

KVGEN_HD void attention_generic_item(int64_t g, const float* __restrict__ q, const uint8_t* __restrict__ kc,
                                     const uint8_t* __restrict__ vc, const int* __restrict__ d_pos0, int n_heads,
                                     int n_rep, const KvLayout& kv, float scale, float* __restrict__ out) {
    const int h = int(g % n_heads), i = int(g / n_heads);
    const int hd = kv.head_dim, kvh = h / n_rep;
    const float* qi = q + g * hd;  // g = i * n_heads + h: rows of [n][n_heads][head_dim]
    float o[kAttnGenericMaxHd];
    for (int j = 0; j < hd; ++j) o[j] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const int n_pos = *d_pos0 + i + 1;
    for (int t = 0; t < n_pos; ++t) {
        const uint8_t* kr = kc + kv.row_index(0, kvh, t) * kv.k_row_bytes();
        const uint8_t* vr = vc + kv.row_index(0, kvh, t) * kv.v_row_bytes();
        auto at = [&](const uint8_t* row, KvType ty, int j) {
            float x[1];
            kv_load<1>(ty, row, j, x);
            return x[0];
        };
        float s = 0.0f;
        for (int j = 0; j < hd; ++j) s = fmaf(qi[j] * scale, at(kr, kv.k_type, j), s);
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
        for (int j = 0; j < hd; ++j) o[j] = fmaf(o[j], corr, p * at(vr, kv.v_type, j));
        m = mn;
    }
    float* oi = out + g * hd;
    for (int j = 0; j < hd; ++j) oi[j] = o[j] / l;
}

// Query heads per block: the largest of 8, 4, 3, 2, 1 that divides n_rep.
inline int heads_per_block(int n_rep) {
    for (int nq : {8, 4, 3, 2, 1})
        if (n_rep % nq == 0) return nq;
    return 1;
}

// Query heads per block of one token's decode over cache kv: heads_per_block, but at most 4 over a cache with a
// quantized half, the most the wide kernel takes (kAttnWide): a group of 8 query heads is then two blocks, each
// reading the KV head's rows (the second mostly from L2, the blocks being neighbours in the grid). (A block of 8
// took a kernel that read a lane's head_dim / 32 columns with a branch on the type around each row's byte loads,
// one row at a time.)
inline int decode_heads_per_block(int n_rep, const KvLayout& kv) {
    const int nq = heads_per_block(n_rep);
    return kv.quantized() && nq > 4 ? 4 : nq;
}

// Calls f(NQ, E) as integral constants for nq query heads a block (heads_per_block's or decode_heads_per_block's) and
// head_dim; false for a head_dim without kernels.
template <typename F>
bool dispatch_attention_heads(int nq, int head_dim, F&& f) {
    auto by_e = [&](auto nq) {
        switch (head_dim) {
            case 32:
                f(nq, std::integral_constant<int, 1>{});
                return true;
            case 64:
                f(nq, std::integral_constant<int, 2>{});
                return true;
            case 96:
                f(nq, std::integral_constant<int, 3>{});
                return true;
            case 128:
                f(nq, std::integral_constant<int, 4>{});
                return true;
            case 256:
                f(nq, std::integral_constant<int, 8>{});
                return true;
            default:
                return false;
        }
    };
    switch (nq) {
        case 8:
            return by_e(std::integral_constant<int, 8>{});
        case 4:
            return by_e(std::integral_constant<int, 4>{});
        case 3:
            return by_e(std::integral_constant<int, 3>{});
        case 2:
            return by_e(std::integral_constant<int, 2>{});
        default:
            return by_e(std::integral_constant<int, 1>{});
    }
}

// The same for n_rep query heads a KV head: heads_per_block(n_rep) a block (the prefill kernels').
template <typename F>
bool dispatch_attention(int n_rep, int head_dim, F&& f) {
    return dispatch_attention_heads(heads_per_block(n_rep), head_dim, std::forward<F>(f));
}

// The same for one token's decode over kv: decode_heads_per_block.
template <typename F>
bool dispatch_decode_attention(int n_rep, const KvLayout& kv, F&& f) {
    return dispatch_attention_heads(decode_heads_per_block(n_rep, kv), kv.head_dim, std::forward<F>(f));
}

}  // namespace kvgen::cuda
