// The portable build of the matmul kernels: any x86-64 (or other) CPU.
#include "cpu/matmul.h"
#define KVGEN_VEC_DOT_ROWS vec_dot_rows_generic
#define KVGEN_MATMUL_ROWS matmul_rows_generic
#include "cpu/matmul_kernels.inc"
