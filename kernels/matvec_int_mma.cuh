#pragma once
// The integer products of a short prompt (2 to kImBatchTokens tokens) on the tensor cores (--cuda-matvec-mma on, sm_80
// and later), for Q4_0, Q8_0, Q4_K and Q6_K weights: the CUDA-core products' operands (matvec_int.cuh: the weights' own
// blocks and the tokens' 16-bit activation blocks, ActBlock) and integer dots, but 16 rows x 8 tokens of a block's dots
// in two mma.sync m16n8k32 (DeviceThread::mma_i8) instead of a lane's __dp2a per row and token. A 16-bit activation q
// is 256 hi + lo, hi its high byte (signed) and lo its low byte (unsigned), so a block's dot sum_j w_j q_j is
// 256 sum_j w_j hi_j + sum_j w_j lo_j: two products of bytes, each exact in s32, and their sum the same integer.
// A Q4_0 or Q8_0 block's term is then the CUDA-core product's, fmaf(d_w d_x, float(dot), acc), the same bits, and only
// the order in which a row's blocks are added differs (here: a warp's units in turn, then the warps in order); a Q4_K
// sub-block's term is unit_dot's arithmetic for one whole sub-block, where the CUDA cores take a unit of two halves,
// and a Q6_K block's two halves of 16 values (each its own scale) are two products of their own, the other half's
// columns zero.
//
// A block of kImWarps warps owns 32 rows of one matrix (16 of each of gate and up with GLU) for one group of up to 16
// tokens (one or two tiles of 8; Q6_K 8: int_mma_tokens); a launch takes up to kImBatchTokens tokens, its groups the
// grid's x and its row blocks its y, so that the blocks of a row block run one after another and the groups after the
// first read its weights from L2 rather than DRAM, and with several groups a block owns two such sets of rows, 4 warps
// each, which share the activations' loads through L1 (int_mma_plan). The block's (set's) warps take turns along the
// row, kImUnits consecutive units (blocks of 32 weights) a warp at a time, all of a turn's weight and scale loads
// issued first, each unit's activations loaded while the unit before it is multiplied, and the warps' sums meet in
// shared memory at the end. Weights: lane 4 gid + tig reads bytes 4 tig .. + 3 of rows gid and gid + 8 of each
// 16-row tile, which are mma's A fragments as the planar layout (weight_layout.h) stores them: Q4_0's low nibbles are
// columns 4 tig .. + 3 and its high ones 16 + 4 tig .. + 3; Q8_0's bytes 4 tig .. and 16 + 4 tig ..; a Q4_K pair of
// sub-blocks 2 p and 2 p + 1 is the low and the high nibbles of the same 32 bytes (4 tig .. and 16 + 4 tig ..).
// Activations: token 8 t + gid's values 4 tig .. + 3 and 16 + 4 tig .. of the unit's block (two 8-byte loads), split
// into bytes by two byte permutes each: B fragments. Rows past the matrix read its last row, tokens past the group's
// its last token, and neither is stored. Written against a thread context (DeviceThread, or the host emulation's,
// tests/cuda_support/host_emulation.cu).
#include <cstdint>
#include <type_traits>

#include "common/hd.h"
#include "elementwise.cuh"
#include "matvec_int.cuh"

