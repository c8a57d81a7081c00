// Compiled with -mavx2 -mfma -mf16c; used only where the CPU has them.
#define KVGEN_VD(name) name##_avx2
#include "cpu/vecdot_kernels.inc"
