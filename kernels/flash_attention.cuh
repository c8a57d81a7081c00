#pragma once
// Causal attention for prefill on the tensor cores (flash attention): a block takes 64 rows, each a (query, head) pair
// of one KV group (kFaRows / NQ queries of NQ heads that read the same K/V), and walks the cache in tiles of 64
// positions that its four warps share through shared memory. Each warp owns 16 rows: S = Q K^T and O += P V are
// mma.sync m16n8k16 products (f16 operands, f32 accumulation), the softmax is online (running max m, sum l) in
// registers, and tiles past a warp's last query are skipped. (A block of at most 16 rows, a short prompt's, instead
// gives each warp all of them and a quarter of each tile: flash_warp_split, WS in flash_prefill_body.)
//
// Exactness: an f16 cache's K and V are its values as they are. The query, scaled by 1/sqrt(head_dim) log2(e) in f32,
// is split into an f16 high part and an f16 low part (q = hi + lo to about 2^-22), and S is both parts' products
// summed in f32, so the scores keep f32 precision. A quantized cache's values (d * q, a K row's key offset added back)
// are not f16 values: with LO (a cache with a quantized half) the tiles hold each value the same way, as hi + lo, and
// S adds q_hi k_lo, O adds P v_lo, so K and V count to about 2^-22 as well, as the CPU's f32 reads them. P is rounded
// to f16 for P V (each weight within 2^-11 of itself; l, the normalizer, sums the unrounded values).
//
// Written against a thread context, like attention.cuh: on the GPU, DeviceThread::mma is the mma.sync instruction;
// on the host (tests/cuda_support/host_emulation.cu) the warp's fragments are gathered and multiplied as the PTX ISA
// lays them out, so the CPU-only tests check every fragment index against cpu::attention.
//
// Fragments of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"); lane = 4 gid +
// tig. A (16 x 16, row-major) in four f16x2 registers: rows gid (a[0], a[2]) and gid + 8 (a[1], a[3]), columns
// 2 tig + {0, 1} (a[0], a[1]) and 2 tig + 8 + {0, 1} (a[2], a[3]). B (16 x 8) in two: rows 2 tig + {0, 1} (b[0]) and
// 2 tig + 8 + {0, 1} (b[1]), column gid. C (16 x 8 f32) in four: row gid (c[0], c[1]) and gid + 8 (c[2], c[3]),
// columns 2 tig + {0, 1}. The lower-numbered element is the lower half of a register.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/hd.h"
#include "engine/kv_layout.h"
#include "kv_quant.cuh"

