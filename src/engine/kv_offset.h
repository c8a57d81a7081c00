#pragma once
// Key offsets of a quantized cache. Keys carry a bias: channels whose value is much the same for every token. RoPE
// turns channel pair j by an angle proportional to the position, so in the pairs that turn slowly (low frequencies)
// the bias stays put across the whole context, and a 4-bit block spends its few levels on it instead of on what
// differs between tokens. Attention is blind to a key offset: softmax(q . (k_t - c)) = softmax(q . k_t), since
// q . c is the same for every position t. So a quantized K row at position t >= kKvOffsetPositions is stored as
// k_t - c, where c (one per layer and KV head) is the mean of the first kKvOffsetPositions keys as stored, kept on
// the dimensions [dim0, head_dim) that turn by at most one radian over the context (and any past rope_dim), and the
// first kKvOffsetPositions rows are stored as they are. A reader adds c back to a row past them (or, the same for
// softmax, subtracts q . c from the scores of the first rows). c depends only on the stored bytes of those first
// rows, so it is the same whatever batches wrote them, after a prompt-cache file is loaded, and on either backend.
#include "common/hd.h"
#include "engine/kv_rotation.h"

namespace kvgen {

// The positions whose mean sets the offsets (a power of two: the mean is a sum times an exact 1/16).
constexpr int kKvOffsetPositions = 16;

// c in the stored (rotated) basis, from s: the sum, in position order, of the first kKvOffsetPositions rows of one
// head's K as stored (quantized values decoded: d * q, in the rotated basis). Their mean is turned back to the
// model's basis, its dimensions below dim0 set to zero, and turned to the stored basis again. s is overwritten
// with c.
KVGEN_HD void kv_offset_from_sum(float* s, int head_dim, int dim0) {
    for (int j = 0; j < head_dim; ++j) s[j] *= 1.0f / float(kKvOffsetPositions);
    kv_rotate_scaled(s, head_dim, head_dim);
    for (int j = 0; j < dim0; ++j) s[j] = 0.0f;
    kv_rotate(s, head_dim);
}

}  // namespace kvgen
