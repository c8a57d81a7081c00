#pragma once
// Decode products in integers, for Q4_0, Q8_0, Q4_K, Q5_K and Q6_K weights. The input vector is quantized once per
// product to 16-bit integers in blocks of 32 (ActBlock: x ~ d * q, |q| <= 32512, the CPU's activation rounding, see
// src/cpu/vecdot.h), and each lane dots a unit of 32 weights' small integers with their int16 activations by __dp2a
// (two int16 x int8 products per instruction), converting to float once per unit. Weights come in 16-byte loads
// from the device layout (weight_layout.h); the activations' rounding (1 part in 32512 of a block's largest value)
// stays far below what the logits can show.
// Compiled for the host too: the CPU-only tests run these bodies (tests/cuda_support/host_emulation.cu).
#include "matvec.cuh"

namespace kvgen::cuda {

// 32 activations as 16-bit integers: x[j] ~ d * q[j], s = sum of q, h[0] and h[1] the sums of q[0..15] and
// q[16..31] (the units of the k-quant products meet half a block). 80 bytes, so q is four 16-byte loads.
struct alignas(16) ActBlock {
    int16_t q[32];
    float d;
    int32_t s;
    int32_t h[2];
};
static_assert(sizeof(ActBlock) == 80, "ActBlock");

constexpr float kActQMax = 32512.0f;

// As quantize_a32 does on the CPU: a block's scale d = amax / 32512 (0 where that is below the smallest normal float:
// the block reads as zeros), id = 1 / d (0 for d = 0), and each value q = round-half-even(x * id).
KVGEN_HD float act_scale(float amax) {
    const float d = amax / kActQMax;
    return d >= 1.17549435e-38f ? d : 0.0f;
}
KVGEN_HD float act_inverse_scale(float d) {
    return d > 0.0f ? 1.0f / d : 0.0f;
}
KVGEN_HD int act_quant(float v, float id) {
    const float r = rintf(v * id);
    return int(r > kActQMax ? kActQMax : r < -kActQMax ? -kActQMax : r);
}

// Programmatic dependent launch (sm_90; a launch attribute, see ops.cu): a kernel launched with it may start while
// the kernel before it in the stream still runs, and must call pdl_wait before it reads anything that kernel (or an
// earlier one) wrote, or writes anything they read; a kernel calls pdl_trigger to let such a successor start before
// it ends. No-ops on older devices and on the host.
KVGEN_HD void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
KVGEN_HD void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// A hint that the 128-byte line holding p will be read soon, to be brought into L1 (nothing on the host).
KVGEN_HD void prefetch_l1(const void* p) {
#if defined(__CUDA_ARCH__)
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
#else
    (void)p;
#endif
}

// Block b of x (32 values) by one thread: the twin of quantize_act_warp (the kernels' blocks) that the host tests
// quantize the integer products' inputs with.
KVGEN_HD void quantize_act_item(int64_t b, const float* __restrict__ x, ActBlock* __restrict__ out) {
    const float* xb = x + b * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(xb[j]));
    const float d = act_scale(amax), id = act_inverse_scale(d);
    int h[2] = {0, 0};
    for (int j = 0; j < 32; ++j) {
        const int q = act_quant(xb[j], id);
        out[b].q[j] = int16_t(q);
        h[j / 16] += q;
    }
    out[b].d = d;
    out[b].s = h[0] + h[1];
    out[b].h[0] = h[0];
    out[b].h[1] = h[1];
}

// The same block written by the 32 lanes of a warp, lane l holding value l: its largest magnitude by a warp
// reduction, then the sum of q over each half of the warp (the butterfly's steps within 16 lanes) and over both (its
// last step): 10 shuffles. Exact in any order: |sum| <= 32 * 32512 < 2^24. Ctx: a thread context with warp_max and
// shfl_xor (DeviceThread, or the host emulation's).
#pragma nv_exec_check_disable
template <class Ctx>
KVGEN_HD void quantize_act_warp(const Ctx& ctx, float v, int lane, ActBlock& a) {
    const float d = act_scale(ctx.warp_max(fabsf(v)));
    const int q = act_quant(v, act_inverse_scale(d));
    float half = float(q);
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) half += ctx.shfl_xor(half, o);
    const float s = half + ctx.shfl_xor(half, 16);
    a.q[lane] = int16_t(q);
    if (lane == 0) {  // half: lanes 0-15's sum
        a.d = d;
        a.s = int(s);
        a.h[0] = int(half);
        a.h[1] = int(s) - int(half);
    }
}

// Whether a type has an integer decode product.
KVGEN_HD bool has_int_matvec(GgmlType t) {
    return t == GgmlType::Q4_0 || t == GgmlType::Q8_0 || t == GgmlType::Q4_K || t == GgmlType::Q5_K ||
           t == GgmlType::Q6_K;
}

// c + a.lo16 * b.byte[k] + a.hi16 * b.byte[k + 1], signed, with k = 0 (lo) or 2 (hi).
KVGEN_HD int dp2a_lo(int a, int b, int c) {
#if defined(__CUDA_ARCH__)
    return __dp2a_lo(a, b, c);
#else
    return c + int(int16_t(uint32_t(a) & 0xffffu)) * int(int8_t(uint32_t(b) & 0xffu)) +
           int(int16_t(uint32_t(a) >> 16)) * int(int8_t((uint32_t(b) >> 8) & 0xffu));
#endif
}
KVGEN_HD int dp2a_hi(int a, int b, int c) {
#if defined(__CUDA_ARCH__)
    return __dp2a_hi(a, b, c);
#else
    return c + int(int16_t(uint32_t(a) & 0xffffu)) * int(int8_t((uint32_t(b) >> 16) & 0xffu)) +
           int(int16_t(uint32_t(a) >> 16)) * int(int8_t(uint32_t(b) >> 24));
#endif
}
// Byte-wise a - b, each byte wrapping on its own.
KVGEN_HD uint32_t sub_bytes(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __vsub4(a, b);
#else
    uint32_t r = 0;
    for (int k = 0; k < 4; ++k) r |= (((a >> (8 * k)) - (b >> (8 * k))) & 0xffu) << (8 * k);
    return r;
#endif
}

// The activations one unit of 32 weights meets, as 16 words of two int16 values each (word p: values 2p, 2p + 1 of
// the unit's order), the scale of the one or two activation blocks they come from, and the sums of q the unit meets:
// a whole block's (Q4_0), or each half block's (the k-quants).
struct UnitActs {
    int xw[16];
    float d[2];
    int s[2];
};

// Words w0 .. w0 + 7 (values 2 w0 .. 2 w0 + 15) of block a into xw[at .. at + 7]: two 16-byte loads.
KVGEN_HD void load_act_half(const ActBlock& a, int w0, int (&xw)[16], int at) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const uint4 v = ld16(reinterpret_cast<const uint8_t*>(a.q) + 4 * w0 + 16 * k);
        xw[at + 4 * k] = int(v.x);
        xw[at + 4 * k + 1] = int(v.y);
        xw[at + 4 * k + 2] = int(v.z);
        xw[at + 4 * k + 3] = int(v.w);
    }
}

// sum over j of w[j] * q[j] for N4 * 4 int8 weights packed 4 to a word (weight 4m + k in byte k of word m), q[j] in
// the int16 halves of the words xw[0 .. 2 N4) (value 2p low, 2p + 1 high in word p).
template <int N4>
KVGEN_HD int dot_words(const uint32_t* w4, const int* xw) {
    int s = 0;
#pragma unroll
    for (int m = 0; m < N4; ++m) {
        s = dp2a_lo(xw[2 * m], int(w4[m]), s);
        s = dp2a_hi(xw[2 * m + 1], int(w4[m]), s);
    }
    return s;
}

KVGEN_HD void words_of(const uint4& v, uint32_t* w) {
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
}

