#include "cpu/ops.h"
#define KVGEN_ATTENTION_ITEMS attention_items_generic
#include "cpu/attention_kernels.inc"
