#pragma once
// The CUDA KV cache in any of its types (KvLayout: f16, or ggml's Q8_0 / Q4_0 blocks of 32 per row, stored in the
// rotated basis of engine/kv_rotation.h): reading E consecutive values of a cached row, and writing a row. The
// decoded values are the CPU's (kv_decode_row before its rotation back: d * q in f32), and a written row is the CPU's
// bytes (kv_encode_row: H x per piece, then quantize_row_q8_0's arithmetic or kv_q4_0_levels, kept from fused
// multiply-adds), so a cache written by either backend reads the same on the other (a prompt-cache file moves
// between them).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/hd.h"
#include "elementwise.cuh"
#include "engine/kv_blocks.h"
#include "engine/kv_layout.h"
#include "engine/kv_offset.h"
#include "engine/kv_rotation.h"
#include "quant.cuh"

namespace kvgen::cuda {

// The head_dims a quantized cache runs for on the GPU: those of the tensor-core prefill attention (the only prefill
// kernel that reads one), whose rows also split evenly over a decode warp's lanes within blocks.
KVGEN_HD bool kv_quantized_head_dim(int hd) {
    return hd == 64 || hd == 128;
}

// Calls f(std::integral_constant<int, E>{}) with E = hd / 32 for the warp-per-row kernels (store_kv_row_warp,
// kv_rotate_row_warp); false for a head_dim they are not built for (those of kv_quantized_head_dim).
template <typename F>
bool dispatch_kv_rows(int hd, F&& f) {
    if (hd == 64) {
        f(std::integral_constant<int, 2>{});
        return true;
    }
    if (hd == 128) {
        f(std::integral_constant<int, 4>{});
        return true;
    }
    return false;
}

KVGEN_HD float kv_half_at(const uint8_t* p) {
    __half h;
    memcpy(&h, p, sizeof(h));
    return __half2float(h);
}

// The 8 halves of 16 loaded bytes (an f16 row's, as ld16 gives them) as floats: out[at .. at + 7].
template <int N>
KVGEN_HD void halves_of(const uint4& u, float (&out)[N], int at = 0) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        __half2 h;  // note: memcpy, not a cast: the host compiler may assume a __half2 never aliases w
        memcpy(&h, &w[i], sizeof(h));
        const float2 f = __half22float2(h);
        out[at + 2 * i] = f.x;
        out[at + 2 * i + 1] = f.y;
    }
}

// E halves from p: 16 bytes a load where E is a multiple of 8 (p then 16-byte aligned: a lane's 8 E columns of an f16
// row, rows 2 head_dim bytes apart), else 8, 4 or 2.
template <int E>
KVGEN_HD void load_halves(const __half* p, float (&out)[E]) {
    if constexpr (E % 8 == 0) {
#pragma unroll
        for (int e = 0; e < E; e += 8) halves_of(ld16(reinterpret_cast<const uint8_t*>(p + e)), out, e);
    } else if constexpr (E % 4 == 0) {
#pragma unroll
        for (int e = 0; e < E; e += 4) {
            check_aligned(p + e, 8);
            const uint2 u = *reinterpret_cast<const uint2*>(p + e);
            __half2 ha, hb;
            memcpy(&ha, &u.x, sizeof(ha));
            memcpy(&hb, &u.y, sizeof(hb));
            const float2 a = __half22float2(ha), b = __half22float2(hb);
            out[e] = a.x;
            out[e + 1] = a.y;
            out[e + 2] = b.x;
            out[e + 3] = b.y;
        }
    } else if constexpr (E % 2 == 0) {
#pragma unroll
        for (int e = 0; e < E; e += 2) {
            check_aligned(p + e, 4);
            const float2 a = __half22float2(*reinterpret_cast<const __half2*>(p + e));
            out[e] = a.x;
            out[e + 1] = a.y;
        }
    } else {
#pragma unroll
        for (int e = 0; e < E; ++e) out[e] = __half2float(p[e]);
    }
}

// load_halves of the f16 row at base + offset bytes, from value j0 on, where `in`; else E zeros, nothing read (a
// position past the range being attended).
template <int E>
KVGEN_HD void load_halves_or_zero(bool in, const uint8_t* base, int64_t offset, int j0, float (&out)[E]) {
    if (in) {
        load_halves<E>(reinterpret_cast<const __half*>(base + offset) + j0, out);
    } else {
#pragma unroll
        for (int e = 0; e < E; ++e) out[e] = 0.0f;
    }
}