// The integer decode product works in units of 32 weights of a row, unit u of n_units = cols / 32, each read by
// a lane with 16-byte loads:
//   Q4_0  block u: its 16 bytes of nibbles; activations: block u whole.
//   Q8_0  block u: its 32 bytes; activations: block u whole.
//   Q4_K  super-block u / 8, k = u % 8: the 16 bytes 16 k of qs, low nibbles values 16 (k % 2) .. + 15 of
//         sub-block 2 (k / 2), high nibbles the same values of sub-block 2 (k / 2) + 1; the pair's scale word
//         (sc[2p], sc[2p + 1], m[2p], m[2p + 1] for p = k / 2) and the super-block's d and dmin, two 4-byte loads
//         shared by 2 and 8 units.
//   Q5_K  (its GGUF blocks, 176 bytes: 16-byte multiples) super-block u / 8, k = u % 8: Q4_K's unit, plus the 16
//         bytes 16 (k % 2) of qh (bits 2 (k / 2) and 2 (k / 2) + 1: the fifth bits of its two sub-blocks' values),
//         and the block's first 16 bytes (d, dmin and the 12 packed bytes of scales and mins), unpacked into Q4_K's
//         scale word of the pair as they are loaded.
//   Q6_K  super-block u / 8, k = u % 8: half h = k / 4, g = k % 2, ql bytes 64 h + 32 ((k / 2) % 2) + 16 g (16),
//         qh bytes 128 + 32 h + 16 g (16): values 16 g .. + 15 of quarter (k / 2) % 2 (low nibbles) and of the
//         quarter two further (high nibbles).
// For the k-quants the unit's 32 activations come from two blocks (two 16-value halves), whose sums of q carry the
// mins (Q4_K, Q5_K) and the offset of 32 (Q6_K's 6-bit values go in unsigned, 0..63).
template <GgmlType T>
KVGEN_HD void load_unit_acts(const ActBlock* __restrict__ x, int u, UnitActs& a) {
    if constexpr (T == GgmlType::Q4_0 || T == GgmlType::Q8_0) {
        const ActBlock& b = x[u];
        load_act_half(b, 0, a.xw, 0);
        load_act_half(b, 8, a.xw, 8);
        a.d[0] = a.d[1] = b.d;
        a.s[0] = a.s[1] = b.s;
    } else {
        const int k = u % 8, g = k % 2;
        constexpr bool pairs = T == GgmlType::Q4_K || T == GgmlType::Q5_K;  // sub-blocks 2p and 2p + 1
        const int b0 = (u / 8) * 8 + (pairs ? 2 * (k / 2) : 4 * (k / 4) + (k / 2) % 2);
        const int b1 = b0 + (pairs ? 1 : 2);
        load_act_half(x[b0], 8 * g, a.xw, 0);
        load_act_half(x[b1], 8 * g, a.xw, 8);
        a.d[0] = x[b0].d;
        a.d[1] = x[b1].d;
        a.s[0] = x[b0].h[g];
        a.s[1] = x[b1].h[g];
    }
}

// A unit's weight bytes of one row, loaded (load_unit) before any is used, so that a lane has every row's loads in
// flight at once; unit_dot then dots them with the unit's activations and adds the result to acc, in float. Every
// multiply-add there is written out as fmaf: nvcc would otherwise fuse some products and sums into multiply-adds of
// its own choosing, and the host (built without contraction) would round them apart, so the device's sums are the
// host emulation's bit for bit.
template <GgmlType T>
struct UnitWeights;

template <>
struct UnitWeights<GgmlType::Q4_0> {
    uint4 q;  // the block's 16 bytes of nibbles
    uint16_t d;
};
KVGEN_HD void load_unit(const uint8_t* __restrict__ row, int u, int n_units, UnitWeights<GgmlType::Q4_0>& w) {
    w.q = ld16(row + 16 * u);
    w.d = ld_u16(row + 16 * n_units + 2 * u);
}
KVGEN_HD float unit_dot(const UnitWeights<GgmlType::Q4_0>& w, int, const UnitActs& a, float acc) {
    uint32_t v[4], q[8];
    words_of(w.q, v);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        q[m] = v[m] & 0x0f0f0f0fu;             // weights 4m .. 4m + 3
        q[m + 4] = (v[m] >> 4) & 0x0f0f0f0fu;  // weights 16 + 4m ..
    }
    // note: the nibbles go in unsigned (0..15); the offset of 8 comes back through the activations' sum.
    return fmaf(half_bits(w.d) * a.d[0], float(dot_words<8>(q, a.xw) - 8 * a.s[0]), acc);
}

template <>
struct UnitWeights<GgmlType::Q8_0> {
    uint4 q[2];  // the block's 32 int8 weights
    uint16_t d;
};
KVGEN_HD void load_unit(const uint8_t* __restrict__ row, int u, int n_units, UnitWeights<GgmlType::Q8_0>& w) {
    w.q[0] = ld16(row + 32 * u);
    w.q[1] = ld16(row + 32 * u + 16);
    w.d = ld_u16(row + 32 * n_units + 2 * u);
}
KVGEN_HD float unit_dot(const UnitWeights<GgmlType::Q8_0>& w, int, const UnitActs& a, float acc) {
    uint32_t q[8];
    words_of(w.q[0], q);
    words_of(w.q[1], q + 4);
    return fmaf(half_bits(w.d) * a.d[0], float(dot_words<8>(q, a.xw)), acc);
}

template <>
struct UnitWeights<GgmlType::Q4_K> {
    uint4 q;      // 16 bytes of qs
    uint32_t sm;  // the pair's scales and mins
    uint32_t dd;  // the super-block's d and dmin
};
KVGEN_HD void load_unit(const uint8_t* __restrict__ row, int u, int n_units, UnitWeights<GgmlType::Q4_K>& w) {
    const int sb = u / 8, k = u % 8, n_super = n_units / 8;
    w.q = ld16(row + 128 * sb + 16 * k);
    w.sm = ld_u32(row + q4k_scales_at(n_super) + 16 * sb + 4 * (k / 2));
    w.dd = ld_u32(row + q4k_d_at(n_super) + 4 * sb);
}
// A Q4_K or Q5_K unit's sum from its values (lo: the first sub-block's 16, hi: the second's, 4 to a word, unsigned),
// the pair's scale word sm and the super-block's d and dmin (dd).
KVGEN_HD float k_pair_dot(const uint32_t (&lo)[4], const uint32_t (&hi)[4], uint32_t sm, uint32_t dd, const UnitActs& a,
                          float acc) {
    const float d = half_bits(uint16_t(dd & 0xffffu)), dmin = half_bits(uint16_t(dd >> 16));
    const int dot0 = int(sm & 0xffu) * dot_words<4>(lo, a.xw);
    const int dot1 = int((sm >> 8) & 0xffu) * dot_words<4>(hi, a.xw + 8);
    const int min0 = int((sm >> 16) & 0xffu) * a.s[0], min1 = int(sm >> 24) * a.s[1];
    const float sd = fmaf(a.d[0], float(dot0), a.d[1] * float(dot1));
    const float sms = fmaf(a.d[0], float(min0), a.d[1] * float(min1));
    return acc + fmaf(d, sd, -(dmin * sms));
}
KVGEN_HD float unit_dot(const UnitWeights<GgmlType::Q4_K>& w, int, const UnitActs& a, float acc) {
    uint32_t v[4], lo[4], hi[4];
    words_of(w.q, v);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        lo[m] = v[m] & 0x0f0f0f0fu;
        hi[m] = (v[m] >> 4) & 0x0f0f0f0fu;
    }
    return k_pair_dot(lo, hi, w.sm, w.dd, a, acc);
}

