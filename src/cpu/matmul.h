#pragma once
// y = x W^T for a weight in its GGUF type: y[i][r] = dot(W row r, x[i]) for n tokens.
// Generated tokens (Pass::Decode): quantized weights meet 16-bit integer activations in integer dot products
// (vecdot.h), read straight from the mapped file, 16 rows side by side; float weights are dotted in f32.
// A prompt's tokens (Pass::Prefill): on AVX-512 VNNI, Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q2_K / Q3_K / Q4_K / Q5_K /
// Q6_K weights widened to int16 (k-quants with their sub-block scales) meet the tokens' 16-bit activations sixteen
// tokens to a vector (prompt_integer); on AVX2 the k-quants and Q5_0 / Q5_1 / Q2_K / Q3_K do the same eight tokens to
// a vector, and Q8_0 / Q4_0 / Q4_1 take the generated tokens' kernels, four tokens at a time (so does everything on
// CPUs without AVX2, and a group too small to pay for widening a tile, matmul.cpp's min_group and min_one; with --math
// fast AVX2 runs all six types eight tokens to a vector); float weights, and Q5_0 / Q5_1 / Q2_K / Q3_K without AVX2,
// decode tiles of rows to f32 once and multiply them with the exact f32 activations in a register-blocked GEMM. For
// the types prompt_matches_decode names, every path computes the same sequence of roundings for a row and a token
// (vecdot_kernels.inc; fold16 in matmul_kernels.inc): a token's result is the same bits in a prompt of any length or as
// a generated token, on every instruction set (Q5_0, Q5_1, Q2_K and Q3_K: on AVX2 and AVX-512 VNNI). Rows are split
// across threads; each row's sum runs in a fixed order, so results do not depend on the thread count either.
// Activations::mode() picks the activation forms (MathMode): the 8-bit ones of
// --math fast take the same paths (8-bit prompt groups on AVX-512 VNNI and AVX2, for all six types) and the same
// guarantees; --math f32 takes the f32 paths for every weight.
#include <cstdint>

#include "cpu/thread_pool.h"
#include "cpu/vecdot.h"
#include "model/weights.h"

