// The CUDA backend's operations (engine/ops.h): decode through the quantized matrix-vector kernels and
// flash-decoding attention, the whole step captured once as a CUDA graph and replayed; prefill through f16 GEMMs on
// the tensor cores. Memory comes from one allocation placed by plan_memory (memory_plan.h).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "cuda_backend.h"
#include "cuda_common.cuh"
#include "device.h"
#include "engine/kv_offset.h"
#include "matvec_int.cuh"
#include "matvec_int_mma.cuh"
#include "memory_plan.h"
#include "ops.cuh"
#include "quant.cuh"
#include "upload.cuh"

namespace kvgen::cuda {

namespace {

static_assert(sizeof(ActBlock) == kActBlockBytes, "the memory plan's ActBlock size");
static_assert(kImBatchTokens == kIntBatchTokens && kMvMaxTokens <= kIntBatchTokens && kImMaxGroups == kIntBatchGroups,
              "the memory plan's tokens of an integer product");
static_assert(kMvMaxTokens == kSplitBatchTokens, "the memory plan's tokens of a product on split activations");

constexpr size_t kReserve = size_t(512) << 20;  // the CUDA context, cuBLAS's workspace and kernels

std::string gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / double(1ull << 30)); }

class CudaOps final : public Ops {
public:
    CudaOps(const Model& model, const Settings& s, int device);
    ~CudaOps() override { release(); }
    CudaOps(const CudaOps&) = delete;
    CudaOps& operator=(const CudaOps&) = delete;

    std::string name() const override { return "cuda"; }
    Buffers buffers() override { return Buffers{x_, q_, k_, v_, att_, ffn_, logits_}; }
    const KvLayout& kv_layout() const override { return kv_; }
    int n_batch() const override { return n_batch_; }
    int n_logits() const override { return n_logits_; }
    void kv_read(void* k, void* v, int n) override { kv_copy(k, v, n, true); }
    void kv_write(const void* k, const void* v, int n) override {
        kv_copy(const_cast<void*>(k), const_cast<void*>(v), n, false);
    }

    void begin(const int32_t* tokens, int n, int pos0, Pass pass) override;
    const float* run(int n, int n_out, const std::function<void()>& step) override;

    void embed(float* x, int n) override;
    void norm_qkv(float* q, float* k, float* v, const float* x, int l, int n) override;
    void rope_store_kv(float* q, float* k, const float* v, int l, int n) override;
    void attention(float* out, const float* q, int l, int n) override;
    void out_proj_add(float* x, const float* att, int l, int n) override;
    void norm_swiglu(float* h, const float* x, int l, int n) override;
    void down_proj_add(float* x, const float* h, int l, int n) override;
    void head(float* logits, const float* x, int n) override;

private:
    template <typename T>
    T* at(const Region& r) const {
        return r.bytes > 0 ? reinterpret_cast<T*>(base_ + r.offset) : nullptr;
    }
    // out[n][w.rows] = in[n][w.cols] . W^T (+= when accumulate).
    void proj(float* out, const DevWeight& w, const float* in, int n, bool accumulate);
    void proj_f16(const RowSplit& out, const DevWeight& w, int n, bool accumulate);
    // wh_ as floats: the partial sums of --cuda-gemm mma's split products (and of a short prompt's on split
    // activations through the same kernel). wh_ is also the cuBLAS path's decoding
    // scratch, which weights that gemm_mma_ok refuses use in that mode too: the mma path joins the side stream's
    // decoding first (gemm_overlap_join), the rest is one product after the other on stream_.
    float* scratch() const { return reinterpret_cast<float*>(wh_); }
    // The product a prefill forward makes after w's where gemm_weight decodes it in chunks on the side stream (its
    // first chunk decoded while w's last is multiplied): the layer's next matrix, the next layer's Q, the output
    // after the last layer's down projection with every position's logits; null otherwise, without overlap, or where
    // that product of n tokens may run in integers instead (int_product).
    const DevWeight* gemm_next(const DevWeight& w, int n) const;
    // Whether a product with w of up to kMvMaxTokens tokens runs in integers, and `in` (count floats) quantized for
    // it into xq_.
    bool use_int(const DevWeight& w) const { return int_matvec_ && int_matvec_ok(w); }
    // Whether an n-token product with w runs in integers: up to kMvMaxTokens tokens where use_int, unless a short
    // prompt's product takes split activations (split_product: Q5_K, the one type both take, goes there), and with
    // --cuda-matvec-mma on up to kImBatchTokens of the types the tensor cores take (int_mma_ok).
    bool int_product(const DevWeight& w, int n) const {
        return use_int(w) && (n <= kMvMaxTokens || (mvi_.mma && int_mma_ok(w, n))) && !split_product(w, n);
    }
    // Whether layer l's Q|K|V products (its SwiGLU products) of n tokens run in integers, on the ActBlocks the norm
    // before them writes.
    bool qkv_in_int(const LayerDev& L, int n) const {
        return L.fused_qkv ? int_product(L.qkv, n)
                           : int_product(L.wq, n) && int_product(L.wk, n) && int_product(L.wv, n);
    }
    bool glu_in_int(const LayerDev& L, int n) const { return glu_fusable(L.gate, L.up) && int_product(L.gate, n); }
    // Whether a short prompt's product with w (2 to kMvMaxTokens tokens) runs on the tensor cores on split
    // activations (Settings::cuda_prompt_split: auto, products of at least kSplitMinWeights weights;
    // split_prompt_weight: F16 by f16_split_product, the others through gemm_weight_mma, whatever --cuda-gemm says),
    // which are written into xh_ once for the products that share them (by the RMSNorm kernel before Q|K|V and before
    // gate and up, by the up product's sums for the down projection, by to_f16_split for the output projection);
    // split_proj makes it, through ys_.
    bool split_product(const DevWeight& w, int n) const {
        return prompt_split_ != 0 && (prompt_split_ > 0 || w.rows * w.cols >= kSplitMinWeights) && ys_ && n >= 2 &&
               n <= kMvMaxTokens && split_prompt_weight(w.type, w.cols);  // the memory plan's test
    }
    // to_f16_split of in [n][cols] into xh_; split_out: xh_ for n rows of cols, for a kernel that writes them itself
    // (the RMSNorm before Q|K|V and before gate and up, SwiGLU's up product for the down projection).
    void split_in(const float* in, int n, int64_t cols);
    __half* split_out(int n, int64_t cols) const;
    void split_proj(const RowSplit& out, const DevWeight& w, int n, bool accumulate, SplitSumTail tail = {});
    // The residual product of one token into x_ (w, as matvec_int on the ActBlocks in), with the next RMSNorm (weight
    // norm_w) folded in where the products after it read its ActBlocks (Settings::cuda_norm_fold; then norm_folded_
    // tells the next norm that xnq_ holds them).
    void residual_int(const DevWeight& w, const ActBlock* in, const float* norm_w, bool next_int);
    // The ActBlocks of x normed by w for integer products of n tokens: xnq_ where the residual product folded it in,
    // else rmsnorm's into xq_.
    const ActBlock* norm_int(const float* x, const float* w, int n);
    const ActBlock* quantized(const float* in, int64_t count);
    void capture(const std::function<void()>& step);
    // Layer l's first K (V) row in the cache.
    uint8_t* layer_k(int l) const { return k_cache_ + kv_.row_index(l, 0, 0) * kv_.k_row_bytes(); }
    uint8_t* layer_v(int l) const { return v_cache_ + kv_.row_index(l, 0, 0) * kv_.v_row_bytes(); }
    // Layer l's key offsets [n_kv_heads][head_dim], or null where K carries none.
    float* layer_offsets(int l) const {
        return k_offsets_ ? k_offsets_ + int64_t(l) * kv_.n_kv_heads * kv_.head_dim : nullptr;
    }
    // Positions [0, n) of every layer's K and V between the cache and host memory (Ops::kv_read / kv_write).
    void kv_copy(void* k_host, void* v_host, int n, bool to_host);
    void release();  // frees everything taken so far; safe to call twice

