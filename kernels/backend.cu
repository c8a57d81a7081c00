// The CUDA backend: weights uploaded once in their GGUF types, decode through the quantized matrix-vector kernels
// and flash-decoding attention (captured once as a CUDA graph), prefill through f16 GEMMs on the tensor cores.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "cuda_backend.h"
#include "cuda_common.cuh"
#include "device.h"
#include "model/dequant.h"
#include "ops.cuh"

namespace kvgen::cuda {

namespace {

constexpr size_t kAlign = 256;
constexpr size_t kReserve = size_t(512) << 20;  // the CUDA context, cuBLAS's workspace and kernels
size_t align_up(size_t n) {
    return (n + kAlign - 1) / kAlign * kAlign;
}

size_t weight_bytes(const WeightView& w) {
    return size_t(w.rows) * size_t(w.row_bytes);
}

// The weight matrices the device keeps in their GGUF types (norms are decoded to f32 separately), in upload order.
std::vector<const WeightView*> device_weights(const Model& m) {
    std::vector<const WeightView*> out{&m.weights.token_embd};
    if (!m.weights.tied_output) out.push_back(&m.weights.output);
    for (const LayerWeights& L : m.weights.layers)
        for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) out.push_back(w);
    return out;
}

// Whether `next` is uploaded right after `prev`'s last row, without padding, so that Q, K and V read as one matrix
// (one decode matvec for all three). Rows stay aligned: the group starts on kAlign and every row size of a type is a
// multiple of what its decoder's loads need.
bool continues(const Model& m, const WeightView* prev, const WeightView* next) {
    for (const LayerWeights& L : m.weights.layers)
        if ((prev == &L.wq && next == &L.wk) || (prev == &L.wk && next == &L.wv))
            return prev->type == next->type && prev->row_bytes == next->row_bytes;
    return false;
}

std::string gib(double bytes) {
    return fmt::format("{:.2f} GiB", bytes / double(1ull << 30));
}

// Sizes of the activation buffers for a batch of nb tokens.
struct Sizes {
    int64_t nb, e, qd, kvd, ff, half, vocab, partials, wh, xh;
};

Sizes sizes_for(const Model& m, int n_batch, int splits) {
    const Config& c = m.config;
    Sizes s{};
    s.nb = n_batch;
    s.e = c.n_embd;
    s.qd = int64_t(c.n_heads) * c.head_dim;
    s.kvd = int64_t(c.n_kv_heads) * c.head_dim;
    s.ff = c.n_ff;
    s.half = c.rope_dim / 2;
    s.vocab = c.n_vocab;
    s.partials = attention_partials({c.n_heads, c.n_kv_heads, c.head_dim, 0}, splits);
    s.xh = n_batch > 1 ? s.nb * std::max({s.e, s.qd, s.ff}) : 0;
    s.wh = 0;  // the largest layer matrix that needs decoding to f16 for the prefill GEMM
    if (n_batch > 1)
        for (const LayerWeights& L : m.weights.layers)
            for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
                if (w->type != GgmlType::F16) s.wh = std::max(s.wh, w->rows * w->cols);
    return s;
}

size_t buffer_bytes(const Sizes& s, int n_layers) {
    const int64_t f32 = 2 * s.nb * s.e + 2 * s.nb * s.qd + 2 * s.kvd + 2 * s.nb * s.kvd + 2 * s.nb * s.ff + s.vocab +
                        s.partials + (2 * int64_t(n_layers) + 1) * s.e + 2 * s.nb * s.half;
    return size_t(f32) * 4 + size_t(s.xh + s.wh) * 2 + size_t(2 + s.nb) * 4 + size_t(2 * s.half) * 8 + 16 * kAlign;
}

int sm_count_of(int device) {
    int n = 0;
    KVGEN_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
}

class CudaBackend final : public Backend {
  public:
    CudaBackend(const Model& model, const CudaOptions& opt);
    ~CudaBackend() override;
    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;

