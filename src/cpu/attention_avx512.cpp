// Compiled with AVX-512 F, BW, VL and VNNI (and AVX2, FMA, F16C); used only where the CPU has them. The same bits as
// the other two builds: sixteen lanes where the arithmetic is element by element, the eight-lane order of the sums
// kept where it is not.
#include "cpu/ops.h"
#define KVGEN_ATTENTION_ITEMS attention_items_avx512
#define KVGEN_ATTENTION_SCORES attention_scores_avx512
#define KVGEN_ATTENTION_VALUES attention_values_avx512
#define KVGEN_ATTENTION_SOFTMAX attention_softmax_avx512
#include "cpu/attention_kernels.inc"