namespace kvgen::cuda {

constexpr int kFaWarps = 4;
constexpr int kFaThreads = 32 * kFaWarps;
constexpr int kFaRows = 16 * kFaWarps;  // (query, head) rows per block
constexpr int kFaTile = 64;             // cache positions per tile
// Units of 8 values of a row a thread loads at once in the register path (of its 8 a tile for head_dim 128, 4 for
// 64). sm_90: head_dim 128 221-232 registers, as one at a time; 64 131-141 with two (four would take 166-168 and
// spill), where one at a time took 128-140: over an f16 cache with 2-8 query heads a block 133 against 128, three
// blocks an SM instead of four (unmeasured which is faster). Since the epilogue also quantizes a short prompt's output
// (xq): head_dim 128 200-252, 64 112-157 (157 over a quantized K with 2-8 query heads, still three blocks an SM).
template <int HD, bool LO>
constexpr int kFaUnitBatch = HD >= 128 ? 4 : 2;
constexpr int kFaVStride = kFaTile + 8;  // halves per transposed V row (36 words: fragment reads in 32 banks)
template <int HD>
constexpr int kFaKStride = HD + 8;  // halves per K row in shared memory (HD / 2 + 4 words: no bank conflicts)
// Floats of shared memory a block needs: the K tile [kFaTile][HD + 8] and the transposed V tile [HD][kFaTile + 8], and
// with LO both again for the low parts (head_dim 128: 35,840 bytes, with LO 71,680). ASYNC (an f16 cache, copied
// tile by tile, see flash_prefill_body): two stages of the K tile and the V tile as it is, [kFaTile][HD + 8] each
// (head_dim 128: 69,632 bytes; 64: 36,864).
template <int HD, bool LO = false, bool ASYNC = false>
constexpr int kFaShared =
    ASYNC ? 2 * (kFaTile * kFaKStride<HD>) : (LO ? 2 : 1) * (kFaTile * kFaKStride<HD> + HD * kFaVStride) / 2;

// head_dim values the tensor-core kernel is built for (the rest use attention_prefill_body).
KVGEN_HD bool flash_head_dim(int hd) {
    return hd == 64 || hd == 128;
}
// Query heads per block: the largest power of two up to 8 that divides n_rep.
KVGEN_HD int flash_heads_per_block(int n_rep) {
    return n_rep % 8 == 0 ? 8 : n_rep % 4 == 0 ? 4 : n_rep % 2 == 0 ? 2 : 1;
}
// Whether a launch for n queries with nq heads a block splits each tile's positions among the warps
// (flash_prefill_body's WS): where every block's rows are one warp's 16 (a short prompt: up to 16 tokens of a model
// with one query head a KV head, 4 with four), which would leave the other three warps without work.
KVGEN_HD bool flash_warp_split(int n, int nq) {
    return n * nq <= 16;
}

KVGEN_HD uint32_t half2_bits(__half2 h) {
    uint32_t u;
    memcpy(&u, &h, sizeof(u));
    return u;
}
// Two floats as one f16x2 register, lo in the lower half.
KVGEN_HD uint32_t pack_halves(float lo, float hi) {
    return half2_bits(__floats2half2_rn(lo, hi));
}
KVGEN_HD uint32_t load_u32(const __half* p) {
    uint32_t u;
    memcpy(&u, p, sizeof(u));
    return u;
}

// Values d .. d + 7 (d a multiple of 8) of a cached row as loaded, not yet decoded: an f16 row's 16 bytes, or a
// Q8_0 / Q4_0 row's three words and block scale (kv_block_load). The only branch is the uniform one on the type, and
// it holds loads alone, so a thread has several rows' loads in flight before it decodes the first (kv_raw8_f16).
struct KvRaw8 {
    uint32_t w[4];
};

KVGEN_HD KvRaw8 kv_raw8_load(KvType t, const uint8_t* row, int d) {
    if (t == KvType::F16) {
        check_aligned(row + 2 * d, 16);
        const uint4 u = *reinterpret_cast<const uint4*>(row + 2 * d);
        return {{u.x, u.y, u.z, u.w}};
    }
    const KvBlockRaw r = kv_block_load(kv_block_cols(t, d), row);
    return {{r.w[0], r.w[1], r.w[2], r.scale}};
}

// Those values as eight f16 (a quantized row's d * q, kv_load's values, rounded to f16: within 2^-12 of itself).
// add (a quantized row only; null: none): eight values added before the rounding. lo (null: not wanted): each value
// less its f16, rounded to f16 (exact in f32: hi + lo is the value to about 2^-22 of it; zeros for an f16 row).
KVGEN_HD uint4 kv_raw8_f16(KvType t, int d, const KvRaw8& raw, const float* add = nullptr, uint4* lo = nullptr) {
    if (t == KvType::F16) {
        if (lo) *lo = make_uint4(0, 0, 0, 0);
        return make_uint4(raw.w[0], raw.w[1], raw.w[2], raw.w[3]);
    }
    float f[8];
    kv_block_decode(kv_block_cols(t, d), KvBlockRaw{raw.w[3], {raw.w[0], raw.w[1], raw.w[2]}}, f);
    if (add)
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] += add[e];
    uint32_t w[4], r[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const __half2 h = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
        w[i] = half2_bits(h);
        const float2 back = __half22float2(h);
        r[i] = pack_halves(f[2 * i] - back.x, f[2 * i + 1] - back.y);
    }
    uint4 u;
    memcpy(&u, w, sizeof(u));
    if (lo) memcpy(lo, r, sizeof(*lo));
    return u;
}

// A short prompt over a deep cache has few blocks (n_heads / NQ for up to 64 / NQ queries), so the cache positions
// are split among several blocks (flash-decoding): each takes an equal share of the tiles and writes its rows'
// unnormalized partial results, which a second kernel combines (combine_head, the decode attention's). The split
// count: blocks for at most kFaBlocksPerSm per SM (one wave), at least kFaMinSplitTiles tiles a split, at most
// kFaMaxSplits, and at most kFaSplitBlocks blocks in all (the partials buffer's bound, flash_partials).
// A long prompt over a cache at least as deep as itself has blocks of nearly equal work, and where they are more
// than a wave the last wave runs part-empty: LLaMA-2-13B's 40 heads at 512 tokens are 320 blocks for the 264 places of
// 132 SMs, two waves for 1.21 waves' work (on an H200, pp512 at depth 4096 spent 1.6 times 7B's attention time a
// head and layer, where 7B's 256 blocks are one wave). There the split count is the fewest whose waves per split
// come within kFaWaveSlack of the best the bounds allow (13B at 512 tokens: 4 splits, 1280 blocks in 5 waves).
constexpr int kFaBlocksPerSm = 2;  // at 221-232 registers (head_dim 128, sm_90) two blocks of 128 threads fit an SM
constexpr int kFaMinSplitTiles = 4;
constexpr int kFaMaxSplits = 16;
constexpr int kFaSplitBlocks = 2048;
constexpr float kFaWaveSlack = 1.05f;

