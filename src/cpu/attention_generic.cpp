#include "cpu/ops.h"
#define KVGEN_ATTENTION_ITEMS attention_items_generic
#define KVGEN_ATTENTION_SCORES attention_scores_generic
#define KVGEN_ATTENTION_VALUES attention_values_generic
#define KVGEN_ATTENTION_SOFTMAX attention_softmax_generic
#include "cpu/attention_kernels.inc"