// Q5_K's block on the device: its GGUF bytes.
constexpr int kQ5kBlockBytes = 176, kQ5kQhAt = 16, kQ5kQsAt = 48;
// The scale word of sub-blocks 2p and 2p + 1 (sc[2p], sc[2p + 1], m[2p], m[2p + 1], as Q4_K's plane holds it) from a
// Q5_K (or Q4_K) block's first 16 bytes, v.y .. v.w the 12 packed bytes: 6-bit scale and min j in the low bits of
// bytes j and j + 4 for j < 4; for j >= 4, their low 4 bits in byte j + 4 (scale low, min high nibble) and their top 2
// bits in the top bits of bytes j - 4 (scale) and j (min).
KVGEN_HD uint32_t k5_scale_word(const uint4& v, int p) {
    const int sh = 16 * (p % 2);
    if (p < 2) return ((v.y >> sh) & 0x3f3fu) | (((v.z >> sh) & 0x3f3fu) << 16);
    const uint32_t lo = v.w >> sh, top_s = v.y >> sh, top_m = v.z >> sh;
    const uint32_t sc = (lo & 0x0f0fu) | ((top_s >> 2) & 0x3030u);
    const uint32_t mn = ((lo >> 4) & 0x0f0fu) | ((top_m >> 2) & 0x3030u);
    return sc | (mn << 16);
}

template <>
struct UnitWeights<GgmlType::Q5_K> {
    uint4 q;      // 16 bytes of qs
    uint4 h;      // 16 bytes of qh
    uint32_t sm;  // the pair's scales and mins
    uint32_t dd;  // the super-block's d and dmin
};
KVGEN_HD UnitWeights<GgmlType::Q5_K> q5k_unit(const uint4& q, const uint4& h, const uint4& head, int u) {
    return UnitWeights<GgmlType::Q5_K>{q, h, k5_scale_word(head, (u % 8) / 2), head.x};
}
KVGEN_HD void load_unit(const uint8_t* __restrict__ row, int u, int, UnitWeights<GgmlType::Q5_K>& w) {
    const uint8_t* b = row + int64_t(kQ5kBlockBytes) * (u / 8);
    const int k = u % 8;
    w = q5k_unit(ld16(b + kQ5kQsAt + 16 * k), ld16(b + kQ5kQhAt + 16 * (k % 2)), ld16(b), u);
}
KVGEN_HD float unit_dot(const UnitWeights<GgmlType::Q5_K>& w, int u, const UnitActs& a, float acc) {
    const int j0 = 2 * ((u % 8) / 2);  // the first sub-block: its fifth bits are bit j0 of each qh byte
    uint32_t v[4], hv[4], lo[4], hi[4];
    words_of(w.q, v);
    words_of(w.h, hv);
#pragma unroll
    for (int m = 0; m < 4; ++m) {  // the 5-bit values, 0..31
        const uint32_t hs = hv[m] >> j0;
        lo[m] = (v[m] & 0x0f0f0f0fu) | ((hs << 4) & 0x10101010u);
        hi[m] = ((v[m] >> 4) & 0x0f0f0f0fu) | ((hs << 3) & 0x10101010u);
    }
    return k_pair_dot(lo, hi, w.sm, w.dd, a, acc);
}

template <>
struct UnitWeights<GgmlType::Q6_K> {
    uint4 l, h;   // 16 bytes of ql and of qh
    int sc0, sc1;  // the scales of the two quarters' values
    uint16_t d;
};
KVGEN_HD void load_unit(const uint8_t* __restrict__ row, int u, int n_units, UnitWeights<GgmlType::Q6_K>& w) {
    const int sb = u / 8, n_super = n_units / 8;
    const int k = u % 8, h = k / 4, qa = (k / 2) % 2, g = k % 2;
    const uint8_t* b = row + 192 * sb;
    w.l = ld16(b + 64 * h + 32 * qa + 16 * g);
    w.h = ld16(b + 128 + 32 * h + 16 * g);
    const uint8_t* sc = row + 192 * n_super + 16 * sb + 8 * h + 2 * qa + g;
    w.sc0 = int(int8_t(ld_u8(sc)));
    w.sc1 = int(int8_t(ld_u8(sc + 4)));
    w.d = ld_u16(row + 208 * n_super + 2 * sb);
}
KVGEN_HD float unit_dot(const UnitWeights<GgmlType::Q6_K>& w, int u, const UnitActs& a, float acc) {
    const int qa = (u % 8) / 2 % 2;
    uint32_t lv[4], hv[4], wa[4], wb[4];
    words_of(w.l, lv);
    words_of(w.h, hv);
#pragma unroll
    for (int m = 0; m < 4; ++m) {  // the 6-bit values, 0..63: the offset of 32 comes back through the sums of q
        const uint32_t hs = hv[m] >> (2 * qa);  // quarter qa's top bits at bits 0-1, quarter qa + 2's at 4-5
        wa[m] = (lv[m] & 0x0f0f0f0fu) | ((hs << 4) & 0x30303030u);
        wb[m] = ((lv[m] >> 4) & 0x0f0f0f0fu) | (hs & 0x30303030u);
    }
    const int dot0 = w.sc0 * (dot_words<4>(wa, a.xw) - 32 * a.s[0]);
    const int dot1 = w.sc1 * (dot_words<4>(wb, a.xw + 8) - 32 * a.s[1]);
    return fmaf(half_bits(w.d), fmaf(a.d[0], float(dot0), a.d[1] * float(dot1)), acc);
}

// Two consecutive units 2s and 2s + 1 of a Q4_0 row (a step of S = 2 units, --cuda-matvec-unit 64): a lane then has
// 32 bytes of each row's quants in flight, as a Q8_0 unit does, and the two blocks' d in one 4-byte load. pair_dot
// dots unit 2s + h as unit_dot does, the same bits. (Q4_K in pairs, 10 registers a row, spills at 8 rows a block on
// sm_90, and at 4 rows holds fewer bytes in flight per SM than its steps of one unit at 8 rows.)
KVGEN_HD constexpr bool mvi_pair_type(GgmlType t) {
    return t == GgmlType::Q4_0;
}
template <GgmlType T>
struct PairWeights;

template <>
struct PairWeights<GgmlType::Q4_0> {
    uint4 q[2];
    uint32_t d;  // block 2s's f16 d in the low half, 2s + 1's in the high half
};
// note: with n_units odd, the last step's second unit is past the row's blocks: its loads stay inside the row (the
// scales' plane and the padding to 16 bytes follow the quants) and its dot is skipped.
KVGEN_HD void load_pair(const uint8_t* __restrict__ row, int s, int n_units, PairWeights<GgmlType::Q4_0>& w) {
    w.q[0] = ld16(row + 32 * s);
    w.q[1] = ld16(row + 32 * s + 16);
    w.d = ld_u32(row + 16 * n_units + 4 * s);
}
KVGEN_HD float pair_dot(const PairWeights<GgmlType::Q4_0>& w, int u, const UnitActs& a, float acc) {
    // note: u & 1, not u % 2: for step_dots' u = 2 s + h the compiler then sees h, a constant of the unrolled loop, and
    // keeps w.q in registers (with u % 2, whose sign follows a signed s, every thread's PairWeights went to the stack:
    // sm_90, 96-384 bytes a thread, each step's weights stored to local memory and loaded back)
    const int h = u & 1;
    return unit_dot(UnitWeights<GgmlType::Q4_0>{w.q[h], uint16_t(w.d >> (16 * h))}, u, a, acc);
}

// A thread's weights of one step of S units of a row (S = 1: UnitWeights, 2: PairWeights), its loads and its dots.
template <GgmlType T, int S>
using StepWeights = std::conditional_t<S == 2, PairWeights<T>, UnitWeights<T>>;
template <GgmlType T, int S>
KVGEN_HD void load_step(const uint8_t* __restrict__ row, int s, int n_units, StepWeights<T, S>& w) {
    if constexpr (S == 2)
        load_pair(row, s, n_units, w);
    else
        load_unit(row, s, n_units, w);
}
template <GgmlType T, int S>
KVGEN_HD float step_dot(const StepWeights<T, S>& w, int u, const UnitActs& a, float acc) {
    if constexpr (S == 2)
        return pair_dot(w, u, a, acc);
    else
        return unit_dot(w, u, a, acc);
}