namespace kvgen::cuda {

constexpr int kImWarps = 8;  // warps a block
constexpr int kImUnits = 4;  // consecutive units a warp's turn
constexpr int kImRows = 32;  // rows a block (of each of gate and up with GLU: kImRows / 2)
constexpr int kImTiles = 2;  // 16-row tiles a warp: kImRows / 16
constexpr int kImMaxTokens = kMvMaxTokens;  // tokens a block takes at most
constexpr int kImBatchTokens = 64;          // tokens a launch takes at most: up to 4 groups of 16 (Q6_K: 8 of 8)
constexpr int kImMaxGroups = kImBatchTokens / 8;  // groups of tokens a launch has at most (Q6_K's 8 of 8)
static_assert(kImRows == 16 * kImTiles && kImMaxTokens == 16, "two 16-row tiles, up to two 8-token tiles");

KVGEN_HD constexpr bool int_mma_type(GgmlType t) {
    return t == GgmlType::Q4_0 || t == GgmlType::Q8_0 || t == GgmlType::Q4_K || t == GgmlType::Q6_K;
}
// Tokens a block takes at most: 16 (two tiles of 8), but Q6_K 8, whose 16-token kernel held too much in its registers
// (sm_90: 136-168 bytes spilled), so that its groups of 8 tokens read the weights twice as often (from L2 after the
// first: int_mma_plan).
KVGEN_HD constexpr int int_mma_tokens(GgmlType t) {
    return t == GgmlType::Q6_K ? 8 : kImMaxTokens;
}
// The one launch of an n-token product (2 <= n <= kImBatchTokens) of type T on the tensor cores: groups of
// group_tokens tokens (the last one shorter), block (g, b) taking group g's tokens for row block b, whose rows are
// sets x int_mma_block_rows: 2 sets where there are several groups (so L2 carries each group's activations once per
// 64 rows; a single group keeps blocks of 32 rows, twice the blocks for the SMs).
struct ImPlan {
    int group_tokens, groups, sets;
};
template <GgmlType T>
constexpr ImPlan int_mma_plan(int n) {
    const int g = n < int_mma_tokens(T) ? n : int_mma_tokens(T), groups = (n + g - 1) / g;
    return ImPlan{g, groups, groups > 1 ? 2 : 1};
}
// Calls f(std::integral_constant<int, NTT>{}, plan) for that launch, NTT the 8-token tiles of a group.
template <GgmlType T, typename F>
void int_mma_launch_of(int n, F&& f) {
    const ImPlan p = int_mma_plan<T>(n);
    if constexpr (int_mma_tokens(T) > 8) {
        if (p.group_tokens > 8) {
            f(std::integral_constant<int, 2>{}, p);
            return;
        }
    }
    f(std::integral_constant<int, 1>{}, p);
}
// Output rows a block owns.
KVGEN_HD constexpr int int_mma_block_rows(bool glu) {
    return glu ? kImRows / 2 : kImRows;
}
// Floats of shared memory a block of NTT 8-token tiles uses: every warp's sums.
KVGEN_HD constexpr int int_mma_shared(int ntt) {
    return kImWarps * kImRows * 8 * ntt;
}

// 8 bytes at an 8-byte aligned address, in one load.
KVGEN_HD uint2 ld8(const uint8_t* p) {
    check_aligned(p, 8);
#if defined(__CUDA_ARCH__)
    return __ldg(reinterpret_cast<const uint2*>(p));
#else
    uint2 v;
    memcpy(&v, p, 8);
    return v;
#endif
}
// Bytes of a and b picked by selector s (__byte_perm: nibble k of s names byte k of the result, 0-3 a's, 4-7 b's).
KVGEN_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
    return __byte_perm(a, b, s);
#else
    const uint64_t v = uint64_t(a) | (uint64_t(b) << 32);
    uint32_t r = 0;
    for (int k = 0; k < 4; ++k) r |= uint32_t((v >> (8 * ((s >> (4 * k)) & 7u))) & 0xffu) << (8 * k);
    return r;
#endif
}
// Four int16 values (two words, value 2 p low in word p) as their high bytes (signed) and low bytes (unsigned).
KVGEN_HD void split_act_bytes(uint2 q, uint32_t& hi, uint32_t& lo) {
    hi = byte_perm(q.x, q.y, 0x7531u);
    lo = byte_perm(q.x, q.y, 0x6420u);
}

