#pragma once
// y = x W^T for a weight in its GGUF type: y[i][r] = dot(W row r, x[i]) for n tokens. Each row is decoded once per
// call and dotted with every token (matrix-vector for decode, matrix-matrix for prefill). Rows are split across
// threads; each row's sum runs in a fixed order, so results do not depend on the thread count.
#include <cstdint>

#include "cpu/thread_pool.h"
#include "model/weights.h"

namespace kvgen::cpu {

// x: [n][w.cols], y: [n][w.rows]. scratch: at least threads x w.cols floats.
void matmul(float* y, const float* x, const WeightView& w, int n, float* scratch, ThreadPool& pool);

// Rows `rows` of an embedding-like weight, decoded: out [n][w.cols].
void get_rows(float* out, const WeightView& w, const int32_t* rows, int n);

// The instruction set the kernels were dispatched to ("avx2" or "generic").
const char* matmul_isa();

namespace kernels {
// One implementation per instruction set (matmul_avx2.cpp, matmul_generic.cpp): rows [r0, r1).
void matmul_rows_avx2(float* y, const float* x, const WeightView& w, int n, int64_t r0, int64_t r1, float* buf);
void matmul_rows_generic(float* y, const float* x, const WeightView& w, int n, int64_t r0, int64_t r1, float* buf);
}  // namespace kernels

}  // namespace kvgen::cpu