    const Config& c_;
    int device_;
    KvLayout kv_;
    int n_batch_, n_logits_, sm_count_, splits_;
    int head_rows_ = 1;      // the logits rows of the forward being run (run's n_out)
    GemmMmaDevice mma_dev_;  // the SMs and shared memory (--cuda-gemm mma's launch facts)
    bool graphs_;
    bool int_matvec_;  // Settings::cuda_int_matvec
    bool pdl_;         // Settings::cuda_pdl on a device that has it (sm_90 and later)
    MviShape mvi_;     // wide: Settings::cuda_matvec_rows == 8 (one token's Q4_0 / Q8_0 / Q4_K products, 8 rows a
                       // block); pairs: Settings::cuda_matvec_unit == 64 (Q4_0 steps of two units); stages:
                       // Settings::cuda_matvec_stages on a device with cp.async (sm_80 and later), else 0
    bool qkv_store_;   // Settings::cuda_qkv_store
    bool kv_stored_ = false;      // the last norm_qkv() also rotated Q and K and stored K and V (QkvStore)
    bool att_quantized_ = false;  // the last attention() also wrote its output, quantized, into xq_
    bool glu_quantized_ = false;  // the last norm_swiglu() also wrote its output into hq_
    bool norm_fold_;              // Settings::cuda_norm_fold
    bool f16_block_;              // Settings::cuda_f16_block
    int prompt_split_;            // Settings::cuda_prompt_split
    bool norm_folded_ = false;    // the last residual product also wrote the next norm's ActBlocks into xnq_
    bool h_split_ = false;        // the last norm_swiglu() also wrote its output, split, into xh_ (split_out)
    bool att_split_ = false;      // the last attention() also wrote its output, split, into xh_ (split_out)
    bool flash_;       // Settings::cuda_flash_attention
    bool flash_async_;  // Settings::cuda_flash_pipeline, where the device has the shared memory (flash_async_fits)
    bool flash_warp_split_;  // Settings::cuda_flash_warp_split
    bool mma_gemm_;    // Settings::cuda_mma_gemm
    int64_t gemm_chunk_;  // Settings::cuda_gemm_chunk_mib in weights (0: whole matrices; kGemmChunkAuto)
    bool gemm_overlap_;   // Settings::cuda_gemm_overlap: gemm_weight decodes on overlap_.side
    bool ring_fit_;       // Settings::cuda_ring_fit (set_ring_carveout at every forward: a process-wide setting)
    // Settings::cuda_l2_prefetch on a device that has the bulk prefetch (sm_90 and later): what one token's decode
    // attention of each layer asks the L2 cache for (decode_l2_prefetch, planned once), else empty
    std::vector<L2Prefetch> l2_prefetch_;
    GemmOverlap overlap_;  // its stream and events (made in the constructor, freed by release)
    // The step begin() announced: its first position, and whether it writes the last of the first kKvOffsetPositions
    // rows of a K with offsets and so sets them (engine/kv_offset.h).
    int pos0_ = 0;
    bool sets_offsets_ = false;
    cudaStream_t stream_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    cudaGraphExec_t graph_ = nullptr;
    uint8_t* base_ = nullptr;     // the one device allocation (plan_memory)
    int* h_step_ = nullptr;       // pinned: [pos0, n, tokens...], what the next step copies to d_step_
    float* h_logits_ = nullptr;   // pinned: [n_logits][n_vocab]
    DeviceModel w_;

    // Device pointers into base_, shapes as MemoryPlan gives them.
    float *x_, *q_, *k_, *v_, *att_, *ffn_, *up_, *logits_, *xn_, *partials_, *cos_, *sin_;
    __half *xh_, *wh_;
    int64_t wh_floats_ = 0;  // wh_'s size in floats: --cuda-gemm mma's partial sums where it splits the columns
    int64_t xh_halves_ = 0;  // xh_'s size in halves
    float* ys_ = nullptr;    // [2 kMvMaxTokens][rows] at most: the products on split activations (null: none planned)
    int64_t ys_floats_ = 0;
    uint8_t *k_cache_, *v_cache_;  // every layer's K rows, then V rows (KvLayout, in kv_'s types)
    float* k_offsets_;             // [n_layers][n_kv_heads][head_dim] key offsets, or null (KvLayout::k_offsets)
    int* d_step_;
    ActBlock* xq_;
    int* counters_;
    ActBlock* hq_;  // [tokens][n_ff / 32]: the SwiGLU output as its product quantized it (null where n_ff % 32 != 0)
    int* hq_counters_;  // [kImMaxGroups][n_ff / 32]
    ActBlock* xnq_;     // [n_embd / 32]: the next norm's output, made by a residual product (null where n_embd % 32)
    float* norm_sums_;  // [n_embd / 32]
    int* norm_counters_;  // [n_embd / 32 + 1]
};

