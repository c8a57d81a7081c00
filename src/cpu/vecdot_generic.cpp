#define KVGEN_VD(name) name##_generic
#include "cpu/vecdot_kernels.inc"
