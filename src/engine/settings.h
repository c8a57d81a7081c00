#pragma once
// What a run asks of a backend: the settings generation, --bench and both backends share, with their defaults in
// this one place.
#include <string>

#include "engine/kv_layout.h"

namespace kvgen {

struct Config;

// The context a run gets when none is asked for: the model's trained context, at most this.
constexpr int kDefaultCtx = 4096;
// The largest context (-c) a run may ask for.
constexpr int kMaxCtx = 1 << 24;
// The largest batch (-b) a run may ask for (the CUDA prefill kernels' grids are sized to take it in one pass).
constexpr int kMaxBatch = 1 << 16;

// How a run multiplies quantized weights (--math). Exact: activations rounded to 16-bit integers per block (the
// default: logits within a few parts in 10^4 of the exact math at integer speed). Fast: 8-bit activations, as
// llama.cpp rounds them, for Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K (other types keep 16 bits; CPU only). F32: every
// product on the f32 activations and exactly decoded weights: the exact math itself, slow, a reference to measure the
// other two against.
enum class MathMode { Exact, Fast, F32 };
const char* math_mode_name(MathMode m);
bool math_mode_from_name(const std::string& s, MathMode* m);

struct Settings {
    std::string device = "auto";  // cpu, cuda (= cuda0), cudaN, or auto: cuda0 when this build has it and it is visible
    int n_ctx = 0;                // positions the KV cache holds; 0: min(model's trained context, kDefaultCtx)
    int n_batch = 512;            // prompt tokens per forward pass
    int n_threads = 0;            // CPU threads; 0: physical cores
    KvType kv_type_k = KvType::F16;  // KV cache element types (--kv-type, -ctk, -ctv)
    KvType kv_type_v = KvType::F16;
    bool cuda_graphs = true;      // CUDA: capture the decode step once as a graph and replay it
    bool cuda_int_matvec = true;  // CUDA: products of up to 16 tokens (64 with cuda_int_mma) in integers (16-bit
                                  // activations) for the types that have them
    bool cuda_flash_attention = true;  // CUDA: prefill attention on the tensor cores where head_dim has the kernel
    bool cuda_flash_pipeline = true;  // CUDA, an f16 cache, head_dim 128: flash attention's tiles copied by cp.async in
                                      // two stages, fragments by ldmatrix (--cuda-flash-pipeline; the same bits)
    bool cuda_flash_warp_split = true;  // CUDA: flash attention's blocks of up to 16 rows (a short prompt) split each
                                        // tile's positions among their warps (--cuda-flash-warps positions), not
                                        // one warp over the whole tile (rows)
    bool cuda_pdl = true;  // CUDA (sm_90+): integer products start as the kernel before them drains (--cuda-pdl)
    int cuda_matvec_rows = 8;    // CUDA, cuda_matvec_stages 0: rows a block of one token's Q4_0 / Q8_0 / Q4_K integer
                                 // products (8 or 4; the same bits) (--cuda-matvec-rows)
    int cuda_matvec_unit = 64;   // CUDA: weights a lane takes a step in Q4_0 integer products (64: two units, or
                                 // 32) (--cuda-matvec-unit)
    int cuda_matvec_stages = 3;  // CUDA (sm_80+): integer and F16 products' weights through a ring of this many
                                 // stages of shared memory in blocks that stay (2-4), or 0: through registers, a
                                 // block a row group (--cuda-matvec-stages; the same bits)
    bool cuda_ring_fit = true;   // CUDA: the rings' share of each SM's L1 as shared memory is what their blocks need
                                 // (fit), the rest L1 for the activations, not all of it (max) (--cuda-ring-carveout)
    bool cuda_int_mma = false;   // CUDA (sm_80+): integer products of 2-64 tokens of Q4_0 / Q8_0 / Q4_K / Q6_K on the
                                 // tensor cores in one launch (groups of up to 16 tokens, Q6_K 8, a block; 8-bit mma
                                 // on the activations' two bytes; --cuda-matvec-mma)
    bool cuda_qkv_store = true;  // CUDA, an f16 cache: the Q|K|V products (integer, or the sums of a short prompt's
                                 // on split activations) rotate Q and K and store K and V themselves, without a
                                 // launch of their own (--cuda-kv-store)
    bool cuda_norm_fold = true;  // CUDA, one token: each RMSNorm after the first folded into the integer residual
                                 // product before it, without a launch of its own (--cuda-norm)
    bool cuda_f16_block = true;  // CUDA, one token: F16 and BF16 products by blocks of warps over 4 rows
                                 // (matvec_f16_kernel), not a warp per 2 rows (--cuda-f16-matvec)
    int cuda_prompt_split = -1;  // CUDA, 2-16 tokens: products with F16, BF16, Q5_K and the quantized types without
                                 // integer products on the tensor cores, on activations split into f16 high and low
                                 // parts (f16_split_product): -1 auto (those of at least kSplitMinWeights weights), 1
                                 // all, 0 none (the f32 lanes of matvec_batch; Q5_K: the integer kernel)
                                 // (--cuda-short-prompt)
    bool cuda_mma_gemm = false;  // CUDA: prefill products of quantized weights in one kernel, each weight tile decoded
                                 // into shared memory and multiplied there (--cuda-gemm mma), instead of cuBLAS
    int cuda_gemm_chunk_mib = -1;   // CUDA: MiB of f16 a quantized weight's prefill product decodes at a time for
                                    // cuBLAS (0: the whole matrix; -1: auto, from the tokens and the SMs)
                                    // (--cuda-gemm-chunk)
    bool cuda_gemm_overlap = true;  // CUDA: the next chunk (or the next product's first) decoded on a second stream
                                    // while cuBLAS multiplies this one, into the other of two buffers of scratch
                                    // (--cuda-gemm-overlap)
    bool cuda_l2_prefetch = true;   // CUDA (sm_90+), one token: decode attention asks the L2 cache for the output
                                    // projection's weight and gate's and up's first rows while it runs
                                    // (decode_l2_prefetch; --cuda-prefetch)
    bool progress = true;         // CUDA: weight upload progress on stderr
    bool all_logits = false;      // logits for every position of a batch, not only the last (perplexity)
    MathMode math = MathMode::Exact;  // --math

    // n_ctx with 0 resolved for the model.
    int context_size(const Config& c) const;
    // The batch a backend sizes its buffers for: n_batch, at most the context.
    int batch_size(int n_ctx) const;
    // Rows of logits a backend keeps: the batch with all_logits, else 1.
    int logits_rows(int n_ctx) const { return all_logits ? batch_size(n_ctx) : 1; }
};

// The CUDA options of s that differ from the defaults, as the command line spells them ("--cuda-gemm mma
// --cuda-pdl on"; empty for none): what --bench names beside the CUDA backend.
std::string cuda_options_name(const Settings& s);
// The CUDA device index of "cuda" / "cudaN" (0 for "auto").
int cuda_device_index(const std::string& device);

}  // namespace kvgen