// A warp's weights of one step for one 16-row tile (rows lo and lo + 8, the lane's two row pointers), loaded
// (int_mma_load) before any is used: a step is one unit of Q4_0 or Q8_0 (ImStep::units 1: the A fragment and the
// two rows' block scales), a pair of Q4_K sub-blocks 2 p and 2 p + 1 (units 2), which the same quant bytes hold
// (low and high nibbles), with the same scale word and the super-block's d and dmin, or half a Q6_K super-block
// (units 4: its quarters share their bytes of ql in pairs and of qh all four, and its 8 scales). int_mma_a gives the
// A fragments of unit k of the step, one for each of its parts (ImStep::parts): a Q6_K unit's two halves of 16 values
// have scales of their own, so each is a product of its own, the other half's columns zero. int_mma_add adds the
// parts' C elements (row lo + 8 hi, dots c) for a token (TokScale: its block's d, sum of q and the halves' sums) to
// acc.
template <GgmlType T>
struct ImStep {
    static constexpr int units = 1, parts = 1;
    uint32_t a[4];
    uint16_t d[2];
};
template <>
struct ImStep<GgmlType::Q4_K> {
    static constexpr int units = 2, parts = 1;
    uint32_t q[2][2];  // [row lo, lo + 8][bytes 32 p + 4 tig .., 32 p + 16 + 4 tig ..]
    uint32_t sm[2];    // the pair's scales and mins (sc[2p], sc[2p + 1], m[2p], m[2p + 1]), each row
    uint32_t dd[2];    // the super-block's d and dmin, each row
};
template <>
struct ImStep<GgmlType::Q6_K> {
    static constexpr int units = 4, parts = 2;
    uint32_t ql[2][4];  // [row][ql bytes 64 h + 16 i + 4 tig .., i = 0..3] (h: the half of the super-block)
    uint32_t qh[2][2];  // [row][qh bytes 32 h + 16 i + 4 tig .., i = 0..1]
    uint32_t sc[2][2];  // [row][the half's 8 int8 scales, 4 a word]
    uint16_t d[2];
};
// A token's activation block as the products meet it: its scale, its sum of q and the sums of its two halves.
struct TokScale {
    float d;
    int s, h0, h1;
};

template <GgmlType T>
KVGEN_HD void int_mma_load(const uint8_t* row_lo, const uint8_t* row_hi, int u, int n_units, int tig, ImStep<T>& w) {
    if constexpr (T == GgmlType::Q4_0) {
        const uint32_t ql = ld_u32(row_lo + 16 * u + 4 * tig), qh = ld_u32(row_hi + 16 * u + 4 * tig);
        // note: the nibbles go in unsigned (0..15), as unit_dot's; the offset of 8 comes back through the sums of q
        w.a[0] = ql & 0x0f0f0f0fu;
        w.a[1] = qh & 0x0f0f0f0fu;
        w.a[2] = (ql >> 4) & 0x0f0f0f0fu;
        w.a[3] = (qh >> 4) & 0x0f0f0f0fu;
        w.d[0] = ld_u16(row_lo + 16 * n_units + 2 * u);
        w.d[1] = ld_u16(row_hi + 16 * n_units + 2 * u);
    } else if constexpr (T == GgmlType::Q8_0) {
        w.a[0] = ld_u32(row_lo + 32 * u + 4 * tig);
        w.a[1] = ld_u32(row_hi + 32 * u + 4 * tig);
        w.a[2] = ld_u32(row_lo + 32 * u + 16 + 4 * tig);
        w.a[3] = ld_u32(row_hi + 32 * u + 16 + 4 * tig);
        w.d[0] = ld_u16(row_lo + 32 * n_units + 2 * u);
        w.d[1] = ld_u16(row_hi + 32 * n_units + 2 * u);
    } else if constexpr (T == GgmlType::Q4_K) {
        const int sb = u / 8, p = (u % 8) / 2, n_super = n_units / 8;  // u even: sub-blocks u % 8 and the next
        const uint8_t* const rows2[2] = {row_lo, row_hi};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint8_t* qs = rows2[h] + 128 * sb + 32 * p + 4 * tig;
            w.q[h][0] = ld_u32(qs);
            w.q[h][1] = ld_u32(qs + 16);
            w.sm[h] = ld_u32(rows2[h] + q4k_scales_at(n_super) + 16 * sb + 4 * p);
            w.dd[h] = ld_u32(rows2[h] + q4k_d_at(n_super) + 4 * sb);
        }
    } else {
        static_assert(T == GgmlType::Q6_K, "Q4_0, Q8_0, Q4_K and Q6_K");
        const int sb = u / 8, h = (u % 8) / 4, n_super = n_units / 8;  // u a multiple of 4: quarters 0..3 of half h
        const uint8_t* const rows2[2] = {row_lo, row_hi};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint8_t* b = rows2[r] + 192 * sb;
#pragma unroll
            for (int i = 0; i < 4; ++i) w.ql[r][i] = ld_u32(b + 64 * h + 16 * i + 4 * tig);
#pragma unroll
            for (int i = 0; i < 2; ++i) w.qh[r][i] = ld_u32(b + 128 + 32 * h + 16 * i + 4 * tig);
            const uint8_t* sc = rows2[r] + 192 * n_super + 16 * sb + 8 * h;
            w.sc[r][0] = ld_u32(sc);
            w.sc[r][1] = ld_u32(sc + 4);
            w.d[r] = ld_u16(rows2[r] + 208 * n_super + 2 * sb);
        }
    }
}