// A block of the integer products: mvi_warps(n_units) warps share R rows of NM matrices of one shape (NM = 2:
// SwiGLU's gate and up) for NT tokens, striding over their units, so each unit's weights are loaded once for all the
// tokens and each token's activations once for all the rows, and every lane has NM * R rows' 16-byte weight loads in
// flight at once. The block is as wide as the row's units need, up to kMviMaxWarps, in as few passes as that allows
// and then in equal ones (4096 columns: 4 warps, one pass; 5120: 5; 11008: 6 x 2 passes; 13824: 7 x 2), so that no
// pass leaves most of the block idle; at most 8 warps, so that two blocks fit an SM at the kernels' registers and
// one's start and end hide behind the other's loads. acc[m][r][i]: this thread's share of row r0 + r of matrix m for
// token i, summed over its units in the same order whatever NM, R and NT: a token's product is the same bits in a
// batch as alone.
constexpr int kMviMaxWarps = 8;
// Tokens a launch takes at most (a prompt of up to kMvMaxTokens goes in launches of this many).
constexpr int kMviMaxTokens = 8;
// Rows per block of each of NM matrices for NT tokens. One token: 4 of one matrix, 2 of each of gate and up. Several
// tokens: fewer where a thread's rows' weights and sums would not fit in 128 registers (ptxas sm_90, no spills): at
// most 32 sums, Q6_K and Q5_K 16, Q4_K 2 rows of one matrix for 8 tokens (4 rows spill 144 bytes there; for 4 tokens,
// 4 rows of one matrix or 2 of each of gate and up take 128 registers, no spills, since Q4_K's planar layout), Q5_K 2
// for 4 tokens too (4 rows: 72 bytes of stack).
template <GgmlType T>
KVGEN_HD constexpr int mvi_rows(int nm, int nt) {
    const int rows = ((nt > 4 && T == GgmlType::Q4_K) || (nt > 1 && T == GgmlType::Q5_K) ? 2 : 4) / nm;
    const int fit = (nt > 1 && (T == GgmlType::Q6_K || T == GgmlType::Q5_K) ? 16 : 32) / (nm * nt);
    return fit < 1 ? 1 : fit < rows ? fit : rows;
}
constexpr int kMviRows = mvi_rows<GgmlType::Q4_0>(1, 1);     // one token: rows per block of one matrix (4, any type)
constexpr int kMviGluRows = mvi_rows<GgmlType::Q4_0>(2, 1);  // one token: of each of gate and up (2)
// By default (--cuda-matvec-rows 8), one token's products of the types whose threads then still fit in 128 registers
// without spilling (sm_90: Q4_0 94, 124 in steps of two units; Q8_0 115; Q4_K 100; Q6_K would spill) take twice the
// rows a block: each thread has twice the 16-byte loads in flight, and the launch has half the blocks (H200, 7B tg128:
// Q4_0 +1.4%, Q8_0 +4.7%). A row's sum is the same bits whatever the rows a block: its threads' shares and their
// reduction do not depend on them.
constexpr int kMviWideRows = 2 * kMviRows;
KVGEN_HD constexpr bool mvi_wide_type(GgmlType t) {
    return t == GgmlType::Q4_0 || t == GgmlType::Q8_0 || t == GgmlType::Q4_K;
}
// How the integer products' blocks take their rows and units (Settings::cuda_matvec_rows, cuda_matvec_unit).
struct MviShape {
    bool wide = false;  // one token of a wide type: kMviWideRows rows a block (--cuda-matvec-rows 8)
    bool pairs = true;  // Q4_0: a lane's step is two units (--cuda-matvec-unit 64), one token or several
    int stages = 0;     // 2-4: through a ring of shared memory (matvec_ring; --cuda-matvec-stages), rows a group
                        // as without wide; 0: matvec_int_thread
    bool mma = false;   // 2-64 tokens of Q4_0 / Q8_0 / Q4_K / Q6_K without QkvStore on the tensor cores
                        // (matvec_int_mma.cuh; --cuda-matvec-mma on, sm_80 and later)
};
// Rows a block of NM matrices of a pair type takes for NT tokens with steps of two units: a thread then holds twice
// each row's weights, so 8 tokens take 2 rows (sm_90, Q4_0, the register path: 86 registers; one token with 8 rows
// 124, 4 tokens with 4 rows 128; no stack).
template <GgmlType T>
KVGEN_HD constexpr int mvi_pair_rows(int nm, int nt) {
    const int rows = mvi_rows<T>(nm, nt), cap = nm == 1 ? 2 : 1;
    return nt > 4 && rows > cap ? cap : rows;
}
// Calls f(std::integral_constant<int, R>{}, std::integral_constant<int, S>{}) with the rows R a block of NM matrices
// of type T takes for NT tokens and the units S a lane's step takes: S = 2 for a pair type with shape.pairs (rows
// mvi_pair_rows, or kMviWideRows / NM for one token when wide), else 1 (rows mvi_rows, or twice that for one token of
// a wide type when wide).
template <GgmlType T, int NM, int NT, typename F>
void with_mvi_shape(MviShape shape, F&& f) {
    using One = std::integral_constant<int, 1>;
    if constexpr (mvi_pair_type(T)) {
        if (shape.pairs) {
            using Two = std::integral_constant<int, 2>;
            if constexpr (NT == 1) {
                if (shape.wide) return f(std::integral_constant<int, kMviWideRows / NM>{}, Two{});
            }
            return f(std::integral_constant<int, mvi_pair_rows<T>(NM, NT)>{}, Two{});
        }
    }
    if constexpr (NT == 1 && mvi_wide_type(T)) {
        if (shape.wide) return f(std::integral_constant<int, kMviWideRows / NM>{}, One{});
    }
    f(std::integral_constant<int, mvi_rows<T>(NM, NT)>{}, One{});
}
// The same for a ring launch (MviShape::stages): with_mvi_shape's choice without wide, whose wider blocks would only
// make a ring's slots take more shared memory (a ring's bytes in flight do not need registers).
template <GgmlType T, int NM, int NT, typename F>
void with_ring_shape(MviShape shape, F&& f) {
    if constexpr (mvi_pair_type(T)) {
        if (shape.pairs)
            return f(std::integral_constant<int, mvi_pair_rows<T>(NM, NT)>{}, std::integral_constant<int, 2>{});
    }
    f(std::integral_constant<int, mvi_rows<T>(NM, NT)>{}, std::integral_constant<int, 1>{});
}

// A block's R outputs v (held by lane 0 of its first warp) stored at y[r0 ..], and that thread counts the block done
// on the counter of their 32-row group after a fence; true, in every lane, for the group's last block (of 32 / R),
// which has set the counter back to zero for the next launch and may read the group's 32 outputs (past L1, after a
// fence). Run by the 32 lanes of one warp per block; rows a multiple of 32.
#pragma nv_exec_check_disable
template <int R, class Ctx>
KVGEN_HD bool group_store_last(const Ctx& ctx, int lane, const float (&v)[R], float* y, int64_t r0, int* counters) {
    static_assert(32 % R == 0, "a 32-row group is whole blocks");
    const int64_t g = r0 / 32;
    float last = 0.0f;
    if (lane == 0) {
        for (int r = 0; r < R; ++r) y[r0 + r] = v[r];
        ctx.fence();  // the outputs are visible to every block before the count says so
        const bool done = ctx.atomic_add(&counters[g], 1) == 32 / R - 1;
        if (done) counters[g] = 0;
        last = done ? 1.0f : 0.0f;
    }
    ctx.sync_warp();  // lane 0's observation of the count is ordered before the other lanes' loads after this
    if (ctx.warp_sum(last) == 0.0f) return false;  // lane 0's answer, the same in every lane
    ctx.fence();
    return true;
}