CudaOps::CudaOps(const Model& model, const Settings& s, int device)
    : c_(model.config),
      device_(device),
      kv_(KvLayout::of(model.config, s.context_size(model.config), s.kv_type_k, s.kv_type_v)),
      n_batch_(s.batch_size(kv_.n_ctx)),
      n_logits_(s.logits_rows(kv_.n_ctx)),
      graphs_(s.cuda_graphs),
      int_matvec_(s.cuda_int_matvec),
      pdl_(false),
      mvi_{s.cuda_matvec_rows == 8, s.cuda_matvec_unit == 64, 0},
      qkv_store_(s.cuda_qkv_store),
      norm_fold_(s.cuda_norm_fold),
      f16_block_(s.cuda_f16_block),
      prompt_split_(s.cuda_prompt_split),
      flash_(s.cuda_flash_attention),
      flash_async_(false),
      flash_warp_split_(s.cuda_flash_warp_split),
      mma_gemm_(s.cuda_mma_gemm),
      gemm_chunk_(gemm_chunk_elems_of_mib(s.cuda_gemm_chunk_mib)),
      gemm_overlap_(s.cuda_gemm_overlap),
      ring_fit_(s.cuda_ring_fit) {
    KVGEN_CUDA_CHECK(cudaSetDevice(device_));
    int major = 0;
    KVGEN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_));
    pdl_ = s.cuda_pdl && major >= 9 && CUDART_VERSION >= 12030;  // (graphs take PDL edges from 12.3)
    int l2 = 0;                                                  // the L2 cache's bytes
    KVGEN_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device_));
    mvi_.stages = major >= 8 && ring_stages_ok(s.cuda_matvec_stages) ? s.cuda_matvec_stages : 0;
    mvi_.mma = s.cuda_int_mma && major >= 8;
    mma_dev_ = gemm_mma_device(device_);
    flash_async_ = s.cuda_flash_pipeline && flash_async_fits(c_.head_dim, mma_dev_);
    sm_count_ = mma_dev_.sm_count;
    splits_ = attention_splits(c_.n_heads, kv_, sm_count_);
    const MemoryPlan p =
        plan_memory(model, kv_, n_batch_, n_logits_, attention_partials(c_.n_heads, c_.head_dim, splits_, n_batch_),
                    gemm_chunk_, gemm_overlap_);
    KVGEN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    try {
        if (gemm_overlap_) make_gemm_overlap(overlap_);
        check_cublas(cublasCreate(&cublas_), "cublasCreate");
        check_cublas(cublasSetStream(cublas_, stream_), "cublasSetStream");
        KVGEN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&base_), p.total));
        KVGEN_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_step_), p.step.bytes));
        KVGEN_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_logits_), p.logits.bytes));
        w_ = upload_model(model, p, base_, device_, s.progress, stream_);
        if (s.cuda_l2_prefetch && major >= 9 && l2 > 0) {
            // the output projection's weight, then the first rows of gate's and up's, which the products after one
            // token's attention read
            auto whole = [](const DevWeight& w) { return L2Range{w.data, w.rows * w.row_bytes}; };
            for (const LayerDev& L : w_.layers)
                l2_prefetch_.push_back(decode_l2_prefetch({whole(L.wo), whole(L.gate), whole(L.up)}, l2,
                                                          kv_.n_kv_heads * (kv_.k_row_bytes() + kv_.v_row_bytes())));
        }
        KVGEN_CUDA_CHECK(cudaMemsetAsync(base_ + p.k_cache.offset, 0, p.k_cache.bytes, stream_));
        KVGEN_CUDA_CHECK(cudaMemsetAsync(base_ + p.v_cache.offset, 0, p.v_cache.bytes, stream_));
        KVGEN_CUDA_CHECK(cudaMemsetAsync(base_ + p.k_offsets.offset, 0, p.k_offsets.bytes, stream_));
        KVGEN_CUDA_CHECK(cudaMemsetAsync(base_ + p.counters.offset, 0, p.counters.bytes, stream_));
        KVGEN_CUDA_CHECK(cudaMemsetAsync(base_ + p.hq_counters.offset, 0, p.hq_counters.bytes, stream_));
        KVGEN_CUDA_CHECK(cudaMemsetAsync(base_ + p.norm_counters.offset, 0, p.norm_counters.bytes, stream_));
        KVGEN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    } catch (...) {
        release();  // a constructor that throws runs no destructor
        throw;
    }
    x_ = at<float>(p.x);
    q_ = at<float>(p.q);
    k_ = at<float>(p.k);
    v_ = at<float>(p.v);
    att_ = at<float>(p.att);
    ffn_ = at<float>(p.ffn);
    up_ = at<float>(p.up);
    logits_ = at<float>(p.logits);
    xn_ = at<float>(p.xn);
    partials_ = at<float>(p.partials);
    cos_ = at<float>(p.cos);
    sin_ = at<float>(p.sin);
    xh_ = at<__half>(p.xh);
    xh_halves_ = int64_t(p.xh.bytes / sizeof(__half));
    ys_ = at<float>(p.ys);
    ys_floats_ = int64_t(p.ys.bytes / sizeof(float));
    wh_ = at<__half>(p.wh);
    wh_floats_ = int64_t(p.wh.bytes / sizeof(float));
    if (gemm_overlap_) set_gemm_overlap_buffers(overlap_, wh_, int64_t(p.wh.bytes / sizeof(__half)));
    k_cache_ = at<uint8_t>(p.k_cache);
    v_cache_ = at<uint8_t>(p.v_cache);
    k_offsets_ = at<float>(p.k_offsets);
    d_step_ = at<int>(p.step);
    xq_ = at<ActBlock>(p.xq);
    counters_ = at<int>(p.counters);
    hq_ = at<ActBlock>(p.hq);
    hq_counters_ = at<int>(p.hq_counters);
    xnq_ = at<ActBlock>(p.xnq);
    norm_sums_ = at<float>(p.norm_sums);
    norm_counters_ = at<int>(p.norm_counters);
}

