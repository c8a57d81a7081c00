#include "cpu/matmul.h"

#include "common/error.h"
#include "model/dequant.h"

namespace kvgen::cpu {

namespace {

using RowsFn = void (*)(float*, const float*, const WeightView&, int, int64_t, int64_t, float*);

RowsFn pick() {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return kernels::matmul_rows_avx2;
#endif
    return kernels::matmul_rows_generic;
}

const RowsFn kRows = pick();

}  // namespace

const char* matmul_isa() { return kRows == kernels::matmul_rows_generic ? "generic" : "avx2"; }

void matmul(float* y, const float* x, const WeightView& w, int n, float* scratch, ThreadPool& pool) {
    KVGEN_ASSERT(w.tensor != nullptr);
    pool.parallel_for(w.rows, [&](int64_t r0, int64_t r1, int t) {
        kRows(y, x, w, n, r0, r1, scratch + int64_t(t) * w.cols);
    });
}

void get_rows(float* out, const WeightView& w, const int32_t* rows, int n) {
    for (int i = 0; i < n; ++i) dequantize_row(w.type, w.row(rows[i]), out + int64_t(i) * w.cols, w.cols);
}

}  // namespace kvgen::cpu