    const float* forward(const int32_t* tokens, int n_tokens, int pos0) override;
    void kv_truncate(int n_past) override { n_past_ = n_past; }
    int n_past() const override { return n_past_; }
    int n_ctx() const override { return n_ctx_; }
    int n_batch() const override { return n_batch_; }
    size_t kv_bytes() const override { return kv_bytes_; }
    std::string name() const override { return "cuda"; }

  private:
    struct DeviceFree {
        void operator()(void* p) const { cudaFree(p); }
    };
    struct PinnedFree {
        void operator()(void* p) const { cudaFreeHost(p); }
    };
    // Device (pinned: host) memory for count elements, owned by the backend until release().
    template <typename T>
    T* alloc(int64_t count) {
        void* p = nullptr;
        if (count <= 0) return nullptr;
        KVGEN_CUDA_CHECK(cudaMalloc(&p, size_t(count) * sizeof(T)));
        allocations_.emplace_back(p);
        return static_cast<T*>(p);
    }
    template <typename T>
    T* alloc_pinned(int64_t count) {
        void* p = nullptr;
        KVGEN_CUDA_CHECK(cudaMallocHost(&p, size_t(count) * sizeof(T)));
        pinned_.emplace_back(p);
        return static_cast<T*>(p);
    }
    void upload(const CudaOptions& opt);
    const float* upload_f32(const WeightView& w);
    void enqueue(int n);
    void proj(const DevWeight& w, const float* in, int n, float* out, bool accumulate);
    void capture_decode();
    void release();  // frees everything taken so far; safe to call twice

    const Model& model_;
    const Config& c_;
    int device_;
    int n_ctx_, n_batch_, n_past_ = 0, splits_;
    bool graphs_;
    size_t kv_bytes_ = 0;
    AttnShape attn_{};
    cudaStream_t stream_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    cudaGraphExec_t graph_ = nullptr;
    std::vector<std::unique_ptr<void, DeviceFree>> allocations_;
    std::vector<std::unique_ptr<void, PinnedFree>> pinned_;

    struct LayerDev {
        DevWeight wq, wk, wv, wo, gate, up, down;
        const float *attn_norm, *ffn_norm;
        __half *k_cache, *v_cache;
        DevWeight qkv;  // wq, wk, wv as one matrix when they were uploaded back to back (fused_qkv)
        bool fused_qkv;
    };
    std::vector<LayerDev> layers_;
    DevWeight embd_, output_;
    const float* output_norm_ = nullptr;
    const double *pw_ = nullptr, *ff_ = nullptr;
    double pos_div_ = 1.0;