void CudaOps::release() {
    if (graph_) cudaGraphExecDestroy(graph_);
    graph_ = nullptr;
    if (base_) cudaFree(base_);
    base_ = nullptr;
    if (h_step_) cudaFreeHost(h_step_);
    h_step_ = nullptr;
    if (h_logits_) cudaFreeHost(h_logits_);
    h_logits_ = nullptr;
    if (cublas_) cublasDestroy(cublas_);
    cublas_ = nullptr;
    release_gemm_overlap(overlap_);
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
}

// note: the GPU chooses its kernels by the batch size alone (one token, 2 to 16, with --cuda-matvec-mma on 17 to 64,
// more); Pass does not change them.
void CudaOps::begin(const int32_t* tokens, int n, int pos0, Pass) {
    pos0_ = pos0;
    kv_stored_ = norm_folded_ = h_split_ = att_split_ = att_quantized_ = glu_quantized_ = false;
    sets_offsets_ = kv_.k_offsets() && pos0 < kKvOffsetPositions && pos0 + n >= kKvOffsetPositions;
    h_step_[0] = pos0;
    h_step_[1] = n;
    std::memcpy(h_step_ + 2, tokens, size_t(n) * 4);
}

void CudaOps::capture(const std::function<void()>& step) {
    cudaGraph_t g = nullptr;
    KVGEN_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
        KVGEN_CUDA_CHECK(cudaMemcpyAsync(d_step_, h_step_, 3 * sizeof(int), cudaMemcpyHostToDevice, stream_));
        step();
        KVGEN_CUDA_CHECK(cudaMemcpyAsync(h_logits_, logits_, size_t(c_.n_vocab) * 4, cudaMemcpyDeviceToHost, stream_));
    } catch (...) {
        cudaStreamEndCapture(stream_, &g);
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        throw;
    }
    KVGEN_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    const cudaError_t err = cudaGraphInstantiate(&graph_, g, 0);
    cudaGraphDestroy(g);
    if (err != cudaSuccess) {
        graph_ = nullptr;
        throw_cuda(err, "cudaGraphInstantiate", __FILE__, __LINE__);
    }
}

const float* CudaOps::run(int n, int n_out, const std::function<void()>& step) {
    head_rows_ = n_out;
    set_ring_carveout(ring_fit_);
    // note: the graph is captured once and replayed at every later position, so the one decode step that sets the
    // key offsets (kv_offsets between its rows in rope_store_kv) runs launch by launch, neither captured nor replayed.
    if (n == 1 && graphs_ && !sets_offsets_) {
        if (!graph_) {
            try {
                capture(step);
            } catch (const Error& e) {
                graphs_ = false;  // run the same kernels launch by launch
                spdlog::warn("CUDA graph capture failed, decoding without graphs: {}", e.what());
            }
        }
        if (graph_) {
            KVGEN_CUDA_CHECK(cudaGraphLaunch(graph_, stream_));
            KVGEN_CUDA_CHECK(cudaStreamSynchronize(stream_));
            return h_logits_;
        }
    }
    KVGEN_CUDA_CHECK(cudaMemcpyAsync(d_step_, h_step_, size_t(2 + n) * 4, cudaMemcpyHostToDevice, stream_));
    step();
    gemm_overlap_join(gemm_overlap_ ? &overlap_ : nullptr, stream_);  // nothing left running on the side stream
    KVGEN_CUDA_CHECK(cudaMemcpyAsync(h_logits_, logits_, size_t(n_out) * size_t(c_.n_vocab) * 4,
                                     cudaMemcpyDeviceToHost, stream_));
    KVGEN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return h_logits_;
}

const ActBlock* CudaOps::quantized(const float* in, int64_t count) {
    quantize_act(xq_, in, count, stream_, pdl_);
    return xq_;
}

void CudaOps::split_in(const float* in, int n, int64_t cols) {
    to_f16_split(split_out(n, cols), in, n, cols, stream_);
}

__half* CudaOps::split_out(int n, int64_t cols) const {
    KVGEN_ASSERT(2 * int64_t(n) * cols <= xh_halves_);
    return xh_;
}

void CudaOps::split_proj(const RowSplit& out, const DevWeight& w, int n, bool accumulate, SplitSumTail tail) {
    KVGEN_ASSERT(split_product(w, n) && 2 * int64_t(n) * w.rows <= ys_floats_);
    if (f16_split_ok(w)) {
        f16_split_product(cublas_, out, w, xh_, n, accumulate, ys_, stream_, tail);
        return;
    }
    // the 2n rows' products into ys_ (partial sums, where the kernel splits the columns, in wh_), then added up
    gemm_overlap_join(gemm_overlap_ ? &overlap_ : nullptr, stream_);
    gemm_weight_mma(RowSplit::one(ys_, w.rows), w, xh_, 2 * n, false, mma_dev_, scratch(), wh_floats_, stream_);
    f16_split_sum(out, ys_, n, w.rows, accumulate, stream_, tail);
}

void CudaOps::proj(float* out, const DevWeight& w, const float* in, int n, bool accumulate) {
    if (int_product(w, n)) {  // one token, or a short prompt: each weight read once for up to 8 tokens (16, or from
                              // DRAM once for all 64, on the tensor cores)
        matvec_int(RowSplit::one(out, w.rows), w, quantized(in, n * w.cols), n, accumulate, pdl_, stream_, nullptr,
                   mvi_);
        return;
    }
    if (n == 1) {
        matvec(out, w, in, accumulate, stream_, f16_block_, pdl_, mvi_.stages);
        return;
    }
    if (split_product(w, n)) {  // a short prompt's product on split activations: the weight read once, on the tensor
                                // cores
        split_in(in, n, w.cols);
        split_proj(RowSplit::one(out, w.rows), w, n, accumulate);
        return;
    }
    if (n <= kMvMaxTokens) {  // a short prompt: each weight read once for all its tokens
        matvec_batch(out, w, in, n, accumulate, stream_);
        return;
    }
    to_f16(xh_, in, int64_t(n) * w.cols, stream_);
    proj_f16(RowSplit::one(out, w.rows), w, n, accumulate);
}

