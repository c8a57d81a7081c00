#include "cpu/matmul.h"

#include "common/error.h"
#include "model/dequant.h"

namespace kvgen::cpu {

namespace {

using RowsFn = void (*)(float*, const float*, const void*, int64_t, const WeightView&, int, int64_t, int64_t, float*);
using QuantFn = void (*)(const float*, BlockA32*, int64_t);
using QuantKFn = void (*)(const float*, BlockA256*, int64_t);

bool has_avx2() {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return false;
#endif
}

const bool kAvx2 = has_avx2();
const RowsFn kRows = kAvx2 ? kernels::matmul_rows_avx2 : kernels::matmul_rows_generic;
const QuantFn kQuant = kAvx2 ? kernels::quantize_a32_avx2 : kernels::quantize_a32_generic;
const QuantKFn kQuantK = kAvx2 ? kernels::quantize_a256_avx2 : kernels::quantize_a256_generic;

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

const char* matmul_isa() { return kAvx2 ? "avx2" : "generic"; }

const void* Activations::quantized(ActFormat f, ThreadPool& pool, int64_t* stride) {
    if (f == ActFormat::A256) {
        KVGEN_ASSERT(a256_ != nullptr && cols_ % 256 == 0);
        const int64_t nb = cols_ / 256;
        if (!have_a256_) each_row(n_, pool, [&](int64_t i) { kQuantK(x_ + i * cols_, a256_ + i * nb, cols_); });
        have_a256_ = true;
        *stride = nb * int64_t(sizeof(BlockA256));
        return a256_;
    }
    const int64_t nb = cols_ / 32;
    if (!have_a32_) each_row(n_, pool, [&](int64_t i) { kQuant(x_ + i * cols_, a32_ + i * nb, cols_); });
    have_a32_ = true;
    *stride = nb * int64_t(sizeof(BlockA32));
    return a32_;
}

void matmul(float* y, Activations& x, const WeightView& w, float* scratch, ThreadPool& pool) {
    KVGEN_ASSERT(w.tensor != nullptr && w.cols == x.cols());
    const ActFormat f = act_format(w.type);
    int64_t stride = 0;
    const void* xq = f == ActFormat::None ? nullptr : x.quantized(f, pool, &stride);
    const int n = x.n();
    pool.parallel_for(w.rows, [&](int64_t r0, int64_t r1, int t) {
        kRows(y, x.x(), xq, stride, w, n, r0, r1, scratch + int64_t(t) * w.cols);
    });
}

void get_rows(float* out, const WeightView& w, const int32_t* rows, int n) {
    for (int i = 0; i < n; ++i) dequantize_row(w.type, w.row(rows[i]), out + int64_t(i) * w.cols, w.cols);
}

}  // namespace kvgen::cpu
