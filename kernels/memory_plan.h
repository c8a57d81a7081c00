#pragma once
// Where the CUDA backend keeps everything on the device. One function places every weight matrix, the norms, the
// RoPE frequencies, the KV cache and every activation buffer at an offset of one allocation: the memory check
// before loading, the allocation and the pointers the backend hands its kernels all come from the same numbers.
// Host code only (no CUDA types), so the CPU-only tests check it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/hd.h"
#include "engine/kv_layout.h"
#include "model/weights.h"

namespace kvgen::cuda {

struct Region {
    size_t offset = 0, bytes = 0;
};

constexpr size_t kActBlockBytes = 80;  // sizeof(ActBlock), matvec_int.cuh
constexpr int kIntBatchTokens = 64;    // kImBatchTokens, matvec_int_mma.cuh: the most tokens an integer product takes
constexpr int kIntBatchGroups = 8;     // kImMaxGroups: the most groups of tokens such a product's launch has
constexpr int kSplitBatchTokens = 16;  // kMvMaxTokens, matvec.cuh: the most tokens of a short prompt's product on
                                       // split activations (f16_split_product, ops.cuh)
// The weight types whose short-prompt products take split activations on the tensor cores (Settings::
// cuda_prompt_split): F16 by cuBLAS in place; BF16, Q5_K and the quantized types without integer products
// (matvec_int.cuh's has_int_matvec; Q5_K has them, for one token, or for a short prompt where its products do not take
// split activations) through the prefill kernel that decodes each weight tile into shared memory (gemm_weight_mma)
// where their rows are whole 32-weight chunks. Not F32, whose f16 tiles would round the weights.
constexpr bool split_prompt_type(GgmlType t) {
    return t == GgmlType::F16 || t == GgmlType::BF16 || t == GgmlType::Q4_1 || t == GgmlType::Q5_0 ||
           t == GgmlType::Q5_1 || t == GgmlType::Q2_K || t == GgmlType::Q3_K || t == GgmlType::Q5_K;
}
constexpr bool split_prompt_weight(GgmlType t, int64_t cols) {
    return split_prompt_type(t) && (t == GgmlType::F16 || cols % 32 == 0);
}
// --cuda-short-prompt auto splits products of at least this many weights (a 2048 x 2048 matrix: TinyLlama-1.1B's
// smallest, every LLaMA-7B one). Below that a product takes a few microseconds either way, and the split's extra
// launches (the sum, and for the output projection the split) would cost about what it saves: SmolLM2-135M's largest
// is 576 x 1536. (Chosen before the norm and SwiGLU took the split into their own launches; not yet measured.)
constexpr int64_t kSplitMinWeights = int64_t(1) << 22;

// The prefill GEMM of a quantized weight decodes it to f16 a chunk of rows at a time (gemm_weight, ops.cuh): at most
// chunk_elems weights, in whole steps of kGemmChunkRowStep rows (the GEMM's tiles), at least one step, the rows shared
// out about evenly (in those steps, the last chunk shorter) among as few chunks as that takes (at 64 MiB an 11008 x
// 4096 matrix in two of 5632 rows, not 8192 and 2816); chunk_elems 0: the whole matrix at once. kGemmChunkElems, 16
// MiB of f16, is a third of an H100/H200 L2 cache, so a chunk is read back from L2.
constexpr int64_t kGemmChunkElems = int64_t(8) << 20;
constexpr int64_t kGemmChunkRowStep = 256;
// --cuda-gemm-chunk auto (the default; kGemmChunkAuto as chunk_elems): each product's chunk from its tokens and the
// GPU's SMs (gemm_auto_chunk_elems). Fixed at 16 MiB, a chunk of 4096-column rows is 2048 rows, 64 output tiles of
// 128 x 128 at 512 tokens for 132 SMs, and a 7B down projection's chunks of 512 rows 16 tiles: each GEMM fills part
// of the GPU, and a 4096-row matrix takes two of them where the whole takes one. Auto takes as many chunks as still
// leave each enough rows for kGemmFillWaves waves of such tiles (one, the whole matrix, where it has fewer than twice
// those rows), at least 16 MiB and at most kGemmChunkAutoMaxElems: at 512 tokens on 132 SMs every LLaMA-2-7B matrix
// whole (128 tiles a 4096-row one, 344 gate and up), 13B's gate, up and down in two chunks (the cap); from about
// 2,000 tokens chunks near 16 MiB, which then give two waves (a 4096 x 4096 matrix in two chunks of 2048 rows from
// 2,049 tokens).
constexpr int64_t kGemmChunkAuto = -1;
constexpr int64_t kGemmChunkAutoMaxElems = int64_t(64) << 20;  // 128 MiB of f16
constexpr int64_t kGemmFillTile = 128;
constexpr int64_t kGemmFillWaves = 2;
// The chunk of --cuda-gemm-chunk MIB (0: the whole matrix, as chunk_elems 0; below 0, auto: kGemmChunkAuto).
constexpr int64_t gemm_chunk_elems_of_mib(int mib) {
    return mib < 0 ? kGemmChunkAuto : int64_t(mib) << 19;
}
// Auto's chunk, in weights, for a product of n tokens over a rows x cols matrix on sm_count SMs.
inline int64_t gemm_auto_chunk_elems(int64_t rows, int64_t cols, int n, int sm_count) {
    const int64_t token_tiles = (std::max(n, 1) + kGemmFillTile - 1) / kGemmFillTile;
    const int64_t fill_rows = (kGemmFillWaves * std::max(sm_count, 1) + token_tiles - 1) / token_tiles * kGemmFillTile;
    const int64_t chunks = std::max<int64_t>(1, rows / fill_rows);  // each at least fill_rows
    const int64_t chunk_rows =
        ((rows + chunks - 1) / chunks + kGemmChunkRowStep - 1) / kGemmChunkRowStep * kGemmChunkRowStep;
    return std::min(std::max(chunk_rows * cols, kGemmChunkElems), kGemmChunkAutoMaxElems);
}
// The chunk one product takes: chunk_elems as set, or for kGemmChunkAuto auto's for its n tokens and the SMs.
inline int64_t gemm_chunk_elems_for(int64_t chunk_elems, int64_t rows, int64_t cols, int n, int sm_count) {
    return chunk_elems == kGemmChunkAuto ? gemm_auto_chunk_elems(rows, cols, n, sm_count) : chunk_elems;
}
// Rows a chunk of at most chunk_elems weights takes; for kGemmChunkAuto, the most auto takes whatever the tokens and
// SMs (what scratch is planned for).
inline int64_t gemm_chunk_rows(int64_t rows, int64_t cols, int64_t chunk_elems = kGemmChunkElems) {
    if (chunk_elems == kGemmChunkAuto) chunk_elems = kGemmChunkAutoMaxElems;
    if (chunk_elems <= 0 || rows * cols <= chunk_elems) return rows;
    const int64_t fit = std::max(chunk_elems / cols / kGemmChunkRowStep * kGemmChunkRowStep, kGemmChunkRowStep);
    if (fit >= rows) return rows;
    const int64_t chunks = (rows + fit - 1) / fit;
    const int64_t even = ((rows + chunks - 1) / chunks + kGemmChunkRowStep - 1) / kGemmChunkRowStep * kGemmChunkRowStep;
    return std::min(even, fit);
}
// Halves of scratch gemm_weight needs for a rows x cols weight of type t (none for F16, used in place); with overlap
// (--cuda-gemm-overlap), two buffers of a chunk each, which the chunks of a product and the first of the next take in
// turn (GemmOverlap, ops.cuh).
inline int64_t gemm_scratch_elems(GgmlType t, int64_t rows, int64_t cols, int64_t chunk_elems = kGemmChunkElems,
                                  bool overlap = false) {
    if (t == GgmlType::F16) return 0;
    if (cols % 32 != 0) return rows * cols;
    return (overlap ? 2 : 1) * gemm_chunk_rows(rows, cols, chunk_elems) * cols;
}

// With --cuda-gemm mma the product is one kernel (gemm_mma_body, prefill_gemm.cuh) whose block owns kQgRows rows and
// 64 or 128 tokens; its grid is x along the tokens, y along the rows.
constexpr int kQgRows = 128;            // weight rows per block
constexpr int kQgBlocksPerSm = 2;       // at most 128 registers a thread (gemm_mma_kernel's bounds)
constexpr int kQgStep = 64;             // weights of a row per step: two chunks
constexpr int kQgStride = kQgStep + 8;  // halves per shared row: 36 words, fragment reads in 32 banks
inline int gemm_mma_token_tiles(int n, int tok) {
    return (n + tok - 1) / tok;
}
inline int64_t gemm_mma_row_tiles(int64_t rows) {
    return (rows + kQgRows - 1) / kQgRows;
}
// Shared memory of one stage of a block of tok tokens: a step's weights and activations in f16, kQgStride halves a row.
constexpr int64_t gemm_mma_stage_bytes(int tok) {
    return int64_t(kQgRows + tok) * kQgStride * 2;
}
// What the launch of such a product needs to know of its device (gemm_mma_device, ops.cuh): its SMs, and the bytes
// of shared memory a multiprocessor has and one block may ask for.
struct GemmMmaDevice {
    int sm_count = 1;
    int64_t shared_per_sm = 0, shared_per_block = 0;
};
constexpr int64_t kSharedReservePerBlock = 1024;  // what the runtime keeps of an SM's shared memory per block
// A ring launch (matvec_ring) with --cuda-ring-carveout fit: the smallest shared-memory carveout, in percent of an SM's
// shared memory (`shared_per_sm`, cudaDevAttrMaxSharedMemoryPerMultiprocessor) as the carveout attributes
// (cudaLaunchAttributePreferredSharedMemoryCarveout, cudaFuncAttributePreferredSharedMemoryCarveout) take it, that
// holds `blocks` blocks of `block_bytes` (static and dynamic) each: a block takes its bytes and the runtime's reserve,
// in units of 128 bytes (sm_80 and later). The driver rounds the percentage up to one of the SM's sizes (228 KiB an
// H200's SM at most: 0, 8, 16, 32, 64, 100, 132, 164, 196 or 228), so at least that much is shared memory and the rest
// of the SM's 256 KiB is L1, where the tokens' activations stay while the blocks' groups read them (26.9 KiB a token
// for 11,008 columns in the integer products). 100 where they take it all.
inline int ring_carveout_percent(int64_t blocks, int64_t block_bytes, int64_t shared_per_sm) {
    constexpr int64_t unit = 128;
    const int64_t need = blocks * ((block_bytes + kSharedReservePerBlock + unit - 1) / unit * unit);
    if (shared_per_sm <= 0 || need >= shared_per_sm) return 100;
    return int((100 * need + shared_per_sm - 1) / shared_per_sm);
}
// Whether kQgBlocksPerSm blocks of `bytes` of shared memory each fit on one of d's multiprocessors.
inline bool gemm_mma_blocks_fit(int64_t bytes, const GemmMmaDevice& d) {
    return kQgBlocksPerSm * (bytes + kSharedReservePerBlock) <= d.shared_per_sm;
}

// Prefill flash attention's two stages of tiles (--cuda-flash-pipeline, flash_attention.cuh's ASYNC): the bytes of
// shared memory a block takes for head_dim 128 (kFaShared<128, false, true> floats: two stages of a K and a V tile of
// 64 rows of 136 halves), and the blocks an SM should hold (kFaBlocksPerSm).
constexpr int64_t kFlashAsyncBytes = 2 * 2 * 64 * (128 + 8) * 2;
constexpr int kFlashAsyncBlocksPerSm = 2;
// Whether flash attention takes its two stages of tiles for head_dim on device d: head_dim 128, where the register
// path's 221-232 registers a thread hold two blocks an SM as the two-stage kernel's 250-252 do, when two blocks of its
// 68 KiB fit an SM (sm_80, sm_90; not sm_86/89's 100 KiB, nor sm_75's 64). Not head_dim 64 (sm_90: 174 registers
// against 131-141, two blocks an SM instead of three; capped by launch bounds, it spills), until measured.
inline bool flash_async_fits(int head_dim, const GemmMmaDevice& d) {
    return head_dim == 128 && kFlashAsyncBytes <= d.shared_per_block &&
           kFlashAsyncBlocksPerSm * (kFlashAsyncBytes + kSharedReservePerBlock) <= d.shared_per_sm;
}
// Bytes of shared memory a flash attention block takes over a quantized cache (kFaShared<head_dim, true>: the K tile,
// 64 rows of head_dim + 8 halves, and the transposed V tile, head_dim rows of 72, each again for the low parts):
// head_dim 128 71,680, 64 36,864. A quantized cache is prefilled by flash attention alone, so the device must let one
// block ask for that much (flash_quantized_fits: not sm_75's 64 KiB at head_dim 128).
constexpr int64_t flash_quantized_bytes(int head_dim) {
    return 2 * 2 * (int64_t(64) * (head_dim + 8) + int64_t(head_dim) * (64 + 8));
}
inline bool flash_quantized_fits(int head_dim, const GemmMmaDevice& d) {
    return flash_quantized_bytes(head_dim) <= d.shared_per_block;
}

// One token's decode attention at a shallow depth reads a few cache rows a head and waits on its own latency while
// the memory bus idles; the products after it then stream their weights from DRAM. So decode attention's blocks first
// ask the L2 cache to fetch them (--cuda-prefetch on; cp.async.bulk.prefetch.L2 on sm_90 and later, a hint that
// changes no value): the output projection's weight, and the first rows of gate's and up's, which the SwiGLU
// product's first blocks take while the output projection's blocks still hold the GPU. decode_l2_prefetch plans it
// for the weights in the order they are read, on a device with l2_bytes of L2: a third of the L2 in all, the first
// weight as much of it as it needs (its first bytes where it is larger: the rows its first blocks take) and the
// others what is left in equal shares, each the 16-byte aligned whole 16-byte pieces inside; and only at positions
// whose cache rows of one layer (cache_bytes_per_position each, what attention streams through L2 beside them) take
// at most another third (max_pos). None (max_pos -1, every range empty) where the cache outgrows that at position 0
// or no range has a whole piece.
struct L2Range {
    const uint8_t* data = nullptr;
    int64_t bytes = 0;  // L2Prefetch's: a multiple of 16 from data, itself a multiple of 16; 0: nothing
};
constexpr int kL2PrefetchRanges = 3;
struct L2Prefetch {
    L2Range range[kL2PrefetchRanges];
    int max_pos = -1;  // the last position (the step's *d_pos0) at which they are fetched
};
constexpr int64_t kL2PrefetchChunk = 4096;  // bytes a prefetch instruction asks for (a range's last one fewer)
inline L2Range l2_aligned_inside(const L2Range& w) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(w.data), start = (at + 15) / 16 * 16;
    const int64_t rest = w.bytes - int64_t(start - at);
    return rest < 16 ? L2Range{} : L2Range{reinterpret_cast<const uint8_t*>(start), rest / 16 * 16};
}
inline L2Prefetch decode_l2_prefetch(const std::vector<L2Range>& weights, int64_t l2_bytes,
                                     int64_t cache_bytes_per_position) {
    const int64_t third = l2_bytes / 3 / 16 * 16;
    const int64_t positions = cache_bytes_per_position > 0 ? third / cache_bytes_per_position : 0;
    L2Prefetch p;
    const int n = int(std::min<size_t>(weights.size(), kL2PrefetchRanges));
    if (positions < 1 || n == 0) return p;
    const L2Range first = l2_aligned_inside(weights[0]);
    p.range[0] = {first.data, std::min(first.bytes, third)};
    const int64_t share = n > 1 ? (third - p.range[0].bytes) / (n - 1) / 16 * 16 : 0;
    for (int i = 1; i < n; ++i) {
        const L2Range w = l2_aligned_inside(weights[size_t(i)]);
        if (w.bytes > 0 && share > 0) p.range[i] = {w.data, std::min(w.bytes, share)};
    }
    if (p.range[0].bytes + p.range[1].bytes + p.range[2].bytes == 0) return L2Prefetch{};
    p.max_pos = int(std::min<int64_t>(positions - 1, INT32_MAX));
    return p;
}
// A launch's share of such a prefetch for one thread: every range in kL2PrefetchChunk pieces, numbered on from one
// range to the next, piece c to block c % blocks and that block's thread c / blocks % threads, so that every block
// (every SM it runs on) asks for about as many as the others; f(range, offset, bytes) for each of this thread's
// pieces, the range a constant of an unrolled loop. Every piece is one thread's, once.
#ifdef __CUDACC__
#pragma nv_exec_check_disable
#endif
template <class F>
KVGEN_HD void l2_prefetch_pieces(const L2Prefetch& p, int blocks, int threads, int block, int thread, F&& f) {
    const int64_t step = int64_t(blocks) * threads, base = block + int64_t(thread) * blocks;
    int64_t first = 0;  // the number of the range's first piece
#ifdef __CUDACC__
#pragma unroll
#endif
    for (int r = 0; r < kL2PrefetchRanges; ++r) {
        const int64_t bytes = p.range[r].bytes, pieces = (bytes + kL2PrefetchChunk - 1) / kL2PrefetchChunk;
        for (int64_t c = base < first ? base + (first - base + step - 1) / step * step : base; c < first + pieces;
             c += step) {
            const int64_t off = (c - first) * kL2PrefetchChunk;
            f(r, off, bytes - off < kL2PrefetchChunk ? bytes - off : kL2PrefetchChunk);
        }
        first += pieces;
    }
}

