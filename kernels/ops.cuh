#pragma once
// The CUDA kernels of the forward pass, as host launchers on a stream. Each one has a CPU twin, named beside it,
// that the [cuda] tests compare it with (tests/test_cuda_kernels.cpp). Shapes follow the CPU backend:
// activations are [n_tokens][...] rows of f32; one layer's K or V cache is f16, indexed through KvLayout::row.
// Positions come from device memory (d_pos0), so a captured decode graph replays at any position.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "elementwise.cuh"
#include "engine/kv_layout.h"
#include "gguf/ggml_types.h"
#include "matvec.cuh"
#include "matvec_int.cuh"
#include "memory_plan.h"

namespace kvgen::cuda {

// A weight matrix in device memory, in its GGUF type: rows of cols weights, row_bytes apart.
struct DevWeight {
    GgmlType type = GgmlType::F32;
    int64_t rows = 0, cols = 0, row_bytes = 0;
    const uint8_t* data = nullptr;
};

// True when kvgen has a device decoder for the type (every type the CPU computes with).
bool device_type_supported(GgmlType t);

// All weights of w decoded to f32 / f16, row-major [rows][cols]. Twin: dequantize_row.
void dequantize_f32(float* out, const DevWeight& w, cudaStream_t s);
void dequantize_f16(__half* out, const DevWeight& w, cudaStream_t s);

// out[i] = row tokens[i] of the embedding table, decoded. Twin: CPU get_rows (dequantize_row of the row).
void get_rows(float* out, const DevWeight& emb, const int32_t* d_tokens, int n, cudaStream_t s);

// y[r] = W[r] . x (y[r] += when accumulate), one token: the decode matrix-vector product, reading the quantized
// blocks directly. Twin: a double-precision dot of the dequantized row (the CPU matmul up to its rounding). F16 rows
// of whole 32-weight units take matvec_f16_kernel (matvec_f16_thread, matvec_int.cuh: a block of warps per 4 rows,
// 16-byte loads) unless f16_block is false (--cuda-f16-matvec warp: the warp kernel of every type); pdl: launched as
// a programmatic dependent launch (that kernel; sm_90); stages 2-4: that kernel's weights through rings of shared
// memory (F16Ring; MviShape::stages, --cuda-matvec-stages), 0 through registers.
void matvec(float* y, const DevWeight& w, const float* x, bool accumulate, cudaStream_t s, bool f16_block = true,
            bool pdl = false, int stages = 0);
// How much of each SM's L1 the rings' launches (the integer and F16 products with stages 2-4) take as shared memory,
// for the whole process (a backend sets it as each forward starts; Settings::cuda_ring_fit, --cuda-ring-carveout):
// fit (true) each launch the least that holds its blocks (a launch attribute: CUDA 12.6 builds and drivers and later;
// before, as false), the rest L1; false all an SM allows (the kernels' own attribute). The same results either way.
void set_ring_carveout(bool fit);
// The same product with its rows spread over up to three buffers (RowSplit, matvec.cuh): Q|K|V uploaded as one
// matrix fill q, k and v in one launch. Twin: three matvec calls.
void matvec_split(const RowSplit& y, const DevWeight& w, const float* x, cudaStream_t s, bool f16_block = true,
                  bool pdl = false, int stages = 0);

// Products in integers (matvec_int.cuh) for the types int_matvec_ok accepts, one token's or a short prompt's (n <=
// kMvMaxTokens): x is first quantized to 16-bit activation blocks (count values, a multiple of 32, into count / 32
// ActBlocks; n tokens of cols values: [n][cols / 32]), then y (+)= W x[i] through a RowSplit (token i's rows at
// RowSplit::at(r, i, rows)), each weight read once for up to kMviMaxTokens tokens; a token's result is the same bits
// as its product alone. pdl: launched as a programmatic dependent launch (sm_90 only), so that its weights start
// streaming while the kernel before it (the norm, attention or quantize_act that writes x, which let it start) still
// runs. With MviShape::mma, a product of 2 to kImBatchTokens tokens that int_mma_ok takes runs on the tensor cores
// instead (past kMvMaxTokens only there). Twins: cpu::quantize_a32 and the double-precision product of the dequantized
// rows.
bool int_matvec_ok(const DevWeight& w);
// Whether an n-token product with w (n <= kImBatchTokens, 64) may run on the tensor cores in integers
// (matvec_int_mma.cuh: Q4_0, Q8_0, Q4_K and Q6_K; with MviShape::mma, from 2 tokens, and then past kMvMaxTokens too).
bool int_mma_ok(const DevWeight& w, int n);
void quantize_act(ActBlock* out, const float* x, int64_t count, cudaStream_t s, bool pdl = false);
// With store (an f16 cache; not accumulate), the product's rows are queries, keys and values as QkvStore says: Q
// rotated into y, K rotated and K and V stored into the cache at the step's positions, as rope_store_kv would (the
// same bits; k and v are not written). shape (MviShape): wide (one token of Q4_0, Q8_0 or Q4_K; --cuda-matvec-rows 8,
// the default) kMviWideRows rows a block instead of kMviRows, the same bits; pairs (Q4_0; --cuda-matvec-unit 64, the
// default) steps of two units a lane, sums in another order than steps of one. With norm (one token,
// accumulate, one buffer, rows a multiple of 32: a residual product), the RMSNorm of the updated y with weight norm->w
// is also written into norm->xq as the ActBlocks an integer product reads (residual_norm_store, matvec_int.cuh): within
// a rounding step of the blocks rmsnorm's quantization makes of it; norm->counters: rows / 32 + 1 ints, zero before the
// first launch and left at zero.
void matvec_int(const RowSplit& y, const DevWeight& w, const ActBlock* x, int n, bool accumulate, bool pdl,
                cudaStream_t s, const QkvStore* store = nullptr, MviShape shape = {}, const NormStore* norm = nullptr);
// y[i][r] = silu(gate[r] . x[i]) * (up[r] . x[i]) in integers (glu_fusable and int_matvec_ok), n <= kMvMaxTokens
// (with MviShape::mma and int_mma_ok, up to kImBatchTokens).
// With yq (may be null; gate.rows a multiple of 32), y is also written as [n][gate.rows / 32] ActBlocks for the down
// projection, the blocks quantize_act makes of it; counters: kImMaxGroups x gate.rows / 32 ints (on the tensor cores
// each group of tokens counts on its own; the CUDA cores' launches use the first gate.rows / 32), zero before the
// first launch and left at zero. shape: as for matvec_int (wide: twice the rows of each of gate and up a block).
void matvec_glu_int(float* y, ActBlock* yq, int* counters, const DevWeight& gate, const DevWeight& up,
                    const ActBlock* x, int n, bool pdl, cudaStream_t s, MviShape shape = {});

// y[i][r] = W[r] . x[i] (+= when accumulate) for n tokens, 1 <= n <= kMvMaxTokens (16), in f32: each weight read
// once for all of them (a short prompt's prefill, for weights without an integer product). Twin: a double-precision
// dot of the dequantized row, per token.
void matvec_batch(float* y, const DevWeight& w, const float* x, int n, bool accumulate, cudaStream_t s);

// One token's SwiGLU: y[r] = silu(gate[r] . x) * (up[r] . x), both products in one warp (gate and up must share
// type and shape: glu_fusable). Twin: the two double-precision products and cpu::swiglu.
bool glu_fusable(const DevWeight& gate, const DevWeight& up);
void matvec_glu(float* y, const DevWeight& gate, const DevWeight& up, const float* x, cudaStream_t s,
                bool f16_block = true, bool pdl = false, int stages = 0);

// out = rmsnorm(x) * w for n rows of dim; with xq (may be null; dim a multiple of 32), each row also as dim / 32
// ActBlocks, quantized in the same kernel; with xh (may be null), the rows also split as to_f16_split makes them
// ([2n][dim] halves). pdl: a programmatic dependent launch (as matvec_int), which fetches w while the kernel before
// it still runs. Twins: cpu::rmsnorm, then quantize_act (to_f16_split) of the output.
void rmsnorm(float* out, ActBlock* xq, const float* x, const float* w, int n, int dim, float eps, bool pdl,
             cudaStream_t s, __half* xh = nullptr);

// cos/sin tables [n][rope_dim / 2] for positions *d_pos0 + i, theta from rope_theta (engine/rope.h) on a RopeFreqs'
// arrays in device memory (factors may be null). Twin: cpu::rope_tables.
void rope_tables(float* cos_t, float* sin_t, const int* d_pos0, int n, int half, const double* inv_freq,
                 const double* factors, double pos_div, cudaStream_t s);
// Rotates pairs of the first rope_dim dims of each head of x [n][n_heads][head_dim] in place. Twin: cpu::rope.
void rope(float* x, const float* cos_t, const float* sin_t, int n, int n_heads, int head_dim, int rope_dim,
          cudaStream_t s);
// Whether the GPU keeps a cache of kv's types: K and V each f16, or q8_0 / q4_0 for head_dim 64 or 128.
bool kv_cache_supported(const KvLayout& kv);
// Writes the step's tokens [i0, i1) of K (rotated like rope(); cos_t == nullptr: as given) and V, each
// [n][n_kv_heads][head_dim] f32, into one layer's cache (k_cache, v_cache: the layer's first row, kv_cache_supported
// types) at positions *d_pos0 + i; a quantized half in the rotated basis of kv_rotation.h (kv_quant.cuh). k_offsets:
// the layer's key offsets [n_kv_heads][head_dim] where K carries them (KvLayout::k_offsets; null otherwise), taken
// from the K rows at positions from kKvOffsetPositions on, so they must be set (kv_offsets) before any such row is
// stored: a step that crosses that position is stored in two parts with kv_offsets between. i0 > 0 only then (a
// quantized K). Twin: cpu::rope + KvCache::write (the same bytes).
void store_kv(uint8_t* k_cache, uint8_t* v_cache, const float* k, const float* v, const float* cos_t,
              const float* sin_t, const float* k_offsets, const int* d_pos0, int i0, int i1, const KvLayout& kv,
              int rope_dim, cudaStream_t s);
// store_kv, and in the same launch the query's RoPE: q [i1][n_heads][head_dim] rotated in place as rope() does (all
// i1 tokens, so a step stored in two parts passes q with the second); over a quantized K then also turned into the
// basis K is stored in, as kv_rotate_rows turns it (a warp a row), which attention reads it in. Twins: cpu::rope
// (and kv_rotate_scaled), then store_kv's.
void rope_store_kv(float* q, uint8_t* k_cache, uint8_t* v_cache, const float* k, const float* v, const float* cos_t,
                   const float* sin_t, const float* k_offsets, const int* d_pos0, int i0, int i1, int n_heads,
                   const KvLayout& kv, int rope_dim, cudaStream_t s);
// The key offsets (engine/kv_offset.h) of n_layers layers of a K cache that carries them (k_cache: the first layer's
// first row), each head's from its first kKvOffsetPositions rows as stored, into k_offsets
// [n_layers][n_kv_heads][head_dim]. Twin: kv_offset_of_rows (KvCache::k_offset), bit for bit.
void kv_offsets(float* k_offsets, const uint8_t* k_cache, int n_layers, const KvLayout& kv, cudaStream_t s);
// rows rows of head_dim values <- H x / w per piece (kv_rotate_scaled): an attention output after a quantized V (and
// a query before attention over a quantized K, which the backend turns in rope_store_kv's launch instead). Twin:
// kv_rotate_scaled. pdl: a programmatic dependent launch (sm_90), which reads x only once the kernel before it has
// finished. xq (null: none): the rotated rows quantized as quantize_act quantizes them (rows x head_dim / 32 blocks,
// the same bits), for an integer product that reads them.
void kv_rotate_rows(float* x, int64_t rows, int head_dim, cudaStream_t s, bool pdl = false, ActBlock* xq = nullptr);

// gate[j] = silu(gate[j]) * up[j]; y = f16(x) (saturating). Twin: cpu::swiglu.
void swiglu(float* gate, const float* up, int64_t count, cudaStream_t s);
void to_f16(__half* y, const float* x, int64_t count, cudaStream_t s);

// Rows [r0, r0 + n_rows) of w (cols a multiple of 32) decoded to f16, row-major, into out (16-byte aligned). Twin:
// dequantize_row of those rows, rounded to f16.
void dequantize_rows_f16(__half* out, const DevWeight& w, int64_t r0, int64_t n_rows, cudaStream_t s);
// A second stream, its events and two buffers of scratch for gemm_weight to decode a weight's next chunk of rows while
// cuBLAS multiplies the one before (--cuda-gemm-overlap), and the first chunk of the product after while the last
// is multiplied: the decoding kernel, bound by memory, runs beside GEMMs bound by the tensor cores. Made and freed by
// its owner; the buffers set by set_gemm_overlap_buffers.
struct GemmOverlap {
    cudaStream_t side = nullptr;
    cudaEvent_t start = nullptr;     // recorded on the main stream at entry: what came before, done first
    cudaEvent_t decoded[2] = {};     // buffer b written (side stream)
    cudaEvent_t multiplied[2] = {};  // buffer b read by its GEMM (main stream)
    __half* buf[2] = {};
    int64_t buf_elems = 0;  // halves each buffer holds
    // The first chunk of the next product, decoded ahead: its weight (data null: none), its rows and its buffer.
    DevWeight ahead;
    int64_t ahead_rows = 0;
    int ahead_buf = 0;
    int64_t taken = 0;  // first chunks taken from there so far (for tests)
};
// Makes o's stream and events (throws on failure; what was made is left for release_gemm_overlap).
void make_gemm_overlap(GemmOverlap& o);
// Frees what o holds, made or partly made, and leaves it empty.
void release_gemm_overlap(GemmOverlap& o);
// o's two buffers: the halves of scratch (elems halves, gemm_scratch_elems with overlap).
void set_gemm_overlap_buffers(GemmOverlap& o, __half* scratch, int64_t elems);
// Stream s waits for a chunk decoded ahead, if there is one, and o forgets it: before s writes the scratch otherwise,
// and at the end of a forward (nothing of it left running on the side stream). o may be null.
void gemm_overlap_join(GemmOverlap* o, cudaStream_t s);
// A short prompt's product with an F16 weight (f16_split_ok) on the tensor cores, as exact as on f32 activations:
// to_f16_split turns x [n][cols] into xh [2n][cols] halves (each value's f16, then what that leaves times
// kF16SplitScale: elementwise.cuh's to_f16_split_item), then f16_split_product makes one cuBLAS GEMM of those 2n rows
// with w in place into t ([2n][w.rows] floats) and adds each token's two results (f16_split_sum_item) where out says
// (to it when accumulate). The weight is read once for all the tokens, and the tensor cores take the rest, where
// matvec_batch's lanes load 32 bytes of activations from L1 for every weight. The cuBLAS handle must be on stream s.
// Twin: the f32 product, within about 2^-22 of each activation (saturated at +-65504, as to_f16 saturates).
// Other weights multiply the same split rows elsewhere (gemm_weight_mma: a weight decoded tile by tile into shared
// memory) into t, and f16_split_sum adds each token's two results where out says. tail: SwiGLU's epilogue and the
// next product's split input, or a Q|K|V product's RoPE and K/V store, made in the same launch (SplitSumTail,
// elementwise.cuh); tail.xh may be the xh the product read (the GEMM is done when the sum starts).
bool f16_split_ok(const DevWeight& w);
void to_f16_split(__half* xh, const float* x, int n, int64_t cols, cudaStream_t s);
void f16_split_product(cublasHandle_t h, const RowSplit& out, const DevWeight& w, const __half* xh, int n,
                       bool accumulate, float* t, cudaStream_t s, SplitSumTail tail = {});
void f16_split_sum(const RowSplit& out, const float* t, int n, int64_t rows, bool accumulate, cudaStream_t s,
                   SplitSumTail tail = {});
// Whether gemm_weight decodes w chunk by chunk (every type with a decoder but F16, cols a multiple of 32).
bool gemm_decodes_chunks(const DevWeight& w);
// The prefill product of any weight: out[n][rows] = x[n][cols] . W^T (+= when accumulate) with x in f16. F16 weights
// go to cuBLAS in place; the rest are decoded chunk by chunk (prefill_gemm.cuh) and each chunk multiplied: chunks of
// gemm_chunk_rows(w.rows, w.cols, gemm_chunk_elems_for(chunk_elems, w.rows, w.cols, n, sm_count)) rows
// (memory_plan.h; chunk_elems may be kGemmChunkAuto). Without overlap, one after the other on stream s in scratch,
// which holds gemm_scratch_elems(w.type, w.rows, w.cols, chunk_elems) halves. With overlap, in its buffers, chunk k + 1
// decoded on its side stream while chunk k is multiplied on s (chunk k + 2's decoding waits for chunk k's GEMM), and
// where next is given (the product the caller makes next, of the same n tokens) and gemm_decodes_chunks(next), next's
// first chunk decoded into the other buffer while this product's last chunk is multiplied, and taken from there by
// the next call for it (any other call decodes its own first chunk). The same GEMMs of the same chunks every way, so
// the same bits. The cuBLAS handle must be on stream s. Twin: the product of the f16-rounded operands in double.
void gemm_weight(cublasHandle_t h, float* out, const DevWeight& w, const __half* x, int n, bool accumulate,
                 __half* scratch, cudaStream_t s, int64_t chunk_elems = kGemmChunkElems, int sm_count = 1,
                 GemmOverlap* overlap = nullptr, const DevWeight* next = nullptr);
void check_cublas(cublasStatus_t st, const char* what);
// The same product in one kernel (gemm_mma_body, prefill_gemm.cuh: each weight tile decoded into shared memory and
// multiplied there on the tensor cores, nothing written out; --cuda-gemm mma) for the weights gemm_mma_ok accepts
// (every type with a decoder but F16, cols a multiple of 32). Twin: as gemm_weight's.
bool gemm_mma_ok(const DevWeight& w);
// The device's multiprocessors and shared memory, as those products' launches use them (memory_plan.h).
GemmMmaDevice gemm_mma_device(int device);
// Row r of token i is written (added to when accumulate) at out.at(r, i, w.rows): Q, K and V from their weights as one
// matrix go to three buffers. dev: the device, for the tile size (gemm_mma_tokens), the stages of shared memory
// (gemm_mma_stages) and, where the grid has fewer blocks than SMs, the split of the columns among blocks
// (gemm_mma_splits), whose partial sums take up to scratch_floats floats of scratch (null: no split) and a second
// kernel that adds them up.
void gemm_weight_mma(const RowSplit& out, const DevWeight& w, const __half* x, int n, bool accumulate,
                     const GemmMmaDevice& dev, float* scratch, int64_t scratch_floats, cudaStream_t s);
// y[i][r] = silu(gate[r] . x[i]) * (up[r] . x[i]) in the same kernel, both weights' tiles in one block (glu_fusable
// and gemm_mma_ok): no gate and up products written out and no swiglu pass. Twin: the two products and cpu::swiglu.
void gemm_glu_mma(float* y, const DevWeight& gate, const DevWeight& up, const __half* x, int n,
                  const GemmMmaDevice& dev, cudaStream_t s);

// Attention reads one layer's cache (k_cache, v_cache: that layer's first K and V rows, laid out and typed as kv
// says); query head h of n_heads reads KV head h / (n_heads / kv.n_kv_heads). Over a quantized K the query must come
// rotated (rope_store_kv's, or kv_rotate_rows), and over a quantized V the output comes rotated. k_offsets: the layer's
// key offsets [n_kv_heads][head_dim] where K carries them (KvLayout::k_offsets; null otherwise), added back to the K
// rows past the first kKvOffsetPositions. head_dim values attention runs for: every even one up to 256 (32, 64, 96, 128
// and 256 by warp kernels, the rest by a one-thread-per-query fallback).
bool attention_head_dim_supported(int head_dim);
// Blocks per query-head group for decode (flash-decoding splits) on a device of sm_count multiprocessors, for the
// deepest cache kv holds; a launch uses as many of them as the depth gives positions for (attention_active_splits).
// At most attention_max_splits(kv): kMaxAttnSplits, or the splits kv.n_ctx positions can fill.
constexpr int kMaxAttnSplits = 64;
int attention_splits(int n_heads, const KvLayout& kv, int sm_count);
int attention_max_splits(const KvLayout& kv);
// Floats of partial results attention_decode needs (n_heads * splits * (head_dim + 2)), or a split prefill of up to
// n_batch tokens (flash_partials), whichever is more.
int64_t attention_partials(int n_heads, int head_dim, int splits, int n_batch);
// Splits of the cache positions for a prefill of n queries at positions pos0 .. on a device of sm_count SMs, so that
// a short prompt over a deep cache fills the GPU (flash_splits; 1 where flash attention does not run).
int attention_prefill_splits(int n_heads, const KvLayout& kv, int n, int pos0, int sm_count);

// One query (position *d_pos0) of each head over cache positions 0 ..= *d_pos0: flash-decoding, positions split
// across the first attention_active_splits(*d_pos0 + 1, splits) of `splits` blocks per query-head group, then a
// log-sum-exp combine: by each group's last block when counters is given (attention_counters() ints, zero before
// the first launch; they are left at zero), else by a second kernel. q, out: [n_heads][head_dim]. With xq (may be null;
// head_dim a multiple of 32) out is also written as n_heads * head_dim / 32 ActBlocks, quantized where each value is
// made (the output projection's integer input). pdl: a programmatic dependent launch (sm_90; waits for the kernel
// before it in pdl_wait before reading anything). prefetch (decode_l2_prefetch, memory_plan.h; sm_90): the ranges
// the blocks ask the L2 cache for before that wait, shared among them (l2_prefetch_pieces), at positions up to
// its max_pos.
// Twins: cpu::attention with n = 1, then quantize_act of the output.
int attention_counters(int n_heads, const KvLayout& kv);
void attention_decode(float* out, ActBlock* xq, float* partials, int* counters, const float* q, const uint8_t* k_cache,
                      const uint8_t* v_cache, const float* k_offsets, const int* d_pos0, int n_heads,
                      const KvLayout& kv, int splits, cudaStream_t s, bool pdl = false,
                      const L2Prefetch& prefetch = {});
// n queries at positions *d_pos0 + i, each over cache positions 0 ..= its own (causal). With tensor_cores, head_dim
// 64 and 128 run flash attention on the tensor cores (flash_attention.cuh); other head_dims, or without, a warp per
// query on the CUDA cores (attention_prefill_body, an f16 cache only: a quantized one always takes flash attention).
// flash_async (Settings::cuda_flash_pipeline, where flash_async_fits, memory_plan.h): over an f16 cache with head_dim
// 128, flash attention copies its tiles by cp.async in two stages and reads their fragments by ldmatrix (the same
// bits); elsewhere it is ignored. warp_split (Settings::cuda_flash_warp_split): where a block's rows are 16 at most
// (flash_warp_split), its warps split each tile's positions instead of one warp taking the whole tile.
// splits > 1 (flash attention only; attention_prefill_splits): the positions are split among that many blocks per
// query block, their partial results (attention_partials floats at most) combined by a second kernel.
// xh (not null): flash attention also writes out split into xh [2n][n_heads head_dim] (f16_split_store), the output
// projection's input on split activations without to_f16_split's launch; xq (not null; head_dim a multiple of 32):
// out also as the ActBlocks quantize_act makes of it, an integer output projection's input without its launch. True
// where it wrote them (flash attention ran), false where xh and xq are untouched.
// Twin: cpu::attention.
bool attention_prefill(float* out, const float* q, const uint8_t* k_cache, const uint8_t* v_cache,
                       const float* k_offsets, const int* d_pos0, int n, int n_heads, const KvLayout& kv,
                       bool tensor_cores, bool flash_async, bool warp_split, int splits, float* partials,
                       cudaStream_t s, __half* xh = nullptr, ActBlock* xq = nullptr);

}  // namespace kvgen::cuda
