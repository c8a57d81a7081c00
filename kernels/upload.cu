#include "upload.cuh"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "cuda_common.cuh"
#include "engine/rope.h"
#include "model/dequant.h"
#include "weight_layout.h"

namespace kvgen::cuda {

namespace {

std::string gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / double(1ull << 30)); }

// Two pinned staging buffers used in turn: a piece of the mapped file is copied into one while the other's transfer
// runs. Frees itself.
class Staging {
public:
    static constexpr size_t kBytes = size_t(64) << 20;
    explicit Staging(cudaStream_t s) : s_(s) {
        for (int i = 0; i < 2; ++i) {
            KVGEN_CUDA_CHECK(cudaMallocHost(&buf_[i], kBytes));
            KVGEN_CUDA_CHECK(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
        }
    }
    ~Staging() {
        for (int i = 0; i < 2; ++i) {
            if (done_[i]) cudaEventDestroy(done_[i]);
            if (buf_[i]) cudaFreeHost(buf_[i]);
        }
    }
    Staging(const Staging&) = delete;
    Staging& operator=(const Staging&) = delete;

    // Queues a copy of len <= kBytes bytes to device dst, which fill(buffer) writes into a staging buffer first.
    template <typename Fill>
    void copy(uint8_t* dst, size_t len, Fill&& fill) {
        KVGEN_CUDA_CHECK(cudaEventSynchronize(done_[turn_]));
        fill(static_cast<uint8_t*>(buf_[turn_]));
        KVGEN_CUDA_CHECK(cudaMemcpyAsync(dst, buf_[turn_], len, cudaMemcpyHostToDevice, s_));
        KVGEN_CUDA_CHECK(cudaEventRecord(done_[turn_], s_));
        turn_ ^= 1;
    }

private:
    cudaStream_t s_;
    void* buf_[2] = {nullptr, nullptr};
    cudaEvent_t done_[2] = {nullptr, nullptr};
    int turn_ = 0;
};

}  // namespace

DeviceModel upload_model(const Model& m, const MemoryPlan& plan, uint8_t* base, int device, bool progress,
                         cudaStream_t s) {
    const auto t0 = std::chrono::steady_clock::now();
    const Config& c = m.config;
    const std::vector<const WeightView*> ws = device_weights(m);
    size_t total = 0;
    for (const WeightView* w : ws) total += size_t(w->rows) * size_t(device_row_bytes(w->type, w->cols));
    const bool tty = isatty(2) != 0;
    if (progress)
        std::fprintf(stderr, "kvgen: cuda%d: uploading %s of weights%s", device, gib(double(total)).c_str(),
                     tty ? "" : "\n");
    try {
        Staging stage(s);
        size_t sent = 0;
        int last_pct = -1;
        for (size_t i = 0; i < ws.size(); ++i) {
            // Whole rows at a time, laid out for the device (weight_layout.h) on their way through the staging buffer.
            const WeightView& w = *ws[i];
            const int64_t dev_row = device_row_bytes(w.type, w.cols);
            const int64_t piece_rows = std::max<int64_t>(1, int64_t(Staging::kBytes) / dev_row);
            KVGEN_ASSERT(dev_row <= int64_t(Staging::kBytes));
            for (int64_t r = 0; r < w.rows; r += piece_rows) {
                const int64_t n = std::min(piece_rows, w.rows - r);
                const size_t len = size_t(n * dev_row);
                stage.copy(base + plan.matrices[i].offset + size_t(r * dev_row), len, [&](uint8_t* buf) {
                    to_device_rows(w.type, w.data + r * w.row_bytes, n, w.cols, buf);
                });
                sent += len;
                const int pct = int(100.0 * double(sent) / double(total));
                if (progress && tty && pct != last_pct) {
                    std::fprintf(stderr, "\rkvgen: cuda%d: uploading %s of weights: %3d%%", device,
                                 gib(double(total)).c_str(), pct);
                    last_pct = pct;
                }
            }
        }
        // Norms decoded to f32 and the RoPE frequencies, small enough to send from ordinary memory.
        std::vector<float> norms;
        auto decode = [&norms](const WeightView& w) {
            const size_t at = norms.size();
            norms.resize(at + size_t(w.rows * w.cols));
            dequantize_row(w.type, w.data, norms.data() + at, w.rows * w.cols);
        };
        for (const LayerWeights& L : m.weights.layers) {
            decode(L.attn_norm);
            decode(L.ffn_norm);
        }
        decode(m.weights.output_norm);
        KVGEN_ASSERT(norms.size() * 4 == plan.norms.bytes);
        KVGEN_CUDA_CHECK(cudaMemcpyAsync(base + plan.norms.offset, norms.data(), plan.norms.bytes,
                                         cudaMemcpyHostToDevice, s));
        const RopeFreqs rope = RopeFreqs::of(m);
        KVGEN_CUDA_CHECK(cudaMemcpyAsync(base + plan.rope_inv_freq.offset, rope.inv_freq.data(),
                                         plan.rope_inv_freq.bytes, cudaMemcpyHostToDevice, s));
        if (!rope.factors.empty())
            KVGEN_CUDA_CHECK(cudaMemcpyAsync(base + plan.rope_factors.offset, rope.factors.data(),
                                             plan.rope_factors.bytes, cudaMemcpyHostToDevice, s));
        KVGEN_CUDA_CHECK(cudaStreamSynchronize(s));  // before the host vectors go
    } catch (...) {
        if (progress && tty) std::fputs("\n", stderr);
        throw;
    }

    DeviceModel d;
    auto dev = [&](const WeightView& w) {
        for (size_t i = 0; i < ws.size(); ++i)
            if (ws[i] == &w)
                return DevWeight{w.type, w.rows, w.cols, device_row_bytes(w.type, w.cols),
                                 base + plan.matrices[i].offset};
        throw Error("CUDA: a weight was not uploaded");  // not reached: device_weights lists every matrix
    };
    const float* norms = reinterpret_cast<const float*>(base + plan.norms.offset);
    d.embd = dev(m.weights.token_embd);
    d.output = m.weights.tied_output ? d.embd : dev(m.weights.output);
    for (size_t l = 0; l < m.weights.layers.size(); ++l) {
        const LayerWeights& L = m.weights.layers[l];
        LayerDev ld{dev(L.wq), dev(L.wk),  dev(L.wv), dev(L.wo), dev(L.w_gate), dev(L.w_up), dev(L.w_down),
                    {},        plan.fused_qkv[l], norms + 2 * l * size_t(c.n_embd),
                    norms + (2 * l + 1) * size_t(c.n_embd)};
        if (ld.fused_qkv) {
            ld.qkv = ld.wq;
            ld.qkv.rows = ld.wq.rows + ld.wk.rows + ld.wv.rows;
        }
        d.layers.push_back(ld);
    }
    d.output_norm = norms + 2 * m.weights.layers.size() * size_t(c.n_embd);
    d.rope_inv_freq = reinterpret_cast<const double*>(base + plan.rope_inv_freq.offset);
    if (plan.rope_factors.bytes > 0) d.rope_factors = reinterpret_cast<const double*>(base + plan.rope_factors.offset);
    d.rope_pos_div = RopeFreqs::of(m).pos_div;

    if (progress) {
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fprintf(stderr, "%skvgen: cuda%d: weights uploaded in %.2f s (%.1f GB/s), KV cache %s\n", tty ? "\r" : "",
                     device, sec, double(total) / sec / 1e9, gib(double(plan.kv_cache)).c_str());
    }
    return d;
}

}  // namespace kvgen::cuda