// Tokens per block for n tokens and `rows` rows on device d: 128, which decodes each weight tile once for twice as
// many tokens, unless n fits in 64, or 128-token tiles leave the GPU short of one full wave of blocks (LLaMA-2-7B's
// output and down projections at 512 tokens: 32 x 4 blocks for 264 places on an H200), where 64-token tiles give
// twice the blocks, or two 128-token blocks do not fit on an SM (sm_75: 2 x 37 KiB against 64).
inline int gemm_mma_tokens(int n, int64_t rows, const GemmMmaDevice& d) {
    if (n <= 64 || !gemm_mma_blocks_fit(gemm_mma_stage_bytes(128), d)) return 64;
    return gemm_mma_row_tiles(rows) * gemm_mma_token_tiles(n, 128) < int64_t(kQgBlocksPerSm) * d.sm_count ? 64 : 128;
}

// Stages of a block's shared memory: 2 (the next step's weights and activations are written into one while the
// tensor cores read the other: one barrier a step instead of two, and warps that finish a step's products go on
// decoding) where kQgBlocksPerSm blocks of twice the bytes still fit on a multiprocessor (A100 and H100/H200: 164 and
// 228 KiB); else 1, where doubling would cost a block per SM (86 and 89: 100 KiB) or not fit (75: 64 KiB).
inline int gemm_mma_stages(int tok, const GemmMmaDevice& d) {
    const int64_t two = 2 * gemm_mma_stage_bytes(tok);
    return two <= d.shared_per_block && gemm_mma_blocks_fit(two, d) ? 2 : 1;
}