// out[e] = value j0 + e of a cached row of type t (E values, in the stored basis).
template <int E>
KVGEN_HD void kv_load(KvType t, const uint8_t* row, int j0, float (&out)[E]) {
    if (t == KvType::F16) {
        load_halves<E>(reinterpret_cast<const __half*>(row) + j0, out);
        return;
    }
    if (t == KvType::Q8_0) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const int j = j0 + e;
            const uint8_t* b = row + (j / 32) * 34;
            out[e] = kv_half_at(b) * float(int8_t(b[2 + j % 32]));
        }
        return;
    }
    if (t == KvType::Q4_0) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const int j = j0 + e, jj = j % 32;
            const uint8_t* b = row + (j / 32) * 18;
            const int byte = b[2 + jj % 16];
            out[e] = kv_half_at(b) * float((jj < 16 ? byte & 0x0f : byte >> 4) - 8);
        }
        return;
    }
#pragma unroll
    for (int e = 0; e < E; ++e) out[e] = reinterpret_cast<const float*>(row)[j0 + e];  // F32 (not on the GPU)
}

// Values [c0, c0 + 8) (c0 a multiple of 8) of a Q8_0 or Q4_0 row read without a branch on the type, for a loop that
// puts several rows' loads in flight before it uses the first (kv_load's switch around each row's byte loads makes
// every row wait for the one before): where they lie, worked out once per lane (kv_block_cols), then one row's raw
// words (kv_block_load: the block's f16 scale and three 4-byte aligned words) and their values (kv_block_decode:
// kv_load<8>'s, bit for bit). The 8 quant bytes (Q8_0: values c0 % 32 ...; Q4_0: bytes c0 % 16 ..., whose high
// nibbles hold columns 16-31 of a block) start 2 bytes into a 4-byte word or on one: rows of either type at
// head_dim 64 or 128 are a multiple of 4 bytes long, so every row starts 4-byte aligned, and the three words end
// inside the row.
struct KvBlockCols {
    int scale;      // the block's f16 scale, bytes from the row's start
    int w0, w2;     // the first and third words read (the second follows the first; w2 = w0 + 4 where aligned)
    int shift;      // bits of the first word before the quant bytes: 0 or 16
    int nib;        // Q4_0 columns 16-31 of a block: 4 (the high nibbles); else 0
    uint32_t mask;  // 0xff (Q8_0) or 0xf (Q4_0)
    uint32_t flip;  // value = (x ^ flip) - bias: Q8_0 0x80 and 128 (x as int8), Q4_0 0 and 8
    int bias;
};

KVGEN_HD KvBlockCols kv_block_cols(KvType t, int c0) {
    const bool q8 = t == KvType::Q8_0;
    const int b = c0 / 32, scale = b * (q8 ? 34 : 18);
    const int o = scale + 2 + (q8 ? c0 % 32 : c0 % 16);
    KvBlockCols c;
    c.scale = scale;
    c.w0 = o & ~3;
    c.w2 = c.w0 + (o & 2 ? 8 : 4);
    c.shift = (o & 2) * 8;
    c.nib = !q8 && c0 % 32 >= 16 ? 4 : 0;
    c.mask = q8 ? 0xffu : 0xfu;
    c.flip = q8 ? 0x80u : 0u;
    c.bias = q8 ? 128 : 8;
    return c;
}

struct KvBlockRaw {
    uint32_t scale;  // the f16 scale's bits
    uint32_t w[3];
};

KVGEN_HD KvBlockRaw kv_block_load(const KvBlockCols& c, const uint8_t* row) {
    return {ld_u16(row + c.scale), {ld_u32(row + c.w0), ld_u32(row + c.w0 + 4), ld_u32(row + c.w2)}};
}

// Values of an empty place (a position past the range): zeros.
KVGEN_HD KvBlockRaw kv_block_zero() {
    return {0u, {0u, 0u, 0u}};
}

KVGEN_HD void kv_block_decode(const KvBlockCols& c, const KvBlockRaw& r, float (&out)[8]) {
    const float d = half_bits(uint16_t(r.scale));
    const uint64_t w01 = uint64_t(r.w[0]) | uint64_t(r.w[1]) << 32, w12 = uint64_t(r.w[1]) | uint64_t(r.w[2]) << 32;
    const uint32_t lo = uint32_t(w01 >> c.shift), hi = uint32_t(w12 >> c.shift);  // the 8 quant bytes
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const uint32_t x = ((e < 4 ? lo : hi) >> (8 * (e % 4) + c.nib)) & c.mask;
        out[e] = d * float(int(x ^ c.flip) - c.bias);
    }
}

