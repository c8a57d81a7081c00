// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni (and AVX2, FMA, F16C); used only where the CPU has them.
#define KVGEN_VD(name) name##_avx512
#include "cpu/vecdot_kernels.inc"