// The SwiGLU product's output quantized where it is made, for the down projection (one launch fewer per layer): the
// last block of each 32-row group (group_store_last) writes the group's outputs as ActBlock yq[r0 / 32]
// (quantize_act_warp: the blocks quantize_act makes).
#pragma nv_exec_check_disable
template <int R, class Ctx>
KVGEN_HD void glu_store_quantized(const Ctx& ctx, int lane, const float (&v)[R], float* y, int64_t r0, int* counters,
                                  ActBlock* yq) {
    if (!group_store_last(ctx, lane, v, y, r0, counters)) return;
    const int64_t g = r0 / 32;
    quantize_act_warp(ctx, ctx.load_other(y + 32 * g + lane), lane, yq[g]);
}

// The same for a launch of m <= NT tokens (a short prompt; R NT <= 32): lane t < R NT holds o, the output of row
// r0 + t / NT for token t % NT, stored at y[token][r0 ..] (y [m][rows]); every lane fences its store, and after the
// warp's barrier lane 0 fences again and counts the block done on its 32-row group's counter; the group's last block
// writes the group's outputs of each token i as ActBlock yq[i rows / 32 + g] (quantize_act_warp).
#pragma nv_exec_check_disable
template <int R, int NT, class Ctx>
KVGEN_HD void glu_store_quantized_tokens(const Ctx& ctx, int lane, float o, float* y, int64_t rows, int64_t r0, int m,
                                         int* counters, ActBlock* yq) {
    static_assert(32 % R == 0 && R * NT <= 32, "a 32-row group is whole blocks, a block's outputs one warp's");
    const int r = lane / NT, i = lane % NT;
    if (r < R && i < m) y[int64_t(i) * rows + r0 + r] = o;
    ctx.fence();      // each lane's output is visible to every block before the count says so
    ctx.sync_warp();  // ... and stored before lane 0 counts
    const int64_t g = r0 / 32;
    float last = 0.0f;
    if (lane == 0) {
        ctx.fence();  // (and lane 0's fence after the warp's stores: a release of them all, without relying on the
                      // lanes' fences being sequentially consistent)
        const bool done = ctx.atomic_add(&counters[g], 1) == 32 / R - 1;
        if (done) {
            counters[g] = 0;
            ctx.fence();  // the count read before the other blocks' outputs are
        }
        last = done ? 1.0f : 0.0f;
    }
    ctx.sync_warp();
    if (ctx.warp_sum(last) == 0.0f) return;  // lane 0's answer, the same in every lane
    ctx.fence();
    for (int t = 0; t < m; ++t)
        quantize_act_warp(ctx, ctx.load_other(y + int64_t(t) * rows + 32 * g + lane), lane, yq[t * (rows / 32) + g]);
}

// The RMSNorm after a residual product, folded into it (one token): what the next integer products read, instead of
// a launch of rmsnorm_kernel. out = x * w / rms(x) quantized in blocks of 32 is the blocks of u = x * w with each
// scale divided by rms(x): a block's integers are round(u_j * 32512 / max |u|) either way, so the norm's factor is
// only needed at the end. The product's blocks add their rows to the residual x (group_store_last); each 32-row
// group's last block writes ActBlock xq[g] of x * w over its rows, unscaled, and the group's sum of squares in
// sums[g]; after a fence it counts the group done on counters[groups] (groups = dim / 32), and the last group's block
// sums the groups' sums in a fixed order (lane l: groups l, l + 32, ... in turn, then the butterfly), takes
// 1 / sqrt(sum / dim + eps) as rmsnorm_body does, and scales every block's d by it. The counters are zero between
// launches (each last block sets its own back).
struct NormStore {
    const float* w = nullptr;  // the norm's weight [dim]
    ActBlock* xq = nullptr;    // [dim / 32]: null for a product without the norm folded in
    float* sums = nullptr;     // [dim / 32]
    int* counters = nullptr;   // [dim / 32 + 1]
    float eps = 0.0f;
};

#pragma nv_exec_check_disable
template <int R, class Ctx>
KVGEN_HD void residual_norm_store(const Ctx& ctx, int lane, const float (&v)[R], float* x, int64_t r0, int64_t dim,
                                  const NormStore& ns) {
    if (!group_store_last(ctx, lane, v, x, r0, ns.counters)) return;
    const int64_t g = r0 / 32, groups = dim / 32;
    const float xv = ctx.load_other(x + 32 * g + lane);
    quantize_act_warp(ctx, xv * ns.w[32 * g + lane], lane, ns.xq[g]);
    // note: the square rounded on its own (fmaf with 0), so that no compiler fuses it into the butterfly's first add
    const float ss = ctx.warp_sum(fmaf(xv, xv, 0.0f));
    float last = 0.0f;
    if (lane == 0) {
        ns.sums[g] = ss;
        ctx.fence();  // the group's sum and block (lane 0 wrote d) are visible before the count says so
        const bool done = ctx.atomic_add(&ns.counters[groups], 1) == int(groups) - 1;
        if (done) ns.counters[groups] = 0;
        last = done ? 1.0f : 0.0f;
    }
    ctx.sync_warp();
    if (ctx.warp_sum(last) == 0.0f) return;
    ctx.fence();
    float part = 0.0f;
    for (int64_t k = lane; k < groups; k += 32) part += ctx.load_other(ns.sums + k);
    const float total = ctx.warp_sum(part);
    const float inv = float(1.0 / sqrt(double(total) / double(dim) + double(ns.eps)));
    for (int64_t k = lane; k < groups; k += 32) ns.xq[k].d = ctx.load_other(&ns.xq[k].d) * inv;
}

// The steps of a row of n_units units, S at a time.
KVGEN_HD constexpr int mvi_steps(int n_units, int s) {
    return (n_units + s - 1) / s;
}
KVGEN_HD int mvi_warps(int n_units) {
    if (n_units <= 32) return 1;
    const int max_threads = 32 * kMviMaxWarps;
    const int passes = (n_units + max_threads - 1) / max_threads;
    const int per_pass = (n_units + passes - 1) / passes;
    return (per_pass + 31) / 32;
}

// Calls f(std::integral_constant<int, NT>{}, i0, m) for each launch of an n-token integer product: launches of
// m <= NT tokens from token i0; NT = 1 for one token, else 4 or kMviMaxTokens (n > 8 in launches of 8).
template <typename F>
void int_launches(int n, F&& f) {
    if (n == 1) {
        f(std::integral_constant<int, 1>{}, 0, 1);
        return;
    }
    for (int i0 = 0; i0 < n; i0 += kMviMaxTokens) {
        const int m = n - i0 < kMviMaxTokens ? n - i0 : kMviMaxTokens;
        if (m <= 4)
            f(std::integral_constant<int, 4>{}, i0, m);
        else
            f(std::integral_constant<int, kMviMaxTokens>{}, i0, m);
    }
}

// Rows r0 .. r0 + R - 1 of each of NM matrices, and their sums for NT tokens set to zero. Rows past the matrix read
// its last row again (never written), so no branch splits the loads.
template <int NM, int R, int NT>
KVGEN_HD void block_rows(const uint8_t* const (&w)[NM], int64_t row_bytes, int64_t rows, int64_t r0,
                         const uint8_t* (&row)[NM][R], float (&acc)[NM][R][NT]) {
#pragma unroll
    for (int m = 0; m < NM; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) {
            row[m][r] = w[m] + (r0 + r < rows ? r0 + r : rows - 1) * row_bytes;
#pragma unroll
            for (int i = 0; i < NT; ++i) acc[m][r][i] = 0.0f;
        }
}