template <GgmlType T>
KVGEN_HD void int_mma_a(const ImStep<T>& w, int k, uint32_t (&a)[ImStep<T>::parts][4]) {
    if constexpr (T == GgmlType::Q4_K) {  // sub-block 2 p + k: the low (k = 0) or high nibbles
        a[0][0] = (w.q[0][0] >> (4 * k)) & 0x0f0f0f0fu;
        a[0][1] = (w.q[1][0] >> (4 * k)) & 0x0f0f0f0fu;
        a[0][2] = (w.q[0][1] >> (4 * k)) & 0x0f0f0f0fu;
        a[0][3] = (w.q[1][1] >> (4 * k)) & 0x0f0f0f0fu;
    } else if constexpr (T == GgmlType::Q6_K) {
        // quarter k's values 16 p + 4 tig .. + 3 (part p), 0..63 unsigned: ql bytes 32 (k % 2) + 16 p + 4 tig .., the
        // low nibbles for k < 2, the high ones after; qh bytes 16 p + 4 tig .., bits 2 k and 2 k + 1 (the offset of 32
        // comes back through the halves' sums of q, as in unit_dot)
        uint32_t v[2][2];  // [row][part]
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int p = 0; p < 2; ++p)
                v[r][p] = ((w.ql[r][2 * (k % 2) + p] >> (4 * (k / 2))) & 0x0f0f0f0fu) |
                          (((w.qh[r][p] >> (2 * k)) & 0x03030303u) << 4);
        a[0][0] = v[0][0];
        a[0][1] = v[1][0];
        a[0][2] = a[0][3] = 0u;  // part 0: columns 0..15
        a[1][0] = a[1][1] = 0u;  // part 1: columns 16..31
        a[1][2] = v[0][1];
        a[1][3] = v[1][1];
    } else {
        for (int i = 0; i < 4; ++i) a[0][i] = w.a[i];
    }
}

template <GgmlType T>
KVGEN_HD float int_mma_add(const ImStep<T>& w, int k, int hi, const int (&c)[ImStep<T>::parts], const TokScale& x,
                           float acc) {
    if constexpr (T == GgmlType::Q4_K) {
        // as unit_dot's for one sub-block: d (xd sc dot) - dmin (xd m s), the scale and the min in integers
        const uint32_t sm = w.sm[hi];
        const int sc = int((sm >> (8 * k)) & 0xffu), m = int((sm >> (16 + 8 * k)) & 0xffu);
        const float d = half_bits(uint16_t(w.dd[hi] & 0xffffu)), dmin = half_bits(uint16_t(w.dd[hi] >> 16));
        return acc + fmaf(d, x.d * float(sc * c[0]), -(dmin * (x.d * float(m * x.s))));
    } else if constexpr (T == GgmlType::Q6_K) {
        // as unit_dot's: each half's scale times its dot less 32 times its sum of q, in integers (|sum| < 2^31)
        const int s0 = int(int8_t(uint8_t(w.sc[hi][(2 * k) / 4] >> (8 * ((2 * k) % 4)))));
        const int s1 = int(int8_t(uint8_t(w.sc[hi][(2 * k + 1) / 4] >> (8 * ((2 * k + 1) % 4)))));
        const int dot0 = s0 * (c[0] - 32 * x.h0), dot1 = s1 * (c[1] - 32 * x.h1);
        return fmaf(half_bits(w.d[hi]), fmaf(x.d, float(dot0), x.d * float(dot1)), acc);
    } else {
        // note: Q4_0's offset of 8, which the unsigned nibbles left out, through the sum of q (unit_dot's)
        const int dot = T == GgmlType::Q4_0 ? c[0] - 8 * x.s : c[0];
        return fmaf(half_bits(w.d[hi]) * x.d, float(dot), acc);
    }
}

