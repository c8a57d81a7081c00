#pragma once
// The basis a quantized KV cache stores its rows in. Keys carry a few channels far larger than the rest, and a block
// of 32 values that holds one of them gets a scale so coarse that its other values round to almost nothing (4-bit
// blocks fare worst). Before a q8_0 / q4_0 row is quantized it is multiplied, in pieces of w values, by the w x w
// Walsh-Hadamard matrix H (entries +1 and -1, H H = w I; w the largest power of two dividing head_dim: 64 for
// head_dim 64, 128 for 128, 32 for 96): every stored value is then a sum over its piece, the energy is spread evenly
// and one scale per block fits all of its values. Nothing is lost: attention needs K only through
// q . k = (H q / w) . (H k), and V only through sum_t p_t v_t = H (sum_t p_t H v_t) / w, so the query is rotated once
// per step, the output once per head, and the cached rows are read as they are. Dividing by w is exact in floating
// point; only the sums of H x round (f32), far below the quantization step.
#include "common/hd.h"

namespace kvgen {

// The piece width w for a head_dim (a multiple of 32 wherever the cache is quantized).
KVGEN_HD int kv_rotation_width(int head_dim) { return head_dim & -head_dim; }

// x[0..w) <- H x[0..w), in place (w a power of two): the fast Walsh-Hadamard transform, log2(w) rounds of w / 2
// butterflies.
KVGEN_HD void hadamard(float* x, int w) {
    for (int len = 1; len < w; len *= 2)
        for (int i = 0; i < w; i += 2 * len)
            for (int j = i; j < i + len; ++j) {
                const float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
}

// A K or V row of head_dim values into the stored basis: H x per piece.
KVGEN_HD void kv_rotate(float* x, int head_dim) {
    const int w = kv_rotation_width(head_dim);
    for (int b = 0; b < head_dim; b += w) hadamard(x + b, w);
}

// n values (rows of head_dim) <- H x / w per piece: the query's side of q . k, and the attention output's way back.
KVGEN_HD void kv_rotate_scaled(float* x, int n, int head_dim) {
    const int w = kv_rotation_width(head_dim);
    const float inv_w = 1.0f / float(w);
    for (int b = 0; b < n; b += w) {
        hadamard(x + b, w);
        for (int j = 0; j < w; ++j) x[b + j] *= inv_w;
    }
}

}  // namespace kvgen
