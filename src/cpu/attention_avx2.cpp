// Compiled with -mavx2 -mfma -mf16c; used only where the CPU has them.
#include "cpu/ops.h"
#define KVGEN_ATTENTION_ITEMS attention_items_avx2
#define KVGEN_ATTENTION_SCORES attention_scores_avx2
#define KVGEN_ATTENTION_VALUES attention_values_avx2
#define KVGEN_ATTENTION_SOFTMAX attention_softmax_avx2
#include "cpu/attention_kernels.inc"