// Where a block of an n-token launch works: its first row (GLU: of gate's and up's), its group's first token and the
// group's tokens.
struct ImBlock {
    int64_t rb;
    int i0, m;
};
#pragma nv_exec_check_disable
template <class Ctx>
KVGEN_HD ImBlock int_mma_block(const Ctx& ctx, bool glu, int n, int group_tokens, int sets) {
    const int i0 = ctx.block_x() * group_tokens;
    return ImBlock{int64_t(ctx.block_y()) * sets * int_mma_block_rows(glu), i0,
                   n - i0 < group_tokens ? n - i0 : group_tokens};
}

// The sums of an n-token product of the block's rows and tokens: with GLU, rows r0 .. r0 + 15 of gate (w) and up,
// else rows r0 .. r0 + 31 of w, for each of the block's sets of rows (r0 = (block_y x sets + set) x
// int_mma_block_rows(GLU); sets 1 or 2, the block's warps split evenly among them, each set's warps taking the units
// in turns), for the block's group of tokens, i0 .. i0 + m - 1 (i0 = block_x x group_tokens, m <= group_tokens <= 8
// NTT the tokens left from i0); x the n tokens' ActBlocks, n_units a token. With two sets, warps w and w + 4 load the
// same activations at about the same time, so that L1 gives them the second time. store(row, token, v) for each row
// below rows and each of the group's tokens, v the row's sum for the token (GLU: silu(gate) * up).
#pragma nv_exec_check_disable
template <GgmlType T, bool GLU, int NTT, class Ctx, class Store>
KVGEN_HD void matvec_int_mma_body(const Ctx& ctx, const uint8_t* __restrict__ w, const uint8_t* __restrict__ up,
                                  int64_t row_bytes, int n_units, int64_t rows, const ActBlock* __restrict__ x, int n,
                                  int group_tokens, int sets, Store&& store) {
    static_assert(int_mma_type(T) && (NTT == 1 || NTT == 2) && 8 * NTT <= int_mma_tokens(T),
                  "Q4_0 / Q8_0 / Q4_K / Q6_K, one or two 8-token tiles");
    constexpr bool kAu = T != GgmlType::Q8_0;  // 4- and 6-bit quants unsigned, Q8_0's bytes signed
    constexpr int S = ImStep<T>::units, P = ImStep<T>::parts, kSteps = kImUnits / S;
    static_assert(kSteps * S == kImUnits, "a turn is whole steps");
    constexpr int NT = 8 * NTT;
    const int t = ctx.thread(), warp = t / 32, lane = t % 32, gid = lane >> 2, tig = lane & 3;
    // the warp's set of rows, its place among the set's warps, and the set's warps
    const int sw = kImWarps / sets, set = warp / sw, wi = warp % sw;
    const ImBlock blk = int_mma_block(ctx, GLU, n, group_tokens, sets);
    const int64_t rb = blk.rb, r0 = rb + set * int_mma_block_rows(GLU);  // the block's first row, the warp's
    const int i0 = blk.i0, m = blk.m;
    x += int64_t(i0) * n_units;
    // The tiles that hold one of the group's tokens (a last group of up to 8 in a launch of 16-token groups: one)
    const int tiles = (m + 7) / 8;

    // The lane's rows: tile a's rows gid and gid + 8 (GLU: tile 0 of gate, tile 1 of up, the same rows).
    const uint8_t* row[kImTiles][2];
#pragma unroll
    for (int a = 0; a < kImTiles; ++a)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t r = r0 + (GLU ? 0 : 16 * a) + gid + 8 * h;
            row[a][h] = (GLU && a == 1 ? up : w) + (r < rows ? r : rows - 1) * row_bytes;
        }
    // The lane's tokens: B's (8 t + gid) and C's columns (8 t + 2 tig + {0, 1}), past the group's the last.
    auto tok = [&](int i) { return i < m ? i : m - 1; };

    float acc[kImTiles][NTT][4];