// Ways to split the columns of such a product among blocks (gemm_mma_body's splits) where its grid has fewer blocks
// than SMs (a prompt of up to 64 tokens: LLaMA-2-7B's output and down projections have 32 blocks for an H200's 132
// SMs): as many as make a full wave of kQgBlocksPerSm blocks per SM, at most kQgMaxSplits, no more than cols /
// kQgSplitMinCols (ranges of whole steps: the last may be shorter), and their partial sums (splits x n x rows floats)
// within `capacity` floats of scratch.
constexpr int kQgMaxSplits = 8;
constexpr int64_t kQgSplitMinCols = 512;
inline int gemm_mma_splits(int n, int64_t rows, int64_t cols, const GemmMmaDevice& d, int64_t capacity) {
    const int64_t blocks = gemm_mma_row_tiles(rows) * gemm_mma_token_tiles(n, gemm_mma_tokens(n, rows, d));
    if (blocks >= d.sm_count) return 1;
    int64_t s = (int64_t(kQgBlocksPerSm) * d.sm_count + blocks - 1) / blocks;
    if (s > kQgMaxSplits) s = kQgMaxSplits;
    if (s > cols / kQgSplitMinCols) s = cols / kQgSplitMinCols;
    while (s > 1 && s * n * rows > capacity) --s;
    return s > 1 ? int(s) : 1;
}

