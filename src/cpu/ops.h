#pragma once
// Element-wise and attention ops of the CPU forward pass. Shapes: [n_tokens][...] rows, outermost first.
#include <cstdint>

#include "cpu/thread_pool.h"
#include "engine/kv_cache.h"
#include "engine/rope.h"
#include "model/config.h"

namespace kvgen::cpu {

// out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * w, for n rows of dim.
void rmsnorm(float* out, const float* x, const float* w, int n, int dim, float eps);

// cos/sin tables for n positions pos0..: [n][rope_dim / 2] each.
void rope_tables(float* cos_t, float* sin_t, int pos0, int n, const RopeFreqs& r);
// Rotates adjacent pairs (x[2j], x[2j+1]) of the first rope_dim dims of every head: x is [n][n_heads][head_dim].
void rope(float* x, const float* cos_t, const float* sin_t, int n, int n_heads, const Config& c);

// h[j] = silu(gate[j]) * up[j], in place in gate.
void swiglu(float* gate, const float* up, int64_t count);
void add(float* x, const float* y, int64_t count);

// Causal attention of n queries at positions pos0.. over cache positions 0..pos: out and q are
// [n][n_heads][head_dim]; query head h reads KV head h / n_rep. scratch: threads x attention_scratch floats.
void attention(float* out, const float* q, const KvCache& kv, int l, int pos0, int n, const Config& c,
               float* scratch, ThreadPool& pool);
int64_t attention_scratch(const Config& c, int n_ctx);
// The positions whose K or V rows attention decodes at a time (into its scratch).
constexpr int kAttentionRowTile = 32;
// The most consecutive tokens of a prompt that share each decoded K or V row (attention_items' token_tile).
constexpr int kAttentionTokenTile = 8;

namespace kernels {
// One (tile of token_tile consecutive tokens, KV head) pair per work item, for items [w0, w1) of
// ceil(n / token_tile) * n_kv_heads: the scores, their softmax and the weighted values of the group's n_rep query heads
// for each token of the tile, each K and V row decoded once for the tile. Every output is computed as with a tile of
// one token: the tile changes the memory traffic, not the bits. token_tile: 1 .. kAttentionTokenTile. scratch:
// attention_scratch floats.
void attention_items_avx512(float* out, const float* q, const KvCache& kv, int l, int pos0, const Config& c, int n,
                            int token_tile, int64_t w0, int64_t w1, float* scratch);
void attention_items_avx2(float* out, const float* q, const KvCache& kv, int l, int pos0, const Config& c, int n,
                          int token_tile, int64_t w0, int64_t w1, float* scratch);
void attention_items_generic(float* out, const float* q, const KvCache& kv, int l, int pos0, const Config& c, int n,
                             int token_tile, int64_t w0, int64_t w1, float* scratch);
// The parts of one item, for splitting an item's positions or columns across threads (each element is computed as
// the items function computes it). scores: [n_rep] rows `stride` apart, positions [t0, t1) of KV head g for a query
// that sees n_pos positions, from qg (attention_query's); rows: kAttentionRowTile * head_dim floats. Where K carries
// offsets and the query sees rows past the first kKvOffsetPositions, the scores of those first rows have q . offset
// taken off (engine/kv_offset.h), so that every score is of the same k - offset.
void attention_scores_avx512(float* scores, int64_t stride, const float* qg, const KvCache& kv, int l, int g, int t0,
                             int t1, int n_pos, const Config& c, float* rows);
void attention_scores_avx2(float* scores, int64_t stride, const float* qg, const KvCache& kv, int l, int g, int t0,
                           int t1, int n_pos, const Config& c, float* rows);
void attention_scores_generic(float* scores, int64_t stride, const float* qg, const KvCache& kv, int l, int g, int t0,
                              int t1, int n_pos, const Config& c, float* rows);
// og[r][j0, j0 + width) (after attention_softmax zeroed it) += the softmaxed scores' weighted V columns over
// positions 0 .. n_pos; j0 and width multiples of 32 where V is quantized.
void attention_values_avx512(float* og, const float* scores, int64_t stride, const KvCache& kv, int l, int g, int n_pos,
                             int j0, int width, const Config& c, float* rows);
void attention_values_avx2(float* og, const float* scores, int64_t stride, const KvCache& kv, int l, int g, int n_pos,
                           int j0, int width, const Config& c, float* rows);
void attention_values_generic(float* og, const float* scores, int64_t stride, const KvCache& kv, int l, int g,
                              int n_pos, int j0, int width, const Config& c, float* rows);
// The query heads of token i's group g as attention reads them: q itself, or turned into q_rot ([n_rep][head_dim])
// where K is quantized (the rotated basis of kv_rotation.h).
const float* attention_query(float* q_rot, const float* q, const KvCache& kv, int i, int g, const Config& c);
// A group's output rows og ([n_rep][head_dim]) as attention returns them: turned back from the rotated basis where V
// is quantized.
void attention_output(float* og, const KvCache& kv, const Config& c);
// s[0..n_pos) <- softmax(s), and o[0..hd) <- 0; the three builds give the same bits.
void attention_softmax_avx512(float* s, int n_pos, float* o, int hd);
void attention_softmax_avx2(float* s, int n_pos, float* o, int hd);
void attention_softmax_generic(float* s, int n_pos, float* o, int hd);
}  // namespace kernels

}  // namespace kvgen::cpu
