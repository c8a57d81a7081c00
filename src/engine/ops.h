#pragma once
// The operations the forward pass (engine/backend.cpp) is written in. A backend is an implementation of this
// interface plus its memory: cpu/cpu_backend.* and kernels/cuda_ops.*. The step boundaries leave a backend room to
// fuse inside a step (the norm into the projection after it, Q|K|V as one matrix, RoPE into the K/V store) without
// asking the CPU to do the same. A new operation is one method here and one implementation per backend.
//
// Every buffer lives in the backend's memory (device memory for CUDA): the forward passes the pointers of buffers()
// from op to op and never reads them. The step's tokens and positions are given once, to begin(), so that a backend
// can record a step and replay it at any position (CUDA graphs); ops see only the batch size n.
#include <cstdint>
#include <functional>
#include <string>

#include "engine/kv_layout.h"

namespace kvgen {

// What a step computes. On the CPU a prompt's tokens (Prefill) are computed the same way whatever batch they come in:
// a prompt split into other batches, or partly loaded from a prompt-cache file, gives the same numbers to the last
// bit. A generated token (Decode, one at a time) may take a faster path (the CPU's 16-bit integer activations). The
// CUDA backend picks its kernels by the batch size instead (one token, 2 to 16, more), whatever the pass.
enum class Pass { Prefill, Decode };

// The activations of one step, each sized for the backend's batch (n_batch tokens), outermost dimension first.
struct Buffers {
    float* x = nullptr;       // [n_batch][n_embd]               the residual stream
    float* q = nullptr;       // [n_batch][n_heads][head_dim]     queries (rotated by rope_store_kv)
    float* k = nullptr;       // [n_batch][n_kv_heads][head_dim]  keys of the step, before they enter the cache
    float* v = nullptr;       // [n_batch][n_kv_heads][head_dim]  values of the step
    float* att = nullptr;     // [n_batch][n_heads][head_dim]     attention output, heads concatenated
    float* ffn = nullptr;     // [n_batch][n_ff]                  silu(gate) * up
    float* logits = nullptr;  // [n_logits][n_vocab]              the last n_logits positions' (n_logits: 1, or the
                              //                                  batch with Settings::all_logits)
};

class Ops {
public:
    virtual ~Ops() = default;

    virtual std::string name() const = 0;  // "cpu", "cuda"
    virtual Buffers buffers() = 0;
    virtual const KvLayout& kv_layout() const = 0;
    virtual int n_batch() const = 0;
    virtual int n_logits() const = 0;  // rows of Buffers::logits
    // Whether a generated token (Pass::Decode) gets the same bits as the same token at the same position in a
    // prompt (Pass::Prefill): then cache rows written by decode steps are exactly a prompt's, and can be reused as
    // one.
    virtual bool decode_matches_prompt() const { return false; }

    // Positions [0, n) of every layer's cache copied out (kv_read) or in (kv_write), K and V apart: k is
    // [n_layers][n_kv_heads][n][k_row_bytes] in host memory, v likewise (the rows as kv_layout() stores them).
    virtual void kv_read(void* k, void* v, int n) = 0;
    virtual void kv_write(const void* k, const void* v, int n) = 0;

    // The step that follows: tokens[0 .. n) at positions pos0 .. pos0 + n - 1 (n <= n_batch, checked).
    virtual void begin(const int32_t* tokens, int n, int pos0, Pass pass) = 0;
    // Runs `step` (the forward enqueuing its ops for n tokens) and returns the last n_out positions' logits
    // ([n_out][n_vocab]) in host memory, valid until the next call. The CPU calls it; CUDA records it once as a graph
    // for decode and replays that.
    virtual const float* run(int n, int n_out, const std::function<void()>& step) = 0;

    // x = the embedding rows of the step's tokens.
    virtual void embed(float* x, int n) = 0;
    // n = rmsnorm(x) * attn_norm[l]; q = Wq n, k = Wk n, v = Wv n.
    virtual void norm_qkv(float* q, float* k, float* v, const float* x, int l, int n) = 0;
    // q and k rotated for their positions; k and v stored into layer l's cache at the step's positions (k may be
    // rotated in place).
    virtual void rope_store_kv(float* q, float* k, const float* v, int l, int n) = 0;
    // out = causal attention of q over layer l's cache, positions 0 ..= each query's own.
    virtual void attention(float* out, const float* q, int l, int n) = 0;
    // x += Wo att: the attention output projection and its residual.
    virtual void out_proj_add(float* x, const float* att, int l, int n) = 0;
    // m = rmsnorm(x) * ffn_norm[l]; h = silu(Wgate m) * (Wup m).
    virtual void norm_swiglu(float* h, const float* x, int l, int n) = 0;
    // x += Wdown h: the feed-forward down projection and its residual.
    virtual void down_proj_add(float* x, const float* h, int l, int n) = 0;
    // logits = Wout (rmsnorm(x) * output_norm), for n rows x [n][n_embd].
    virtual void head(float* logits, const float* x, int n) = 0;
};

}  // namespace kvgen
