#pragma once
// Test support for the CUDA kernels, built only with the tests (kvgen_cuda_testing). cuda::testing: each kernel
// through the launcher the backend uses on a device (device_calls.cu), for the [cuda] tests. cuda::host: the kernels'
// bodies run on the host (host_emulation.cu), for the CPU-only tests. Declared without CUDA types.
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/kv_layout.h"
#include "model/config.h"
#include "gguf/ggml_types.h"

namespace kvgen::cuda::testing {

// A step's queries [n][q rows] as written (rotated), and the K and V cache rows of its key and value heads read back,
// [n][heads][head_dim] (QkvStore).
struct QkvStored {
    std::vector<float> q, k, v;
};

// A KV cache as the device holds it, copied to the host: every layer's K rows, then V rows, each
// [n_layers][n_kv_heads][n_ctx][row bytes] (0xee where never written), and the key offsets, f32
// [n_layers][n_kv_heads][head_dim] (empty where K carries none, KvLayout::k_offsets; zeros until set).
struct KvBytes {
    KvLayout kv;
    std::vector<uint8_t> k, v;
    std::vector<float> k_offsets;
    explicit KvBytes(const KvLayout& layout)
        : kv(layout),
          k(layout.k_bytes(), 0xee),
          v(layout.v_bytes(), 0xee),
          k_offsets(
              layout.k_offsets() ? size_t(layout.n_layers) * size_t(layout.n_kv_heads) * size_t(layout.head_dim) : 0,
              0.0f) {}
};

// rows x cols weights of `type` given as their GGUF bytes.
struct HostWeight {
    GgmlType type;
    int64_t rows, cols;
    const std::vector<uint8_t>* bytes;
};

std::vector<float> dequantize(const HostWeight& w, bool via_f16);
std::vector<float> get_rows(const HostWeight& w, const std::vector<int32_t>& ids);
// y = W x (accumulate: y0 + W x) through the decode kernel (F16: the block kernel unless f16_block is false, its
// weights through rings of `stages` stages where 2-4, MviShape::stages).
std::vector<float> matvec(const HostWeight& w, const std::vector<float>& x, const std::vector<float>* y0,
                          bool f16_block = true, int stages = 0);
// [n][rows] = x[n][cols] . W^T through the short-prompt kernel (n <= 16, each weight read once); accumulate onto y0
// when given.
std::vector<float> matvec_batch(const HostWeight& w, const std::vector<float>& x, int n, const std::vector<float>* y0);
// The same product of an F16 weight on split activations (to_f16_split, f16_split_product: cuBLAS on 2n rows of
// halves); rows [0, first_rows) go to one buffer, the next second_rows to another and the rest to a third, as a
// fused Q|K|V's go to q, k and v.
std::vector<float> f16_split(const HostWeight& w, const std::vector<float>& x, int n, const std::vector<float>* y0,
                             int64_t first_rows, int64_t second_rows);
// The same on the weight-tile kernel (BF16 and the quantized types split_prompt_type takes): gemm_weight_mma on the 2n
// split rows, its columns split as sm_count SMs call for (mma_device), then f16_split_sum.
std::vector<float> f16_split_tiled(const HostWeight& w, const std::vector<float>& x, int n,
                                   const std::vector<float>* y0, int sm_count);
// y = W x in integers: x quantized by quantize_act, then matvec_int (Q4_0, Q8_0, Q4_K, Q6_K); n tokens x [n][cols]
// give y [n][rows]. stages: MviShape::stages (2-4: rings of shared memory, where the device has cp.async; 0: the
// register path).
// mma: n of 2 to 16 tokens of Q4_0 / Q8_0 / Q4_K / Q6_K on the tensor cores (MviShape::mma; the device must be sm_80 or
// later). pairs: Q4_0 in steps of two units (MviShape::pairs, --cuda-matvec-unit 64, the default), else one.
std::vector<float> matvec_int(const HostWeight& w, const std::vector<float>& x, int n = 1, int stages = 0,
                              bool mma = false, bool pairs = true);
// The carveout (percent) that the kernel node of a graph captured from one token's integer product of w through a ring
// of `stages` carries (cudaKernelNodeAttributePreferredSharedMemoryCarveout), with --cuda-ring-carveout fit or max
// (set_ring_carveout); -1 where the build has no such attribute or the graph no kernel node.
int ring_node_carveout(const HostWeight& w, int stages, bool fit);
// silu(gate x) * (up x) through the fused integer kernel; n tokens, stages, mma and pairs as matvec_int.
std::vector<float> matvec_glu_int(const HostWeight& gate, const HostWeight& up, const std::vector<float>& x, int n = 1,
                                  int stages = 0, bool mma = false, bool pairs = true);
// silu(gate x) * (up x) through the fused decode kernel (F16: the block kernel unless f16_block is false).
std::vector<float> matvec_glu(const HostWeight& gate, const HostWeight& up, const std::vector<float>& x,
                              bool f16_block = true, int stages = 0);
// [n][rows] = x[n][cols] . W^T through the prefill path (f16 decode + cuBLAS; mma: gemm_weight_mma where
// gemm_mma_ok, as the backend's --cuda-gemm mma, its tiles chosen for a device of sm_count SMs, its columns split
// among blocks where that leaves SMs idle unless split is false, two stages of shared memory where the device has
// room unless stages is 1); accumulate onto y0 when given. chunk_mib: the cuBLAS path's chunk (--cuda-gemm-chunk; 0:
// the whole matrix, -1 auto for sm_count SMs); overlap: its chunks decoded on a second stream (--cuda-gemm-overlap).
std::vector<float> gemm(const HostWeight& w, const std::vector<float>& x, int n, const std::vector<float>* y0,
                        bool mma = false, int sm_count = 132, bool split = true, int stages = 2, int chunk_mib = 16,
                        bool overlap = false);

// The products of x with each of ws in turn through gemm_weight (cuBLAS on decoded chunks), as prefill makes a
// layer's: product i names ws[next[i]] as the one after it (-1: none), whose first chunk is decoded while its own
// last is multiplied where overlap (--cuda-gemm-overlap) is on. chunk_mib: --cuda-gemm-chunk (-1: auto, for a device
// of sm_count SMs). Each weight's cols times n is x's size. taken: where given, how many products took their first
// chunk from the decoding ahead.
std::vector<std::vector<float>> gemm_chain(const std::vector<HostWeight>& ws, const std::vector<int>& next,
                                           const std::vector<float>& x, int n, int chunk_mib, int sm_count,
                                           bool overlap, int64_t* taken = nullptr);

// The one-kernel product (gemm_weight_mma, x through to_f16) writing Q, K and V: rows [0, q_rows), the next k_rows
// and the rest to three buffers, gathered back here into [n][rows].
std::vector<float> gemm_mma_qkv(const HostWeight& w, const std::vector<float>& x, int n, int64_t q_rows,
                                int64_t k_rows, int sm_count = 132);
// silu(f16(x) . gate^T) * (f16(x) . up^T) [n][rows] in one kernel (gemm_glu_mma).
std::vector<float> gemm_glu_mma(const HostWeight& gate, const HostWeight& up, const std::vector<float>& x, int n,
                                int sm_count = 132);

std::vector<float> rmsnorm(const std::vector<float>& x, const std::vector<float>& w, int n, int dim, float eps);
std::vector<float> swiglu(const std::vector<float>& gate, const std::vector<float>& up);
// rmsnorm with the split for a short prompt's products folded in: the f32 rows [n][dim], then the 2 n dim halves
// (high parts, then low parts) as floats.
std::vector<float> rmsnorm_split(const std::vector<float>& x, const std::vector<float>& w, int n, int dim, float eps);
// f16_split_sum of t ([2n][rows]) onto out = y0 ([n][rows]; accumulate, or with glu SwiGLU's gate sums), the next
// input split where split: the rows, then (split) the 2 n rows halves as floats.
std::vector<float> f16_split_sum(const std::vector<float>& t, int n, int64_t rows, const std::vector<float>& y0,
                                 bool accumulate, bool glu, bool split);
// rmsnorm with the quantization folded in: the f32 rows [n][dim], then each ActBlock as d, s, h[0], h[1], q[0..31]
// (36 floats).
std::vector<float> rmsnorm_quantized(const std::vector<float>& x, const std::vector<float>& w, int n, int dim,
                                     float eps);
// One token's residual product with the next RMSNorm folded in (matvec_int with NormStore; wide: 8 rows a block of
// Q4_0 / Q8_0): the rows residual + W x, then the norm's ActBlocks (36 floats each as above), then the rows / 32 + 1
// counters as left after the launch.
std::vector<float> matvec_int_residual_norm(const HostWeight& w, const std::vector<float>& x,
                                            const std::vector<float>& residual, const std::vector<float>& norm_w,
                                            float eps, bool wide, int stages = 0);
// The ActBlocks quantize_act makes of x (a multiple of 32 values), 36 floats each as above.
std::vector<float> quantize_act(const std::vector<float>& x);
// kv_rotate_rows with its ActBlocks (head_dim 64 or 128): the turned rows, then their blocks, 36 floats each.
std::vector<float> rotate_rows_quantized(const std::vector<float>& x, int head_dim);
// A step's Q, K and V products in integers (one matrix Q|K|V, or three) over an f16 cache of n_ctx positions with c's
// heads, tokens x [n][cols] at positions pos0..: .first with RoPE and the store in the products' epilogue (QkvStore),
// .second with rope_store_kv's launch after them.
std::pair<QkvStored, QkvStored> qkv_store(const HostWeight& wq, const HostWeight& wk, const HostWeight& wv,
                                          bool one_product, const std::vector<float>& x, int n, const Config& c,
                                          int pos0, int n_ctx);
// f16_split_sum of t ([2n][rows]) with RoPE and the f16 K/V store as its tail (SplitSumTail::qkv) over a cache of
// n_ctx positions with c's heads at positions pos0..: rows [0, q_end) queries, [q_end, k_end) keys, the rest values.
// launch (a whole Q|K|V product): the plain sums, then rope_store_kv's launch, on the same RoPE tables.
QkvStored f16_split_sum_qkv_store(const std::vector<float>& t, int n, int64_t rows, const Config& c, int pos0,
                                  int n_ctx, int64_t q_end, int64_t k_end, bool launch = false);
// W x through matvec_split with rows [0, q_rows) to one buffer, the next k_rows to a second and the rest to a third,
// read back and concatenated (= W x when the split is right).
std::vector<float> matvec_qkv(const HostWeight& w, const std::vector<float>& x, int64_t q_rows, int64_t k_rows);
// x [n][n_heads][head_dim] rotated for positions pos0 .. (freq_factors: [rope_dim / 2] or empty).
std::vector<float> rope(const std::vector<float>& x, int n, int n_heads, int pos0, const Config& c,
                        const std::vector<float>& freq_factors);

// Attention of n queries q [n][n_heads][head_dim] at positions pos0 .. over K/V [pos0 + n][n_kv_heads][head_dim]
// (f32, stored without rotation into a one-layer cache of n_ctx positions by store_step: positions [0, pos0), then
// the queries' own). n == 1 uses the flash-decoding kernel with `splits` splits (fold: the combine folded into it, as
// the backend runs it), n > 1 the prefill kernel: flash attention on the tensor cores where head_dim has it and
// tensor_cores is set (splits > 1: the positions split among that many blocks per query block, then combined), else
// a warp per query. The cache's K and V types kt, vt (a quantized one: the query rotated
// before, the output after, as the backend does; a K with offsets: the layer's offsets passed to the kernel).
// flash_async: over an f16 cache, flash attention's tiles copied in two stages (--cuda-flash-pipeline). warp_split:
// a block of up to 16 rows splits each tile's positions among its warps (--cuda-flash-warps positions).
std::vector<float> attention(const Config& c, const std::vector<float>& q, const std::vector<float>& k,
                             const std::vector<float>& v, int pos0, int n, int n_ctx, int splits, bool fold = false,
                             bool tensor_cores = true, KvType kt = KvType::F16, KvType vt = KvType::F16,
                             bool flash_async = true, bool warp_split = true);
// One step of n positions pos0 .. of K and V ([n][n_kv_heads][head_dim] each, no RoPE) stored into layer l as
// CudaOps::rope_store_kv stores it: store_kv; and where the step writes the last of the first kKvOffsetPositions rows
// of a K with offsets, store_kv of the rows before it, kv_offsets of the layer, store_kv of the rest.
void store_step(KvBytes& cache, int l, const float* k, const float* v, int pos0, int n);
// Positions [0, n) of every layer loaded as CudaOps::kv_write loads them (k, v packed as KvCache::read gives them),
// the key offsets set again by kv_offsets when the rows hold the first kKvOffsetPositions.
void kv_write(KvBytes& cache, const void* k, const void* v, int n);
// K rotated and stored by store_kv for positions pos0 .. pos0 + n, read back from the f16 cache as floats:
// [n][n_kv_heads][head_dim].
std::vector<float> store_k(const Config& c, const std::vector<float>& k, int pos0, int n, int n_ctx);
// rope_store_kv's one launch: *q rotated in place, and K as store_k reads it back.
std::vector<float> rope_store_k(const Config& c, std::vector<float>* q, const std::vector<float>& k, int pos0, int n,
                                int n_ctx);
// One layer's step of n tokens at pos0 (k, v: [pos0 + n][n_kv_heads][head_dim], the earlier positions stored first as
// store_step does) over a kt / vt cache of n_ctx positions with c's heads and RoPE, stored as CudaOps::rope_store_kv
// stores it (the rows before kKvOffsetPositions, the layer's offsets, then the rest): with_q, by rope_store_kv with
// q [n][n_heads][head_dim]; else by store_kv, q left as given. The query and the cache after the step.
struct RopeStored {
    std::vector<float> q;
    std::vector<uint8_t> k, v;
    std::vector<float> k_offsets;
};
RopeStored rope_store_step(const Config& c, KvType kt, KvType vt, const std::vector<float>& q,
                           const std::vector<float>& k, const std::vector<float>& v, int pos0, int n, int n_ctx,
                           bool with_q);
// rope_store_kv of a q8_0 cache with nothing left to store (a step whose rows a first part stored): q, rotated by RoPE
// and turned into the basis K is stored in.
std::vector<float> rope_q_after_store(const Config& c, const std::vector<float>& q, int pos0, int n);

}  // namespace kvgen::cuda::testing

