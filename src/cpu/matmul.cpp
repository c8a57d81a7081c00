#include "cpu/matmul.h"

#include "common/error.h"
#include "cpu/cpu_features.h"
#include "cpu/ops.h"
#include "model/dequant.h"

namespace kvgen::cpu {

namespace {

using RowsFn = void (*)(float*, const float*, bool, ActFormat, const void*, int64_t, const WeightView&, int, int64_t,
                        int64_t, float*);

const bool kAvx2 = has_avx2();
const bool kAvx512 = has_avx512_vnni();
const RowsFn kRows = kAvx512 ? kernels::matmul_rows_avx512 : kAvx2 ? kernels::matmul_rows_avx2 : kernels::matmul_rows_generic;

// Quantizes n rows (in parallel when there are several).
template <typename Fn>
void each_row(int n, ThreadPool& pool, Fn&& fn) {
    if (n == 1) {
        fn(0);
        return;
    }
    pool.parallel_for(n, [&](int64_t i0, int64_t i1, int) {
        for (int64_t i = i0; i < i1; ++i) fn(i);
    });
}

// Types whose generated tokens' kernels take one token at a time (AVX2 and AVX-512; without AVX2 the scalar reference)
bool one_token_rows(GgmlType t) {
    return t == GgmlType::Q5_0 || t == GgmlType::Q5_1 || t == GgmlType::Q2_K || t == GgmlType::Q3_K;
}

}  // namespace

bool prompt_integer(GgmlType t) {
    switch (t) {
        case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q4_K: case GgmlType::Q5_K:
        case GgmlType::Q6_K: return true;
        default:
            return kAvx2 && one_token_rows(t);  // Q5_0, Q5_1, Q2_K, Q3_K
    }
}

bool prompt_matches_decode(GgmlType t) { return prompt_integer(t) || act_format(t) == ActFormat::None; }

const char* matmul_isa() { return kAvx512 ? "avx512-vnni" : kAvx2 ? "avx2" : "generic"; }

const void* Activations::quantized(ActFormat f, ThreadPool& pool, int64_t* stride) {
    const int k = int(f);
    const int64_t per = act_256(f) ? 256 : 32, nb = cols_ / per;
    KVGEN_ASSERT(cols_ % per == 0);
    void* out = nullptr;
    switch (f) {
        case ActFormat::A32: out = buf_.a32, *stride = nb * int64_t(sizeof(BlockA32)); break;
        case ActFormat::A256: out = buf_.a256, *stride = nb * int64_t(sizeof(BlockA256)); break;
        case ActFormat::B32: out = buf_.b32, *stride = nb * int64_t(sizeof(BlockB32)); break;
        case ActFormat::B256: out = buf_.b256, *stride = nb * int64_t(sizeof(BlockB256)); break;
        case ActFormat::None: KVGEN_ASSERT(false);
    }
    KVGEN_ASSERT(out != nullptr);
    if (!have_[k]) {
        each_row(n_, pool, [&](int64_t i) {
            const float* xi = x_ + i * cols_;
            switch (f) {
                case ActFormat::A32: quantize_a32(xi, buf_.a32 + i * nb, cols_); break;
                case ActFormat::A256: quantize_a256(xi, buf_.a256 + i * nb, cols_); break;
                case ActFormat::B32: quantize_b32(xi, buf_.b32 + i * nb, cols_); break;
                default: quantize_b256(xi, buf_.b256 + i * nb, cols_); break;
            }
        });
        have_[k] = true;
    }
    return out;
}

const void* Activations::tokens16(ActFormat f, ThreadPool& pool) {
    int64_t stride = 0;
    const int k = int(f);
    const int groups = (n_ + 15) / 16;
    auto group_size = [&](int64_t g) { return int(n_ - 16 * g < 16 ? n_ - 16 * g : 16); };
    const int64_t per = act_256(f) ? 256 : 32, nb = cols_ / per;
    void* out = f == ActFormat::A32    ? static_cast<void*>(buf_.t16)
                : f == ActFormat::A256 ? static_cast<void*>(buf_.t256)
                : f == ActFormat::B32  ? static_cast<void*>(buf_.u16)
                                       : static_cast<void*>(buf_.u256);
    if (!out || cols_ % per != 0) return nullptr;
    if (!have_t_[k]) {
        const void* a = quantized(f, pool, &stride);
        each_row(groups, pool, [&](int64_t g) {
            const int m = group_size(g);
            const int64_t at = 16 * g * nb;
            switch (f) {
                case ActFormat::A32:
                    tokens16_from_a32(static_cast<const BlockA32*>(a) + at, m, nb, buf_.t16 + g * nb);
                    break;
                case ActFormat::A256:
                    tokens16_from_a256(static_cast<const BlockA256*>(a) + at, m, nb, buf_.t256 + g * nb);
                    break;
                case ActFormat::B32:
                    tokens16_from_b32(static_cast<const BlockB32*>(a) + at, m, nb, buf_.u16 + g * nb);
                    break;
                default: tokens16_from_b256(static_cast<const BlockB256*>(a) + at, m, nb, buf_.u256 + g * nb); break;
            }
        });
        have_t_[k] = true;
    }
    return out;
}

namespace {

// matmul_many's body. paired: the weights have the same rows, and each thread takes the same range of rows in every
// weight, then calls after(r0, r1) on it (matmul_glu); else the threads split all the weights' rows as one list.
template <typename After>
void products(float* const* ys, Activations& x, const WeightView* const* ws, int count, float* scratch,
              ThreadPool& pool, bool paired, After&& after) {
    constexpr int kMax = 4;
    KVGEN_ASSERT(count >= 1 && count <= kMax);
    const int n = x.n();
    // A prompt's tokens side by side go in groups of 16: a group of fewer than min_group tokens (a short prompt, or
    // the last group of a longer one) would leave most of its lanes empty while each weight tile is still widened for
    // it, so its tokens take the generated tokens' kernels instead, four at a time (the same bits). Measured faster
    // below these counts (AVX-512, TinyLlama-shaped Q4_K_M, 2 threads): a short prompt of 6 to 8 tokens 1.3x to 1.5x
    // in 16 bits (level at 10), of 6 to 11 tokens up to 1.7x in 8 bits; the last group of a longer prompt, whose
    // weight tiles are widened for the groups before it anyway, 1.1x to 1.3x for 1 to 4 tokens, level at 6.
    const int min_group = !kAvx512 ? 14 : n > 16 ? 6 : x.mode() == MathMode::Fast ? 12 : 11;
    // Q5_0, Q5_1, Q2_K, Q3_K (one_token_rows): their generated tokens' kernels take a token at a time, each a pass
    // over the weights; measured (TinyLlama-shaped Q3_K and Q5_0 files, 2 threads) against a group of 16: a short
    // prompt of 3 tokens 1.2x to 1.6x faster that way, 4 even (Q3_K) or 1.3x (Q5_0), 6 slower (0.63x, 0.87x); the last
    // token of a longer prompt 1.2x to 1.4x, the last 2 even to 1.2x, the last 4 slower (0.77x, 0.92x).
    const int min_one = n > 16 ? 3 : 5;
    auto side = [&](GgmlType t) {
        const int mg = one_token_rows(t) ? min_one : min_group;
        return n % 16 < mg ? n - n % 16 : n;
    };
    const void* xs[kMax];  // tokens 0 .. n_gemm[i] side by side: tokens16 (null: the f32 tiles of x)
    const void* xq[kMax];  // the others as generated tokens: from token n_gemm[i], stride[i] bytes apart (null: f32)
    int64_t stride[kMax] = {}, total = 0;
    int n_gemm[kMax];
    ActFormat fs[kMax];
    const bool f32_math = x.mode() == MathMode::F32;
    for (int i = 0; i < count; ++i) {
        const WeightView& w = *ws[i];
        KVGEN_ASSERT(w.tensor != nullptr && w.cols == x.cols());
        const ActFormat f = f32_math ? ActFormat::None : act_format(w.type, x.mode());
        fs[i] = f;
        // A prompt: tokens side by side in integer products (AVX-512 VNNI), or for the same types elsewhere (or
        // without the buffers for them) the generated tokens' kernels: the same bits either way. f32 tiles for the
        // other types (Q5_0, Q5_1, Q2_K and Q3_K without AVX2, whose prompt_integer is false there) and for
        // everything with MathMode::F32. Quantized before the region.
        const bool integer = prompt_integer(w.type) && !f32_math;
        // the kernels for tokens16 (matmul_kernels.inc): AVX-512 VNNI; AVX2 for the 8-bit forms, the k-quants' and
        // Q5_0, Q5_1, Q2_K and Q3_K
        const bool side_by_side = kAvx512 || (kAvx2 && (act_8bit(f) || f == ActFormat::A256 || one_token_rows(w.type)));
        const int n_side = side(w.type);
        xs[i] = x.f32() && side_by_side && integer && n_side > 0 ? x.tokens16(f, pool) : nullptr;
        n_gemm[i] = !x.f32() ? 0 : !integer ? n : xs[i] != nullptr ? n_side : 0;
        xq[i] = n_gemm[i] == n || f == ActFormat::None
                    ? nullptr
                    : static_cast<const char*>(x.quantized(f, pool, &stride[i])) + int64_t(n_gemm[i]) * stride[i];
        KVGEN_ASSERT(!paired || w.rows == ws[0]->rows);
        total += w.rows;
    }
    pool.parallel_for(paired ? ws[0]->rows : total, [&](int64_t r0, int64_t r1, int t) {
        int64_t base = 0;  // the first row of weight i in the joint numbering
        for (int i = 0; i < count; ++i) {
            const WeightView& w = *ws[i];
            const int64_t lo = paired ? r0 : (r0 > base ? r0 : base) - base;
            const int64_t hi = paired ? r1 : (r1 < base + w.rows ? r1 : base + w.rows) - base;
            float* buf = scratch + int64_t(t) * matmul_scratch(w.cols);
            const int m = n_gemm[i];
            if (lo < hi && m > 0) kRows(ys[i], x.x(), true, fs[i], xs[i], 0, w, m, lo, hi, buf);
            if (lo < hi && m < n)
                kRows(ys[i] + int64_t(m) * w.rows, x.x() + int64_t(m) * w.cols, false, fs[i], xq[i], stride[i], w,
                      n - m, lo, hi, buf);
            base += w.rows;
        }
        if (paired) after(r0, r1);
    });
}

}  // namespace

void matmul_many(float* const* ys, Activations& x, const WeightView* const* ws, int count, float* scratch,
                 ThreadPool& pool) {
    products(ys, x, ws, count, scratch, pool, false, [](int64_t, int64_t) {});
}

void matmul_glu(float* h, float* up, Activations& x, const WeightView& w_gate, const WeightView& w_up,
                float* scratch, ThreadPool& pool) {
    float* const ys[] = {h, up};
    const WeightView* const ws[] = {&w_gate, &w_up};
    const int64_t rows = w_gate.rows;
    products(ys, x, ws, 2, scratch, pool, true, [&](int64_t r0, int64_t r1) {
        for (int i = 0; i < x.n(); ++i) swiglu(h + int64_t(i) * rows + r0, up + int64_t(i) * rows + r0, r1 - r0);
    });
}

void matmul(float* y, Activations& x, const WeightView& w, float* scratch, ThreadPool& pool) {
    const WeightView* const ws[] = {&w};
    matmul_many(&y, x, ws, 1, scratch, pool);
}

void get_rows(float* out, const WeightView& w, const int32_t* rows, int n) {
    for (int i = 0; i < n; ++i) dequantize_row(w.type, w.row(rows[i]), out + int64_t(i) * w.cols, w.cols);
}

}  // namespace kvgen::cpu