namespace kvgen::cpu {

// Where an input's integer forms are built (any may be null where no weight asks for it): a32 [n][cols / 32], a256
// [n][cols / 256] (null when cols is not a multiple of 256); t16: [ceil(n / 16)][cols / 32], t256: [ceil(n / 16)][cols
// / 256] (null: prompt products then take the generated tokens' kernels, four tokens at a time, for the types that
// would use them); and the 8-bit forms likewise for --math fast.
struct ActBuffers {
    BlockA32* a32 = nullptr;
    BlockA256* a256 = nullptr;
    BlockT16* t16 = nullptr;
    BlockT256* t256 = nullptr;
    BlockB32* b32 = nullptr;
    BlockB256* b256 = nullptr;
    BlockU16* u16 = nullptr;
    BlockU256* u256 = nullptr;
};

// The input of one or more matmuls: n rows of cols floats, quantized (vecdot.h) on first use by a quantized weight
// and then reused (Q, K and V share one input; so do gate and up).
class Activations {
public:
    // f32: a prompt's tokens, multiplied in f32 tiles or, where prompt_integer allows, through tokens16. mode: the
    // activation forms the quantized weights meet (MathMode).
    Activations(const float* x, int n, int64_t cols, const ActBuffers& buf, bool f32, MathMode mode = MathMode::Exact)
        : x_(x), buf_(buf), n_(n), cols_(cols), f32_(f32), mode_(mode) {}
    const float* x() const { return x_; }
    bool f32() const { return f32_; }
    MathMode mode() const { return mode_; }
    int n() const { return n_; }
    int64_t cols() const { return cols_; }
    // The activations in the given integer form (quantized on first request), and the bytes from one token's to
    // the next's.
    const void* quantized(ActFormat f, ThreadPool& pool, int64_t* stride);
    // The A32 (A256, B32, B256) form as groups of 16 tokens, BlockT16 (BlockT256, BlockU16, BlockU256), or null
    // without a buffer for it.
    const void* tokens16(ActFormat f, ThreadPool& pool);

private:
    const float* x_;
    ActBuffers buf_;
    int n_;
    int64_t cols_;
    bool f32_;
    MathMode mode_;
    // which forms are built: indexed by ActFormat, quantized and side by side
    bool have_[5] = {}, have_t_[5] = {};
};

// Scratch floats each thread needs for a weight of `cols` columns.
// (a decoded f32 tile of 4 rows; or 8 rows widened to int16 with their scales and mins)
inline int64_t matmul_scratch(int64_t cols) { return cols * 5; }

// y: [n][w.rows]. scratch: threads x matmul_scratch(w.cols) floats. Quantized weights meet the activation form
// act_format(w.type, x.mode()); with MathMode::F32, the f32 activations (prompt tiles, or a decoded row per token).
void matmul(float* y, Activations& x, const WeightView& w, float* scratch, ThreadPool& pool);

// ys[i] = x ws[i]^T for count (at most 4) weights of the same input, in one parallel region over all their rows (Q,
// K and V; gate and up): one wait for the threads instead of count. Each row's result is matmul's.
void matmul_many(float* const* ys, Activations& x, const WeightView* const* ws, int count, float* scratch,
                 ThreadPool& pool);

// The feed-forward's gate and up products and their SwiGLU in one parallel region: h = silu(x w_gate^T) * (x w_up^T)
// element by element (swiglu's bits), up: [n][w_up.rows] scratch. Each thread takes the same rows of both weights and
// combines them itself, so the SwiGLU is split among the threads too.
void matmul_glu(float* h, float* up, Activations& x, const WeightView& w_gate, const WeightView& w_up,
                float* scratch, ThreadPool& pool);

// Rows `rows` of an embedding-like weight, decoded: out [n][w.cols].
void get_rows(float* out, const WeightView& w, const int32_t* rows, int n);

// Weight types whose prompt products run in integers: Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, 16 tokens per group
// (Activations::tokens16) where the kernels above have them, else the generated tokens' integer kernels; on AVX2 and
// AVX-512 VNNI also Q5_0, Q5_1, Q2_K and Q3_K (16 tokens per group, in their scalar references' sequence). The other
// types multiply prompts in f32 tiles.
bool prompt_integer(GgmlType t);

// Types whose products are the same bits for a prompt's token and a generated one: the integer types above and the
// float types (without AVX2, Q5_0, Q5_1, Q2_K and Q3_K multiply prompts in f32 and generated tokens in integers).
bool prompt_matches_decode(GgmlType t);

// The instruction set the kernels were dispatched to ("avx512-vnni", "avx2" or "generic").
const char* matmul_isa();

namespace kernels {
// One implementation per instruction set (matmul_avx2.cpp, matmul_generic.cpp): rows [r0, r1).
// gemm: a prompt's tokens, side by side (xq: tokens16 of form xf; AVX-512 VNNI for every form, AVX2 for the 8-bit
// forms and A256) or null: the f32 tiles (x);
// else xq, the activations in form xf with xq_stride bytes per token (null: x dotted in f32 with each row decoded).
void matmul_rows_avx512(float* y, const float* x, bool gemm, ActFormat xf, const void* xq, int64_t xq_stride,
                        const WeightView& w, int n, int64_t r0, int64_t r1, float* buf);
void matmul_rows_avx2(float* y, const float* x, bool gemm, ActFormat xf, const void* xq, int64_t xq_stride,
                      const WeightView& w, int n, int64_t r0, int64_t r1, float* buf);
void matmul_rows_generic(float* y, const float* x, bool gemm, ActFormat xf, const void* xq, int64_t xq_stride,
                         const WeightView& w, int n, int64_t r0, int64_t r1, float* buf);
}  // namespace kernels

}  // namespace kvgen::cpu