// d rounded to f16 at p (2-byte aligned: an f16 row's value, or a block's scale, blocks of 34 or 18 bytes from an
// even row start). On the device one 16-bit store: ptxas of CUDA 13.0 compiled memcpy's byte stores of a __half into
// F2I.U8.F16, the low byte written as the scale's value truncated to an integer (3.52 -> 0x03) instead of its bits.
KVGEN_HD void kv_store_half(uint8_t* p, float d) {
    const __half h = __float2half_rn(d);
#if defined(__CUDA_ARCH__)
    *reinterpret_cast<__half*>(p) = h;
#else
    memcpy(p, &h, sizeof(h));
#endif
}

// x <- H x per piece (kv_rotate's butterflies, bit for bit) for a row of 32 E values held by a warp, lane t holding
// values t + 32 e in x[e]: pairs t, t ^ len are lanes for len < 32 and registers e, e ^ len / 32 above, the lower
// index taking a + b and the upper a - b, as hadamard does.
#pragma nv_exec_check_disable
template <int E, class Ctx>
KVGEN_HD void kv_hadamard_warp(const Ctx& ctx, int lane, float (&x)[E]) {
    constexpr int hd = 32 * E, w = hd & -hd;  // w: kv_rotation_width
#pragma unroll
    for (int len = 1; len < w; len *= 2) {
        if (len < 32) {
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const float o = ctx.shfl_xor(x[e], len);
                x[e] = lane & len ? o - x[e] : x[e] + o;
            }
        } else {
#pragma unroll
            for (int e = 0; e < E; ++e)
                if ((e & (len / 32)) == 0) {
                    const float a = x[e], b = x[e + len / 32];
                    x[e] = a + b;
                    x[e + len / 32] = a - b;
                }
        }
    }
}

// A row of 32 E values at p <- H x / w per piece (kv_rotate_scaled, bit for bit), by the 32 lanes of a warp: a query
// turned to a quantized K's basis, an attention output back from a quantized V's. xq (null: none): the row's E
// activation blocks, quantized as they are stored (quantize_act_warp, quantize_act's bits): one token's attention
// output for the output projection's integer product, without a launch of quantize_act.
#pragma nv_exec_check_disable
template <int E, class Ctx>
KVGEN_HD void kv_rotate_row_warp(const Ctx& ctx, float* __restrict__ p, ActBlock* __restrict__ xq = nullptr) {
    constexpr int hd = 32 * E, w = hd & -hd;
    const int lane = ctx.thread() % 32;
    float x[E];
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = p[lane + 32 * e];
    kv_hadamard_warp<E>(ctx, lane, x);
    const float inv_w = 1.0f / float(w);
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const float y = x[e] * inv_w;
        p[lane + 32 * e] = y;
        if (xq) quantize_act_warp(ctx, y, lane, xq[e]);  // lane t holds value t of block e
    }
}

// kv_q4_0_levels of one block held by a warp, lane j holding value j (x): the same value of largest magnitude (the
// first in j order among equals), the same trials, and each trial's sum(x l) in kv_q4_0_trial_scalar's order: lane k
// (k < 8) sums part k from lanes k, k ^ 8, k ^ 16, k ^ 24 (that is k + 8, k + 16, k + 24) in turn, then the parts go
// pairwise by lanes ^ 4, ^ 2, ^ 1 (each add commutes, so lane 0 ends with the loop's sum). sum(l l) is exact in any
// order. Returns d, in every lane; *level <- lane j's level.
#pragma nv_exec_check_disable
template <class Ctx>
KVGEN_HD float kv_q4_0_levels_warp(const Ctx& ctx, float x, int lane, int* level) {
    float amag = fabsf(x) > 0.0f ? fabsf(x) : 0.0f;  // a NaN, like a zero, is never the largest
    float m = x, at = float(lane);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {  // (largest magnitude, then first lane): one order, so every lane agrees
        const float a2 = ctx.shfl_xor(amag, o), m2 = ctx.shfl_xor(m, o), at2 = ctx.shfl_xor(at, o);
        if (a2 > amag || (a2 == amag && at2 < at)) {
            amag = a2;
            m = m2;
            at = at2;
        }
    }
    *level = 0;
    if (amag == 0.0f) return 0.0f;
    float best_num = 0.0f, best_sxl = 0.0f;
    int best_sll = 1;
    for (int i = 0; i < kKvQ4Trials; ++i) {
        const int q = kv_q4_0_level(x, kv_q4_0_trial_id(i, m));
        const float p = kv_mul(x, float(q));
        float part = kv_add(0.0f, p);
        part = kv_add(part, ctx.shfl_xor(p, 8));
        part = kv_add(part, ctx.shfl_xor(p, 16));
        part = kv_add(part, ctx.shfl_xor(p, 24));
        part = kv_add(part, ctx.shfl_xor(part, 4));
        part = kv_add(part, ctx.shfl_xor(part, 2));
        part = kv_add(part, ctx.shfl_xor(part, 1));
        const float sxl = ctx.shfl(part, 0);
        const int sll = int(ctx.warp_sum(float(q * q)));  // at most 32 * 64: exact
        const float num = kv_mul(sxl, sxl);
        if (kv_q4_0_better(num, sll, best_num, best_sll)) {
            best_num = num;
            best_sll = sll;
            best_sxl = sxl;
            *level = q;
        }
    }
    return best_sxl / float(best_sll);
}

