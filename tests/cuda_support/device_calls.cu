// Each kernel through the launcher the backend uses, on a real device: inputs uploaded, the result read back as
// floats. Only the [cuda] tests call these.
#include "testing.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <tuple>
#include <vector>

#include "act_blocks.h"
#include "attention.cuh"
#include "cuda_common.cuh"
#include "elementwise.cuh"
#include "matvec.cuh"
#include "engine/kv_offset.h"
#include "engine/rope.h"
#include "memory_plan.h"
#include "ops.cuh"
#include "weight_layout.h"

namespace kvgen::cuda::testing {

namespace {

// A device copy that frees itself.
template <typename T>
struct Dev {
    T* p = nullptr;
    size_t n = 0;
    explicit Dev(size_t count) : n(count) {
        KVGEN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(1, n) * sizeof(T)));
    }
    explicit Dev(const std::vector<T>& v) : Dev(v.size()) {
        KVGEN_CUDA_CHECK(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    }
    ~Dev() { cudaFree(p); }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
    std::vector<T> get() const {
        std::vector<T> out(n);
        KVGEN_CUDA_CHECK(cudaDeviceSynchronize());
        KVGEN_CUDA_CHECK(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
        return out;
    }
};

// A weight's bytes in the device layout the upload gives them (weight_layout.h).
std::vector<uint8_t> device_bytes(const HostWeight& w) {
    std::vector<uint8_t> out(size_t(w.rows * device_row_bytes(w.type, w.cols)));
    to_device_rows(w.type, w.bytes->data(), w.rows, w.cols, out.data());
    return out;
}

DevWeight dev_weight(const HostWeight& w, const Dev<uint8_t>& bytes) {
    return DevWeight{w.type, w.rows, w.cols, device_row_bytes(w.type, w.cols), bytes.p};
}

std::vector<float> halves_to_floats(const std::vector<__half>& h) {
    std::vector<float> out(h.size());
    for (size_t i = 0; i < h.size(); ++i) out[i] = __half2float(h[i]);
    return out;
}

// A poisoned output: NaN everywhere, so an element the kernel forgets to write fails the comparison.
template <typename T>
void poison(Dev<T>& d) {
    KVGEN_CUDA_CHECK(cudaMemset(d.p, 0xff, d.n * sizeof(T)));
}

}  // namespace

std::vector<float> dequantize(const HostWeight& w, bool via_f16) {
    Dev<uint8_t> b(device_bytes(w));
    const size_t n = size_t(w.rows * w.cols);
    if (via_f16) {
        Dev<__half> out(n);
        poison(out);
        dequantize_f16(out.p, dev_weight(w, b), nullptr);
        return halves_to_floats(out.get());
    }
    Dev<float> out(n);
    poison(out);
    dequantize_f32(out.p, dev_weight(w, b), nullptr);
    return out.get();
}

std::vector<float> get_rows(const HostWeight& w, const std::vector<int32_t>& ids) {
    Dev<uint8_t> b(device_bytes(w));
    Dev<int32_t> d_ids(ids);
    Dev<float> out(ids.size() * size_t(w.cols));
    poison(out);
    kvgen::cuda::get_rows(out.p, dev_weight(w, b), d_ids.p, int(ids.size()), nullptr);
    return out.get();
}

std::vector<float> matvec(const HostWeight& w, const std::vector<float>& x, const std::vector<float>* y0,
                          bool f16_block, int stages) {
    Dev<uint8_t> b(device_bytes(w));
    Dev<float> dx(x);
    Dev<float> y(size_t(w.rows));
    if (y0)
        KVGEN_CUDA_CHECK(cudaMemcpy(y.p, y0->data(), y0->size() * 4, cudaMemcpyHostToDevice));
    else
        poison(y);
    kvgen::cuda::matvec(y.p, dev_weight(w, b), dx.p, y0 != nullptr, nullptr, f16_block, false, stages);
    return y.get();
}

std::vector<float> matvec_batch(const HostWeight& w, const std::vector<float>& x, int n, const std::vector<float>* y0) {
    Dev<uint8_t> b(device_bytes(w));
    Dev<float> dx(x);
    Dev<float> y(size_t(n) * size_t(w.rows));
    if (y0)
        KVGEN_CUDA_CHECK(cudaMemcpy(y.p, y0->data(), y0->size() * 4, cudaMemcpyHostToDevice));
    else
        poison(y);
    kvgen::cuda::matvec_batch(y.p, dev_weight(w, b), dx.p, n, y0 != nullptr, nullptr);
    return y.get();
}

int ring_node_carveout(const HostWeight& w, int stages, bool fit) {
    int carveout = -1;
#if CUDART_VERSION >= 12060
    int driver = 0;
    KVGEN_CUDA_CHECK(cudaDriverGetVersion(&driver));
    if (driver < 12060) return -1;
    Dev<uint8_t> b(device_bytes(w));
    Dev<float> y(size_t(w.rows));
    Dev<ActBlock> xq(size_t(w.cols / 32));
    KVGEN_CUDA_CHECK(cudaMemset(xq.p, 0, xq.n * sizeof(ActBlock)));
    cudaStream_t s = nullptr;
    KVGEN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    set_ring_carveout(fit);
    const MviShape shape{false, true, stages, false};
    const auto product = [&] {
        kvgen::cuda::matvec_int(RowSplit::one(y.p, w.rows), dev_weight(w, b), xq.p, 1, false, false, s, nullptr, shape);
    };
    product();  // once outside the capture, as a backend's first decode step
    KVGEN_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraph_t g = nullptr;
    KVGEN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    product();
    KVGEN_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    size_t n = 0;
    KVGEN_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    KVGEN_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
    for (cudaGraphNode_t node : nodes) {
        cudaGraphNodeType type{};
        KVGEN_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
        if (type != cudaGraphNodeTypeKernel) continue;
        cudaLaunchAttributeValue v{};
        KVGEN_CUDA_CHECK(
            cudaGraphKernelNodeGetAttribute(node, cudaKernelNodeAttributePreferredSharedMemoryCarveout, &v));
        carveout = int(v.sharedMemCarveout);
    }
    KVGEN_CUDA_CHECK(cudaGraphDestroy(g));
    KVGEN_CUDA_CHECK(cudaStreamDestroy(s));
    set_ring_carveout(true);
#else
    (void)w, (void)stages, (void)fit;
#endif
    return carveout;
}

std::vector<float> matvec_int(const HostWeight& w, const std::vector<float>& x, int n, int stages, bool mma,
                              bool pairs) {
    Dev<uint8_t> b(device_bytes(w));
    Dev<float> dx(x), y(size_t(n) * size_t(w.rows));
    Dev<ActBlock> xq(x.size() / 32);
    poison(y);
    quantize_act(xq.p, dx.p, int64_t(x.size()), nullptr);
    kvgen::cuda::matvec_int(RowSplit::one(y.p, w.rows), dev_weight(w, b), xq.p, n, false, false, nullptr, nullptr,
                            MviShape{false, pairs, stages, mma});
    return y.get();
}

std::vector<float> matvec_glu_int(const HostWeight& gate, const HostWeight& up, const std::vector<float>& x, int n,
                                  int stages, bool mma, bool pairs) {
    const MviShape shape{false, pairs, stages, mma};
    Dev<uint8_t> g(device_bytes(gate)), u(device_bytes(up));
    Dev<float> dx(x), y(size_t(n) * size_t(gate.rows));
    Dev<ActBlock> xq(x.size() / 32);
    poison(y);
    quantize_act(xq.p, dx.p, int64_t(x.size()), nullptr);
    kvgen::cuda::matvec_glu_int(y.p, nullptr, nullptr, dev_weight(gate, g), dev_weight(up, u), xq.p, n, false, nullptr,
                                shape);
    const std::vector<float> result = y.get();
    if (gate.rows % 32 == 0) {
        // The output also quantized by the product (for the down projection; one token, or a short prompt's in the
        // CUDA cores' launches of up to 8 or on the tensor cores in one), twice with the same counters: the same y,
        // the blocks quantize_act makes of it, and the counters back at zero after each launch.
        Dev<ActBlock> yq(size_t(n) * size_t(gate.rows / 32)), want(yq.n);
        Dev<int> counters(std::vector<int>(size_t(kIntBatchGroups) * size_t(gate.rows / 32), 0));
        for (int launch = 0; launch < 2; ++launch) {
            poison(y);
            poison(yq);
            kvgen::cuda::matvec_glu_int(y.p, yq.p, counters.p, dev_weight(gate, g), dev_weight(up, u), xq.p, n, false,
                                        nullptr, shape);
            if (y.get() != result) throw Error("matvec_glu_int: another output when it also quantizes it");
            for (int cnt : counters.get())
                if (cnt != 0) throw Error("matvec_glu_int: a row group's counter was not reset");
            quantize_act(want.p, y.p, int64_t(n) * gate.rows, nullptr);
            const std::vector<ActBlock> got = yq.get(), ref = want.get();
            for (size_t b = 0; b < got.size(); ++b)
                if (std::memcmp(&got[b], &ref[b], offsetof(ActBlock, h) + sizeof(ActBlock::h)) != 0)
                    throw Error(fmt::format("matvec_glu_int: ActBlock {} differs from quantize_act of the output", b));
        }
    }
    return result;
}

std::vector<float> matvec_glu(const HostWeight& gate, const HostWeight& up, const std::vector<float>& x, bool f16_block,
                              int stages) {
    Dev<uint8_t> g(device_bytes(gate)), u(device_bytes(up));
    Dev<float> dx(x), y(size_t(gate.rows));
    poison(y);
    kvgen::cuda::matvec_glu(y.p, dev_weight(gate, g), dev_weight(up, u), dx.p, nullptr, f16_block, false, stages);
    return y.get();
}

namespace {
// The current device as the one-kernel GEMM's launch sees it, with sm_count SMs (for the tiles and splits a device of
// that size gets), and stages: 1, no room for two; 2, room for two wherever one block may ask for them (on sm_86/89
// too, which have it for one block a multiprocessor and so take one stage in the backend).
GemmMmaDevice mma_device(int sm_count, int stages) {
    int device = 0;
    KVGEN_CUDA_CHECK(cudaGetDevice(&device));
    GemmMmaDevice d = gemm_mma_device(device);
    d.sm_count = sm_count;
    if (stages == 1) d.shared_per_block = 0;
    if (stages == 2)
        d.shared_per_sm =
            std::max(d.shared_per_sm, kQgBlocksPerSm * (2 * gemm_mma_stage_bytes(128) + kSharedReservePerBlock));
    return d;
}

// A cuBLAS handle on the default stream and, with overlap, gemm_weight's second stream over two buffers of scratch
// (elems halves); both freed when it goes.
struct GemmRig {
    cublasHandle_t h = nullptr;
    GemmOverlap ov;
    GemmOverlap* overlap = nullptr;  // &ov with overlap, else null
    GemmRig(bool with_overlap, __half* scratch, int64_t elems) {
        check_cublas(cublasCreate(&h), "cublasCreate");
        if (!with_overlap) return;
        try {
            make_gemm_overlap(ov);
        } catch (...) {
            release();
            throw;
        }
        set_gemm_overlap_buffers(ov, scratch, elems);
        overlap = &ov;
    }
    ~GemmRig() { release(); }
    GemmRig(const GemmRig&) = delete;
    GemmRig& operator=(const GemmRig&) = delete;
    void release() {
        if (h) cublasDestroy(h);
        h = nullptr;
        release_gemm_overlap(ov);
    }
};
}  // namespace

std::vector<float> f16_split(const HostWeight& w, const std::vector<float>& x, int n, const std::vector<float>* y0,
                             int64_t first_rows, int64_t second_rows) {
    const int64_t rows = w.rows, r1 = std::min(first_rows, rows), r2 = std::min(second_rows, rows - r1);
    const int64_t ends[3] = {r1, r1 + r2, rows}, widths[3] = {r1, r2, rows - r1 - r2};
    // each buffer's rows, token after token, as RowSplit::at puts them
    auto place = [&](int64_t i, int64_t r, int* part) {
        *part = r < ends[0] ? 0 : r < ends[1] ? 1 : 2;
        return size_t(i * widths[*part] + r - (*part == 0 ? 0 : ends[*part - 1]));
    };
    std::vector<std::vector<float>> h(3);
    for (int p = 0; p < 3; ++p) h[size_t(p)].assign(size_t(n * widths[p]), 0.0f);
    if (y0)
        for (int64_t i = 0; i < n; ++i)
            for (int64_t r = 0; r < rows; ++r) {
                int p = 0;
                const size_t at = place(i, r, &p);
                h[size_t(p)][at] = (*y0)[size_t(i * rows + r)];
            }
    Dev<uint8_t> b(device_bytes(w));
    Dev<float> dx(x), t(size_t(2 * n) * size_t(rows)), y1(h[0]), y2(h[1]), y3(h[2]);
    Dev<__half> xh(2 * x.size());
    if (!y0) {
        poison(y1);
        poison(y2);
        poison(y3);
    }
    poison(t);
    const GemmRig rig(false, nullptr, 0);
    to_f16_split(xh.p, dx.p, n, w.cols, nullptr);
    f16_split_product(rig.h, RowSplit{{y1.p, y2.p, y3.p}, {ends[0], ends[1]}}, dev_weight(w, b), xh.p, n, y0 != nullptr,
                      t.p, nullptr);
    h = {y1.get(), y2.get(), y3.get()};
    std::vector<float> out(size_t(n * rows));
    for (int64_t i = 0; i < n; ++i)
        for (int64_t r = 0; r < rows; ++r) {
            int p = 0;
            const size_t at = place(i, r, &p);
            out[size_t(i * rows + r)] = h[size_t(p)][at];
        }
    return out;
}

std::vector<float> f16_split_tiled(const HostWeight& w, const std::vector<float>& x, int n,
                                   const std::vector<float>* y0, int sm_count) {
    // CudaOps::split_proj's tile path: the split rows' product into t (partial sums, where the columns split, in a
    // scratch of up to 8 splits), then each token's two results added.
    const int64_t rows = w.rows;
    Dev<uint8_t> b(device_bytes(w));
    Dev<float> dx(x), t(size_t(2 * n) * size_t(rows)), partials(size_t(8 * 2 * n) * size_t(rows));
    Dev<__half> xh(2 * x.size());
    Dev<float> y(size_t(n) * size_t(rows));
    if (y0)
        KVGEN_CUDA_CHECK(cudaMemcpy(y.p, y0->data(), y0->size() * 4, cudaMemcpyHostToDevice));
    else
        poison(y);
    poison(t);
    poison(partials);
    to_f16_split(xh.p, dx.p, n, w.cols, nullptr);
    gemm_weight_mma(RowSplit::one(t.p, rows), dev_weight(w, b), xh.p, 2 * n, false, mma_device(sm_count, 2), partials.p,
                    int64_t(partials.n), nullptr);
    f16_split_sum(RowSplit::one(y.p, rows), t.p, n, rows, y0 != nullptr, nullptr);
    return y.get();
}

std::vector<float> gemm(const HostWeight& w, const std::vector<float>& x, int n, const std::vector<float>* y0, bool mma,
                        int sm_count, bool split, int stages, int chunk_mib, bool overlap) {
    // The backend's prefill product: activations to f16, then gemm_weight (chunks of rows decoded into the scratch).
    const int64_t chunk = gemm_chunk_elems_of_mib(chunk_mib);
    Dev<uint8_t> b(device_bytes(w));
    Dev<float> dx(x);
    const int64_t scratch = std::max<int64_t>(16, gemm_scratch_elems(w.type, w.rows, w.cols, chunk, overlap));
    Dev<__half> xh(x.size()), wh{size_t(scratch)};
    to_f16(xh.p, dx.p, int64_t(x.size()), nullptr);
    Dev<float> y(size_t(n) * size_t(w.rows));
    if (y0) KVGEN_CUDA_CHECK(cudaMemcpy(y.p, y0->data(), y0->size() * 4, cudaMemcpyHostToDevice));
    else poison(y);
    const GemmRig rig(overlap, wh.p, scratch);
    const DevWeight dw = dev_weight(w, b);
    if (mma && gemm_mma_ok(dw))
        gemm_weight_mma(RowSplit::one(y.p, w.rows), dw, xh.p, n, y0 != nullptr, mma_device(sm_count, stages),
                        split ? reinterpret_cast<float*>(wh.p) : nullptr,
                        int64_t(wh.n * sizeof(__half) / sizeof(float)), nullptr);
    else
        gemm_weight(rig.h, y.p, dw, xh.p, n, y0 != nullptr, wh.p, nullptr, chunk, sm_count, rig.overlap);
    return y.get();
}

std::vector<std::vector<float>> gemm_chain(const std::vector<HostWeight>& ws, const std::vector<int>& next,
                                           const std::vector<float>& x, int n, int chunk_mib, int sm_count,
                                           bool overlap, int64_t* taken) {
    KVGEN_ASSERT(next.size() == ws.size());
    const int64_t chunk = gemm_chunk_elems_of_mib(chunk_mib);
    std::vector<std::unique_ptr<Dev<uint8_t>>> bs;
    std::vector<std::unique_ptr<Dev<float>>> ys;
    int64_t scratch = 16;
    for (const HostWeight& w : ws) {
        KVGEN_ASSERT(size_t(w.cols) * size_t(n) == x.size());
        bs.push_back(std::make_unique<Dev<uint8_t>>(device_bytes(w)));
        ys.push_back(std::make_unique<Dev<float>>(size_t(n) * size_t(w.rows)));
        poison(*ys.back());
        scratch = std::max(scratch, gemm_scratch_elems(w.type, w.rows, w.cols, chunk, overlap));
    }
    Dev<float> dx(x);
    Dev<__half> xh(x.size()), wh{size_t(scratch)};
    to_f16(xh.p, dx.p, int64_t(x.size()), nullptr);
    GemmRig rig(overlap, wh.p, scratch);
    std::vector<DevWeight> dws;
    for (size_t i = 0; i < ws.size(); ++i) dws.push_back(dev_weight(ws[i], *bs[i]));
    for (size_t i = 0; i < ws.size(); ++i)
        gemm_weight(rig.h, ys[i]->p, dws[i], xh.p, n, false, wh.p, nullptr, chunk, sm_count, rig.overlap,
                    next[i] >= 0 ? &dws[size_t(next[i])] : nullptr);
    gemm_overlap_join(rig.overlap, nullptr);
    if (taken) *taken = rig.ov.taken;
    std::vector<std::vector<float>> out;
    for (const auto& y : ys) out.push_back(y->get());
    return out;
}

std::vector<float> rmsnorm(const std::vector<float>& x, const std::vector<float>& w, int n, int dim, float eps) {
    Dev<float> dx(x), dw(w), out(x.size());
    poison(out);
    kvgen::cuda::rmsnorm(out.p, nullptr, dx.p, dw.p, n, dim, eps, false, nullptr);
    return out.get();
}

std::vector<float> rmsnorm_quantized(const std::vector<float>& x, const std::vector<float>& w, int n, int dim,
                                     float eps) {
    Dev<float> dx(x), dw(w), out(x.size());
    Dev<ActBlock> xq(x.size() / 32);
    kvgen::cuda::rmsnorm(out.p, xq.p, dx.p, dw.p, n, dim, eps, false, nullptr);
    return append_blocks(out.get(), xq.get());  // the f32 rows, then the blocks
}

std::vector<float> matvec_int_residual_norm(const HostWeight& w, const std::vector<float>& x,
                                            const std::vector<float>& residual, const std::vector<float>& norm_w,
                                            float eps, bool wide, int stages) {
    Dev<uint8_t> b(device_bytes(w));
    Dev<float> dx(x), y(residual), dw(norm_w), sums(size_t(w.rows / 32));
    Dev<ActBlock> xq(x.size() / 32), yq(size_t(w.rows / 32));
    Dev<int> counters(std::vector<int>(size_t(w.rows / 32 + 1), 0));
    poison(sums);
    quantize_act(xq.p, dx.p, int64_t(x.size()), nullptr);
    const NormStore ns{dw.p, yq.p, sums.p, counters.p, eps};
    kvgen::cuda::matvec_int(RowSplit::one(y.p, w.rows), dev_weight(w, b), xq.p, 1, true, false, nullptr, nullptr,
                            MviShape{wide, true, stages}, &ns);
    std::vector<float> out = append_blocks(y.get(), yq.get());  // the rows, then the blocks, then the counters
    for (int c : counters.get()) out.push_back(float(c));
    return out;
}

std::vector<float> quantize_act(const std::vector<float>& x) {
    Dev<float> dx(x);
    Dev<ActBlock> xq(x.size() / 32);
    kvgen::cuda::quantize_act(xq.p, dx.p, int64_t(x.size()), nullptr);
    return append_blocks({}, xq.get());
}

std::vector<float> rotate_rows_quantized(const std::vector<float>& x, int head_dim) {
    Dev<float> dx(x);
    Dev<ActBlock> xq(x.size() / 32);
    poison(xq);  // a block not written differs from quantize_act's
    kv_rotate_rows(dx.p, int64_t(x.size()) / head_dim, head_dim, nullptr, false, xq.p);
    return append_blocks(dx.get(), xq.get());
}

std::vector<float> gemm_mma_qkv(const HostWeight& w, const std::vector<float>& x, int n, int64_t q_rows,
                                int64_t k_rows, int sm_count) {
    Dev<uint8_t> b(device_bytes(w));
    Dev<float> dx(x);
    Dev<__half> xh(x.size());
    to_f16(xh.p, dx.p, int64_t(x.size()), nullptr);
    const size_t nn = size_t(n);
    Dev<float> q{nn * size_t(q_rows)}, k{nn * size_t(k_rows)}, v{nn * size_t(w.rows - q_rows - k_rows)};
    poison(q);
    poison(k);
    poison(v);
    const RowSplit split{{q.p, k.p, v.p}, {q_rows, q_rows + k_rows}};
    // scratch for the partial sums of a split product, as the backend's (its prefill GEMM's decoding scratch)
    Dev<__half> wh(size_t(std::max<int64_t>(1, gemm_scratch_elems(w.type, w.rows, w.cols))));
    gemm_weight_mma(split, dev_weight(w, b), xh.p, n, false, mma_device(sm_count, 2), reinterpret_cast<float*>(wh.p),
                    int64_t(wh.n * sizeof(__half) / sizeof(float)), nullptr);
    std::vector<float> parts[3] = {q.get(), k.get(), v.get()};
    const RowSplit host{{parts[0].data(), parts[1].data(), parts[2].data()}, {q_rows, q_rows + k_rows}};
    std::vector<float> out(nn * size_t(w.rows));
    for (int i = 0; i < n; ++i)
        for (int64_t r = 0; r < w.rows; ++r) out[size_t(i) * size_t(w.rows) + size_t(r)] = *host.at(r, i, w.rows);
    return out;
}

std::vector<float> gemm_glu_mma(const HostWeight& gate, const HostWeight& up, const std::vector<float>& x, int n,
                                int sm_count) {
    Dev<uint8_t> g(device_bytes(gate)), u(device_bytes(up));
    Dev<float> dx(x), y(size_t(n) * size_t(gate.rows));
    Dev<__half> xh(x.size());
    to_f16(xh.p, dx.p, int64_t(x.size()), nullptr);
    poison(y);
    kvgen::cuda::gemm_glu_mma(y.p, dev_weight(gate, g), dev_weight(up, u), xh.p, n, mma_device(sm_count, 2),
                              nullptr);
    return y.get();
}

std::vector<float> swiglu(const std::vector<float>& gate, const std::vector<float>& up) {
    Dev<float> g(gate), u(up);
    kvgen::cuda::swiglu(g.p, u.p, int64_t(gate.size()), nullptr);
    return g.get();
}

std::vector<float> rmsnorm_split(const std::vector<float>& x, const std::vector<float>& w, int n, int dim, float eps) {
    Dev<float> dx(x), dw(w), out(x.size());
    Dev<__half> xh(2 * x.size());
    poison(out);
    poison(xh);
    kvgen::cuda::rmsnorm(out.p, nullptr, dx.p, dw.p, n, dim, eps, false, nullptr, xh.p);
    std::vector<float> r = out.get();
    const std::vector<float> h = halves_to_floats(xh.get());
    r.insert(r.end(), h.begin(), h.end());
    return r;
}

std::vector<float> f16_split_sum(const std::vector<float>& t, int n, int64_t rows, const std::vector<float>& y0,
                                 bool accumulate, bool glu, bool split) {
    Dev<float> dt(t), y(y0);
    Dev<__half> xh(size_t(2 * n * rows));
    poison(xh);
    kvgen::cuda::f16_split_sum(RowSplit::one(y.p, rows), dt.p, n, rows, accumulate, nullptr,
                               SplitSumTail{glu, split ? xh.p : nullptr});
    std::vector<float> r = y.get();
    if (split) {
        const std::vector<float> h = halves_to_floats(xh.get());
        r.insert(r.end(), h.begin(), h.end());
    }
    return r;
}

std::vector<float> matvec_qkv(const HostWeight& w, const std::vector<float>& x, int64_t q_rows, int64_t k_rows) {
    Dev<uint8_t> b(device_bytes(w));
    Dev<float> dx(x), q{size_t(q_rows)}, k{size_t(k_rows)}, v{size_t(w.rows - q_rows - k_rows)};
    poison(q);
    poison(k);
    poison(v);
    matvec_split(RowSplit{{q.p, k.p, v.p}, {q_rows, q_rows + k_rows}}, dev_weight(w, b), dx.p, nullptr);
    std::vector<float> out = q.get(), kh = k.get(), vh = v.get();
    out.insert(out.end(), kh.begin(), kh.end());
    out.insert(out.end(), vh.begin(), vh.end());
    return out;
}

namespace {
struct RopeDev {
    RopeFreqs r;
    Dev<double> inv_freq, factors;
    Dev<float> cos_t, sin_t;
    Dev<int> pos;
    RopeDev(int n, int pos0, const Config& c, const std::vector<float>& freq_factors)
        : r(RopeFreqs::of(c, freq_factors)),
          inv_freq(r.inv_freq),
          factors(r.factors),
          cos_t(size_t(n) * (c.rope_dim / 2)),
          sin_t(size_t(n) * (c.rope_dim / 2)),
          pos(std::vector<int>{pos0}) {
        rope_tables(cos_t.p, sin_t.p, pos.p, n, c.rope_dim / 2, inv_freq.p, r.factors.empty() ? nullptr : factors.p,
                    r.pos_div, nullptr);
    }
};
}  // namespace

std::vector<float> rope(const std::vector<float>& x, int n, int n_heads, int pos0, const Config& c,
                        const std::vector<float>& freq_factors) {
    RopeDev r(n, pos0, c, freq_factors);
    Dev<float> dx(x);
    kvgen::cuda::rope(dx.p, r.cos_t.p, r.sin_t.p, n, n_heads, c.head_dim, c.rope_dim, nullptr);
    return dx.get();
}

namespace {
// K rotated and stored by store_kv, or with q rotated in the same launch by rope_store_kv when q is given, read back
// from the f16 cache.
std::vector<float> stored_k(const Config& c, std::vector<float>* q, const std::vector<float>& k, int pos0, int n,
                            int n_ctx) {
    RopeDev r(n, pos0, c, {});
    const KvLayout kv = KvLayout::of(c, n_ctx, KvType::F16);
    Dev<float> dk(k), dq(q ? *q : std::vector<float>{});
    Dev<__half> kc(size_t(kv.layer_elems())), vc(size_t(kv.layer_elems()));
    uint8_t *kb = reinterpret_cast<uint8_t*>(kc.p), *vb = reinterpret_cast<uint8_t*>(vc.p);
    if (q) {
        rope_store_kv(dq.p, kb, vb, dk.p, dk.p, r.cos_t.p, r.sin_t.p, nullptr, r.pos.p, 0, n, c.n_heads, kv,
                      c.rope_dim, nullptr);
        *q = dq.get();
    } else {
        store_kv(kb, vb, dk.p, dk.p, r.cos_t.p, r.sin_t.p, nullptr, r.pos.p, 0, n, kv, c.rope_dim, nullptr);
    }
    const std::vector<float> all = halves_to_floats(kc.get());
    std::vector<float> out(size_t(n) * c.n_kv_heads * c.head_dim);
    for (int i = 0; i < n; ++i)
        for (int h = 0; h < c.n_kv_heads; ++h)
            for (int j = 0; j < c.head_dim; ++j)
                out[(size_t(i) * c.n_kv_heads + h) * c.head_dim + j] = all[size_t(kv.row(h, pos0 + i) + j)];
    return out;
}
}  // namespace

std::vector<float> store_k(const Config& c, const std::vector<float>& k, int pos0, int n, int n_ctx) {
    return stored_k(c, nullptr, k, pos0, n, n_ctx);
}

std::pair<QkvStored, QkvStored> qkv_store(const HostWeight& wq, const HostWeight& wk, const HostWeight& wv,
                                          bool one_product, const std::vector<float>& x, int n, const Config& c,
                                          int pos0, int n_ctx) {
    RopeDev r(n, pos0, c, {});
    const KvLayout kv = KvLayout::of(c, n_ctx, KvType::F16);
    const int64_t qd = wq.rows, kvd = wk.rows, cols = wq.cols;
    std::vector<uint8_t> all(*wq.bytes);  // Q|K|V as one matrix (one type)
    all.insert(all.end(), wk.bytes->begin(), wk.bytes->end());
    all.insert(all.end(), wv.bytes->begin(), wv.bytes->end());
    const HostWeight wqkv{wq.type, qd + 2 * kvd, cols, &all};
    Dev<uint8_t> bq(device_bytes(wq)), bk(device_bytes(wk)), bv(device_bytes(wv)), bqkv(device_bytes(wqkv));
    Dev<float> dx(x);
    Dev<ActBlock> xq(x.size() / 32);
    quantize_act(xq.p, dx.p, int64_t(x.size()), nullptr);
    auto run = [&](bool fold) {
        Dev<float> q(size_t(n) * size_t(qd)), k(size_t(n) * size_t(kvd)), v(size_t(n) * size_t(kvd));
        Dev<__half> kc(size_t(kv.layer_elems())), vc(size_t(kv.layer_elems()));
        poison(q);
        poison(kc);  // a row not written reads as NaN, which equals nothing
        poison(vc);
        auto store = [&](int64_t q_end, int64_t k_end) {
            return QkvStore{kc.p, vc.p, q_end, k_end, r.cos_t.p, r.sin_t.p, r.pos.p, c.rope_dim / 2, kv};
        };
        const QkvStore all3 = store(qd, qd + kvd), sq = store(qd, qd), sk = store(0, kvd), sv = store(0, 0);
        if (one_product) {
            kvgen::cuda::matvec_int(RowSplit{{q.p, k.p, v.p}, {qd, qd + kvd}}, dev_weight(wqkv, bqkv), xq.p, n, false,
                                    false, nullptr, fold ? &all3 : nullptr);
        } else {
            kvgen::cuda::matvec_int(RowSplit::one(q.p, qd), dev_weight(wq, bq), xq.p, n, false, false, nullptr,
                                    fold ? &sq : nullptr);
            kvgen::cuda::matvec_int(RowSplit::one(k.p, kvd), dev_weight(wk, bk), xq.p, n, false, false, nullptr,
                                    fold ? &sk : nullptr);
            kvgen::cuda::matvec_int(RowSplit::one(v.p, kvd), dev_weight(wv, bv), xq.p, n, false, false, nullptr,
                                    fold ? &sv : nullptr);
        }
        if (!fold)
            rope_store_kv(q.p, reinterpret_cast<uint8_t*>(kc.p), reinterpret_cast<uint8_t*>(vc.p), k.p, v.p,
                          r.cos_t.p, r.sin_t.p, nullptr, r.pos.p, 0, n, c.n_heads, kv, c.rope_dim, nullptr);
        QkvStored out;
        out.q = q.get();
        const std::vector<float> kh = halves_to_floats(kc.get()), vh = halves_to_floats(vc.get());
        for (const auto& [cache, dst] : {std::pair{&kh, &out.k}, std::pair{&vh, &out.v}})
            for (int i = 0; i < n; ++i)
                for (int h = 0; h < c.n_kv_heads; ++h)
                    for (int j = 0; j < c.head_dim; ++j) dst->push_back((*cache)[size_t(kv.row(h, pos0 + i) + j)]);
        return out;
    };
    return {run(true), run(false)};
}

QkvStored f16_split_sum_qkv_store(const std::vector<float>& t, int n, int64_t rows, const Config& c, int pos0,
                                  int n_ctx, int64_t q_end, int64_t k_end, bool launch) {
    RopeDev r(n, pos0, c, {});
    const KvLayout kv = KvLayout::of(c, n_ctx, KvType::F16);
    const int64_t kd = k_end - q_end, vd = rows - k_end;
    Dev<float> dt(t), q(size_t(n) * size_t(q_end)), k(size_t(n) * size_t(kd)), v(size_t(n) * size_t(vd));
    Dev<__half> kc(size_t(kv.layer_elems())), vc(size_t(kv.layer_elems()));
    poison(q);
    poison(k);  // with the fold, RowSplit's k and v: never written
    poison(v);
    poison(kc);  // a cache row not written reads as NaN
    poison(vc);
    const RowSplit out_rows{{q.p, k.p, v.p}, {q_end, k_end}};
    if (launch) {  // the plain sums, then rope_store_kv's launch on the same tables
        if (q_end != int64_t(c.n_heads) * c.head_dim || kd != int64_t(c.n_kv_heads) * c.head_dim || vd != kd)
            throw Error("f16_split_sum then rope_store_kv: a whole Q|K|V product only");
        kvgen::cuda::f16_split_sum(out_rows, dt.p, n, rows, false, nullptr);
        rope_store_kv(q.p, reinterpret_cast<uint8_t*>(kc.p), reinterpret_cast<uint8_t*>(vc.p), k.p, v.p, r.cos_t.p,
                      r.sin_t.p, nullptr, r.pos.p, 0, n, c.n_heads, kv, c.rope_dim, nullptr);
    } else {
        const QkvStore st{kc.p, vc.p, q_end, k_end, r.cos_t.p, r.sin_t.p, r.pos.p, c.rope_dim / 2, kv};
        kvgen::cuda::f16_split_sum(out_rows, dt.p, n, rows, false, nullptr, SplitSumTail{false, nullptr, st});
        for (const Dev<float>* b : {&k, &v})
            for (float u : b->get())
                if (!std::isnan(u)) throw Error("f16_split_sum with QkvStore wrote RowSplit's k or v");
    }
    QkvStored out;
    out.q = q.get();
    const std::vector<float> kh = halves_to_floats(kc.get()), vh = halves_to_floats(vc.get());
    for (const auto& [cache, dst, seg] : {std::tuple{&kh, &out.k, kd}, std::tuple{&vh, &out.v, vd}}) {
        // the rows of the step's positions, and nothing written elsewhere
        if (std::count_if(cache->begin(), cache->end(), [](float e) { return !std::isnan(e); }) != n * seg)
            throw Error("f16_split_sum with QkvStore: cache values written outside the step's rows");
        for (int i = 0; i < n; ++i)
            for (int h = 0; h < int(seg / c.head_dim); ++h)
                for (int j = 0; j < c.head_dim; ++j) dst->push_back((*cache)[size_t(kv.row(h, pos0 + i) + j)]);
    }
    return out;
}

std::vector<float> rope_q_after_store(const Config& c, const std::vector<float>& q, int pos0, int n) {
    RopeDev r(n, pos0, c, {});
    const KvLayout kv = KvLayout::of(c, 64, KvType::Q8_0);
    Dev<float> dq(q), dk(size_t(n) * c.n_kv_heads * c.head_dim);
    Dev<float> off(kv.k_offsets() ? size_t(c.n_layers) * c.n_kv_heads * c.head_dim : 0);
    Dev<uint8_t> kc(kv.k_bytes()), vc(kv.v_bytes());
    rope_store_kv(dq.p, kc.p, vc.p, dk.p, dk.p, r.cos_t.p, r.sin_t.p, kv.k_offsets() ? off.p : nullptr, r.pos.p, n, n,
                  c.n_heads, kv, c.rope_dim, nullptr);
    return dq.get();
}

std::vector<float> rope_store_k(const Config& c, std::vector<float>* q, const std::vector<float>& k, int pos0, int n,
                                int n_ctx) {
    return stored_k(c, q, k, pos0, n, n_ctx);
}

namespace {
// A KvBytes on the device; get() copies it back.
struct DevCache {
    KvBytes& c;
    Dev<uint8_t> k, v;
    Dev<float> off;
    explicit DevCache(KvBytes& cache) : c(cache), k(cache.k), v(cache.v), off(cache.k_offsets) {}
    uint8_t* layer_k(int l) const { return k.p + c.kv.row_index(l, 0, 0) * c.kv.k_row_bytes(); }
    uint8_t* layer_v(int l) const { return v.p + c.kv.row_index(l, 0, 0) * c.kv.v_row_bytes(); }
    float* layer_offsets(int l) const {
        return c.kv.k_offsets() ? off.p + int64_t(l) * c.kv.n_kv_heads * c.kv.head_dim : nullptr;
    }
    void get() {
        c.k = k.get();
        c.v = v.get();
        c.k_offsets = off.get();
    }
};
}  // namespace

void store_step(KvBytes& cache, int l, const float* k, const float* v, int pos0, int n) {
    const KvLayout& kv = cache.kv;
    const size_t elems = size_t(n) * size_t(kv.n_kv_heads) * size_t(kv.head_dim);
    Dev<float> dk(std::vector<float>(k, k + elems)), dv(std::vector<float>(v, v + elems));
    Dev<int> pos(std::vector<int>{pos0});
    DevCache d(cache);
    const bool sets = kv.k_offsets() && pos0 < kKvOffsetPositions && pos0 + n >= kKvOffsetPositions;
    const int split = sets ? kKvOffsetPositions - pos0 : 0;
    if (split > 0) {
        store_kv(d.layer_k(l), d.layer_v(l), dk.p, dv.p, nullptr, nullptr, d.layer_offsets(l), pos.p, 0, split, kv, 0,
                 nullptr);
        kv_offsets(d.layer_offsets(l), d.layer_k(l), 1, kv, nullptr);
    }
    store_kv(d.layer_k(l), d.layer_v(l), dk.p, dv.p, nullptr, nullptr, d.layer_offsets(l), pos.p, split, n, kv, 0,
             nullptr);
    d.get();
}

RopeStored rope_store_step(const Config& c, KvType kt, KvType vt, const std::vector<float>& q,
                           const std::vector<float>& k, const std::vector<float>& v, int pos0, int n, int n_ctx,
                           bool with_q) {
    KvBytes cache(KvLayout::of(c, n_ctx, kt, vt));
    const KvLayout& kv = cache.kv;
    const size_t row = size_t(c.n_kv_heads) * size_t(c.head_dim);
    if (pos0 > 0) store_step(cache, 0, k.data(), v.data(), 0, pos0);  // the positions before the step's
    DevCache d(cache);
    RopeDev r(n, pos0, c, {});
    Dev<float> dq(q), dk(std::vector<float>(k.begin() + std::ptrdiff_t(size_t(pos0) * row), k.end())),
        dv(std::vector<float>(v.begin() + std::ptrdiff_t(size_t(pos0) * row), v.end()));
    // as CudaOps::rope_store_kv: the rows before position kKvOffsetPositions, the layer's offsets, then the rest
    const bool sets = kv.k_offsets() && pos0 < kKvOffsetPositions && pos0 + n >= kKvOffsetPositions;
    const int split = sets ? kKvOffsetPositions - pos0 : 0;
    if (split > 0) {
        store_kv(d.layer_k(0), d.layer_v(0), dk.p, dv.p, r.cos_t.p, r.sin_t.p, d.layer_offsets(0), r.pos.p, 0, split,
                 kv, c.rope_dim, nullptr);
        kv_offsets(d.layer_offsets(0), d.layer_k(0), 1, kv, nullptr);
    }
    if (with_q)
        rope_store_kv(dq.p, d.layer_k(0), d.layer_v(0), dk.p, dv.p, r.cos_t.p, r.sin_t.p, d.layer_offsets(0), r.pos.p,
                      split, n, c.n_heads, kv, c.rope_dim, nullptr);
    else
        store_kv(d.layer_k(0), d.layer_v(0), dk.p, dv.p, r.cos_t.p, r.sin_t.p, d.layer_offsets(0), r.pos.p, split, n,
                 kv, c.rope_dim, nullptr);
    d.get();
    return {dq.get(), cache.k, cache.v, cache.k_offsets};
}

void kv_write(KvBytes& cache, const void* k, const void* v, int n) {
    const KvLayout& kv = cache.kv;
    DevCache d(cache);
    const size_t heads = size_t(kv.n_layers) * size_t(kv.n_kv_heads), ctx = size_t(kv.n_ctx), w = size_t(n);
    const size_t krb = size_t(kv.k_row_bytes()), vrb = size_t(kv.v_row_bytes());
    KVGEN_CUDA_CHECK(cudaMemcpy2D(d.k.p, ctx * krb, k, w * krb, w * krb, heads, cudaMemcpyHostToDevice));
    KVGEN_CUDA_CHECK(cudaMemcpy2D(d.v.p, ctx * vrb, v, w * vrb, w * vrb, heads, cudaMemcpyHostToDevice));
    if (kv.k_offsets() && n >= kKvOffsetPositions) kv_offsets(d.off.p, d.k.p, kv.n_layers, kv, nullptr);
    d.get();
}

std::vector<float> attention(const Config& c, const std::vector<float>& q, const std::vector<float>& k,
                             const std::vector<float>& v, int pos0, int n, int n_ctx, int splits, bool fold,
                             bool tensor_cores, KvType kt, KvType vt, bool flash_async, bool warp_split) {
    const KvLayout kv = KvLayout::of(c, n_ctx, kt, vt);
    // the positions before the queries' as one step, theirs as the next
    KvBytes cache(kv);
    const size_t row = size_t(c.n_kv_heads) * size_t(c.head_dim);
    testing::store_step(cache, 0, k.data(), v.data(), 0, pos0);
    testing::store_step(cache, 0, k.data() + size_t(pos0) * row, v.data() + size_t(pos0) * row, pos0, n);
    Dev<float> dq(q), out(q.size());
    Dev<uint8_t> kc(cache.k), vc(cache.v);
    Dev<float> off(cache.k_offsets);
    const float* koff = kv.k_offsets() ? off.p : nullptr;
    Dev<int> pos(std::vector<int>{pos0});
    poison(out);
    const int64_t rows = int64_t(n) * c.n_heads;
    // the query turned to a quantized K's basis (CudaOps: in rope_store_kv's launch, with its RoPE)
    if (kv_type_quantized(kt)) kv_rotate_rows(dq.p, rows, c.head_dim, nullptr);
    if (n == 1) {
        Dev<float> partials(size_t(attention_partials(c.n_heads, c.head_dim, splits, 1)));
        Dev<int> counters(std::vector<int>(size_t(attention_counters(c.n_heads, kv)), 0));
        poison(partials);
        // The output also as ActBlocks where the backend asks for them (an f16 V), checked against quantize_act of it.
        const bool blocks = !kv_type_quantized(vt) && c.head_dim % 32 == 0;
        Dev<ActBlock> xq(blocks ? size_t(rows) * c.head_dim / 32 : 0), want(xq.n);
        poison(xq);
        attention_decode(out.p, blocks ? xq.p : nullptr, partials.p, fold ? counters.p : nullptr, dq.p, kc.p, vc.p,
                         koff, pos.p, c.n_heads, kv, splits, nullptr);
        if (kv_type_quantized(vt)) kv_rotate_rows(out.p, rows, c.head_dim, nullptr);
        const std::vector<float> result = out.get();
        for (int cnt : counters.get())
            if (cnt != 0) throw Error("attention_decode: a head group's counter was not reset");
        if (blocks) {
            quantize_act(want.p, out.p, rows * c.head_dim, nullptr);
            const std::vector<ActBlock> got = xq.get(), ref = want.get();
            for (size_t b = 0; b < got.size(); ++b)
                if (std::memcmp(&got[b], &ref[b], offsetof(ActBlock, h) + sizeof(ActBlock::h)) != 0)
                    throw Error(fmt::format("attention_decode: ActBlock {} differs from quantize_act of the output", b));
        }
        return result;
    }
    // splits > 1: the positions split among that many blocks per query block (flash attention)
    // (64 floats past the partials the launch may write, checked to stay NaN)
    const int sp = splits > 1 ? splits : 1;
    const size_t n_partials = sp > 1 ? size_t(n) * size_t(c.n_heads) * size_t(sp) * size_t(c.head_dim + 2) : 0;
    Dev<float> partials(n_partials + 64);
    poison(partials);
    // the two stages where the backend takes them (flash_async_fits: not where two blocks' shared memory does not fit)
    int device = 0;
    KVGEN_CUDA_CHECK(cudaGetDevice(&device));
    const bool async = flash_async && flash_async_fits(c.head_dim, gemm_mma_device(device));
    // The output also split for the output projection where the backend asks for it (an f16 V; flash attention
    // writes it), checked against to_f16_split of the output; elsewhere left untouched.
    // (the backend asks for one of the two, never both: a prompt of an odd count here takes the blocks alone)
    const bool blocks = !kv_type_quantized(vt) && c.head_dim % 32 == 0 && n % 2 == 1;
    const bool split = !kv_type_quantized(vt) && !blocks;
    Dev<__half> xh(split ? size_t(2 * rows) * c.head_dim : 0), want(xh.n);
    poison(xh);
    // and quantized for an integer one (head_dims of whole blocks), checked against quantize_act of the output
    Dev<ActBlock> xq(blocks ? size_t(rows) * c.head_dim / 32 : 0), want_q(xq.n);
    poison(xq);
    const bool wrote =
        attention_prefill(out.p, dq.p, kc.p, vc.p, koff, pos.p, n, c.n_heads, kv, tensor_cores, async, warp_split, sp,
                          partials.p, nullptr, split ? xh.p : nullptr, blocks ? xq.p : nullptr);
    const std::vector<float> tail = partials.get();
    for (size_t i = n_partials; i < tail.size(); ++i)
        if (!std::isnan(tail[i])) throw Error("attention_prefill: a write past its partials");
    // flash attention (the tensor cores, or a quantized K, with a head_dim it is built for) always writes them
    const bool flash = (tensor_cores || kv.quantized()) && (c.head_dim == 64 || c.head_dim == 128);
    if ((split || blocks) && wrote != flash)
        throw Error("attention_prefill: an output split or quantized where flash attention did not run, or none");
    if (split) {
        const std::vector<float> got = halves_to_floats(xh.get());
        if (wrote) {
            to_f16_split(want.p, out.p, int(rows), c.head_dim, nullptr);
            if (std::memcmp(got.data(), halves_to_floats(want.get()).data(), got.size() * sizeof(float)) != 0)
                throw Error("attention_prefill: the split output differs from to_f16_split of the output");
        } else if (std::any_of(got.begin(), got.end(), [](float e) { return !std::isnan(e); })) {
            throw Error("attention_prefill: a split output written where it says none was");
        }
    }
    if (blocks) {
        const std::vector<ActBlock> g = xq.get();
        std::vector<ActBlock> r(g.size());
        if (wrote) {
            quantize_act(want_q.p, out.p, rows * c.head_dim, nullptr);
            r = want_q.get();
        } else {
            std::memset(r.data(), 0xff, r.size() * sizeof(ActBlock));  // poison's bytes: untouched
        }
        if (std::memcmp(g.data(), r.data(), g.size() * sizeof(ActBlock)) != 0)
            throw Error(wrote ? "attention_prefill: the quantized output differs from quantize_act of the output"
                              : "attention_prefill: a quantized output written where it says none was");
    }
    if (kv_type_quantized(vt)) kv_rotate_rows(out.p, rows, c.head_dim, nullptr);
    return out.get();
}

}  // namespace kvgen::cuda::testing