#pragma unroll
    for (int a = 0; a < kImTiles; ++a)
#pragma unroll
        for (int j = 0; j < NTT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[a][j][e] = 0.0f;

    // A unit's activation loads for the lane: B's values of token 8 j + gid, and (d, s) of C's two tokens (Q6_K: and
    // the halves' sums, h).
    using Ds = std::conditional_t<T == GgmlType::Q6_K, uint4, uint2>;
    struct Acts {
        uint2 q[NTT][2];
        Ds ds[NTT][2];
    };
    auto load_acts = [&](int u, Acts& xa) {
#pragma unroll
        for (int j = 0; j < NTT; ++j) {
            if (NTT > 1 && j >= tiles) break;  // the same for the whole block
            const uint8_t* q = reinterpret_cast<const uint8_t*>(x[int64_t(tok(8 * j + gid)) * n_units + u].q);
            xa.q[j][0] = ld8(q + 8 * tig);
            xa.q[j][1] = ld8(q + 32 + 8 * tig);
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const uint8_t* p =
                    reinterpret_cast<const uint8_t*>(&x[int64_t(tok(8 * j + 2 * tig + c)) * n_units + u].d);
                if constexpr (T == GgmlType::Q6_K)
                    xa.ds[j][c] = ld16(p);
                else
                    xa.ds[j][c] = ld8(p);
            }
        }
    };
    // A turn: its kImUnits units' weight loads all issued first, then unit by unit the activations of the next unit
    // loaded while the products of this one are made. (The kernel waits for the one before it at its start:
    // loading the first turn's weights before that wait, as the CUDA-core products do, took sm_90 past 128 registers.)
    for (int u0 = wi * kImUnits; u0 < n_units; u0 += sw * kImUnits) {
        ImStep<T> ws[kSteps][kImTiles];
#pragma unroll
        for (int k = 0; k < kSteps; ++k) {
            if (u0 + S * k >= n_units) break;  // the same for the whole warp (Q4_K: whole super-blocks)
#pragma unroll
            for (int a = 0; a < kImTiles; ++a)
                int_mma_load<T>(row[a][0], row[a][1], u0 + S * k, n_units, tig, ws[k][a]);
        }
        Acts xa[2];
        load_acts(u0, xa[0]);
#pragma unroll
        for (int k = 0; k < kImUnits; ++k) {
            if (u0 + k >= n_units) break;
            if (k + 1 < kImUnits && u0 + k + 1 < n_units) load_acts(u0 + k + 1, xa[(k + 1) % 2]);
            const Acts& xc = xa[k % 2];
#pragma unroll
            for (int j = 0; j < NTT; ++j) {
                if (NTT > 1 && j >= tiles) break;
                uint32_t bh[2], bl[2];
                split_act_bytes(xc.q[j][0], bh[0], bl[0]);
                split_act_bytes(xc.q[j][1], bh[1], bl[1]);
                TokScale ts[2];
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    memcpy(&ts[c].d, &xc.ds[j][c].x, 4);
                    ts[c].s = int(xc.ds[j][c].y);
                    if constexpr (T == GgmlType::Q6_K) {
                        ts[c].h0 = int(xc.ds[j][c].z);
                        ts[c].h1 = int(xc.ds[j][c].w);
                    } else {
                        ts[c].h0 = ts[c].h1 = 0;
                    }
                }
#pragma unroll
                for (int a = 0; a < kImTiles; ++a) {
                    uint32_t af[P][4];
                    int_mma_a<T>(ws[k / S][a], k % S, af);
                    int ch[P][4], cl[P][4];
#pragma unroll
                    for (int q = 0; q < P; ++q) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) ch[q][e] = cl[q][e] = 0;
                        ctx.template mma_i8<kAu, false>(ch[q], af[q], bh);
                        ctx.template mma_i8<kAu, true>(cl[q], af[q], bl);
                    }
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        int c[P];
#pragma unroll
                        for (int q = 0; q < P; ++q) c[q] = 256 * ch[q][e] + cl[q][e];
                        acc[a][j][e] = int_mma_add<T>(ws[k / S][a], k % S, e >> 1, c, ts[e & 1], acc[a][j][e]);
                    }
                }
            }
        }
    }

    // Every warp's sums into shared memory, [warp][tile row][token], then each output's added over its set's warps in
    // order.
    float* const part = ctx.shared();