// Lane t's values t + 32 e (e < E) of a row at src, the pairs below half_rope turned by RoPE where cos_row is given
// (the token's rows of the tables; null: none): each lane computes its pair's rope_pair, as rope_item and
// store_kv_item do, and keeps its half.
template <int E>
KVGEN_HD void rope_row_lanes(int lane, const float* __restrict__ src, const float* __restrict__ cos_row,
                             const float* __restrict__ sin_row, int half_rope, float (&x)[E]) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int j = lane + 32 * e;
        if (cos_row && j / 2 < half_rope) {
            float a = src[j & ~1], b = src[j | 1];
            rope_pair(a, b, cos_row[j / 2], sin_row[j / 2]);
            x[e] = j % 2 == 0 ? a : b;
        } else {
            x[e] = src[j];
        }
    }
}

// Row r of a step's queries q [n][n_heads][32 E] (token r / n_heads), in place, by the 32 lanes of a warp: turned by
// RoPE (rope_item's bits) and into a quantized K's basis (H x / w, kv_rotate_scaled's bits): what rope_item's launch
// and kv_rotate_rows did in two. In place without a race: every value a lane stores is a whole-row transform, so it
// depends (through kv_hadamard_warp's shuffles, which exchange between all 32 lanes) on the values every lane loaded,
// and no lane can store before every lane has loaded its pair.
#pragma nv_exec_check_disable
template <int E, class Ctx>
KVGEN_HD void rope_turn_q_row_warp(const Ctx& ctx, int64_t r, float* __restrict__ q, const float* __restrict__ cos_t,
                                   const float* __restrict__ sin_t, int n_heads, int half_rope) {
    constexpr int hd = 32 * E, w = hd & -hd;
    const int lane = ctx.thread() % 32;
    const int64_t i = r / n_heads;
    float* p = q + r * hd;
    float x[E];
    rope_row_lanes<E>(lane, p, cos_t + i * half_rope, sin_t + i * half_rope, half_rope, x);
    kv_hadamard_warp<E>(ctx, lane, x);
    const float inv_w = 1.0f / float(w);
#pragma unroll
    for (int e = 0; e < E; ++e) p[lane + 32 * e] = x[e] * inv_w;
}