// Step s's units (S of them; the second of an odd row's last step skipped) dotted with each of n <= NT tokens'
// activations (token i's: the n_units ActBlocks at x + i * n_units) for every row, added to acc in order.
template <GgmlType T, int NM, int R, int NT, int S>
KVGEN_HD void step_dots(const StepWeights<T, S> (&wu)[NM][R], int s, int n_units, const ActBlock* __restrict__ x, int n,
                        float (&acc)[NM][R][NT]) {
#pragma unroll
    for (int h = 0; h < S; ++h) {
        const int u = S * s + h;
        if (S > 1 && u >= n_units) break;  // an odd row's last step
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            if (NT > 1 && i >= n) break;  // the same for the whole block
            UnitActs a;
            load_unit_acts<T>(x + int64_t(i) * n_units, u, a);
#pragma unroll
            for (int m = 0; m < NM; ++m)
#pragma unroll
                for (int r = 0; r < R; ++r) acc[m][r][i] = step_dot<T, S>(wu[m][r], u, a, acc[m][r][i]);
        }
    }
}

// Token i's activations are the n_units ActBlocks at x + i * n_units, for i < n <= NT. The threads stride over steps
// of S units (mvi_steps; S = 2 for Q4_0 with --cuda-matvec-unit 64), each step's units dotted in order.
template <GgmlType T, int NM, int R, int NT, int S = 1>
KVGEN_HD void matvec_int_thread(const uint8_t* const (&w)[NM], int64_t row_bytes, int n_units, int64_t rows, int64_t r0,
                                int t, int n_threads, const ActBlock* __restrict__ x, int n, float (&acc)[NM][R][NT]) {
    static_assert(S == 1 || (S == 2 && mvi_pair_type(T)), "steps of two units for Q4_0");
    const uint8_t* row[NM][R];
    block_rows(w, row_bytes, rows, r0, row, acc);
    // The first step's weights are loaded before pdl_wait: they depend on no kernel, so under programmatic launch
    // they stream in while the kernel that writes x still runs. Offsets inside a row are 32-bit.
    const int n_steps = (n_units + S - 1) / S;
    int s = t;
    StepWeights<T, S> wu[NM][R];
    if (s < n_steps)
#pragma unroll
        for (int m = 0; m < NM; ++m)
#pragma unroll
            for (int r = 0; r < R; ++r) load_step<T, S>(row[m][r], s, n_units, wu[m][r]);
    pdl_wait();
    while (s < n_steps) {
        step_dots<T, NM, R, NT, S>(wu, s, n_units, x, n, acc);
        s += n_threads;
        if (s < n_steps)
#pragma unroll
            for (int m = 0; m < NM; ++m)
#pragma unroll
                for (int r = 0; r < R; ++r) load_step<T, S>(row[m][r], s, n_units, wu[m][r]);
    }
}

// --- decode products through a ring of shared memory (--cuda-matvec-stages) -----------------------------------
// matvec_int_thread loads a step's weights into registers and uses them at once, so a thread has one step's bytes in
// flight, and a block of one step a thread (LLaMA-2's 4096- and 5120-column rows: 128 and 160 units for as many
// threads) loads once, waits, multiplies and ends: each SM streams only while new blocks replace those that end. The
// ring takes the weights through shared memory instead: a grid of as many blocks as the SMs hold, each taking its
// groups of R rows (block, block + grid, ...) one after another, and each thread copying its items (a step of a
// group) into its own slots of `stages` stages by cp.async, stages - 1 items ahead of the one it multiplies, across
// the groups' ends. A thread reads no slot of another thread's, so it waits for its own copies only
// (cp.async.wait_group), no barrier; the bytes in flight are (stages - 1) items of the thread's, held by no register.
// Each group's sums take block_rows_sum's barrier, while the copies of the items after it stream on.

// A step's weights of one row as the ring holds them: n16 16-byte pieces and n4 4-byte words, copied from the row
// (sources: where each starts, 16- and 4-byte aligned) and made into the step's registers (make), the same values
// load_step gives. A 2-byte d or scale comes in the aligned word that holds it (the word of a row's last odd block
// reaches into the row's padding to 16 bytes).
template <GgmlType T, int S>
struct RingStep;
template <>
struct RingStep<GgmlType::Q4_0, 1> {
    static constexpr int n16 = 1, n4 = 1;
    KVGEN_HD static void sources(const uint8_t* row, int u, int n_units, const uint8_t* (&p16)[n16],
                                 const uint8_t* (&p4)[n4]) {
        p16[0] = row + 16 * u;
        p4[0] = row + 16 * n_units + 4 * (u / 2);
    }
    KVGEN_HD static UnitWeights<GgmlType::Q4_0> make(const uint4 (&v)[n16], const uint32_t (&w)[n4], int u) {
        return UnitWeights<GgmlType::Q4_0>{v[0], uint16_t(w[0] >> (16 * (u % 2)))};
    }
};
template <>
struct RingStep<GgmlType::Q4_0, 2> {
    static constexpr int n16 = 2, n4 = 1;
    KVGEN_HD static void sources(const uint8_t* row, int s, int n_units, const uint8_t* (&p16)[n16],
                                 const uint8_t* (&p4)[n4]) {
        p16[0] = row + 32 * s;
        p16[1] = row + 32 * s + 16;
        p4[0] = row + 16 * n_units + 4 * s;
    }
    KVGEN_HD static PairWeights<GgmlType::Q4_0> make(const uint4 (&v)[n16], const uint32_t (&w)[n4], int) {
        return PairWeights<GgmlType::Q4_0>{{v[0], v[1]}, w[0]};
    }
};
template <>
struct RingStep<GgmlType::Q8_0, 1> {
    static constexpr int n16 = 2, n4 = 1;
    KVGEN_HD static void sources(const uint8_t* row, int u, int n_units, const uint8_t* (&p16)[n16],
                                 const uint8_t* (&p4)[n4]) {
        p16[0] = row + 32 * u;
        p16[1] = row + 32 * u + 16;
        p4[0] = row + 32 * n_units + 4 * (u / 2);
    }
    KVGEN_HD static UnitWeights<GgmlType::Q8_0> make(const uint4 (&v)[n16], const uint32_t (&w)[n4], int u) {
        return UnitWeights<GgmlType::Q8_0>{{v[0], v[1]}, uint16_t(w[0] >> (16 * (u % 2)))};
    }
};
template <>
struct RingStep<GgmlType::Q4_K, 1> {
    static constexpr int n16 = 1, n4 = 2;
    KVGEN_HD static void sources(const uint8_t* row, int u, int n_units, const uint8_t* (&p16)[n16],
                                 const uint8_t* (&p4)[n4]) {
        const int sb = u / 8, k = u % 8, n_super = n_units / 8;
        p16[0] = row + 128 * sb + 16 * k;
        p4[0] = row + q4k_scales_at(n_super) + 16 * sb + 4 * (k / 2);
        p4[1] = row + q4k_d_at(n_super) + 4 * sb;
    }
    KVGEN_HD static UnitWeights<GgmlType::Q4_K> make(const uint4 (&v)[n16], const uint32_t (&w)[n4], int) {
        return UnitWeights<GgmlType::Q4_K>{v[0], w[0], w[1]};
    }
};
template <>
struct RingStep<GgmlType::Q6_K, 1> {
    static constexpr int n16 = 2, n4 = 3;
    // the words of the scales hold sc0 at byte 2 qa + g and sc1 at the same byte of the next word
    KVGEN_HD static void sources(const uint8_t* row, int u, int n_units, const uint8_t* (&p16)[n16],
                                 const uint8_t* (&p4)[n4]) {
        const int sb = u / 8, n_super = n_units / 8;
        const int k = u % 8, h = k / 4, qa = (k / 2) % 2, g = k % 2;
        const uint8_t* b = row + 192 * sb;
        p16[0] = b + 64 * h + 32 * qa + 16 * g;
        p16[1] = b + 128 + 32 * h + 16 * g;
        p4[0] = row + 192 * n_super + 16 * sb + 8 * h;
        p4[1] = p4[0] + 4;
        p4[2] = row + 208 * n_super + 4 * (sb / 2);
    }
    KVGEN_HD static UnitWeights<GgmlType::Q6_K> make(const uint4 (&v)[n16], const uint32_t (&w)[n4], int u) {
        const int k = u % 8, byte = 2 * ((k / 2) % 2) + k % 2;
        return UnitWeights<GgmlType::Q6_K>{v[0], v[1], int(int8_t(uint8_t(w[0] >> (8 * byte)))),
                                           int(int8_t(uint8_t(w[1] >> (8 * byte)))),
                                           uint16_t(w[2] >> (16 * ((u / 8) % 2)))};
    }
};