    float *x_, *xn_, *q_, *att_, *k_, *v_, *gate_, *up_, *logits_, *partials_, *cos_, *sin_;
    __half *xh_, *wh_;
    int* d_step_;                // [pos0, n, tokens...]
    int* h_step_ = nullptr;      // pinned: what the next forward copies to d_step_
    float* h_logits_ = nullptr;  // pinned
};

CudaBackend::CudaBackend(const Model& model, const CudaOptions& opt)
    : model_(model),
      c_(model.config),
      device_(opt.device),
      n_ctx_(opt.n_ctx),
      n_batch_(std::max(1, std::min(opt.n_batch, opt.n_ctx))),
      graphs_(opt.graphs) {
    KVGEN_CUDA_CHECK(cudaSetDevice(device_));
    attn_ = {c_.n_heads, c_.n_kv_heads, c_.head_dim, n_ctx_};
    splits_ = attention_splits(attn_, sm_count_of(device_));
    KVGEN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    try {
        check_cublas(cublasCreate(&cublas_), "cublasCreate");
        check_cublas(cublasSetStream(cublas_, stream_), "cublasSetStream");
        upload(opt);
    } catch (...) {
        release();  // a constructor that throws runs no destructor
        throw;
    }
}

CudaBackend::~CudaBackend() {
    release();
}

void CudaBackend::release() {
    if (graph_) cudaGraphExecDestroy(graph_);
    graph_ = nullptr;
    allocations_.clear();
    pinned_.clear();
    h_step_ = nullptr;
    h_logits_ = nullptr;
    if (cublas_) cublasDestroy(cublas_);
    cublas_ = nullptr;
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
}

const float* CudaBackend::upload_f32(const WeightView& w) {
    std::vector<float> host(size_t(w.rows * w.cols));
    dequantize_row(w.type, w.data, host.data(), w.rows * w.cols);
    float* d = alloc<float>(int64_t(host.size()));
    KVGEN_CUDA_CHECK(cudaMemcpy(d, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    return d;
}

void CudaBackend::upload(const CudaOptions& opt) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<const WeightView*> ws = device_weights(model_);
    size_t total = 0;
    for (const WeightView* w : ws) total += align_up(weight_bytes(*w));
    uint8_t* arena = alloc<uint8_t>(int64_t(total));

    // Pages of the mapped file are copied into two pinned staging buffers in turn, so reading the file overlaps
    // the transfer of the previous piece.
    constexpr size_t kStage = size_t(64) << 20;
    void* stage[2] = {nullptr, nullptr};
    cudaEvent_t done[2] = {nullptr, nullptr};
    const bool tty = isatty(2) != 0;
    auto cleanup = [&] {
        for (int i = 0; i < 2; ++i) {
            if (done[i]) cudaEventDestroy(done[i]);
            if (stage[i]) cudaFreeHost(stage[i]);
        }
    };
    try {
        for (int i = 0; i < 2; ++i) {
            KVGEN_CUDA_CHECK(cudaMallocHost(&stage[i], kStage));
            KVGEN_CUDA_CHECK(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming));
        }
        if (opt.progress)
            std::fprintf(stderr, "kvgen: cuda%d: uploading %s of weights%s", device_, gib(double(total)).c_str(),
                         tty ? "" : "\n");
        size_t off = 0, sent = 0;
        int turn = 0, last_pct = -1;
        std::vector<uint8_t*> dst(ws.size());
        for (size_t i = 0; i < ws.size(); ++i) {
            if (i > 0 && !continues(model_, ws[i - 1], ws[i])) off = align_up(off);
            dst[i] = arena + off;
            const size_t bytes = weight_bytes(*ws[i]);
            for (size_t p = 0; p < bytes; p += kStage, turn ^= 1) {
                const size_t len = std::min(kStage, bytes - p);
                KVGEN_CUDA_CHECK(cudaEventSynchronize(done[turn]));
                std::memcpy(stage[turn], ws[i]->data + p, len);
                KVGEN_CUDA_CHECK(cudaMemcpyAsync(dst[i] + p, stage[turn], len, cudaMemcpyHostToDevice, stream_));
                KVGEN_CUDA_CHECK(cudaEventRecord(done[turn], stream_));
                sent += len;
                const int pct = int(100.0 * double(sent) / double(total));
                if (opt.progress && tty && pct != last_pct) {
                    std::fprintf(stderr, "\rkvgen: cuda%d: uploading %s of weights: %3d%%", device_,
                                 gib(double(total)).c_str(), pct);
                    last_pct = pct;
                }
            }
            off += bytes;
        }
        KVGEN_CUDA_CHECK(cudaStreamSynchronize(stream_));
        cleanup();
        auto dev = [&](const WeightView& w) {
            for (size_t i = 0; i < ws.size(); ++i)
                if (ws[i] == &w) return DevWeight{w.type, w.rows, w.cols, w.row_bytes, dst[i]};
            throw Error("CUDA: a weight was not uploaded");  // not reached: device_weights lists every matrix
        };
        embd_ = dev(model_.weights.token_embd);
        output_ = model_.weights.tied_output ? embd_ : dev(model_.weights.output);
        const int64_t cache_elems = int64_t(c_.n_kv_heads) * n_ctx_ * c_.head_dim;
        for (const LayerWeights& L : model_.weights.layers) {
            LayerDev d{dev(L.wq),
                       dev(L.wk),
                       dev(L.wv),
                       dev(L.wo),
                       dev(L.w_gate),
                       dev(L.w_up),
                       dev(L.w_down),
                       upload_f32(L.attn_norm),
                       upload_f32(L.ffn_norm),
                       nullptr,
                       nullptr,
                       {},
                       false};
            if (continues(model_, &L.wq, &L.wk) && continues(model_, &L.wk, &L.wv)) {
                d.qkv = d.wq;
                d.qkv.rows = d.wq.rows + d.wk.rows + d.wv.rows;
                d.fused_qkv = true;
            }
            d.k_cache = alloc<__half>(cache_elems);
            d.v_cache = alloc<__half>(cache_elems);
            KVGEN_CUDA_CHECK(cudaMemsetAsync(d.k_cache, 0, size_t(cache_elems) * 2, stream_));
            KVGEN_CUDA_CHECK(cudaMemsetAsync(d.v_cache, 0, size_t(cache_elems) * 2, stream_));
            layers_.push_back(d);
        }
        kv_bytes_ = size_t(cache_elems) * 2 * 2 * layers_.size();
        output_norm_ = upload_f32(model_.weights.output_norm);
    } catch (...) {
        cleanup();
        if (opt.progress && tty) std::fputs("\n", stderr);
        throw;
    }

    // RoPE: theta = pos / scale * base^(-2j / rope_dim) (/ freq_factor[j]), in double as on the CPU.
    const int half = c_.rope_dim / 2;
    std::vector<double> pw(static_cast<size_t>(half)), ff;
    for (int j = 0; j < half; ++j) pw[size_t(j)] = std::pow(double(c_.rope_base), -2.0 * j / double(c_.rope_dim));
    double* dpw = alloc<double>(half);
    KVGEN_CUDA_CHECK(cudaMemcpy(dpw, pw.data(), pw.size() * 8, cudaMemcpyHostToDevice));
    pw_ = dpw;
    if (model_.weights.rope_freqs.tensor) {
        std::vector<float> f(static_cast<size_t>(half));
        dequantize_row(model_.weights.rope_freqs.type, model_.weights.rope_freqs.data, f.data(), half);
        ff.assign(f.begin(), f.end());
        double* dff = alloc<double>(half);
        KVGEN_CUDA_CHECK(cudaMemcpy(dff, ff.data(), ff.size() * 8, cudaMemcpyHostToDevice));
        ff_ = dff;
    }
    pos_div_ = c_.rope_scaling == RopeScaling::Linear ? double(c_.rope_scale) : 1.0;

    const Sizes s = sizes_for(model_, n_batch_, splits_);
    x_ = alloc<float>(s.nb * s.e);
    xn_ = alloc<float>(s.nb * s.e);
    q_ = alloc<float>(std::max(s.nb * s.qd, s.qd + 2 * s.kvd));  // one token's fused q|k|v fits too
    att_ = alloc<float>(s.nb * s.qd);
    k_ = alloc<float>(s.nb * s.kvd);
    v_ = alloc<float>(s.nb * s.kvd);
    gate_ = alloc<float>(s.nb * s.ff);
    up_ = alloc<float>(s.nb * s.ff);
    logits_ = alloc<float>(s.vocab);
    partials_ = alloc<float>(s.partials);
    cos_ = alloc<float>(s.nb * s.half);
    sin_ = alloc<float>(s.nb * s.half);
    xh_ = alloc<__half>(s.xh);
    wh_ = alloc<__half>(s.wh);
    d_step_ = alloc<int>(2 + s.nb);
    h_step_ = alloc_pinned<int>(2 + s.nb);
    h_logits_ = alloc_pinned<float>(s.vocab);
    KVGEN_CUDA_CHECK(cudaStreamSynchronize(stream_));

    if (opt.progress) {
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fprintf(stderr, "%skvgen: cuda%d: weights uploaded in %.2f s (%.1f GB/s), KV cache %s\n", tty ? "\r" : "",
                     device_, sec, double(total) / sec / 1e9, gib(double(kv_bytes_)).c_str());
    }
}

void CudaBackend::proj(const DevWeight& w, const float* in, int n, float* out, bool accumulate) {
    if (n == 1) {
        matvec(out, w, in, accumulate, stream_);
        return;
    }
    // Prefill: activations to f16, the weight decoded to an f16 scratch matrix (F16 weights are used in place),
    // then out[n][rows] = in[n][cols] . W^T on the tensor cores with f32 accumulation.
    to_f16(xh_, in, int64_t(n) * w.cols, stream_);
    const __half* a = reinterpret_cast<const __half*>(w.data);
    if (w.type != GgmlType::F16) {
        dequantize_f16(wh_, w, stream_);
        a = wh_;
    }
    gemm_f16(cublas_, out, a, xh_, int(w.rows), n, int(w.cols), accumulate);
}

void CudaBackend::enqueue(int n) {
    const int* d_pos0 = d_step_;
    const int32_t* d_tokens = d_step_ + 2;
    const int e = c_.n_embd;
    get_rows(x_, embd_, d_tokens, n, stream_);
    rope_tables(cos_, sin_, d_pos0, n, c_.rope_dim / 2, pw_, ff_, pos_div_, stream_);
    for (const LayerDev& L : layers_) {
        rmsnorm(xn_, x_, L.attn_norm, n, e, c_.rms_eps, stream_);
        // One token reads q, k and v from one matvec's output when the three were uploaded as one matrix.
        float* q = q_;
        float* k = k_;
        float* v = v_;
        if (n == 1 && L.fused_qkv) {
            matvec(q_, L.qkv, xn_, false, stream_);
            k = q_ + int64_t(c_.n_heads) * c_.head_dim;
            v = k + int64_t(c_.n_kv_heads) * c_.head_dim;
        } else {
            proj(L.wq, xn_, n, q, false);
            proj(L.wk, xn_, n, k, false);
            proj(L.wv, xn_, n, v, false);
        }
        rope(q, cos_, sin_, n, c_.n_heads, c_.head_dim, c_.rope_dim, stream_);
        store_kv(L.k_cache, L.v_cache, k, v, cos_, sin_, d_pos0, n, c_.n_kv_heads, c_.head_dim, c_.rope_dim, n_ctx_,
                 stream_);
        if (n == 1)
            attention_decode(att_, partials_, q, L.k_cache, L.v_cache, d_pos0, attn_, splits_, stream_);
        else
            attention_prefill(att_, q, L.k_cache, L.v_cache, d_pos0, n, attn_, stream_);
        proj(L.wo, att_, n, x_, true);  // the residual add is the product's accumulate
        rmsnorm(xn_, x_, L.ffn_norm, n, e, c_.rms_eps, stream_);
        if (n == 1 && glu_fusable(L.gate, L.up)) {
            matvec_glu(gate_, L.gate, L.up, xn_, stream_);
        } else {
            proj(L.gate, xn_, n, gate_, false);
            proj(L.up, xn_, n, up_, false);
            swiglu(gate_, up_, int64_t(n) * c_.n_ff, stream_);
        }
        proj(L.down, gate_, n, x_, true);
    }
    rmsnorm(xn_, x_ + int64_t(n - 1) * e, output_norm_, 1, e, c_.rms_eps, stream_);
    matvec(logits_, output_, xn_, false, stream_);
}

void CudaBackend::capture_decode() {
    cudaGraph_t g = nullptr;
    KVGEN_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
        KVGEN_CUDA_CHECK(cudaMemcpyAsync(d_step_, h_step_, 3 * sizeof(int), cudaMemcpyHostToDevice, stream_));
        enqueue(1);
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

const float* CudaBackend::forward(const int32_t* tokens, int n, int pos0) {
    KVGEN_ASSERT(n >= 1 && n <= n_batch_ && pos0 >= 0 && pos0 + n <= n_ctx_ && pos0 <= n_past_);
    for (int i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= c_.n_vocab)
            throw Error(fmt::format("token id {} is outside the vocabulary of {}", tokens[i], c_.n_vocab));
    h_step_[0] = pos0;
    h_step_[1] = n;
    std::memcpy(h_step_ + 2, tokens, size_t(n) * 4);

    if (n == 1 && graphs_) {
        if (!graph_) {
            try {
                capture_decode();
            } catch (const Error& e) {
                graphs_ = false;  // run the same kernels launch by launch
                spdlog::warn("CUDA graph capture failed, decoding without graphs: {}", e.what());
            }
        }
        if (graph_) {
            KVGEN_CUDA_CHECK(cudaGraphLaunch(graph_, stream_));
            KVGEN_CUDA_CHECK(cudaStreamSynchronize(stream_));
            n_past_ = pos0 + 1;
            return h_logits_;
        }
    }
    KVGEN_CUDA_CHECK(cudaMemcpyAsync(d_step_, h_step_, size_t(2 + n) * 4, cudaMemcpyHostToDevice, stream_));
    enqueue(n);
    KVGEN_CUDA_CHECK(cudaMemcpyAsync(h_logits_, logits_, size_t(c_.n_vocab) * 4, cudaMemcpyDeviceToHost, stream_));
    KVGEN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    n_past_ = pos0 + n;
    return h_logits_;
}

}  // namespace

CudaMemoryPlan plan_memory(const Model& model, const CudaOptions& opt) {
    CudaMemoryPlan p;
    for (const WeightView* w : device_weights(model)) p.weights += align_up(weight_bytes(*w));
    const Config& c = model.config;
    p.kv_cache = size_t(c.kv_bytes_per_token(2)) * size_t(opt.n_ctx);
    const int n_batch = std::max(1, std::min(opt.n_batch, opt.n_ctx));
    // note: the split count depends on the device; 64 (the most) keeps the plan an upper bound.
    p.buffers = buffer_bytes(sizes_for(model, n_batch, std::min(64, std::max(1, opt.n_ctx))), c.n_layers);
    return p;
}

std::string describe_device(int device) {
    cudaDeviceProp p{};
    KVGEN_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    return fmt::format("cuda{} ({}, {} SMs, {:.1f} GiB)", device, p.name, p.multiProcessorCount,
                       double(p.totalGlobalMem) / double(1ull << 30));
}

std::unique_ptr<Backend> make_backend(const Model& model, const CudaOptions& opt) {
    std::string why;
    const std::vector<DeviceInfo> devices = list_devices(&why);
    if (devices.empty()) throw Error(fmt::format("--device cuda: {}", why));
    if (opt.device < 0 || opt.device >= int(devices.size()))
        throw Error(fmt::format("--device cuda{}: only {} CUDA device(s) visible", opt.device, devices.size()));

    const Config& c = model.config;
    if (!attention_head_dim_supported(c.head_dim))
        throw Error(
            fmt::format("--device cuda: head_dim {} has no attention kernel (32, 64, 96, 128 or 256)", c.head_dim));
    if (c.n_embd % 32 != 0 || c.n_ff % 32 != 0 || c.rope_dim % 2 != 0)
        throw Error(fmt::format("--device cuda: n_embd {} and n_ff {} must be multiples of 32", c.n_embd, c.n_ff));
    for (const WeightView* w : device_weights(model))
        if (!device_type_supported(w->type) || w->cols % 32 != 0)
            throw Error(fmt::format("--device cuda: tensor '{}' of type {} has no CUDA kernel",
                                    w->tensor ? w->tensor->name : std::string("?"), ggml_type_name(w->type)));

    KVGEN_CUDA_CHECK(cudaSetDevice(opt.device));
    size_t free_b = 0, total_b = 0;
    KVGEN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const CudaMemoryPlan plan = plan_memory(model, opt);
    if (plan.total() + kReserve > free_b)
        throw Error(fmt::format(
            "not enough GPU memory on {}: needs {} (weights {}, KV cache {} for {} positions, buffers {}, plus {} "
            "for CUDA itself) but {} of {} is free (try a smaller --ctx-size or --batch-size, or --device cpu)",
            describe_device(opt.device), gib(double(plan.total() + kReserve)), gib(double(plan.weights)),
            gib(double(plan.kv_cache)), opt.n_ctx, gib(double(plan.buffers)), gib(double(kReserve)),
            gib(double(free_b)), gib(double(total_b))));
    return std::make_unique<CudaBackend>(model, opt);
}

}  // namespace kvgen::cuda