namespace kvgen::cuda::host {

// The device decoders and the matvec lane body run on the host (no GPU needed): the bit layouts and the kernel's
// indexing, checked by the CPU-only tests against dequantize_row.
std::vector<float> dequantize(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols);
// y = W x with the kernel's lane split (32 lanes, stride 32 chunks, kMvRows rows per warp) and a butterfly sum.
std::vector<float> matvec(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols, const std::vector<float>& x);
// The activation blocks quantize_act writes for x (a multiple of 32 values): per block d, the sum, the sums of each
// half and 32 int16.
struct HostActBlock {
    float d;
    int32_t s;
    int32_t h[2];
    int16_t q[32];
};
std::vector<HostActBlock> quantize_act(const std::vector<float>& x);
// The same blocks by quantize_act_item, one after another: the inputs the host's integer products take.
std::vector<HostActBlock> quantize_act_items(const std::vector<float>& x);
// y = W x in integers with matvec_int_kernel's blocks and their sums (Q4_0, Q8_0, Q4_K, Q6_K); for n tokens x
// [n][cols], y [n][rows], in the launches the device makes (up to 8 tokens each); pairs: Q4_0 in steps of
// two units (MviShape, --cuda-matvec-unit 64), else one; stages 2-4: the weights through rings of that many stages
// (matvec_ring, --cuda-matvec-stages) in a few blocks that take several row groups each, 0: through registers.
std::vector<float> matvec_int(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                              const std::vector<float>& x, int n = 1, bool pairs = true, int stages = 0);
// y = W x for F16 or BF16 (type) rows (the GGUF bytes; cols a multiple of 32) with matvec_f16_kernel's blocks
// (matvec_f16_thread, kMvF16Rows rows a block) and block_rows_sum's order; with up, silu(W x) * (Up x), 2 rows of
// each a block; stages as matvec_int's (F16Ring).
std::vector<float> matvec_f16(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                              const std::vector<float>& x, const uint8_t* up = nullptr, int stages = 0);
// y = W x (with up: silu(W x) * (Up x)) in integers on the tensor cores, matvec_int_mma_body's blocks for n tokens
// (2 to 64 on the device, here 1 to 64) x [n][cols] in the device's launch (int_mma_launch_of: groups of up to 16
// tokens, Q6_K 8), y [n][rows]; Q4_0, Q8_0, Q4_K, Q6_K. Throws where an output is stored other than once. With yq
// (and up; rows a multiple of 32), the SwiGLU output also quantized by the launch (int_mma_glu_quantize): *yq its
// ActBlocks [n][rows / 32]; throws where a counter is not back at zero.
std::vector<float> matvec_int_mma(GgmlType type, const uint8_t* bytes, const uint8_t* up, int64_t rows, int64_t cols,
                                  const std::vector<float>& x, int n, std::vector<HostActBlock>* yq = nullptr);
// One warp's mma.sync m16n8k32 of A [16][32] and B [32][8] bytes (au, bu: unsigned, else signed) with every element of
// C starting at c0, the fragments laid out as DeviceThread::mma_i8 says: D [16][8].
std::vector<int> mma_i8(const uint8_t* a, const uint8_t* b, bool au, bool bu, int c0);
// The warps of matvec_int_kernel's block for rows of n_units units (mvi_warps).
int matvec_int_warps(int n_units);
// y = silu(gate x) * (up x) with matvec_glu_int_kernel's blocks (two rows of each matrix per block); n tokens as
// matvec_int.
std::vector<float> matvec_glu_int(GgmlType type, const uint8_t* gate, const uint8_t* up, int64_t rows, int64_t cols,
                                  const std::vector<float>& x, int n = 1, bool pairs = true, int stages = 0);
// The same with its output also quantized by the product (glu_store_quantized, the blocks in launch order): y, and
// *yq its ActBlocks; rows a multiple of 32.
std::vector<float> matvec_glu_int_quantized(GgmlType type, const uint8_t* gate, const uint8_t* up, int64_t rows,
                                            int64_t cols, const std::vector<float>& x, std::vector<HostActBlock>* yq);
// A short prompt's SwiGLU outputs sums [n][rows] as matvec_glu_int_kernel's tail stores and quantizes them
// (glu_store_quantized_tokens): launches of launch_tokens tokens (2, 4 or 8), blocks of block_rows rows (1, 2 or 4;
// the shapes listed in host_emulation.cu) in a shuffled order: y, and *yq its ActBlocks [n][rows / 32].
std::vector<float> glu_quantized_tokens(const std::vector<float>& sums, int n, int64_t rows, int block_rows,
                                        int launch_tokens, std::vector<HostActBlock>* yq);
// One token's residual product with the next RMSNorm folded in (matvec_int_kernel with NormStore, blocks of
// block_rows = 4 or 8 rows in a shuffled order): residual + W x (x quantized by quantize_act_items), and *xq the
// ActBlocks of its norm with weight norm_w (residual_norm_store); rows a multiple of 32.
std::vector<float> matvec_int_residual_norm(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                                            const std::vector<float>& x, const std::vector<float>& residual,
                                            const std::vector<float>& norm_w, float eps, int block_rows,
                                            std::vector<HostActBlock>* xq);
// [n][rows] = x[n][cols] . W^T with the short-prompt kernel's lane body (matvec_batch_lane, NT = 16).
std::vector<float> matvec_batch(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                                const std::vector<float>& x, int n);
// The same for F16 bytes on split activations (f16_split_product): x split by to_f16_split_item, the 2n rows' GEMM
// as cuBLAS gives it (each f16 x f16 product exact, summed in double and rounded to f32 here), and each token's two
// results added by f16_split_sum_item, onto y0 where given.
std::vector<float> f16_split(const uint8_t* bytes, int64_t rows, int64_t cols, const std::vector<float>& x, int n,
                             const std::vector<float>* y0);
// Each value of x as its split gives it back: high part + low part / kF16SplitScale (to_f16_split_item), in double.
std::vector<double> f16_split_values(const std::vector<float>& x);
// A short prompt's product on split activations for the types the tile kernel takes (CudaOps::split_proj): x split
// by to_f16_split_item, the 2n rows through gemm_mma (tiles of 64 tokens, `splits` ways, two stages), each token's two
// results added by f16_split_sum_item, onto y0 where given.
std::vector<float> f16_split_tiled(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                                   const std::vector<float>& x, int n, const std::vector<float>* y0, int splits);
// The element-wise kernels' bodies on the host (elementwise.cuh); arguments as their cuda::testing twins. The norm
// with blocks of `threads` threads (a multiple of 32, at most kNormThreads; the device's block is kNormThreads).
std::vector<float> rmsnorm(const std::vector<float>& x, const std::vector<float>& w, int n, int dim, float eps,
                           int threads = 256);
std::vector<float> rmsnorm_quantized(const std::vector<float>& x, const std::vector<float>& w, int n, int dim,
                                     float eps, int threads = 256);
std::vector<float> rmsnorm_split(const std::vector<float>& x, const std::vector<float>& w, int n, int dim, float eps,
                                 int threads = 256);
std::vector<float> f16_split_sum(const std::vector<float>& t, int n, int64_t rows, const std::vector<float>& y0,
                                 bool accumulate, bool glu, bool split);
// to_f16_split_item's halves of x (high parts, then low parts) as floats.
std::vector<float> split_halves(const std::vector<float>& x);
std::vector<float> rope(const std::vector<float>& x, int n, int n_heads, int pos0, const Config& c,
                        const std::vector<float>& freq_factors);
// rope_store_kv's query over a quantized K (head_dim 64 or 128): each row turned by RoPE and into K's basis by a warp
// (rope_turn_q_row_warp), in place.
std::vector<float> rope_turn_q(const std::vector<float>& x, int n, int n_heads, int pos0, const Config& c);
// A Q|K|V product in integers (matvec_int, n tokens x [n][cols]) with RoPE and the f16 K/V store in its epilogue
// (QkvStore): rows [0, q_end) queries, [q_end, k_end) keys, the rest values, at positions pos0.. of an f16 cache of
// n_ctx positions with c's heads and RoPE.
using testing::QkvStored;
QkvStored matvec_int_qkv_store(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                               const std::vector<float>& x, int n, const Config& c, int pos0, int n_ctx, int64_t q_end,
                               int64_t k_end);
// The sums of a Q|K|V product on split activations (f16_split_sum of t [2n][rows]) with RoPE and the f16 K/V store
// as their tail (SplitSumTail::qkv, f16_split_sum_qkv_item), rows as in matvec_int_qkv_store.
QkvStored f16_split_sum_qkv_store(const std::vector<float>& t, int n, int64_t rows, const Config& c, int pos0,
                                  int n_ctx, int64_t q_end, int64_t k_end);
std::vector<float> store_k(const Config& c, const std::vector<float>& k, int pos0, int n, int n_ctx);
std::vector<float> get_rows(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                            const std::vector<int32_t>& ids);
// Where RowSplit sends each of `rows` rows of each of n tokens (token after token) with the given ends:
// buffer * 1000000 + index in that buffer.
std::vector<int> row_split_targets(int64_t rows, int64_t end0, int64_t end1, int n = 1);
// Rows [r0, r0 + n_rows) of a rows x cols weight (cols a multiple of 32) as the prefill GEMM's decoding kernel writes
// them in f16 (dequantize_rows_body, every block of it), read back as floats.
std::vector<float> dequantize_rows(GgmlType type, const uint8_t* bytes, int64_t cols, int64_t r0, int64_t n_rows);
// The one-kernel prefill product (gemm_mma_body in tiles of tok = 64 or 128 tokens, every block of its grid, mma.sync
// emulated): [n][rows] = f16(x)[n][cols] . W^T, accumulated onto y0 when given. The kernel writes rows through a
// RowSplit with ends end0 and end1 (three buffers; rows and rows: one), gathered back into [n][rows]. With up_bytes
// (an up weight of the same type and shape; y0 null), the SwiGLU kernel: silu(f16(x) . W^T) * (f16(x) . Up^T).
// splits > 1 (not with up_bytes): the columns split among that many blocks per tile, then gemm_split_sum_item.
// stages: 1 or 2 steps in shared memory at a time (gemm_mma_stages).
std::vector<float> gemm_mma(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                            const std::vector<float>& x, int n, const std::vector<float>* y0, int tok,
                            const uint8_t* up_bytes, int64_t end0, int64_t end1, int splits = 1, int stages = 1);
// The attention kernels' own bodies (attention.cuh) run on the host, each CUDA thread a fiber; arguments as
// cuda::testing::attention. With xq, one token's decode also writes its output as the ActBlocks it quantizes.
std::vector<float> attention(const Config& c, const std::vector<float>& q, const std::vector<float>& k,
                             const std::vector<float>& v, int pos0, int n, int n_ctx, int splits, bool fold = false,
                             bool tensor_cores = true, KvType kt = KvType::F16, KvType vt = KvType::F16,
                             std::vector<HostActBlock>* xq = nullptr, bool flash_async = true, bool warp_split = true);
// Decode attention's split counts: the positions a split takes at least (kAttnSplitPositions), the splits a depth of
// n_pos uses (attention_active_splits), a launch's splits (attention_splits) and their bound (attention_max_splits).
int attention_split_positions();
int attention_active_splits(int n_pos, int splits);
int attention_splits(int n_heads, const KvLayout& kv, int sm_count);
int attention_max_splits(const KvLayout& kv);
// A prefill's splits of the cache positions (attention_prefill_splits), and the partials' floats the memory plan keeps
// (attention_partials).
int attention_prefill_splits(int n_heads, const KvLayout& kv, int n, int pos0, int sm_count);
int64_t attention_partials(int n_heads, int head_dim, int splits, int n_batch);
// Whether flash attention's warps split each tile's positions for n queries of a model with n_rep query heads a KV
// head (flash_warp_split, with the heads a block flash_heads_per_block gives).
bool flash_warp_split(int n, int n_rep);
// The emulator's own check: one warp whose lane 31 returns before the others shuffle (kind 0) or multiply with
// mma.sync (kind 1), which the device leaves undefined; throws kvgen::Error saying so. Kind 2: no lane returns.
void warp_after_a_lane_returned(int kind);
// The emulator's order of warps: what the second warp of a 64-thread block (block 0, 0) reads of a shared word (0
// until then) that the first warp writes (1) with no block barrier between: in the part after the block's first
// barrier (the word written at once), then in the part after its second (written after a warp barrier).
std::pair<float, float> unsynchronized_reads();
// Thread 0 of a block copies 16 bytes with copy16_async and ends without waiting for them: throws kvgen::Error.
void copy_never_waited();
// Lane 0 of a warp waits at a warp barrier while the others wait at the block's: throws kvgen::Error (deadlock).
void barrier_deadlock();
using testing::KvBytes;
// Rows of head_dim (64 or 128) values each turned as kv_rotate_rows_kernel turns them, a warp a row; xq (null: not
// wanted): the activation blocks it writes of the turned rows (one token's attention output over a quantized V).
std::vector<float> rotate_rows(const std::vector<float>& x, int head_dim, std::vector<HostActBlock>* xq = nullptr);
// store_step and kv_write with the kernels' items run on the host (store_kv_item, store_kv_row_warp, kv_offset_warp).
void store_step(KvBytes& cache, int l, const float* k, const float* v, int pos0, int n);
void kv_write(KvBytes& cache, const void* k, const void* v, int n);
// The values of `rows` cached rows of type t (q8_0 or q4_0, head_dim 64 or 128) at `bytes` (rows one after another,
// as in the cache), 8 columns at a time: as the wide decode attention reads them (kv_block_cols, kv_block_load,
// kv_block_decode), or as kv_load<8> does.
std::vector<float> kv_block_values(KvType t, const uint8_t* bytes, int rows, int head_dim);
std::vector<float> kv_load_values(KvType t, const uint8_t* bytes, int rows, int head_dim);
// Whether one token's decode attention over a cache of types k and v for c's heads reads its rows wide (8 columns a
// lane; warp_attend_wide) rather than a lane per head_dim / 32 columns, as attention_decode picks its kernel.
bool decode_reads_wide(const Config& c, KvType k, KvType v);

}  // namespace kvgen::cuda::host