// Item g = (token i0 + g / (2 n_kv_heads), KV head h, half c: 0 K, 1 V) of (i1 - i0) x n_kv_heads x 2 for a step's
// tokens [i0, i1), by the 32 lanes of a warp: that row of k or v ([n][n_kv_heads][hd], hd = 32 E), K rotated by RoPE
// like store_kv_item (cos_t null: as given), stored at position *d_pos0 + i of one layer's cache (kc / vc: the
// layer's first row) in its half's type (f16, or q8_0 / q4_0 with the rotation of kv_rotation.h). For caches with a
// quantized half. k_offsets: the layer's key offsets [n_kv_heads][hd] (null where K carries none), taken from the K
// rows at positions from kKvOffsetPositions on; they must be set before such a row is stored.
// Lane t holds values t + 32 e of the row (e < E), so register e is the row's block e. The bits of kv_encode_row:
// the rotation (kv_hadamard_warp), the key offset subtracted, then quantize_row_q8_0's arithmetic (a warp maximum) or
// kv_q4_0_levels_warp.
#pragma nv_exec_check_disable
template <int E, class Ctx>
KVGEN_HD void store_kv_row_warp(const Ctx& ctx, int64_t g, const float* __restrict__ k, const float* __restrict__ v,
                                const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                const float* __restrict__ k_offsets, const int* __restrict__ d_pos0, int i0,
                                const KvLayout& kv, int half_rope, uint8_t* __restrict__ kc, uint8_t* __restrict__ vc) {
    constexpr int hd = 32 * E;
    const int lane = ctx.thread() % 32, c = int(g % 2);
    const int64_t ih = int64_t(i0) * kv.n_kv_heads + g / 2;  // token * n_kv_heads + head
    const int i = int(ih / kv.n_kv_heads), h = int(ih % kv.n_kv_heads);
    const int pos = *d_pos0 + i;
    const float* src = (c == 0 ? k : v) + ih * hd;
    float x[E];
    const bool turn = c == 0 && cos_t;
    rope_row_lanes<E>(lane, src, turn ? cos_t + int64_t(i) * half_rope : nullptr,
                      turn ? sin_t + int64_t(i) * half_rope : nullptr, half_rope, x);
    const KvType t = c == 0 ? kv.k_type : kv.v_type;
    uint8_t* dst = (c == 0 ? kc : vc) + (int64_t(h) * kv.n_ctx + pos) * KvLayout::row_bytes(t, hd);
    if (t == KvType::F16) {  // (an F32 cache does not run on the GPU: kv_cache_supported)
#pragma unroll
        for (int e = 0; e < E; ++e) kv_store_half(dst + 2 * (lane + 32 * e), x[e]);
        return;
    }
    kv_hadamard_warp<E>(ctx, lane, x);
    if (c == 0 && k_offsets && pos >= kKvOffsetPositions) {
        const float* offset = k_offsets + int64_t(h) * hd;
#pragma unroll
        for (int e = 0; e < E; ++e) x[e] -= offset[lane + 32 * e];
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
        if (t == KvType::Q8_0) {
            uint8_t* y = dst + 34 * e;
            const float amax = ctx.warp_max(fmaxf(0.0f, fabsf(x[e])));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            if (lane == 0) kv_store_half(y, d);
            y[2 + lane] = uint8_t(int8_t(roundf(kv_mul(x[e], id))));
        } else {  // Q4_0: element j in the low nibble of byte j, element j + 16 in its high nibble (kv_q4_0_pack)
            uint8_t* y = dst + 18 * e;
            int l;
            const float d = kv_q4_0_levels_warp(ctx, x[e], lane, &l);
            const int hi = int(ctx.shfl_xor(float(l), 16));
            if (lane == 0) kv_store_half(y, d);
            if (lane < 16) y[2 + lane] = uint8_t((l + 8) | ((hi + 8) << 4));
        }
    }
}

// Item g of n_layers x n_kv_heads (g = l n_kv_heads + h; one layer: kc and k_offsets at that layer's first row and
// offsets), by the 32 lanes of a warp: the key offset of that head from its first kKvOffsetPositions rows in the
// quantized K cache kc, into k_offsets [g][32 E]. Twin: kv_offset_of_rows, bit for bit: lane t holds values t + 32 e
// (a row's 32 E bytes of quants a load of the warp, coalesced), each the decoded rows' d * q (exact in f32) summed in
// position order; then kv_offset_from_sum's steps in registers: the mean (an exact 1/16), H x / w
// (kv_hadamard_warp), the dimensions below dim0 zeroed, H x again.
#pragma nv_exec_check_disable
template <int E, class Ctx>
KVGEN_HD void kv_offset_warp(const Ctx& ctx, int64_t g, const uint8_t* __restrict__ kc, const KvLayout& kv,
                             float* __restrict__ k_offsets) {
    constexpr int hd = 32 * E, w = hd & -hd;  // w: kv_rotation_width
    static_assert(w == hd, "one rotation piece a row: kv_offset_from_sum's kv_rotate_scaled(s, hd, hd)");
    const int lane = ctx.thread() % 32;
    const int64_t rb = kv.k_row_bytes();
    const uint8_t* rows = kc + g * kv.n_ctx * rb;  // row_index(0, g, 0): layers follow each other
    float x[E];
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = 0.0f;
#pragma unroll
    for (int p = 0; p < kKvOffsetPositions; ++p)
#pragma unroll
        for (int e = 0; e < E; ++e) {
            float value[1];
            kv_load<1>(kv.k_type, rows + p * rb, lane + 32 * e, value);
            x[e] = kv_add(x[e], value[0]);
        }
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = kv_mul(x[e], 1.0f / float(kKvOffsetPositions));  // not fused into the adds
    kv_hadamard_warp<E>(ctx, lane, x);
    const float inv_w = 1.0f / float(w);
    const int dim0 = kv.k_offset_dim0 < hd ? kv.k_offset_dim0 : hd;
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = lane + 32 * e < dim0 ? 0.0f : kv_mul(x[e], inv_w);
    kv_hadamard_warp<E>(ctx, lane, x);
    float* s = k_offsets + g * hd;
#pragma unroll
    for (int e = 0; e < E; ++e) s[lane + 32 * e] = x[e];
}

}  // namespace kvgen::cuda
