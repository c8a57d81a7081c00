// Compiled with AVX-512 (BW, VL, VNNI) as well as AVX2, FMA and F16C; used only where the CPU has them.
#include "cpu/matmul.h"
#define KVGEN_VEC_DOT_ROWS vec_dot_rows_avx512
#define KVGEN_MATMUL_ROWS matmul_rows_avx512
#include "cpu/matmul_kernels.inc"