// Prefill's product of the activations in xh_ (f16, made by the caller: once for the products that share them):
// out[n][rows] = xh_[n][cols] . W^T on the tensor cores with f32 accumulation, a quantized weight decoded a chunk of
// rows at a time into wh_ (F16 weights used in place), or with --cuda-gemm mma tile by tile inside one kernel (which
// alone can write the rows to several buffers: cuBLAS takes out whole).
void CudaOps::proj_f16(const RowSplit& out, const DevWeight& w, int n, bool accumulate) {
    if (mma_gemm_ && gemm_mma_ok(w)) {
        gemm_overlap_join(gemm_overlap_ ? &overlap_ : nullptr, stream_);  // its partial sums go where wh_ is
        gemm_weight_mma(out, w, xh_, n, accumulate, mma_dev_, scratch(), wh_floats_, stream_);
        return;
    }
    KVGEN_ASSERT(out.end[0] == w.rows);  // one buffer
    gemm_weight(cublas_, out.y[0], w, xh_, n, accumulate, wh_, stream_, gemm_chunk_, sm_count_,
                gemm_overlap_ ? &overlap_ : nullptr, gemm_next(w, n));
}

const DevWeight* CudaOps::gemm_next(const DevWeight& w, int n) const {
    if (!gemm_overlap_) return nullptr;
    const DevWeight* next = nullptr;
    for (size_t l = 0; l < w_.layers.size() && !next; ++l) {
        const LayerDev& L = w_.layers[l];
        const DevWeight* order[] = {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down};
        for (size_t i = 0; i < 7; ++i) {
            if (order[i] != &w) continue;
            if (i + 1 < 7)
                next = order[i + 1];
            else if (l + 1 < w_.layers.size())
                next = &w_.layers[l + 1].wq;
            else if (head_rows_ > 1)  // every position's logits (head)
                next = &w_.output;
            break;
        }
    }
    if (!next || !gemm_decodes_chunks(*next) || (mma_gemm_ && gemm_mma_ok(*next)) || int_product(*next, n))
        return nullptr;
    return next;
}

void CudaOps::embed(float* x, int n) {
    // A forward starts here: nothing is left folded or stored by a step that did not finish (a capture that failed
    // halfway, after which run() launches the same step again without begin()).
    kv_stored_ = norm_folded_ = h_split_ = att_split_ = att_quantized_ = glu_quantized_ = false;
    get_rows(x, w_.embd, d_step_ + 2, n, stream_);
    // note: the step's RoPE tables are made here, once, for every layer's rope_store_kv; inside the recorded step,
    // since they depend on the position in device memory.
    rope_tables(cos_, sin_, d_step_, n, c_.rope_dim / 2, w_.rope_inv_freq, w_.rope_factors, w_.rope_pos_div, stream_);
}

void CudaOps::norm_qkv(float* q, float* k, float* v, const float* x, int l, int n) {
    const LayerDev& L = w_.layers[size_t(l)];
    // In integers (one token or a short prompt) the norm quantizes the input once for all three products; one
    // product over the rows of all three where they share a type (one token's also in f32).
    const bool in_int = qkv_in_int(L, n);
    // a short prompt's products on the activations split once for the three (one, where fused), by the norm
    const bool split =
        !in_int && (L.fused_qkv ? split_product(L.qkv, n)
                                : split_product(L.wq, n) && split_product(L.wk, n) && split_product(L.wv, n));
    const ActBlock* xin = nullptr;
    if (in_int)
        xin = norm_int(x, L.attn_norm, n);
    else
        rmsnorm(xn_, nullptr, x, L.attn_norm, n, c_.n_embd, c_.rms_eps, pdl_, stream_,
                split ? split_out(n, c_.n_embd) : nullptr);
    // Over an f16 cache the integer products also rotate Q and K and store K and V (rope_store_kv then has nothing
    // left to do), and so do the sums of the products on split activations; a quantized cache stores whole rows, in
    // rope_store_kv's launch.
    // (not where the prompt's Q goes to the integer tensor cores, whose products have no such epilogue: rope_store_kv
    // then)
    const bool qkv_mma = mvi_.mma && n > 1 && int_mma_type(L.wq.type);
    kv_stored_ =
        qkv_store_ && kv_.k_type == KvType::F16 && kv_.v_type == KvType::F16 && ((in_int && !qkv_mma) || split);
    const int64_t qd = L.wq.rows, kvd = L.wk.rows;
    auto store = [&](int64_t q_end, int64_t k_end) {
        return QkvStore{reinterpret_cast<__half*>(layer_k(l)), reinterpret_cast<__half*>(layer_v(l)), q_end, k_end,
                        cos_, sin_, d_step_, c_.rope_dim / 2, kv_};
    };
    if (L.fused_qkv && (in_int || n == 1)) {
        const RowSplit qkv{{q, k, v}, {qd, qd + kvd}};
        const QkvStore st = store(qd, qd + kvd);
        if (in_int)
            matvec_int(qkv, L.qkv, xin, n, false, pdl_, stream_, kv_stored_ ? &st : nullptr, mvi_);
        else
            matvec_split(qkv, L.qkv, xn_, stream_, f16_block_, pdl_, mvi_.stages);
        return;
    }
    if (in_int) {  // Q, K and V of different types (a Q4_K_M file's Q6_K V)
        const QkvStore sq = store(qd, qd), sk = store(0, kvd), sv = store(0, 0);
        matvec_int(RowSplit::one(q, qd), L.wq, xin, n, false, pdl_, stream_, kv_stored_ ? &sq : nullptr, mvi_);
        matvec_int(RowSplit::one(k, kvd), L.wk, xin, n, false, pdl_, stream_, kv_stored_ ? &sk : nullptr, mvi_);
        matvec_int(RowSplit::one(v, L.wv.rows), L.wv, xin, n, false, pdl_, stream_, kv_stored_ ? &sv : nullptr, mvi_);
        return;
    }
    if (split) {
        auto tail = [&](const QkvStore& st) { return SplitSumTail{false, nullptr, kv_stored_ ? st : QkvStore{}}; };
        if (L.fused_qkv) {
            split_proj(RowSplit{{q, k, v}, {qd, qd + kvd}}, L.qkv, n, false, tail(store(qd, qd + kvd)));
            return;
        }
        split_proj(RowSplit::one(q, qd), L.wq, n, false, tail(store(qd, qd)));
        split_proj(RowSplit::one(k, kvd), L.wk, n, false, tail(store(0, kvd)));
        split_proj(RowSplit::one(v, L.wv.rows), L.wv, n, false, tail(store(0, 0)));
        return;
    }
    if (n <= kMvMaxTokens) {  // a short prompt's f32 products
        proj(q, L.wq, xn_, n, false);
        proj(k, L.wk, xn_, n, false);
        proj(v, L.wv, xn_, n, false);
        return;
    }
    // Prefill: the normed activations in f16 once for the three products; with --cuda-gemm mma one kernel over the
    // rows of all three where they are one matrix (a GQA model's narrow K and V in the same grid as Q).
    to_f16(xh_, xn_, int64_t(n) * c_.n_embd, stream_);
    if (L.fused_qkv && mma_gemm_ && gemm_mma_ok(L.qkv)) {
        proj_f16(RowSplit{{q, k, v}, {qd, qd + kvd}}, L.qkv, n, false);
        return;
    }
    proj_f16(RowSplit::one(q, qd), L.wq, n, false);
    proj_f16(RowSplit::one(k, kvd), L.wk, n, false);
    proj_f16(RowSplit::one(v, L.wv.rows), L.wv, n, false);
}