#pragma unroll
    for (int a = 0; a < kImTiles; ++a)
#pragma unroll
        for (int j = 0; j < NTT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int rr = 16 * a + gid + 8 * (e >> 1), i = 8 * j + 2 * tig + (e & 1);
                part[(warp * kImRows + rr) * NT + i] = acc[a][j][e];
            }
    ctx.sync();
    constexpr int kSetOut = int_mma_block_rows(GLU) * NT;
    for (int o = t; o < sets * kSetOut; o += 32 * kImWarps) {
        const int so = o / kSetOut, rr = o % kSetOut / NT, i = o % NT;
        const float* ps = part + so * sw * kImRows * NT;  // the set's first warp's sums
        auto sum = [&](int r) {
            float v = ps[r * NT + i];
            for (int k = 1; k < sw; ++k) v += ps[(k * kImRows + r) * NT + i];
            return v;
        };
        const float v = GLU ? silu_mul(sum(rr), sum(16 + rr)) : sum(rr);
        const int64_t r = rb + so * int_mma_block_rows(GLU) + rr;
        if (r < rows && i < m) store(r, i0 + i, v);
    }
}

// The SwiGLU product's output quantized where it is made, for the down projection, as the CUDA cores' launches do
// (glu_store_quantized_tokens; one launch fewer a layer): after the block's threads have stored its outputs of
// y [n][rows] (matvec_int_mma_body; rows a multiple of 32, so that a block's rows lie in one 32-row group) and fenced,
// thread 0 counts the block done on the counter of its 32-row group g and its group of tokens
// (counters[block_x][rows / 32]: a launch's groups of tokens run side by side), and the last of the group's
// 32 / (sets x 16) blocks writes ActBlock yq[i][g] of each of its tokens i, warp w tokens w, w + kImWarps, ...
// (quantize_act_warp, the blocks quantize_act makes). The counters are zero between launches (each last block sets
// its own back). Run by all the block's threads after the body (its shared memory is free again after the first
// barrier here).
#pragma nv_exec_check_disable
template <class Ctx>
KVGEN_HD void int_mma_glu_quantize(const Ctx& ctx, const float* y, int64_t rows, int n, int group_tokens, int sets,
                                   int* counters, ActBlock* yq) {
    const ImBlock blk = int_mma_block(ctx, true, n, group_tokens, sets);
    const int t = ctx.thread(), warp = t / 32, lane = t % 32;
    const int64_t g = blk.rb / 32, groups = rows / 32;
    float* const last = ctx.shared();
    ctx.fence();  // each thread's outputs visible to every block before the count says so
    ctx.sync();   // ... and stored (and the body's sums read from shared memory) before thread 0 counts
    if (t == 0) {
        ctx.fence();  // a release of the block's stores by the thread that counts
        int* const c = counters + int64_t(ctx.block_x()) * groups + g;
        const bool done = ctx.atomic_add(c, 1) == 32 / (sets * int_mma_block_rows(true)) - 1;
        if (done) {
            *c = 0;
            ctx.fence();  // the count read before the other blocks' outputs are
        }
        *last = done ? 1.0f : 0.0f;
    }
    ctx.sync();
    if (*last == 0.0f) return;  // the same in every thread
    ctx.fence();
    for (int i = warp; i < blk.m; i += kImWarps) {
        const int64_t k = blk.i0 + i;
        quantize_act_warp(ctx, ctx.load_other(y + k * rows + 32 * g + lane), lane, yq[k * groups + g]);
    }
}

}  // namespace kvgen::cuda