template <>
struct RingStep<GgmlType::Q5_K, 1> {
    static constexpr int n16 = 3, n4 = 0;
    KVGEN_HD static void sources(const uint8_t* row, int u, int, const uint8_t* (&p16)[n16], const uint8_t* (&)[1]) {
        const uint8_t* b = row + int64_t(kQ5kBlockBytes) * (u / 8);
        const int k = u % 8;
        p16[0] = b + kQ5kQsAt + 16 * k;
        p16[1] = b + kQ5kQhAt + 16 * (k % 2);
        p16[2] = b;
    }
    KVGEN_HD static UnitWeights<GgmlType::Q5_K> make(const uint4 (&v)[n16], const uint32_t (&)[1], int u) {
        return q5k_unit(v[0], v[1], v[2], u);
    }
};

// A ring's steps as matvec_ring takes them, for the integer products: RingStep's pieces, StepWeights' registers,
// steps of S units, and step_dots' sums. (F16Ring, below, is the F16 products'.) Each such policy P has steps (units
// a step), n16 and n4 (its pieces; n4 may be 0), Weights, sources and make (RingStep's), thread (the register path's
// thread, matvec_int_thread's arguments) and dots (a step's sums, step_dots' arguments).
template <GgmlType T, int S>
struct IntRing : RingStep<T, S> {
    static constexpr int steps = S;
    using Weights = StepWeights<T, S>;
    using Act = ActBlock;
    template <int NM, int R, int NT>
    KVGEN_HD static void dots(const Weights (&wu)[NM][R], int s, int n_units, const ActBlock* __restrict__ x, int n,
                              float (&acc)[NM][R][NT]) {
        step_dots<T, NM, R, NT, S>(wu, s, n_units, x, n, acc);
    }
    template <int NM, int R, int NT>
    KVGEN_HD static void thread(const uint8_t* const (&w)[NM], int64_t row_bytes, int n_units, int64_t rows, int64_t r0,
                                int t, int n_threads, const ActBlock* __restrict__ x, int n, float (&acc)[NM][R][NT]) {
        matvec_int_thread<T, NM, R, NT, S>(w, row_bytes, n_units, rows, r0, t, n_threads, x, n, acc);
    }
};
// The 4-byte words a policy's slot holds, at least one (an array's size).
template <class P>
KVGEN_HD constexpr int ring_words() {
    return P::n4 > 0 ? P::n4 : 1;
}
template <class P>
KVGEN_HD RingLayout ring_layout(int threads, int slots, int stages) {
    return RingLayout{threads, slots, P::n16, P::n4, stages};
}
// Reads of a thread's own ring slots (plain loads: shared memory on the device, where __ldg would fault).
KVGEN_HD uint4 ring_ld16(const uint8_t* p) {
    check_aligned(p, 16);
    return *reinterpret_cast<const uint4*>(p);
}
KVGEN_HD uint32_t ring_ld4(const uint8_t* p) {
    check_aligned(p, 4);
    return *reinterpret_cast<const uint32_t*>(p);
}

// Waits for every group of the thread's copies but the stages - 1 committed last.
#pragma nv_exec_check_disable
template <class Ctx>
KVGEN_HD void ring_wait(const Ctx& ctx, int stages) {
    if (stages == 2)
        ctx.template wait_async_group<1>();
    else if (stages == 3)
        ctx.template wait_async_group<2>();
    else
        ctx.template wait_async_group<3>();
}

// Where a thread's next copies come from and go: the items it has issued, the group and step of the next one, and
// the stage it goes into.
struct RingCursor {
    int64_t issued = 0, group = 0;
    int step = 0, stage = 0;
};
// A thread's next item (c.issued, of `items`: step c.step of its group c.group, as matvec_ring orders them)
// copied into stage c.stage of its slots, and a group of copies committed (an empty one past the last item).
#pragma nv_exec_check_disable
template <class P, int NM, int R, class Ctx>
KVGEN_HD void ring_issue(const Ctx& ctx, uint8_t* ring, const RingLayout& L, const uint8_t* const (&w)[NM],
                         int64_t row_bytes, int n_units, int64_t rows, int64_t block, int64_t grid, int t,
                         int n_threads, int per, int64_t items, RingCursor& c) {
    if (c.issued < items) {
        const int64_t r0 = (block + c.group * grid) * R;
        const int s = t + c.step * n_threads;
#pragma unroll
        for (int m = 0; m < NM; ++m)
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const uint8_t* row = w[m] + (r0 + r < rows ? r0 + r : rows - 1) * row_bytes;
                const uint8_t* p16[P::n16];
                const uint8_t* p4[ring_words<P>()];
                P::sources(row, s, n_units, p16, p4);
#pragma unroll
                for (int k = 0; k < P::n16; ++k) ctx.copy16_async(ring + L.at16(c.stage, m * R + r, k, t), p16[k]);
#pragma unroll
                for (int j = 0; j < P::n4; ++j) ctx.copy4_async(ring + L.at4(c.stage, m * R + r, j, t), p4[j]);
            }
        if (++c.step == per) {
            c.step = 0;
            ++c.group;
        }
    }
    ++c.issued;
    c.stage = c.stage + 1 == L.stages ? 0 : c.stage + 1;
    ctx.commit_async();
}

// Thread t of `block` (of `grid`) of a ring launch of n_threads threads: groups of R rows block, block + grid, ...
// (group g: rows R g ..), each thread's steps of S units t, t + n_threads, ... in each group as matvec_int_thread
// takes them, so each group's sums are the same bits as a block of the register path. The thread's items (its steps
// of its groups, in order) are copied into stage (item % stages) of its ring slots, stages - 1 ahead: the first ones
// before pdl_wait; then for each item, the copies of the item stages - 1 later are issued into the stage the item
// before it used (its values already in registers), a group committed (empty past the last item, so that the count
// of groups stays what ring_wait expects), the item's own group waited for, its slots read and its units dotted. At
// each group's end done(r0, gi, acc) with the group's first row, its index among the block's groups and the thread's
// sums (every thread calls it for every group of its block, with zeros where it has no step).
// P: the steps' policy (IntRing, F16Ring), x its activations (ActBlocks, or the F16 products' floats).
#pragma nv_exec_check_disable
template <class P, int NM, int R, int NT, class Ctx, class Done>
KVGEN_HD void matvec_ring(const Ctx& ctx, uint8_t* ring, int stages, const uint8_t* const (&w)[NM], int64_t row_bytes,
                          int n_units, int64_t rows, int64_t block, int64_t grid, int t, int n_threads,
                          const typename P::Act* __restrict__ x, int n, Done&& done) {
    const RingLayout L = ring_layout<P>(n_threads, NM * R, stages);
    const int n_steps = mvi_steps(n_units, P::steps);
    const int per = t < n_steps ? (n_steps - 1 - t) / n_threads + 1 : 0;  // the thread's steps of a group
    const int64_t n_groups = (rows + R - 1) / R;
    const int64_t groups = block < n_groups ? (n_groups - 1 - block) / grid + 1 : 0;
    const int64_t items = int64_t(per) * groups;
    RingCursor c;
    for (int k = 0; k + 1 < stages; ++k)
        ring_issue<P, NM, R>(ctx, ring, L, w, row_bytes, n_units, rows, block, grid, t, n_threads, per, items, c);
    pdl_wait();
    int stage = 0;
    for (int64_t gi = 0; gi < groups; ++gi) {
        float acc[NM][R][NT];
#pragma unroll
        for (int m = 0; m < NM; ++m)
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int i = 0; i < NT; ++i) acc[m][r][i] = 0.0f;
        for (int j = 0; j < per; ++j) {
            ring_issue<P, NM, R>(ctx, ring, L, w, row_bytes, n_units, rows, block, grid, t, n_threads, per, items, c);
            ring_wait(ctx, stages);
            const int s = t + j * n_threads;
            typename P::Weights wu[NM][R];
#pragma unroll
            for (int m = 0; m < NM; ++m)
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    uint4 v[P::n16];
                    uint32_t v4[ring_words<P>()] = {};
#pragma unroll
                    for (int k = 0; k < P::n16; ++k) v[k] = ring_ld16(ring + L.at16(stage, m * R + r, k, t));
#pragma unroll
                    for (int k = 0; k < P::n4; ++k) v4[k] = ring_ld4(ring + L.at4(stage, m * R + r, k, t));
                    wu[m][r] = P::make(v, v4, s);
                }
            stage = stage + 1 == stages ? 0 : stage + 1;
            P::template dots<NM, R, NT>(wu, s, n_units, x, n, acc);
        }
        done((block + gi * grid) * R, int(gi), acc);
    }
}