struct MemoryPlan {
    // Weights. The GGUF matrices in their own types and the device layout (weight_layout.h), in device_weights()
    // order; a layer's Q, K and V back to back when they share type and row size, so that they read as one matrix
    // (fused_qkv).
    std::vector<Region> matrices;
    std::vector<bool> fused_qkv;  // [n_layers]
    Region norms;                 // f32 [2 n_layers + 1][n_embd]: attn_norm, ffn_norm of each layer, output_norm
    Region rope_inv_freq;         // f64 [rope_dim / 2]
    Region rope_factors;          // f64 [rope_dim / 2], empty without a rope_freqs tensor
    // The KV cache: KvLayout's rows in its K and V types (f16, q8_0 or q4_0), every layer; and f32
    // [n_layers][n_kv_heads][head_dim], the key offsets of a K that carries them (KvLayout::k_offsets; else empty).
    Region k_cache, v_cache, k_offsets;
    // Activations for n_batch tokens (engine/ops.h Buffers, then the backend's own), f32 unless noted.
    Region x;          // [n_batch][n_embd]
    Region q, k, v;    // [n_batch][n_heads | n_kv_heads][head_dim]
    Region att;        // [n_batch][n_heads][head_dim]
    Region ffn, up;    // [n_batch][n_ff]
    Region logits;     // [n_logits][n_vocab]
    Region xn;         // [n_batch][n_embd]: the normalized input of a projection
    Region partials;   // flash-decoding partial results, attention_partials() floats
    Region cos, sin;   // [n_batch][rope_dim / 2]
    Region xh;         // f16 [n_batch][max(n_embd, n_heads head_dim, n_ff)]: prefill GEMM input (n_batch > 1); at
                       // least 2 min(n_batch, kSplitBatchTokens) rows where ys is planned: a short prompt's split
                       // activations
    Region ys;         // f32 [2 min(n_batch, kSplitBatchTokens)][widest product: Q|K|V, n_ff, n_embd, and n_vocab when
                       // n_logits > 1]: a short prompt's products on split activations (f16_split_product and
                       // f16_split_sum; n_batch > 1, a model with layer matrices that split_prompt_weight takes, or
                       // such an output with n_logits > 1)
    Region wh;         // f16, the largest scratch gemm_weight decodes into for the prefill GEMM, gemm_scratch_elems
                       // (n_batch > 1; the output matrix counts when n_logits > 1)
    Region step;       // int [2 + n_batch]: pos0, n, the step's tokens
    Region xq;         // ActBlock [min(n_batch, kIntBatchTokens)][max(n_embd, n_heads head_dim, n_ff) / 32]: the
                       // input of an integer product (one token, or a short prompt: up to 16 tokens, 64 on the
                       // tensor cores) in 16-bit integers
    Region counters;   // int [n_heads]: decode attention's per-head-group split counters, zero between launches
    Region hq;  // ActBlock [min(n_batch, kIntBatchTokens)][n_ff / 32]: the SwiGLU output quantized by its product
                // (n_ff % 32 == 0; one token, or a short prompt's: up to 16 tokens, 64 on the tensor cores)
    Region hq_counters;  // int [kIntBatchGroups][n_ff / 32]: that product's per-32-row-group counters (on the tensor
                         // cores one set per group of tokens), zero between launches
    // One token's RMSNorm folded into the residual product before it (NormStore, matvec_int.cuh; n_embd % 32 == 0):
    Region xnq;            // ActBlock [n_embd / 32]: the normed residual as the next integer products read it
    Region norm_sums;      // f32 [n_embd / 32]: each 32-row group's sum of squares
    Region norm_counters;  // int [n_embd / 32 + 1]: the groups' counters, then the count of groups done; zero between
                           // launches

    size_t weights = 0, kv_cache = 0, buffers = 0;  // bytes of each part
    size_t total = 0;                               // the allocation, alignment included
};

// The matrices the device keeps in their GGUF types, in upload order: token_embd, output (unless tied), then each
// layer's wq, wk, wv, wo, w_gate, w_up, w_down.
std::vector<const WeightView*> device_weights(const Model& m);

// partial_floats: what attention_decode needs for the split count in use (an upper bound when planning ahead);
// n_logits: rows of logits kept (1, or n_batch for Settings::all_logits); chunk_elems: the prefill GEMM's chunk
// (gemm_chunk_rows); gemm_overlap: scratch for two chunks (gemm_scratch_elems).
MemoryPlan plan_memory(const Model& m, const KvLayout& kv, int n_batch, int n_logits, int64_t partial_floats,
                       int64_t chunk_elems = kGemmChunkElems, bool gemm_overlap = false);

}  // namespace kvgen::cuda