void CudaOps::rope_store_kv(float* q, float* k, const float* v, int l, int n) {
    // Q is rotated, and K on its way into the cache, in one launch. The key offsets follow from the first
    // kKvOffsetPositions rows as stored and are taken from every row past them: a step that writes the last of those
    // rows stores the rows before it, sets the layer's offsets, then stores the rest (with Q).
    if (kv_stored_) {  // done by the Q|K|V products (norm_qkv)
        kv_stored_ = false;
        return;
    }
    const int split = sets_offsets_ ? kKvOffsetPositions - pos0_ : 0;
    if (split > 0) {
        store_kv(layer_k(l), layer_v(l), k, v, cos_, sin_, layer_offsets(l), d_step_, 0, split, kv_, c_.rope_dim,
                 stream_);
        kv_offsets(layer_offsets(l), layer_k(l), 1, kv_, stream_);
    }
    kvgen::cuda::rope_store_kv(q, layer_k(l), layer_v(l), k, v, cos_, sin_, layer_offsets(l), d_step_, split, n,
                               c_.n_heads, kv_, c_.rope_dim, stream_);
}

void CudaOps::attention(float* out, const float* q, int l, int n) {
    // note: a quantized K is read in the rotated basis of kv_rotation.h, so the query turns to it (in rope_store_kv's
    // launch, with its RoPE); a quantized V gives the output in it, and it turns back.
    const int64_t rows = int64_t(n) * c_.n_heads;
    // The output is also quantized where it is made, for the output projection's integer product (one token's, or a
    // short prompt's): by attention (a prompt's by flash attention), or through a quantized V by the rotation that
    // turns it back.
    const DevWeight& wo = w_.layers[size_t(l)].wo;
    KVGEN_ASSERT(wo.cols == int64_t(c_.n_heads) * c_.head_dim);  // out_proj_add reads all of out's blocks
    att_quantized_ = c_.head_dim % 32 == 0 && (n == 1 ? use_int(wo) : int_product(wo, n));
    att_split_ = false;
    const bool turns_back = kv_type_quantized(kv_.v_type);
    // the next products' weights fetched into L2 while one token's attention leaves the memory bus idle
    const L2Prefetch pf = n == 1 && !l2_prefetch_.empty() ? l2_prefetch_[size_t(l)] : L2Prefetch{};
    if (n == 1)
        attention_decode(out, att_quantized_ && !turns_back ? xq_ : nullptr, partials_, counters_, q, layer_k(l),
                         layer_v(l), layer_offsets(l), d_step_, c_.n_heads, kv_, splits_, stream_, pdl_, pf);
    else {  // a short prompt over a deep cache: its positions split among more blocks; the output also split for an
            // output projection on split activations, or quantized for an integer one (by flash attention alone)
        __half* const xh = !turns_back && split_product(wo, n) ? split_out(n, wo.cols) : nullptr;
        ActBlock* const xq = !turns_back && att_quantized_ ? xq_ : nullptr;
        const bool wrote = attention_prefill(out, q, layer_k(l), layer_v(l), layer_offsets(l), d_step_, n, c_.n_heads,
                                             kv_, flash_, flash_async_, flash_warp_split_,
                                             attention_prefill_splits(c_.n_heads, kv_, n, pos0_, sm_count_), partials_,
                                             stream_, xh, xq);
        att_split_ = xh && wrote;
        if (xq && !wrote) att_quantized_ = false;  // quantize_act then, in out_proj_add
    }
    if (turns_back) kv_rotate_rows(out, rows, c_.head_dim, stream_, pdl_, att_quantized_ ? xq_ : nullptr);
}

void CudaOps::out_proj_add(float* x, const float* att, int l, int n) {
    const LayerDev& L = w_.layers[size_t(l)];
    const DevWeight& wo = L.wo;
    KVGEN_ASSERT(x == x_);
    if (att_quantized_) {  // xq_: att as quantized by attention, or by the rotation after a quantized V
        att_quantized_ = false;
        if (n == 1)
            residual_int(wo, xq_, L.ffn_norm, glu_in_int(L, 1));
        else
            matvec_int(RowSplit::one(x, wo.rows), wo, xq_, n, true, pdl_, stream_, nullptr, mvi_);
        return;
    }
    if (n == 1 && use_int(wo)) {
        residual_int(wo, quantized(att, wo.cols), L.ffn_norm, glu_in_int(L, 1));
        return;
    }
    if (att_split_) {  // att split by attention into xh_
        att_split_ = false;
        split_proj(RowSplit::one(x, wo.rows), wo, n, true);
        return;
    }
    proj(x, wo, att, n, true);  // the residual add is the product's accumulate
}

