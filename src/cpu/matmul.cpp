#include "cpu/matmul.h"

#include "common/error.h"
#include "cpu/cpu_features.h"
#include "model/dequant.h"

namespace kvgen::cpu {

namespace {

using RowsFn = void (*)(float*, const float*, bool, const void*, int64_t, const WeightView&, int, int64_t, int64_t,
                        float*);

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

}  // namespace

bool prompt_integer(GgmlType t) {
    switch (t) {
        case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q4_K: case GgmlType::Q5_K:
        case GgmlType::Q6_K: return true;
        default: return false;
    }
}

bool prompt_matches_decode(GgmlType t) { return prompt_integer(t) || act_format(t) == ActFormat::None; }

const char* matmul_isa() { return kAvx512 ? "avx512-vnni" : kAvx2 ? "avx2" : "generic"; }

const void* Activations::quantized(ActFormat f, ThreadPool& pool, int64_t* stride) {
    if (f == ActFormat::A256) {
        KVGEN_ASSERT(a256_ != nullptr && cols_ % 256 == 0);
        const int64_t nb = cols_ / 256;
        if (!have_a256_) each_row(n_, pool, [&](int64_t i) { quantize_a256(x_ + i * cols_, a256_ + i * nb, cols_); });
        have_a256_ = true;
        *stride = nb * int64_t(sizeof(BlockA256));
        return a256_;
    }
    const int64_t nb = cols_ / 32;
    if (!have_a32_) each_row(n_, pool, [&](int64_t i) { quantize_a32(x_ + i * cols_, a32_ + i * nb, cols_); });
    have_a32_ = true;
    *stride = nb * int64_t(sizeof(BlockA32));
    return a32_;
}

const void* Activations::tokens16(ActFormat f, ThreadPool& pool) {
    int64_t stride = 0;
    const int groups = (n_ + 15) / 16;
    auto group_size = [&](int64_t g) { return int(n_ - 16 * g < 16 ? n_ - 16 * g : 16); };
    if (f == ActFormat::A256) {
        if (!t256_ || cols_ % 256 != 0) return nullptr;
        if (!have_t256_) {
            const auto* a = static_cast<const BlockA256*>(quantized(ActFormat::A256, pool, &stride));
            const int64_t nsb = cols_ / 256;
            each_row(groups, pool,
                     [&](int64_t g) { tokens16_from_a256(a + 16 * g * nsb, group_size(g), nsb, t256_ + g * nsb); });
            have_t256_ = true;
        }
        return t256_;
    }
    if (!t16_) return nullptr;
    if (!have_t16_) {
        const auto* a = static_cast<const BlockA32*>(quantized(ActFormat::A32, pool, &stride));
        const int64_t nb = cols_ / 32;
        each_row(groups, pool,
                 [&](int64_t g) { tokens16_from_a32(a + 16 * g * nb, group_size(g), nb, t16_ + g * nb); });
        have_t16_ = true;
    }
    return t16_;
}

void matmul_many(float* const* ys, Activations& x, const WeightView* const* ws, int count, float* scratch,
                 ThreadPool& pool) {
    constexpr int kMax = 4;
    KVGEN_ASSERT(count >= 1 && count <= kMax);
    const void* xq[kMax];
    int64_t stride[kMax] = {}, total = 0;
    bool gemm[kMax];
    for (int i = 0; i < count; ++i) {
        const WeightView& w = *ws[i];
        KVGEN_ASSERT(w.tensor != nullptr && w.cols == x.cols());
        const ActFormat f = act_format(w.type);
        // A prompt: tokens side by side in integer products (AVX-512 VNNI), or for the same types elsewhere (or
        // without the buffers for them) the generated tokens' kernels: the same bits either way. f32 tiles for the
        // other types. Quantized before the region.
        const void* t16 = x.f32() && kAvx512 && prompt_integer(w.type) ? x.tokens16(f, pool) : nullptr;
        gemm[i] = x.f32() && (t16 != nullptr || !prompt_integer(w.type));
        if (gemm[i])
            xq[i] = t16;
        else
            xq[i] = f == ActFormat::None ? nullptr : x.quantized(f, pool, &stride[i]);
        total += w.rows;
    }
    const int n = x.n();
    pool.parallel_for(total, [&](int64_t r0, int64_t r1, int t) {
        int64_t base = 0;  // the first row of weight i in the joint numbering
        for (int i = 0; i < count; ++i) {
            const WeightView& w = *ws[i];
            const int64_t lo = (r0 > base ? r0 : base) - base, hi = (r1 < base + w.rows ? r1 : base + w.rows) - base;
            if (lo < hi)
                kRows(ys[i], x.x(), gemm[i], xq[i], stride[i], w, n, lo, hi,
                      scratch + int64_t(t) * matmul_scratch(w.cols));
            base += w.rows;
        }
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