// Blocks of a launch before splitting: (n_heads / NQ) x ceil(n / (kFaRows / NQ)).
KVGEN_HD int flash_blocks(int n_heads, int nq, int n) {
    const int bq = kFaRows / nq;
    return n_heads / nq * ((n + bq - 1) / bq);
}
// Splits of the cache positions for n queries at positions pos0 .. pos0 + n - 1 on a device of sm_count SMs.
KVGEN_HD int flash_splits(int n_heads, int n_rep, int n, int pos0, int sm_count) {
    const int blocks = flash_blocks(n_heads, flash_heads_per_block(n_rep), n);
    const int tiles = (pos0 + n + kFaTile - 1) / kFaTile, slots = kFaBlocksPerSm * sm_count;
    int cap = tiles / kFaMinSplitTiles;
    if (cap > kFaMaxSplits) cap = kFaMaxSplits;
    if (cap > kFaSplitBlocks / blocks) cap = kFaSplitBlocks / blocks;
    if (cap <= 1) return 1;
    if (blocks > slots && pos0 >= n) {  // more than a wave of nearly equal blocks: whole waves
        auto waves_per_split = [&](int s) { return float((int64_t(blocks) * s + slots - 1) / slots) / float(s); };
        float best = waves_per_split(1);
        for (int s = 2; s <= cap; ++s) best = fminf(best, waves_per_split(s));
        int s = 1;
        while (waves_per_split(s) > kFaWaveSlack * best) ++s;
        return s;
    }
    const int s = slots / blocks;  // one wave: at most kFaBlocksPerSm blocks per SM
    return s < 1 ? 1 : s < cap ? s : cap;
}
// Floats of partial results a split launch writes at most for a batch of n_batch tokens: [n][n_heads][splits][hd + 2]
// with splits x blocks <= kFaSplitBlocks, so at most kFaSplitBlocks x kFaRows rows in all.
KVGEN_HD int64_t flash_partials(int n_batch, int n_heads, int head_dim) {
    const int64_t rows = int64_t(n_batch) * n_heads * kFaMaxSplits, cap = int64_t(kFaSplitBlocks) * kFaRows;
    return (rows < cap ? rows : cap) * (head_dim + 2);
}

// ASYNC (flash_prefill_body): the tile of an f16 cache's KV head from position t1 (its rows kg, vg, krb and vrb
// bytes apart) into a stage of shared memory, K at kd [kFaTile][KS] and V after it, as they are: a 16-byte copy
// (ctx.copy16_async) for each 8 values of a row, consecutive threads along a row (a warp copies 512 contiguous bytes);
// rows past block_last as zeros (plain stores, published by the same barrier as the copies, so that masked weights
// multiply zeros). The copies are committed as one group.
#pragma nv_exec_check_disable
template <int HD, class Ctx>
KVGEN_HD void flash_copy_tile(const Ctx& ctx, __half* kd, const uint8_t* kg, const uint8_t* vg, int64_t krb,
                              int64_t vrb, int t1, int block_last) {
    constexpr int KS = kFaKStride<HD>;
    __half* const vd = kd + kFaTile * KS;
    for (int u = ctx.thread(); u < kFaTile * HD / 8; u += kFaThreads) {
        const int p = u / (HD / 8), d = 8 * (u % (HD / 8));
        check_aligned(kd + p * KS + d, 16);
        if (t1 + p <= block_last) {
            ctx.copy16_async(kd + p * KS + d, kg + int64_t(t1 + p) * krb + 2 * d);
            ctx.copy16_async(vd + p * KS + d, vg + int64_t(t1 + p) * vrb + 2 * d);
        } else {
            *reinterpret_cast<uint4*>(kd + p * KS + d) = make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4*>(vd + p * KS + d) = make_uint4(0, 0, 0, 0);
        }
    }
    ctx.commit_async();
}

