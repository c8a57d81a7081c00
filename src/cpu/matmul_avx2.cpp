// Compiled with -mavx2 -mfma -mf16c (see src/CMakeLists.txt); used only where the CPU reports those features.
#include "cpu/matmul.h"
#define KVGEN_VEC_DOT_ROWS vec_dot_rows_avx2
#define KVGEN_MATMUL_ROWS matmul_rows_avx2
#include "cpu/matmul_kernels.inc"