// --- F16 and BF16 weights, one token, f32 activations ---------------------------------------------------------
// The integer products' block scheme for 16-bit float rows, F16 or BF16 (T; both keep exact f32 products with the
// f32 activations, each weight widened to f32 exactly): a block
// of mvi_warps(n_units) warps shares R rows of NM matrices (NM = 2: SwiGLU's gate and up), its threads striding over
// their units of 32 weights, each unit's 64 bytes four 16-byte loads a row, all of a unit's rows' loads issued before
// the first is used, the first unit's before pdl_wait; the unit's 32 activations are eight 16-byte loads (L1) shared
// by the rows. A unit's products run in matvec_lane's order for a chunk (two interleaved chains of fused multiply-
// adds, then acc += s0 + s1), and the block's shares are summed as the integer products' are (block_rows_sum).
// Compiled for the host too (the CPU-only tests run it).
constexpr int kMvF16Rows = 4;  // rows a block of one matrix; SwiGLU: 2 of each of gate and up

struct F16Unit {
    uint4 q[4];  // 32 halves (F16 or BF16 bits)
};
// A 16-bit float row's weight as f32: T is F16 or BF16.
template <GgmlType T>
KVGEN_HD float half_weight(uint16_t h) {
    static_assert(T == GgmlType::F16 || T == GgmlType::BF16, "16-bit float rows");
    if constexpr (T == GgmlType::F16)
        return half_bits(h);
    else
        return Bf16ToFloat::of(h);
}
KVGEN_HD void load_f16_unit(const uint8_t* __restrict__ row, int u, F16Unit& w) {
#pragma unroll
    for (int k = 0; k < 4; ++k) w.q[k] = ld16(row + 64 * u + 16 * k);
}
template <GgmlType T>
KVGEN_HD float f16_unit_dot(const F16Unit& w, const float (&xv)[32], float acc) {
    uint32_t h[16];
#pragma unroll
    for (int k = 0; k < 4; ++k) words_of(w.q[k], h + 4 * k);
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {  // word i: weight 2i in its low half, 2i + 1 in its high half
        s0 = fmaf(half_weight<T>(uint16_t(h[i] & 0xffffu)), xv[2 * i], s0);
        s1 = fmaf(half_weight<T>(uint16_t(h[i] >> 16)), xv[2 * i + 1], s1);
    }
    return acc + (s0 + s1);
}

// Unit u's 32 activations (eight 16-byte loads) dotted with each row's unit, added to acc.
template <GgmlType T, int NM, int R>
KVGEN_HD void f16_unit_dots(const F16Unit (&wu)[NM][R], int u, const float* __restrict__ x, float (&acc)[NM][R][1]) {
    float xv[32];
    load_chunk(x + int64_t(u) * 32, xv);
#pragma unroll
    for (int m = 0; m < NM; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r][0] = f16_unit_dot<T>(wu[m][r], xv, acc[m][r][0]);
}

template <GgmlType T, int NM, int R>
KVGEN_HD void matvec_f16_thread(const uint8_t* const (&w)[NM], int64_t row_bytes, int n_units, int64_t rows, int64_t r0,
                                int t, int n_threads, const float* __restrict__ x, float (&acc)[NM][R][1]) {
    const uint8_t* row[NM][R];
    block_rows(w, row_bytes, rows, r0, row, acc);
    int u = t;
    F16Unit wu[NM][R];
    if (u < n_units)
#pragma unroll
        for (int m = 0; m < NM; ++m)
#pragma unroll
            for (int r = 0; r < R; ++r) load_f16_unit(row[m][r], u, wu[m][r]);
    pdl_wait();
    while (u < n_units) {
        f16_unit_dots<T>(wu, u, x, acc);
        u += n_threads;
        if (u < n_units)
#pragma unroll
            for (int m = 0; m < NM; ++m)
#pragma unroll
                for (int r = 0; r < R; ++r) load_f16_unit(row[m][r], u, wu[m][r]);
    }
}

// Calls f(TypeTag<BF16>{}) for BF16, else f(TypeTag<F16>{}): the 16-bit float rows' kernels of type T.
template <typename F>
void with_half_type(GgmlType t, F&& f) {
    if (t == GgmlType::BF16)
        f(TypeTag<GgmlType::BF16>{});
    else
        f(TypeTag<GgmlType::F16>{});
}

// The F16 (BF16: T) products' steps through a ring (matvec_ring, --cuda-matvec-stages): a unit's 64 bytes of a row
// in four 16-byte pieces, its 32 activations loaded and dotted as matvec_f16_thread does, one token: the same bits.
template <GgmlType T>
struct F16Ring {
    static constexpr int steps = 1, n16 = 4, n4 = 0;
    using Weights = F16Unit;
    using Act = float;
    KVGEN_HD static void sources(const uint8_t* row, int u, int, const uint8_t* (&p16)[n16], const uint8_t* (&)[1]) {
#pragma unroll
        for (int k = 0; k < 4; ++k) p16[k] = row + 64 * u + 16 * k;
    }
    KVGEN_HD static F16Unit make(const uint4 (&v)[n16], const uint32_t (&)[1], int) {
        return F16Unit{{v[0], v[1], v[2], v[3]}};
    }
    template <int NM, int R, int NT>
    KVGEN_HD static void dots(const F16Unit (&wu)[NM][R], int u, int, const float* __restrict__ x, int,
                              float (&acc)[NM][R][NT]) {
        static_assert(NT == 1, "F16 rings take one token");
        f16_unit_dots<T>(wu, u, x, acc);
    }
    template <int NM, int R, int NT>
    KVGEN_HD static void thread(const uint8_t* const (&w)[NM], int64_t row_bytes, int n_units, int64_t rows, int64_t r0,
                                int t, int n_threads, const float* __restrict__ x, int, float (&acc)[NM][R][NT]) {
        matvec_f16_thread<T, NM, R>(w, row_bytes, n_units, rows, r0, t, n_threads, x, acc);
    }
};

// Calls f(TypeTag<T>{}) for the types with an integer product; false for the others.
template <typename F>
bool dispatch_int_type(GgmlType t, F&& f) {
    switch (t) {
        case GgmlType::Q4_0:
            f(TypeTag<GgmlType::Q4_0>{});
            return true;
        case GgmlType::Q8_0:
            f(TypeTag<GgmlType::Q8_0>{});
            return true;
        case GgmlType::Q4_K:
            f(TypeTag<GgmlType::Q4_K>{});
            return true;
        case GgmlType::Q5_K:
            f(TypeTag<GgmlType::Q5_K>{});
            return true;
        case GgmlType::Q6_K:
            f(TypeTag<GgmlType::Q6_K>{});
            return true;
        default:
            return false;
    }
}

}  // namespace kvgen::cuda