void CudaOps::residual_int(const DevWeight& w, const ActBlock* in, const float* norm_w, bool next_int) {
    norm_folded_ = norm_fold_ && next_int && xnq_ && w.rows == c_.n_embd;
    const NormStore ns{norm_w, xnq_, norm_sums_, norm_counters_, c_.rms_eps};
    matvec_int(RowSplit::one(x_, w.rows), w, in, 1, true, pdl_, stream_, nullptr, mvi_, norm_folded_ ? &ns : nullptr);
}

const ActBlock* CudaOps::norm_int(const float* x, const float* w, int n) {
    if (norm_folded_) {  // made by the residual product before: x is the residual it wrote
        KVGEN_ASSERT(n == 1 && x == x_);
        norm_folded_ = false;
        return xnq_;
    }
    rmsnorm(xn_, xq_, x, w, n, c_.n_embd, c_.rms_eps, pdl_, stream_);
    return xq_;
}

void CudaOps::norm_swiglu(float* h, const float* x, int l, int n) {
    const LayerDev& L = w_.layers[size_t(l)];
    // Gate and up in one product: one token's, or in integers a short prompt's.
    const bool pair = glu_fusable(L.gate, L.up), in_int = glu_in_int(L, n);
    const bool fused = in_int || (n == 1 && pair);
    // the down projection's input quantized by the product that makes it, where both run in integers (a short
    // prompt's too: on the CUDA cores, in their launches of up to 8 tokens, or on the tensor cores in one)
    glu_quantized_ = in_int && hq_ && (n == 1 ? use_int(L.down) : int_product(L.down, n));
    // a short prompt's gate and up products on the activations split once for both, by the norm
    const bool split = !fused && split_product(L.gate, n) && split_product(L.up, n);
    h_split_ = false;
    const ActBlock* xin = nullptr;
    if (in_int)
        xin = norm_int(x, L.ffn_norm, n);
    else
        rmsnorm(xn_, nullptr, x, L.ffn_norm, n, c_.n_embd, c_.rms_eps, pdl_, stream_,
                split ? split_out(n, c_.n_embd) : nullptr);
    if (fused) {
        if (in_int)
            matvec_glu_int(h, glu_quantized_ ? hq_ : nullptr, hq_counters_, L.gate, L.up, xin, n, pdl_, stream_, mvi_);
        else
            matvec_glu(h, L.gate, L.up, xn_, stream_, f16_block_, pdl_, mvi_.stages);
        return;
    }
    if (split) {
        // the up product's sums meet the gate's in h as the swiglu kernel would, and where the down projection takes
        // split activations too, h goes into xh_ split (its input read: the sum runs after the up product)
        h_split_ = split_product(L.down, n) && L.down.cols == L.gate.rows;
        split_proj(RowSplit::one(h, L.gate.rows), L.gate, n, false);
        split_proj(RowSplit::one(h, L.up.rows), L.up, n, false,
                   SplitSumTail{true, h_split_ ? split_out(n, L.gate.rows) : nullptr});
        return;
    }
    if (n <= kMvMaxTokens) {  // a short prompt's f32 products
        proj(h, L.gate, xn_, n, false);
        proj(up_, L.up, xn_, n, false);
    } else {  // prefill: the normed activations in f16 once for both products; with --cuda-gemm mma, one kernel
        to_f16(xh_, xn_, int64_t(n) * c_.n_embd, stream_);
        if (pair && mma_gemm_ && gemm_mma_ok(L.gate)) {
            gemm_glu_mma(h, L.gate, L.up, xh_, n, mma_dev_, stream_);
            return;
        }
        proj_f16(RowSplit::one(h, L.gate.rows), L.gate, n, false);
        proj_f16(RowSplit::one(up_, L.up.rows), L.up, n, false);
    }
    swiglu(h, up_, int64_t(n) * c_.n_ff, stream_);
}

void CudaOps::down_proj_add(float* x, const float* h, int l, int n) {
    const DevWeight& down = w_.layers[size_t(l)].down;
    KVGEN_ASSERT(x == x_);
    // the next norm: the next layer's before its Q|K|V products, or the output norm before the head
    const bool last = l + 1 == c_.n_layers;
    const float* norm_w = last ? w_.output_norm : w_.layers[size_t(l) + 1].attn_norm;
    const bool next_int = last ? use_int(w_.output) : qkv_in_int(w_.layers[size_t(l) + 1], 1);
    if (glu_quantized_) {  // hq_: h as quantized by the SwiGLU product
        glu_quantized_ = false;
        if (n == 1)
            residual_int(down, hq_, norm_w, next_int);
        else
            matvec_int(RowSplit::one(x, down.rows), down, hq_, n, true, pdl_, stream_, nullptr, mvi_);
        return;
    }
    if (h_split_) {  // xh_: h as split by the SwiGLU product
        h_split_ = false;
        split_proj(RowSplit::one(x, down.rows), down, n, true);
        return;
    }
    if (n == 1 && use_int(down)) {
        residual_int(down, quantized(h, down.cols), norm_w, next_int);
        return;
    }
    proj(x, down, h, n, true);  // the residual add is the product's accumulate
}

void CudaOps::head(float* logits, const float* x, int n) {
    if (n > 1) {  // every position's logits (Settings::all_logits)
        rmsnorm(xn_, nullptr, x, w_.output_norm, n, c_.n_embd, c_.rms_eps, pdl_, stream_);
        proj(logits, w_.output, xn_, n, false);
        return;
    }
    if (use_int(w_.output)) {
        const ActBlock* xin = norm_int(x, w_.output_norm, 1);
        matvec_int(RowSplit::one(logits, w_.output.rows), w_.output, xin, 1, false, pdl_, stream_, nullptr, mvi_);
        return;
    }
    rmsnorm(xn_, nullptr, x, w_.output_norm, 1, c_.n_embd, c_.rms_eps, pdl_, stream_);
    matvec(logits, w_.output, xn_, false, stream_, f16_block_, pdl_, mvi_.stages);
}