// grid (n_heads / NQ, ceil(n / (kFaRows / NQ)) x splits), kFaThreads threads, kFaShared<HD, LO> floats of shared
// memory. LO: K and V as f16 high and low parts (for a cache with a quantized half; see the top of this file).
// Queries i at positions *d_pos0 + i, each over cache positions 0 ..= its own; q, out [n][n_heads][HD]; scale =
// 1 / sqrt(HD). Row rho of the block is query i0 + rho / NQ of head h0 + rho % NQ. k_offsets: the layer's key offsets
// [n_kv_heads][HD] where K carries them (KvLayout::k_offsets), else null: added back to the K rows from
// kKvOffsetPositions on (engine/kv_offset.h) before they are rounded to f16, so every row of the tile holds k.
// splits > 1: block_y = query block x splits + split; the split takes its share of the tiles its query block reads
// and writes each row's partial result to partials [n][n_heads][splits][HD + 2] (o unnormalized, m, l; m in natural
// log units, as combine_head reads it) instead of out; a split with no tile writes m = -inf, l = 0. xh (not null: a
// short prompt's output projection on split activations): out also written split into xh [2n][n_heads HD] as
// to_f16_split would split it, without its launch (with splits > 1, by combine_head). xq (not null; an integer output
// projection): out also written as the ActBlocks quantize_act makes of it, without its launch (with splits > 1, by
// combine_head).
//
// WS (flash_warp_split: the block's rows are 16 at most): every warp takes those rows and a quarter of each tile's
// positions (16: two n-tiles of S, one k-step of P V), with a running max, sum and output of its own; at the end the
// warps' results meet in shared memory and warp 0 combines them in warp order (each scaled by 2^(its max - the
// largest), as the splits' are), so four warps share the products that one warp would make alone. The tiles are
// loaded and shared as without.
//
// ASYNC (an f16 cache: not with LO; --cuda-flash-pipeline on): the tiles go from the cache to shared memory by
// ctx.copy16_async (cp.async: no registers, no transposing stores), V as it is ([position][d]), in two stages: while
// the warps multiply tile t, tile t + 1's copies are on their way into the other stage, and one barrier a tile (not
// two) both publishes a tile and frees the stage it is then copied over. The B fragments come by
// ctx.ldmatrix_x4 (ldmatrix: four 8 x 8 matrices a lane's instruction; V's with .trans, which makes the transposed
// tile's fragments of it), one instruction for what took four 32-bit loads. The same fragments into the same mma
// products in the same order: the same bits as without.
#pragma nv_exec_check_disable
template <int HD, int NQ, bool LO, class Ctx, bool ASYNC = false, bool WS = false>
KVGEN_HD void flash_prefill_body(const Ctx& ctx, const float* __restrict__ q, const uint8_t* __restrict__ kc,
                                 const uint8_t* __restrict__ vc, const float* __restrict__ k_offsets,
                                 const int* __restrict__ d_pos0, int n, int n_heads, int n_rep, const KvLayout& kv,
                                 float scale, float* __restrict__ out, int splits = 1,
                                 float* __restrict__ partials = nullptr, __half* __restrict__ xh = nullptr,
                                 ActBlock* __restrict__ xq = nullptr) {
    constexpr int KS = kFaKStride<HD>, VS = kFaVStride;
    constexpr int DK = HD / 16;       // k-steps of Q K^T
    constexpr int DN = HD / 8;        // n-tiles of O
    constexpr int NT = kFaTile / 8;   // n-tiles of S
    constexpr int BQ = kFaRows / NQ;  // queries per block
    constexpr float kLog2e = 1.4426950408889634f;
    static_assert(!(ASYNC && LO), "tiles copied as they are: an f16 cache");
    static_assert(!ASYNC || (DK % 2 == 0 && DN % 2 == 0), "ldmatrix_x4: fragments two at a time");
    // The n-tiles of S a warp takes a tile (WS: its quarter of the positions) and its 16 rows' place in the block.
    constexpr int NTW = WS ? NT / kFaWarps : NT;
    static_assert(NTW % 2 == 0 && NTW * kFaWarps >= NT, "whole k-steps of P V a warp");
    static_assert(!WS || kFaWarps * 16 * (HD + 2) <= kFaShared<HD, LO, ASYNC>, "the warps' results in shared memory");
    __half* ks = reinterpret_cast<__half*>(ctx.shared());
    __half* vts = ks + kFaTile * KS;
    __half* kls = vts + HD * VS;  // with LO: the low parts' tiles, laid out as the high parts'
    __half* vtls = kls + kFaTile * KS;
    constexpr int kStage = 2 * kFaTile * KS;  // ASYNC: halves of a stage, K [kFaTile][KS] then V [kFaTile][KS]

    const int tid = ctx.thread(), warp = tid / 32, lane = tid % 32, gid = lane >> 2, tig = lane & 3;
    const int wr = WS ? 0 : warp, jw = WS ? NTW * warp : 0;  // the warp's rows 16 wr .., its first n-tile of S
    const int h0 = ctx.block_x() * NQ, g = h0 / n_rep;
    const int sp = ctx.block_y() % splits, i0 = ctx.block_y() / splits * BQ;
    const int pos0 = *d_pos0;
    const int i_end = n < i0 + BQ ? n : i0 + BQ;
    const int block_last = pos0 + i_end - 1;  // the last cache position any row of the block reads
    // This split's tiles of the block's: [t_begin, t_end) in positions
    const int tiles = block_last / kFaTile + 1, share = (tiles + splits - 1) / splits;
    const int t_begin = sp * share * kFaTile;
    const int t_end = (sp + 1) * share < tiles ? (sp + 1) * share * kFaTile : tiles * kFaTile;
    // The warp's rows: queries i0 + 16 warp / NQ ..= i0 + (16 warp + 15) / NQ (past n: computed as n - 1, not stored;
    // a warp with no query below n skips every tile).
    const int wq0 = i0 + 16 * wr / NQ, wq1 = i0 + (16 * wr + 15) / NQ;
    const int warp_first = pos0 + (wq0 < n ? wq0 : n - 1);
    const int warp_last = wq0 < n ? pos0 + (wq1 < n ? wq1 : n - 1) : -1;

    // This lane's two rows (gid and gid + 8 of the warp's 16).
    int qi[2], hh[2], limit[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int rho = 16 * wr + gid + 8 * r;
        qi[r] = i0 + rho / NQ;
        hh[r] = h0 + rho % NQ;
        limit[r] = pos0 + (qi[r] < n ? qi[r] : n - 1);
    }

    // KV head g's rows, one row's bytes apart, in the cache's types
    const int64_t krb = kv.k_row_bytes(), vrb = kv.v_row_bytes();
    const uint8_t* kg = kc + kv.row_index(0, g, 0) * krb;
    const uint8_t* vg = vc + kv.row_index(0, g, 0) * vrb;
    const float* koff = k_offsets ? k_offsets + int64_t(g) * HD : nullptr;
    if constexpr (ASYNC) {  // the first tile's copies on their way while Q is loaded
        if (t_begin < t_end) flash_copy_tile<HD>(ctx, ks, kg, vg, krb, vrb, t_begin, block_last);
    }

    // Q as A fragments, high and low f16 parts, scaled so that exp2 of a score is its softmax weight.
    const float qs = scale * kLog2e;
    uint32_t qh[DK][4], ql[DK][4];
#pragma unroll
    for (int kk = 0; kk < DK; ++kk)
#pragma unroll
        for (int reg = 0; reg < 4; ++reg) {
            const int r = reg & 1, d = 16 * kk + 2 * tig + (reg >= 2 ? 8 : 0);
            const int qrow = limit[r] - pos0;
            const float* qp = q + (int64_t(qrow) * n_heads + hh[r]) * HD + d;
            const float a = qp[0] * qs, b = qp[1] * qs;
            const __half ha = __float2half_rn(a), hb = __float2half_rn(b);
            qh[kk][reg] = half2_bits(__halves2half2(ha, hb));
            ql[kk][reg] = pack_halves(a - __half2float(ha), b - __half2float(hb));
        }

    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's part of the row sum
    float o[DN][4];
#pragma unroll
    for (int nt = 0; nt < DN; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[nt][e] = 0.0f;

    for (int t0 = t_begin, st = 0; t0 < t_end; t0 += kFaTile, st ^= 1) {
        if constexpr (ASYNC) {
            // Tile t0's copies (the one group outstanding) waited for, then one barrier: every thread's copies of it
            // are in stage st for all, and every warp has left the other stage (its products of the tile before),
            // into which tile t0 + kFaTile is copied while the warps multiply this one.
            ctx.template wait_async_group<0>();
            ctx.sync();
            if (t0 + kFaTile < t_end)
                flash_copy_tile<HD>(ctx, ks + (st ^ 1) * kStage, kg, vg, krb, vrb, t0 + kFaTile, block_last);
        } else {
            // The tile: K as [position][d], V transposed to [d][position] (B fragments of both are then one 32-bit
            // load); positions past block_last as zeros, so that masked weights multiply zeros. A warp's 32 lanes take
            // 16 consecutive positions of 16 dimensions (two lanes a row's 32-byte sector): each transposed V store
            // then fills 8 consecutive words in two rows of the tile, a 2-way bank conflict (lanes taking a row's
            // dimensions, as for K, would hit one bank 8- or 16-way), and each 8 lanes' K stores, HD / 2 + 4 words
            // apart, cover the 32 banks.
            // A thread's units (8 values of a row) come kFaUnitBatch<HD, LO> at a time: every unit's K and V loads
            // first (kv_raw8_load), then their values into the tile, so that a tile costs kUnits / kFaUnitBatch<HD, LO>
            // round trips to memory a thread instead of kUnits. (LO false: an f16 cache, whatever kv says.)
            constexpr int kUnits = kFaTile * HD / 8 / kFaThreads, PG = kFaTile / 16;  // PG: groups of 16 positions
            static_assert(kUnits * kFaThreads == kFaTile * HD / 8 && kUnits % kFaUnitBatch<HD, LO> == 0,
                          "every unit of the tile, in whole batches");
            const KvType kt = LO ? kv.k_type : KvType::F16, vt = LO ? kv.v_type : KvType::F16;
#pragma unroll 1
            for (int b0 = 0; b0 < kUnits; b0 += kFaUnitBatch<HD, LO>) {
                KvRaw8 kr[kFaUnitBatch<HD, LO>], vr[kFaUnitBatch<HD, LO>];
#pragma unroll
                for (int j = 0; j < kFaUnitBatch<HD, LO>; ++j) {
                    const int u = tid + (b0 + j) * kFaThreads, c = u / 32;
                    const int p = 16 * (c % PG) + u % 16, d = 8 * (2 * (c / PG) + u % 32 / 16);
                    kr[j] = vr[j] = KvRaw8{{0u, 0u, 0u, 0u}};  // past block_last: not used
                    if (t0 + p <= block_last) {
                        kr[j] = kv_raw8_load(kt, kg + int64_t(t0 + p) * krb, d);
                        vr[j] = kv_raw8_load(vt, vg + int64_t(t0 + p) * vrb, d);
                    }
                }
#pragma unroll
                for (int j = 0; j < kFaUnitBatch<HD, LO>; ++j) {
                    const int u = tid + (b0 + j) * kFaThreads, c = u / 32;
                    const int p = 16 * (c % PG) + u % 16, d = 8 * (2 * (c / PG) + u % 32 / 16);
                    uint4 k4 = make_uint4(0, 0, 0, 0), v4 = k4, kl4 = k4, vl4 = k4;  // past block_last: zeros
                    if (t0 + p <= block_last) {
                        k4 = kv_raw8_f16(kt, d, kr[j], koff && t0 + p >= kKvOffsetPositions ? koff + d : nullptr,
                                         LO ? &kl4 : nullptr);
                        v4 = kv_raw8_f16(vt, d, vr[j], nullptr, LO ? &vl4 : nullptr);
                    }
                    check_aligned(ks + p * KS + d, 16);
                    *reinterpret_cast<uint4*>(ks + p * KS + d) = k4;
                    __half vh[8];
                    memcpy(vh, &v4, sizeof(vh));
#pragma unroll
                    for (int e = 0; e < 8; ++e) vts[(d + e) * VS + p] = vh[e];
                    if constexpr (LO) {
                        *reinterpret_cast<uint4*>(kls + p * KS + d) = kl4;
                        memcpy(vh, &vl4, sizeof(vh));
#pragma unroll
                        for (int e = 0; e < 8; ++e) vtls[(d + e) * VS + p] = vh[e];
                    }
                }
            }
            ctx.sync();
        }
        if (t0 <= warp_last) {  // the same for the whole warp
            [[maybe_unused]] const __half* const kst = ks + st * kStage;  // ASYNC: this tile's stage
            [[maybe_unused]] const __half* const vst = kst + kFaTile * KS;
            float s[NTW][4];  // n-tile jw + j of the tile's S
#pragma unroll
            for (int jj = 0; jj < NTW; ++jj) {
                const int j = jw + jj;
#pragma unroll
                for (int e = 0; e < 4; ++e) s[jj][e] = 0.0f;
                if constexpr (ASYNC) {
                    // k-steps kk and kk + 1 of n-tile j: matrices of positions 8 j .. 8 j + 7 and dimensions 16 kk,
                    // 16 kk + 8, 16 kk + 16, 16 kk + 24; lane 8 m + i gives row i of matrix m.
#pragma unroll
                    for (int kk = 0; kk < DK; kk += 2) {
                        uint32_t r[4];
                        ctx.template ldmatrix_x4<false>(r, kst + (8 * j + (lane & 7)) * KS + 16 * kk + 8 * (lane >> 3));
                        const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                        ctx.mma(s[jj], qh[kk], b0);
                        ctx.mma(s[jj], ql[kk], b0);
                        ctx.mma(s[jj], qh[kk + 1], b1);
                        ctx.mma(s[jj], ql[kk + 1], b1);
                    }
                } else {
#pragma unroll
                    for (int kk = 0; kk < DK; ++kk) {
                        const __half* kp = ks + (8 * j + gid) * KS + 16 * kk + 2 * tig;
                        const uint32_t b[2] = {load_u32(kp), load_u32(kp + 8)};
                        ctx.mma(s[jj], qh[kk], b);
                        ctx.mma(s[jj], ql[kk], b);
                        if constexpr (LO) {
                            const __half* klp = kls + (8 * j + gid) * KS + 16 * kk + 2 * tig;
                            const uint32_t bl[2] = {load_u32(klp), load_u32(klp + 8)};
                            ctx.mma(s[jj], qh[kk], bl);
                        }
                    }
                }
            }
            if (t0 + kFaTile - 1 > warp_first) {  // the diagonal: positions past a row's own are masked
#pragma unroll
                for (int jj = 0; jj < NTW; ++jj)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (t0 + 8 * (jw + jj) + 2 * tig + (e & 1) > limit[e >> 1]) s[jj][e] = -INFINITY;
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < NTW; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
                mx = ctx.quad_max(mx);  // the four lanes of a row
                const float mn = fmaxf(m[r], mx);
                const float ref = mn == -INFINITY ? 0.0f : mn;
                const float corr = exp2f(m[r] - ref);
                m[r] = mn;
                l[r] *= corr;
#pragma unroll
                for (int nt = 0; nt < DN; ++nt) {
                    o[nt][2 * r] *= corr;
                    o[nt][2 * r + 1] *= corr;
                }
#pragma unroll
                for (int j = 0; j < NTW; ++j)
#pragma unroll
                    for (int e = 2 * r; e < 2 * r + 2; ++e) {
                        s[j][e] = exp2f(s[j][e] - ref);
                        l[r] += s[j][e];
                    }
            }
            // O += P V: P's C fragments of two n-tiles are the A fragment of one k-step (the tile's k-step kp).
#pragma unroll
            for (int kk = 0; kk < NTW / 2; ++kk) {
                const int kp = jw / 2 + kk;
                const uint32_t a[4] = {pack_halves(s[2 * kk][0], s[2 * kk][1]), pack_halves(s[2 * kk][2], s[2 * kk][3]),
                                       pack_halves(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                       pack_halves(s[2 * kk + 1][2], s[2 * kk + 1][3])};
                if constexpr (ASYNC) {
                    // n-tiles nt and nt + 1: matrices of positions 16 kk .. + 7 and 16 kk + 8 .. + 15 at dimensions
                    // 8 nt and 8 nt + 8, transposed (B is V's [position][d] tile read down its columns).
#pragma unroll
                    for (int nt = 0; nt < DN; nt += 2) {
                        uint32_t r[4];
                        ctx.template ldmatrix_x4<true>(
                            r, vst + (16 * kp + 8 * ((lane >> 3) & 1) + (lane & 7)) * KS + 8 * nt + 8 * (lane >> 4));
                        const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                        ctx.mma(o[nt], a, b0);
                        ctx.mma(o[nt + 1], a, b1);
                    }
                } else {
#pragma unroll
                    for (int nt = 0; nt < DN; ++nt) {
                        const __half* vp = vts + (8 * nt + gid) * VS + 16 * kp + 2 * tig;
                        const uint32_t b[2] = {load_u32(vp), load_u32(vp + 8)};
                        ctx.mma(o[nt], a, b);
                        if constexpr (LO) {
                            const __half* vlp = vtls + (8 * nt + gid) * VS + 16 * kp + 2 * tig;
                            const uint32_t bl[2] = {load_u32(vlp), load_u32(vlp + 8)};
                            ctx.mma(o[nt], a, bl);
                        }
                    }
                }
            }
        }
        if constexpr (!ASYNC) ctx.sync();  // the tile is read before the next one overwrites it
    }
    float sum[2];  // the rows' sums of weights
#pragma unroll
    for (int r = 0; r < 2; ++r) sum[r] = ctx.quad_sum(l[r]);
    if constexpr (WS) {
        // Each warp's rows (max, sum, output) into shared memory, [warp][row][HD + 2], once every warp is past its
        // last tile (with ASYNC no copy is left: the last tile's was waited for, and none issued after it); then
        // warp 0 adds them up in warp order and stores the rows as a warp of the other path does.
        float* const red = ctx.shared();
        ctx.sync();
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float* rp = red + (warp * 16 + gid + 8 * r) * (HD + 2);
#pragma unroll
            for (int nt = 0; nt < DN; ++nt) {
                rp[8 * nt + 2 * tig] = o[nt][2 * r];
                rp[8 * nt + 2 * tig + 1] = o[nt][2 * r + 1];
            }
            if (tig == 0) {
                rp[HD] = m[r];
                rp[HD + 1] = sum[r];
            }
        }
        ctx.sync();
        if (warp != 0) return;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float* rp = red + (gid + 8 * r) * (HD + 2);
            constexpr int kW = 16 * (HD + 2);  // floats from one warp's rows to the next's
            float mx = -INFINITY;
            for (int w = 0; w < kFaWarps; ++w) mx = fmaxf(mx, rp[w * kW + HD]);
            float f[kFaWarps], total = 0.0f;
#pragma unroll
            for (int w = 0; w < kFaWarps; ++w) {
                const float mw = rp[w * kW + HD];
                f[w] = mw == -INFINITY ? 0.0f : exp2f(mw - mx);  // a warp none of whose positions the row reads: 0
                total += rp[w * kW + HD + 1] * f[w];
            }
#pragma unroll
            for (int nt = 0; nt < DN; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float v = 0.0f;
#pragma unroll
                    for (int w = 0; w < kFaWarps; ++w) v += rp[w * kW + 8 * nt + 2 * tig + e] * f[w];
                    o[nt][2 * r + e] = v;
                }
            m[r] = mx;
            sum[r] = total;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const bool row = qi[r] < n;  // (the lanes of the row go on without it for xq's shuffles)
        if (splits > 1) {
            if (!row) continue;
            float* pp = partials + ((int64_t(qi[r]) * n_heads + hh[r]) * splits + sp) * (HD + 2);
#pragma unroll
            for (int nt = 0; nt < DN; ++nt) {
                pp[8 * nt + 2 * tig] = o[nt][2 * r];
                pp[8 * nt + 2 * tig + 1] = o[nt][2 * r + 1];
            }
            if (tig == 0) {
                pp[HD] = m[r] == -INFINITY ? -INFINITY : m[r] * 0.6931471805599453f;  // 2^m = e^(m ln 2)
                pp[HD + 1] = sum[r];
            }
            continue;
        }
        const float inv = 1.0f / sum[r];
        const int64_t at = (int64_t(qi[r]) * n_heads + hh[r]) * HD + 2 * tig;
        if (row) {
            float* op = out + at;
#pragma unroll
            for (int nt = 0; nt < DN; ++nt) {
                const float a = o[nt][2 * r] * inv, b = o[nt][2 * r + 1] * inv;
                op[8 * nt] = a;
                op[8 * nt + 1] = b;
                if (xh) {  // the output projection's split input (f16_split_store)
                    f16_split_store(a, at + 8 * nt, int64_t(n) * n_heads * HD, xh);
                    f16_split_store(b, at + 8 * nt + 1, int64_t(n) * n_heads * HD, xh);
                }
            }
        }
        if (xq) {
            // The output projection's integer input, quantize_act_item's blocks: block g of the row is columns
            // 32 g .. + 31, n-tiles 4 g .. 4 g + 3, whose 8 values a lane holds for its tig; the row's 4 lanes (tig
            // 0-3, lane ^ 1 and ^ 2) find the largest magnitude and the two halves' sums (n-tiles 4 g, 4 g + 1 and
            // 4 g + 2, 4 g + 3) by shuffles, exact in any order (a row past n: zeros, nothing written).
#pragma unroll
            for (int g = 0; g < DN / 4; ++g) {
                float amax = 0.0f;
#pragma unroll
                for (int t = 0; t < 4; ++t)
#pragma unroll
                    for (int e = 0; e < 2; ++e) amax = row ? fmaxf(amax, fabsf(o[4 * g + t][2 * r + e] * inv)) : 0.0f;
                amax = fmaxf(amax, ctx.shfl_xor(amax, 1));
                amax = fmaxf(amax, ctx.shfl_xor(amax, 2));
                const float d = act_scale(amax), id = act_inverse_scale(d);
                ActBlock* blk = row ? xq + (at - 2 * tig) / 32 + g : nullptr;
                float h[2] = {0.0f, 0.0f};
#pragma unroll
                for (int t = 0; t < 4; ++t)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int qv = row ? act_quant(o[4 * g + t][2 * r + e] * inv, id) : 0;
                        h[t / 2] += float(qv);
                        if (row) blk->q[8 * t + 2 * tig + e] = int16_t(qv);
                    }
#pragma unroll
                for (int k = 0; k < 2; ++k) h[k] += ctx.shfl_xor(h[k], 1);
#pragma unroll
                for (int k = 0; k < 2; ++k) h[k] += ctx.shfl_xor(h[k], 2);
                if (row && tig == 0) {
                    blk->d = d;
                    blk->s = int(h[0]) + int(h[1]);
                    blk->h[0] = int(h[0]);
                    blk->h[1] = int(h[1]);
                }
            }
        }
    }
}

// Calls f(HD, NQ) as integral constants; false for a head_dim the kernel is not built for.
template <typename F>
bool dispatch_flash(int n_rep, int head_dim, F&& f) {
    auto by_nq = [&](auto hd) {
        switch (flash_heads_per_block(n_rep)) {
            case 8:
                f(hd, std::integral_constant<int, 8>{});
                break;
            case 4:
                f(hd, std::integral_constant<int, 4>{});
                break;
            case 2:
                f(hd, std::integral_constant<int, 2>{});
                break;
            default:
                f(hd, std::integral_constant<int, 1>{});
        }
        return true;
    };
    if (head_dim == 64) return by_nq(std::integral_constant<int, 64>{});
    if (head_dim == 128) return by_nq(std::integral_constant<int, 128>{});
    return false;
}

}  // namespace kvgen::cuda