// One layer-and-head's rows [0, n) per row of a 2-D copy: n_ctx rows apart in the cache, n apart on the host. Rows
// written that hold the first kKvOffsetPositions set every layer's key offsets again, as KvCache::write_rows does.
void CudaOps::kv_copy(void* k_host, void* v_host, int n, bool to_host) {
    if (n == 0) return;
    const size_t heads = size_t(kv_.n_layers) * size_t(kv_.n_kv_heads), ctx = size_t(kv_.n_ctx), w = size_t(n);
    const std::pair<void*, size_t> halves[] = {{k_host, size_t(kv_.k_row_bytes())}, {v_host, size_t(kv_.v_row_bytes())}};
    uint8_t* const caches[] = {k_cache_, v_cache_};
    for (int i = 0; i < 2; ++i) {
        const auto [host, rb] = halves[i];
        if (to_host)
            KVGEN_CUDA_CHECK(cudaMemcpy2DAsync(host, w * rb, caches[i], ctx * rb, w * rb, heads, cudaMemcpyDeviceToHost,
                                               stream_));
        else
            KVGEN_CUDA_CHECK(cudaMemcpy2DAsync(caches[i], ctx * rb, host, w * rb, w * rb, heads, cudaMemcpyHostToDevice,
                                               stream_));
    }
    if (!to_host && k_offsets_ && n >= kKvOffsetPositions) kv_offsets(k_offsets_, k_cache_, kv_.n_layers, kv_, stream_);
    KVGEN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace

CudaMemoryPlan plan_memory(const Model& model, const Settings& s) {
    const Config& c = model.config;
    const KvLayout kv = KvLayout::of(c, s.context_size(c), s.kv_type_k, s.kv_type_v);
    // note: the split count depends on the device; the most there can be keeps the plan an upper bound.
    const int splits = attention_max_splits(kv), n_batch = s.batch_size(kv.n_ctx);
    const MemoryPlan p = plan_memory(model, kv, n_batch, s.logits_rows(kv.n_ctx),
                                     attention_partials(c.n_heads, c.head_dim, splits, n_batch),
                                     gemm_chunk_elems_of_mib(s.cuda_gemm_chunk_mib), s.cuda_gemm_overlap);
    return CudaMemoryPlan{p.weights, p.kv_cache, p.buffers};
}

std::string describe_device(int device) {
    cudaDeviceProp p{};
    KVGEN_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    return fmt::format("cuda{} ({}, {} SMs, {:.1f} GiB)", device, p.name, p.multiProcessorCount,
                       double(p.totalGlobalMem) / double(1ull << 30));
}

std::unique_ptr<Backend> make_backend(const Model& model, const Settings& s) {
    const int device = cuda_device_index(s.device);
    std::string why;
    const std::vector<DeviceInfo> devices = list_devices(&why);
    if (devices.empty()) throw Error(fmt::format("--device cuda: {}", why));
    if (device < 0 || device >= int(devices.size()))
        throw Error(fmt::format("--device cuda{}: only {} CUDA device(s) visible", device, devices.size()));
    const KvLayout kv_asked = KvLayout::of(model.config, 1, s.kv_type_k, s.kv_type_v);
    if (!kv_cache_supported(kv_asked)) {
        const std::string asked = kv_types_name(s.kv_type_k, s.kv_type_v);
        throw Error(fmt::format(
            "--kv-type {}: the CUDA backend keeps K and V in f16, q8_0 or q4_0, quantized for head_dim 64 or 128 "
            "(this model's is {}; use --device cpu for {})",
            asked, model.config.head_dim, asked));
    }

    const Config& c = model.config;
    if (!attention_head_dim_supported(c.head_dim))
        throw Error(fmt::format("--device cuda: head_dim {} has no attention kernel (even values up to 256)",
                                c.head_dim));
    for (const WeightView* w : device_weights(model))
        if (!device_type_supported(w->type) || (w->cols % 32 != 0 && !is_float_type(w->type)))
            throw Error(fmt::format("--device cuda: tensor '{}' of type {} has no CUDA kernel",
                                    w->tensor ? w->tensor->name : std::string("?"), ggml_type_name(w->type)));

    KVGEN_CUDA_CHECK(cudaSetDevice(device));
    if (kv_asked.quantized()) {
        const GemmMmaDevice d = gemm_mma_device(device);
        if (!flash_quantized_fits(c.head_dim, d))
            throw Error(
                fmt::format("--kv-type {}: a quantized cache's prompt attention takes {} bytes of shared memory a "
                            "block at head_dim "
                            "{}, and this GPU allows {} (use --kv-type f16, or --device cpu)",
                            kv_types_name(s.kv_type_k, s.kv_type_v), flash_quantized_bytes(c.head_dim), c.head_dim,
                            d.shared_per_block));
    }
    size_t free_b = 0, total_b = 0;
    KVGEN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const CudaMemoryPlan plan = plan_memory(model, s);
    if (plan.total() + kReserve > free_b) {
        // The positions whose cache fits beside the weights and buffers (the buffers as planned for this context,
        // an upper bound for a smaller one).
        const size_t fixed = plan.weights + plan.buffers + kReserve;
        const int64_t per_token = kv_asked.bytes_per_token();
        const int64_t fit = free_b > fixed ? int64_t((free_b - fixed) / size_t(per_token)) : 0;
        const std::string hint =
            fit >= 2 ? fmt::format("about {} positions fit (try --ctx-size {} or a smaller --batch-size, or --device "
                                   "cpu)",
                                   fit, fit)
                     : "the weights and buffers alone do not fit (try a smaller --batch-size, or --device cpu)";
        throw Error(fmt::format(
            "not enough GPU memory on {}: needs {} (weights {}, KV cache {} for {} positions, buffers {}, plus {} "
            "for CUDA itself) but {} of {} is free: {}",
            describe_device(device), gib(double(plan.total() + kReserve)), gib(double(plan.weights)),
            gib(double(plan.kv_cache)), s.context_size(c), gib(double(plan.buffers)), gib(double(kReserve)),
            gib(double(free_b)), gib(double(total_b)), hint));
    }
    return std::make_unique<Backend>(c, std::make_unique<CudaOps>(model, s, device));
}

}  // namespace kvgen::cuda
