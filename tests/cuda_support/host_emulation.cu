// The kernels' own bodies run on the host, without a GPU: the device decoders, the matvec lane split, the
// element-wise items and the attention blocks (each CUDA thread a fiber). The CPU-only tests compare them with the
// CPU twins, so CI checks the kernels' indexing and bit layouts on every run.
#include "testing.h"

#include <ucontext.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <random>
#include <utility>
#include <vector>

#include "attention.cuh"
#include "cuda_common.cuh"
#include "elementwise.cuh"
#include "engine/rope.h"
#include "flash_attention.cuh"
#include "matvec.cuh"
#include "matvec_int_mma.cuh"
#include "ops.cuh"
#include "prefill_gemm.cuh"

namespace kvgen::cuda::host {

namespace {
// One thread's cp.async copies: those since its last commit, then its committed groups in order, each landing (the
// bytes moved) when a wait leaves fewer groups outstanding than it, not before.
struct AsyncCopies {
    struct Copy {
        void* dst;
        const void* src;
        size_t bytes;
    };
    std::vector<Copy> open;
    std::vector<std::vector<Copy>> groups;
    void push(void* dst, const void* src, size_t bytes) { open.push_back({dst, src, bytes}); }
    void commit() {
        groups.push_back(std::move(open));
        open.clear();
    }
    void land(int keep) {
        while (int(groups.size()) > keep) {
            for (const Copy& c : groups.front()) std::memcpy(c.dst, c.src, c.bytes);
            groups.erase(groups.begin());
        }
    }
    bool outstanding() const {
        bool any = !open.empty();
        for (const auto& g : groups) any = any || !g.empty();
        return any;
    }
};

// The __shfl_xor_sync butterfly of the device: every lane ends with the sum, in the device's order.
float butterfly_sum(float (&v)[32]) {
    for (int o = 16; o > 0; o >>= 1) {
        float nv[32];
        for (int lane = 0; lane < 32; ++lane) nv[lane] = v[lane] + v[lane ^ o];
        std::copy(nv, nv + 32, v);
    }
    return v[0];
}

// A weight's rows in the device layout (weight_layout.h), in 16-byte aligned memory like a device allocation.
struct DeviceRows {
    std::vector<uint4> mem;
    const uint8_t* p = nullptr;
    int64_t row_bytes = 0;
};
DeviceRows device_rows(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols) {
    DeviceRows d;
    d.row_bytes = device_row_bytes(type, cols);
    d.mem.resize(size_t((rows * d.row_bytes + 15) / 16));
    to_device_rows(type, bytes, rows, cols, reinterpret_cast<uint8_t*>(d.mem.data()));
    d.p = reinterpret_cast<const uint8_t*>(d.mem.data());
    return d;
}
}  // namespace

std::vector<float> dequantize(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols) {
    std::vector<float> out(size_t(rows * cols));
    const DeviceRows dev = device_rows(type, bytes, rows, cols);
    const int64_t row_bytes = dev.row_bytes;
    if (cols % 32 != 0) {  // dequantize_ragged_kernel's item
        if (!is_float_type(type)) throw Error("rows that are not whole blocks");
        for (int64_t g = 0; g < rows * cols; ++g)
            out[size_t(g)] = float_weight(type, dev.p + (g / cols) * row_bytes, g % cols);
        return out;
    }
    const bool ok = dispatch_type(type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols / 32; ++c) {
                float w[32];
                row_chunk<T>(dev.p + r * row_bytes, c, cols / 32, w);
                std::copy(w, w + 32, out.begin() + r * cols + c * 32);
            }
    });
    if (!ok) throw Error(fmt::format("no device decoder for {}", ggml_type_name(type)));
    return out;
}

std::vector<float> matvec(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                          const std::vector<float>& x) {
    std::vector<float> y(size_t(rows), NAN);
    const DeviceRows dev = device_rows(type, bytes, rows, cols);
    const int64_t row_bytes = dev.row_bytes;
    if (cols % 32 != 0) {  // matvec_ragged_kernel: a warp per row
        if (!is_float_type(type)) throw Error("rows that are not whole blocks");
        for (int64_t r = 0; r < rows; ++r) {
            float v[32];
            for (int lane = 0; lane < 32; ++lane)
                v[lane] = matvec_ragged_lane(type, dev.p + r * row_bytes, cols, lane, x.data());
            y[size_t(r)] = butterfly_sum(v);
        }
        return y;
    }
    const bool ok = dispatch_type(type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        for (int64_t r0 = 0; r0 < rows; r0 += kMvRows) {
            float lanes[32][kMvRows];
            for (int lane = 0; lane < 32; ++lane)
                matvec_lane<T>(dev.p, row_bytes, cols / 32, rows, r0, lane, x.data(), lanes[lane]);
            for (int r = 0; r < kMvRows && r0 + r < rows; ++r) {
                float v[32];
                for (int lane = 0; lane < 32; ++lane) v[lane] = lanes[lane][r];
                y[size_t(r0 + r)] = butterfly_sum(v);
            }
        }
    });
    if (!ok) throw Error(fmt::format("no device decoder for {}", ggml_type_name(type)));
    return y;
}

namespace {
std::vector<ActBlock> act_blocks(const std::vector<float>& x) {
    std::vector<ActBlock> a(x.size() / 32);
    for (int64_t b = 0; b < int64_t(a.size()); ++b) quantize_act_item(b, x.data(), a.data());
    return a;
}
}  // namespace

std::vector<HostActBlock> host_blocks(const std::vector<ActBlock>& blocks) {
    std::vector<HostActBlock> out;
    for (const ActBlock& a : blocks) {
        HostActBlock h{a.d, a.s, {a.h[0], a.h[1]}, {}};
        std::copy(a.q, a.q + 32, h.q);
        out.push_back(h);
    }
    return out;
}

std::vector<HostActBlock> quantize_act_items(const std::vector<float>& x) {
    return host_blocks(act_blocks(x));
}

namespace {
// The sums of a block's R rows of NM matrices from r0 for n tokens, from its threads' shares acc[thread][m][r][i], in
// block_rows_sum's order (each warp's butterfly, then the warps in turn), into y[m][i * rows + row].
template <int NM, int NT, int R>
void block_sums(const float* acc, int threads, int64_t r0, int64_t rows, int n, std::vector<std::vector<float>>& y) {
    const int warps = threads / 32;
    for (int m = 0; m < NM; ++m)
        for (int r = 0; r < R && r0 + r < rows; ++r)
            for (int i = 0; i < n; ++i) {
                float sum = 0.0f;
                for (int wp = 0; wp < warps; ++wp) {
                    float v[32];
                    for (int lane = 0; lane < 32; ++lane)
                        v[lane] = acc[((size_t(32 * wp + lane) * NM + size_t(m)) * R + size_t(r)) * NT + size_t(i)];
                    const float ws = butterfly_sum(v);
                    sum = wp == 0 ? ws : sum + ws;
                }
                y[size_t(m)][size_t(i) * size_t(rows) + size_t(r0 + r)] = sum;
            }
}

// One launch of matvec_int_kernel or matvec_glu_int_kernel for n <= NT tokens with R rows a block and steps of S
// units: every block's threads' shares (matvec_int_thread), then block_sums; y[m][i * rows + row] for the NM
// matrices.
template <GgmlType T, int NM, int NT, int R, int S>
void matvec_int_launch(const std::vector<DeviceRows>& dev, int64_t rows, int64_t cols, const ActBlock* x, int n,
                       std::vector<std::vector<float>>& y) {
    const uint8_t* p[NM];
    for (int m = 0; m < NM; ++m) p[m] = dev[size_t(m)].p;
    const int n_units = int(cols / 32), threads = 32 * mvi_warps(mvi_steps(n_units, S));
    std::vector<float> acc(size_t(threads) * NM * R * NT);  // [thread][m][r][i]
    for (int64_t r0 = 0; r0 < rows; r0 += R) {
        for (int t = 0; t < threads; ++t) {
            float share[NM][R][NT];
            matvec_int_thread<T, NM, R, NT, S>(p, dev[0].row_bytes, n_units, rows, r0, t, threads, x, n, share);
            std::memcpy(&acc[size_t(t) * NM * R * NT], share, sizeof(share));
        }
        block_sums<NM, NT, R>(acc.data(), threads, r0, rows, n, y);
    }
}

// A thread of a ring launch (matvec_ring) on the host: its copies go into its block's ring [lo, hi) (both ends
// aligned to the copy's size, as cp.async needs, the whole copy inside the ring) and land when it waits for them,
// or at once where eager (every other block): the two ends of when the device may land them, so that a thread that
// reads a slot before its copy has landed, or copies over a slot it has yet to read, shows.
struct RingThread {
    AsyncCopies* c;
    const uint8_t* lo;
    const uint8_t* hi;
    bool eager;
    const std::vector<DeviceRows>* weights;  // a copy's source lies inside one of them
    void copy(void* dst, const void* src, size_t bytes) const {
        const auto* d = static_cast<const uint8_t*>(dst);
        const auto* s = static_cast<const uint8_t*>(src);
        if (reinterpret_cast<uintptr_t>(dst) % bytes != 0 || reinterpret_cast<uintptr_t>(src) % bytes != 0)
            throw Error(fmt::format("host emulation: a ring copy of {} bytes between unaligned addresses", bytes));
        if (d < lo || d + bytes > hi) throw Error("host emulation: a ring copy outside the block's ring");
        bool inside = false;
        for (const DeviceRows& w : *weights) {
            const auto* w0 = reinterpret_cast<const uint8_t*>(w.mem.data());
            inside = inside || (s >= w0 && s + bytes <= w0 + w.mem.size() * sizeof(uint4));
        }
        if (!inside) throw Error("host emulation: a ring copy from outside the weights");
        if (eager)
            std::memcpy(dst, src, bytes);
        else
            c->push(dst, src, bytes);
    }
    void copy16_async(void* dst, const void* src) const { copy(dst, src, 16); }
    void copy4_async(void* dst, const void* src) const { copy(dst, src, 4); }
    void commit_async() const { c->commit(); }
    template <int N>
    void wait_async_group() const {
        c->land(N);
    }
};

// The host's ring launches take this many blocks (the device's: as many as its SMs hold), so that blocks take
// several groups each, and both kinds of RingThread run.
constexpr int kHostRingBlocks = 3;

// A launch through rings of `stages` stages (matvec_ring, steps as policy P takes them) in kHostRingBlocks blocks,
// each ring filled with a pattern first (a slot read before its copy lands reads that), each thread's groups' shares
// kept until the block ends, then block_sums for each of its groups.
template <class P, int NM, int NT, int R>
void ring_launch(const std::vector<DeviceRows>& dev, int64_t rows, int64_t cols, const typename P::Act* x, int n,
                 int stages, std::vector<std::vector<float>>& y) {
    if (!ring_stages_ok(stages)) throw Error(fmt::format("host emulation: a ring of {} stages", stages));
    const uint8_t* p[NM];
    for (int m = 0; m < NM; ++m) p[m] = dev[size_t(m)].p;
    const int n_units = int(cols / 32), threads = 32 * mvi_warps(mvi_steps(n_units, P::steps));
    const RingLayout L = ring_layout<P>(threads, NM * R, stages);
    const int64_t n_groups = (rows + R - 1) / R, grid = kHostRingBlocks;
    const size_t share = size_t(NM) * R * NT;
    for (int64_t b = 0; b < grid; ++b) {
        std::vector<uint4> ring(size_t(L.bytes() / 16));
        std::memset(ring.data(), 0xa5, ring.size() * sizeof(uint4));
        auto* lo = reinterpret_cast<uint8_t*>(ring.data());
        const int64_t groups = b < n_groups ? (n_groups - 1 - b) / grid + 1 : 0;
        std::vector<float> acc(size_t(groups) * size_t(threads) * share);  // [group][thread][m][r][i]
        for (int t = 0; t < threads; ++t) {
            AsyncCopies c;
            const RingThread ctx{&c, lo, lo + L.bytes(), b % 2 == 1, &dev};
            int64_t seen = 0;
            matvec_ring<P, NM, R, NT>(ctx, lo, stages, p, dev[0].row_bytes, n_units, rows, b, grid, t, threads, x, n,
                                      [&](int64_t r0, int gi, const float(&a)[NM][R][NT]) {
                                          if (gi != seen++ || r0 != (b + gi * grid) * R)
                                              throw Error("host emulation: a ring's groups out of order");
                                          std::memcpy(&acc[(size_t(gi) * size_t(threads) + size_t(t)) * share], a,
                                                      sizeof(a));
                                      });
            if (seen != groups) throw Error("host emulation: a ring thread missed a group");
            if (c.outstanding()) throw Error("host emulation: a ring thread ended with copies outstanding");
        }
        for (int64_t gi = 0; gi < groups; ++gi)
            block_sums<NM, NT, R>(&acc[size_t(gi) * size_t(threads) * share], threads, (b + gi * grid) * R, rows, n, y);
    }
}

// The integer product of NM matrices for n tokens x [n][cols], in the launches the device makes (int_launches,
// with_mvi_shape).
template <int NM>
std::vector<std::vector<float>> matvec_int_blocks(GgmlType type, const uint8_t* const (&bytes)[NM], int64_t rows,
                                                  int64_t cols, const std::vector<float>& x, int n, MviShape shape) {
    std::vector<std::vector<float>> y(NM, std::vector<float>(size_t(n) * size_t(rows), NAN));
    const std::vector<ActBlock> a = act_blocks(x);
    std::vector<DeviceRows> dev;
    for (int m = 0; m < NM; ++m) dev.push_back(device_rows(type, bytes[m], rows, cols));
    const bool ok = dispatch_int_type(type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        int_launches(n, [&](auto nt, int i0, int m) {
            constexpr int NT = decltype(nt)::value;
            std::vector<std::vector<float>> part(NM, std::vector<float>(size_t(m) * size_t(rows), NAN));
            const ActBlock* xi = a.data() + int64_t(i0) * (cols / 32);
            if (shape.stages > 0)
                with_ring_shape<T, NM, NT>(shape, [&](auto r, auto step) {
                    ring_launch<IntRing<T, decltype(step)::value>, NM, NT, decltype(r)::value>(dev, rows, cols, xi, m,
                                                                                               shape.stages, part);
                });
            else
                with_mvi_shape<T, NM, NT>(shape, [&](auto r, auto step) {
                    matvec_int_launch<T, NM, NT, decltype(r)::value, decltype(step)::value>(dev, rows, cols, xi, m,
                                                                                            part);
                });
            for (int k = 0; k < NM; ++k)
                std::copy(part[size_t(k)].begin(), part[size_t(k)].end(),
                          y[size_t(k)].begin() + int64_t(i0) * rows);
        });
    });
    if (!ok) throw Error(fmt::format("no integer product for {}", ggml_type_name(type)));
    return y;
}
}  // namespace

int matvec_int_warps(int n_units) {
    return mvi_warps(n_units);
}

std::vector<float> matvec_f16(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                              const std::vector<float>& x, const uint8_t* up, int stages) {
    if (cols % 32 != 0) throw Error("matvec_f16: rows of whole 32-weight units");
    if (type != GgmlType::F16 && type != GgmlType::BF16) throw Error("matvec_f16: F16 or BF16 rows");
    std::vector<DeviceRows> dev;
    dev.push_back(device_rows(type, bytes, rows, cols));
    if (up) dev.push_back(device_rows(type, up, rows, cols));
    const int n_units = int(cols / 32), threads = 32 * mvi_warps(n_units);
    std::vector<std::vector<float>> y(dev.size(), std::vector<float>(size_t(rows), NAN));
    const auto go = [&](auto tag, auto nm) {  // matvec_f16_kernel<T, NM, kMvF16Rows / NM>
        constexpr GgmlType T = decltype(tag)::value;
        constexpr int NM = decltype(nm)::value, R = kMvF16Rows / NM;
        if (stages > 0) return ring_launch<F16Ring<T>, NM, 1, R>(dev, rows, cols, x.data(), 1, stages, y);
        const uint8_t* p[NM];
        for (int m = 0; m < NM; ++m) p[m] = dev[size_t(m)].p;
        std::vector<float> acc(size_t(threads) * NM * R);  // [thread][m][r]
        for (int64_t r0 = 0; r0 < rows; r0 += R) {
            for (int t = 0; t < threads; ++t) {
                float share[NM][R][1];
                matvec_f16_thread<T, NM, R>(p, dev[0].row_bytes, n_units, rows, r0, t, threads, x.data(), share);
                std::memcpy(&acc[size_t(t) * NM * R], share, sizeof(share));
            }
            block_sums<NM, 1, R>(acc.data(), threads, r0, rows, 1, y);
        }
    };
    const auto of = [&](auto tag) {
        if (up)
            go(tag, std::integral_constant<int, 2>{});
        else
            go(tag, std::integral_constant<int, 1>{});
    };
    with_half_type(type, of);
    if (!up) return y[0];
    std::vector<float> out(static_cast<size_t>(rows));
    for (size_t r = 0; r < out.size(); ++r) {
        const float gs = y[0][r], us = y[1][r];
        out[r] = gs / (1.0f + std::exp(-gs)) * us;
    }
    return out;
}

std::vector<float> matvec_int(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                              const std::vector<float>& x, int n, bool pairs, int stages) {
    const uint8_t* const w[1] = {bytes};
    return matvec_int_blocks<1>(type, w, rows, cols, x, n, MviShape{false, pairs, stages})[0];
}

std::vector<float> matvec_glu_int(GgmlType type, const uint8_t* gate, const uint8_t* up, int64_t rows, int64_t cols,
                                  const std::vector<float>& x, int n, bool pairs, int stages) {
    const uint8_t* const w[2] = {gate, up};
    const std::vector<std::vector<float>> gu =
        matvec_int_blocks<2>(type, w, rows, cols, x, n, MviShape{false, pairs, stages});
    std::vector<float> y(gu[0].size());
    for (size_t r = 0; r < y.size(); ++r) {
        const float gs = gu[0][r], us = gu[1][r];
        y[r] = gs / (1.0f + std::exp(-gs)) * us;
    }
    return y;
}

std::vector<float> matvec_batch(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                                const std::vector<float>& x, int n) {
    std::vector<float> y(size_t(n) * size_t(rows), NAN);
    const DeviceRows dev = device_rows(type, bytes, rows, cols);
    const int64_t row_bytes = dev.row_bytes;
    const bool ok = dispatch_type(type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        for (int64_t r0 = 0; r0 < rows; r0 += kMvRows) {
            float lanes[32][kMvRows][kMvMaxTokens];
            for (int lane = 0; lane < 32; ++lane)
                matvec_batch_lane<T, kMvMaxTokens>(dev.p, row_bytes, cols / 32, cols, rows, r0, lane, x.data(), n,
                                                   lanes[lane]);
            for (int r = 0; r < kMvRows && r0 + r < rows; ++r)
                for (int i = 0; i < n; ++i) {
                    float v[32];
                    for (int lane = 0; lane < 32; ++lane) v[lane] = lanes[lane][r][i];
                    y[size_t(i) * size_t(rows) + size_t(r0 + r)] = butterfly_sum(v);
                }
        }
    });
    if (!ok) throw Error(fmt::format("no device decoder for {}", ggml_type_name(type)));
    return y;
}

std::vector<float> f16_split_tiled(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                                   const std::vector<float>& x, int n, const std::vector<float>* y0, int splits) {
    const int64_t count = int64_t(n) * cols;
    std::vector<__half> xh(size_t(2 * count));
    for (int64_t j = 0; j < count; ++j) to_f16_split_item(j, count, x.data(), xh.data());
    // gemm_mma takes floats and rounds them to f16: these are f16 values already, so it gives back the same halves
    std::vector<float> x2(xh.size());
    for (size_t i = 0; i < xh.size(); ++i) x2[i] = __half2float(xh[i]);
    const std::vector<float> t =
        gemm_mma(type, bytes, rows, cols, x2, 2 * n, nullptr, 64, nullptr, rows, rows, splits, 2);
    std::vector<float> y = y0 ? *y0 : std::vector<float>(size_t(n) * size_t(rows), NAN);
    const RowSplit out = RowSplit::one(y.data(), rows);
    for (int64_t j = 0; j < int64_t(n) * rows; ++j) f16_split_sum_item(j, t.data(), n, rows, out, y0 != nullptr);
    return y;
}

std::vector<double> f16_split_values(const std::vector<float>& x) {
    const std::vector<float> h = split_halves(x);
    std::vector<double> out(x.size());
    for (size_t j = 0; j < x.size(); ++j) out[j] = double(h[j]) + double(h[x.size() + j]) / kF16SplitScale;
    return out;
}

std::vector<float> f16_split(const uint8_t* bytes, int64_t rows, int64_t cols, const std::vector<float>& x, int n,
                             const std::vector<float>* y0) {
    const int64_t count = int64_t(n) * cols;
    std::vector<__half> xh(size_t(2 * count));
    for (int64_t j = 0; j < count; ++j) to_f16_split_item(j, count, x.data(), xh.data());
    const DeviceRows dev = device_rows(GgmlType::F16, bytes, rows, cols);
    std::vector<float> t(size_t(2 * n) * size_t(rows));
    for (int i = 0; i < 2 * n; ++i)
        for (int64_t r = 0; r < rows; ++r) {
            double s = 0;
            for (int64_t j = 0; j < cols; ++j)
                s += double(__half2float(reinterpret_cast<const __half*>(dev.p + r * dev.row_bytes)[j])) *
                     double(__half2float(xh[size_t(i * cols + j)]));
            t[size_t(i * rows + r)] = float(s);
        }
    std::vector<float> y = y0 ? *y0 : std::vector<float>(size_t(n) * size_t(rows), NAN);
    const RowSplit out = RowSplit::one(y.data(), rows);
    for (int64_t j = 0; j < int64_t(n) * rows; ++j) f16_split_sum_item(j, t.data(), n, rows, out, y0 != nullptr);
    return y;
}

}  // namespace kvgen::cuda::host

// --- the attention kernels' bodies on the host -----------------------------------------------------------------
// A block runs as one fiber per CUDA thread (ucontext, one OS thread): a fiber runs until it reaches a warp
// barrier (inside a shuffle) or the block barrier (__syncthreads), and a barrier opens when every live thread it
// spans has arrived. Shuffles exchange through a per-warp array between two warp barriers, in the device's
// butterfly order, so the sums are the device's.
namespace kvgen::cuda::host {

namespace {

class FiberBlock;
thread_local FiberBlock* g_block = nullptr;

// Each fiber's stack: AddressSanitizer's red zones make frames larger.
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kFiberStack = 128 * 1024;
#else
constexpr size_t kFiberStack = 64 * 1024;
#endif

// Fiber stacks, kept for the next block instead of allocated (and zeroed) anew for each of a grid's blocks.
class StackPool {
  public:
    static std::unique_ptr<char[]> take() {
        auto& free = list();
        if (free.empty()) return std::unique_ptr<char[]>(new char[kFiberStack]);
        std::unique_ptr<char[]> s = std::move(free.back());
        free.pop_back();
        return s;
    }
    static void give(std::unique_ptr<char[]> s) {
        if (!s) return;
#if defined(__SANITIZE_ADDRESS__)
        // a fiber left suspended (a block stopped by an error) leaves its frames' red zones marked
        ASAN_UNPOISON_MEMORY_REGION(s.get(), kFiberStack);
#endif
        list().push_back(std::move(s));
    }

  private:
    static std::vector<std::unique_ptr<char[]>>& list() {
        thread_local std::vector<std::unique_ptr<char[]>> free;
        return free;
    }
};

// AddressSanitizer follows a switch of stacks only when told (scripts/sanitize.sh runs these tests under it): before
// a switch, the stack switched to; after it, the one left. A fiber that ends says so with a null save slot.
struct StackSwitch {
#if defined(__SANITIZE_ADDRESS__)
    void* fake = nullptr;
    void before(const void* bottom, size_t size, bool ending = false) {
        __sanitizer_start_switch_fiber(ending ? nullptr : &fake, bottom, size);
    }
    void after(const void** from_bottom = nullptr, size_t* from_size = nullptr) {
        __sanitizer_finish_switch_fiber(fake, from_bottom, from_size);
    }
#else
    void before(const void*, size_t, bool = false) {}
    void after(const void** = nullptr, size_t* = nullptr) {}
#endif
};

class FiberBlock {
  public:
    enum Wait { kNone, kWarp, kBlock };

    FiberBlock(int threads, size_t shared_floats, int bx, int by)
        : bx_(bx),
          by_(by),
          smem_(shared_floats),
          exch_(size_t(threads)),
          frags_(size_t(threads)),
          copies_(size_t(threads)),
          rows_(size_t(threads)),
          fibers_(size_t(threads)) {}
    ~FiberBlock() {
        for (Fiber& f : fibers_) StackPool::give(std::move(f.stack));
    }
    FiberBlock(const FiberBlock&) = delete;
    FiberBlock& operator=(const FiberBlock&) = delete;

    void run(const std::function<void(int)>& body) {
        body_ = &body;
        FiberBlock* outer = g_block;
        g_block = this;
        for (size_t i = 0; i < fibers_.size(); ++i) {
            Fiber& f = fibers_[i];
            f.stack = StackPool::take();
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack.get();
            f.ctx.uc_stack.ss_size = kFiberStack;
            f.ctx.uc_link = &main_;
            makecontext(&f.ctx, reinterpret_cast<void (*)()>(&FiberBlock::entry), 1, int(i));
        }
        // Warp by warp, each as far as it goes before the next starts (to the block's barrier or its end), in turn
        // first to last and then last to first between barriers, starting one way or the other with the block (so
        // that a loop with an even number of barriers a pass still runs each part both ways somewhere in the grid):
        // the least fair orders the device could take, so that a warp that writes shared memory another warp has yet
        // to read, with no barrier between, shows here.
        const int warps = (int(fibers_.size()) + 31) / 32;
        for (int phase = (bx_ + by_) & 1;;) {
            bool ran = false;
            for (int k = 0; k < warps; ++k) {
                const int w = phase % 2 == 0 ? k : warps - 1 - k;
                const int end = std::min(w * 32 + 32, int(fibers_.size()));
                for (;;) {
                    bool warp_ran = false;
                    for (int i = w * 32; i < end; ++i) {
                        if (fibers_[size_t(i)].done || fibers_[size_t(i)].wait != kNone) continue;
                        current_ = i;
                        StackSwitch to_fiber;
                        to_fiber.before(fibers_[size_t(i)].stack.get(), kFiberStack);
                        swapcontext(&main_, &fibers_[size_t(i)].ctx);
                        to_fiber.after();
                        warp_ran = ran = true;
                        if (error_) {  // the other threads stay suspended; their stacks go with the block
                            g_block = outer;
                            std::rethrow_exception(error_);
                        }
                    }
                    if (!release(kWarp, w * 32, end) && !warp_ran) break;
                }
            }
            bool live = false;
            for (const Fiber& f : fibers_) live = live || !f.done;
            if (!live) break;
            const bool released = release(kBlock, 0, int(fibers_.size()));
            if (released) ++phase;
            if (!ran && !released) throw Error("host emulation: the block's threads deadlocked at a barrier");
        }
        g_block = outer;
    }

    int bx() const { return bx_; }
    int by() const { return by_; }
    float* shared() { return smem_.data(); }

    // cp.async: the thread's copies land when it waits for them, not before, so that a kernel that reads its shared
    // memory without waiting reads what was there (and a thread that ends with copies outstanding is an error).
    // Both ends 16-byte aligned and the destination inside the block's shared memory, as cp.async needs.
    // Blocks with bx + by odd land each copy at once instead: the two ends of when the device may land it, so that a
    // kernel that copies over what another warp has yet to read shows too.
    void copy_async(void* dst, const void* src) {
        const auto d = reinterpret_cast<uintptr_t>(dst), sm = reinterpret_cast<uintptr_t>(smem_.data());
        if (d % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0)
            throw Error(fmt::format("host emulation: thread {} copies 16 bytes between unaligned addresses", current_));
        if (d < sm || d + 16 > sm + smem_.size() * sizeof(float))
            throw Error(fmt::format("host emulation: thread {} copies 16 bytes outside shared memory", current_));
        if ((bx_ + by_) % 2 == 1) {
            std::memcpy(dst, src, 16);
            return;
        }
        copies_[size_t(current_)].push(dst, src, 16);
    }
    void wait_async() {
        AsyncCopies& c = copies_[size_t(current_)];
        c.commit();
        c.land(0);
    }
    // cp.async.commit_group and cp.async.wait_group n: the copies since the last commit make a group, and a wait
    // lands every group of the thread's but the n committed last.
    void commit_async() { copies_[size_t(current_)].commit(); }
    void wait_async_group(int n) { copies_[size_t(current_)].land(n); }

    // ldmatrix.sync.aligned.m8n8.x4 (trans: .trans) .shared.b16: lane 8 m + i posts the address of row i of matrix m,
    // and each lane takes its four words (DeviceThread::ldmatrix_x4 says which) from the rows the others posted.
    void ldmatrix_x4(uint32_t (&r)[4], const void* p, bool trans) {
        const int lane = current_ % 32, base = current_ - lane;
        const auto a = reinterpret_cast<uintptr_t>(p), sm = reinterpret_cast<uintptr_t>(smem_.data());
        if (a % 16 != 0)
            throw Error(fmt::format("host emulation: ldmatrix row of thread {} not 16-byte aligned", current_));
        if (a < sm || a + 16 > sm + smem_.size() * sizeof(float))
            throw Error(fmt::format("host emulation: ldmatrix row of thread {} outside shared memory", current_));
        rows_[size_t(current_)] = p;
        wait(kWarp);
        require_whole_warp(base, "ldmatrix");
        auto value = [&](int m, int row, int col) {  // 16-bit value col of row `row` of matrix m
            uint16_t v;
            std::memcpy(&v, static_cast<const uint8_t*>(rows_[size_t(base + 8 * m + row)]) + 2 * col, sizeof(v));
            return uint32_t(v);
        };
        const int i = lane / 4, j = lane % 4;
        uint32_t out[4];
        for (int m = 0; m < 4; ++m)
            out[m] = trans ? value(m, 2 * j, i) | value(m, 2 * j + 1, i) << 16
                           : value(m, i, 2 * j) | value(m, i, 2 * j + 1) << 16;
        wait(kWarp);  // every lane has read the rows before any posts new ones
        std::copy(out, out + 4, r);
    }

    void wait(Wait kind) {
        Fiber& f = fibers_[size_t(current_)];
        f.wait = kind;
        StackSwitch to_main;
        to_main.before(main_bottom_, main_size_);
        swapcontext(&f.ctx, &main_);
        to_main.after();
    }

    float warp_sum(float v) {
        return butterfly(v, [](float a, float b) { return a + b; });
    }
    float warp_max(float v) {
        return butterfly(v, [](float a, float b) { return std::fmax(a, b); });
    }

    float quad_sum(float v) {
        return butterfly(v, [](float a, float b) { return a + b; }, 2);
    }
    float quad_max(float v) {
        return butterfly(v, [](float a, float b) { return std::fmax(a, b); }, 2);
    }

    // mma.sync m16n8k16 (f16 A and B, f32 C) as the PTX ISA lays its fragments over the warp's lanes: every lane
    // posts its registers, and each computes its own four outputs from the gathered A and B. The products of two
    // f16 values are exact in f32; they are added in k order.
    void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
        const int lane = current_ % 32, base = current_ - lane, gid = lane >> 2, tig = lane & 3;
        frags_[size_t(current_)] = {a[0], a[1], a[2], a[3], b[0], b[1]};
        wait(kWarp);
        require_whole_warp(base, "mma.sync");
        auto half_of = [](uint32_t reg, int k) {
            const uint16_t bits = uint16_t(k & 1 ? reg >> 16 : reg & 0xffffu);
            __half h;
            std::memcpy(&h, &bits, sizeof(h));
            return __half2float(h);
        };
        float d[4];
        for (int e = 0; e < 4; ++e) {
            const int row = gid + 8 * (e >> 1), col = 2 * tig + (e & 1);
            float acc = c[e];
            for (int k = 0; k < 16; ++k) {
                const auto& fa = frags_[size_t(base + (row % 8) * 4 + (k % 8) / 2)];
                const auto& fb = frags_[size_t(base + col * 4 + (k % 8) / 2)];
                const float av = half_of(fa[size_t((row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0))], k);
                const float bv = half_of(fb[size_t(4 + (k >= 8 ? 1 : 0))], k);
                acc += av * bv;
            }
            d[e] = acc;
        }
        wait(kWarp);  // every lane has read the fragments before any posts new ones
        std::copy(d, d + 4, c);
    }

    // mma.sync m16n8k32 with 8-bit A and B (au, bu: unsigned bytes, else signed) and s32 C, laid out as
    // DeviceThread::mma_i8 says: every lane posts its registers, and each computes its own four outputs.
    void mma_i8(int (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool au, bool bu) {
        const int lane = current_ % 32, base = current_ - lane, gid = lane >> 2, tig = lane & 3;
        frags_[size_t(current_)] = {a[0], a[1], a[2], a[3], b[0], b[1]};
        wait(kWarp);
        require_whole_warp(base, "mma.sync");
        auto byte_of = [](uint32_t reg, int j, bool u) {
            const uint32_t v = (reg >> (8 * j)) & 0xffu;
            return u ? int64_t(v) : int64_t(int8_t(uint8_t(v)));
        };
        int d[4];
        for (int e = 0; e < 4; ++e) {
            const int row = gid + 8 * (e >> 1), col = 2 * tig + (e & 1);
            int64_t acc = c[e];
            for (int k = 0; k < 32; ++k) {
                const auto& fa = frags_[size_t(base + (row % 8) * 4 + (k % 16) / 4)];
                const auto& fb = frags_[size_t(base + col * 4 + (k % 16) / 4)];
                const int64_t av = byte_of(fa[size_t((row >= 8 ? 1 : 0) + (k >= 16 ? 2 : 0))], k % 4, au);
                const int64_t bv = byte_of(fb[size_t(4 + (k >= 16 ? 1 : 0))], k % 4, bu);
                acc += av * bv;
            }
            if (acc < INT32_MIN || acc > INT32_MAX) throw Error("host emulation: mma.sync s32 sum out of range");
            d[e] = int(acc);
        }
        wait(kWarp);  // every lane has read the fragments before any posts new ones
        std::copy(d, d + 4, c);
    }

    // __shfl_xor_sync: lane ^ o's value.
    float shfl_xor(float v, int o) {
        const int lane = current_ % 32;
        return shfl(v, lane ^ o);
    }
    float shfl(float v, int src_lane) {
        if (src_lane < 0 || src_lane >= 32)
            throw Error(fmt::format("host emulation: a shuffle from lane {}", src_lane));
        const int base = current_ - current_ % 32;
        exch_[size_t(current_)] = v;
        wait(kWarp);
        // (stricter than sm_70 and later, whose shuffle waits for the lanes that have not exited: the kernels shuffle
        // with whole warps, and this holds them to it)
        require_whole_warp(base, "a shuffle");
        const float p = exch_[source(base + src_lane)];
        wait(kWarp);
        return p;
    }

    // The __shfl_xor_sync butterfly: each step combines a lane's value with lane ^ o's, o = first, first / 2 .. 1.
    template <typename Op>
    float butterfly(float v, Op op, int first = 16) {
        const int lane = current_ % 32, base = current_ - lane;
        for (int o = first; o > 0; o >>= 1) {
            exch_[size_t(current_)] = v;
            wait(kWarp);
            require_whole_warp(base, "a shuffle");
            const float p = exch_[source(base + (lane ^ o))];
            wait(kWarp);
            v = op(v, p);
        }
        return v;
    }

  private:
    // A .sync.aligned warp instruction (mma.sync, ldmatrix) needs every lane of the warp at it; one that returned early
    // leaves the device undefined. (Shuffles are held to it too, see shfl.)
    void require_whole_warp(int base, const char* what) const {
        for (int i = base; i < base + 32; ++i)
            if (size_t(i) >= fibers_.size() || fibers_[size_t(i)].done)
                throw Error(fmt::format("host emulation: {} with thread {} of the warp gone", what, i));
    }
    // The lane a shuffle reads: one that has returned holds no value on the device (undefined there), so the tests
    // fail instead of reading what it left here.
    size_t source(int i) const {
        if (size_t(i) >= fibers_.size() || fibers_[size_t(i)].done)
            throw Error(fmt::format("host emulation: a shuffle reads thread {}, which has returned", i));
        return size_t(i);
    }

    struct Fiber {
        ucontext_t ctx{};
        std::unique_ptr<char[]> stack;  // kFiberStack bytes from StackPool
        bool done = false;
        Wait wait = kNone;
    };

    // note: an exception cannot unwind past a fiber's first frame, so it is kept here and rethrown by run()
    static void entry(int i) {
        FiberBlock* b = g_block;
        StackSwitch().after(&b->main_bottom_, &b->main_size_);  // the first switch into this fiber
        try {
            (*b->body_)(i);
            if (b->copies_[size_t(i)].outstanding())
                throw Error(fmt::format("host emulation: thread {} ended with copies it never waited for", i));
        } catch (...) {
            if (!b->error_) b->error_ = std::current_exception();
        }
        b->fibers_[size_t(i)].done = true;
        StackSwitch().before(b->main_bottom_, b->main_size_, true);  // back to run() through uc_link, for good
    }

    // Opens a barrier of threads [from, to) when every live one waits at it.
    bool release(Wait kind, int from, int to) {
        to = std::min(to, int(fibers_.size()));
        int waiting = 0, live = 0;
        for (int i = from; i < to; ++i) {
            if (fibers_[size_t(i)].done) continue;
            ++live;
            if (fibers_[size_t(i)].wait == kind) ++waiting;
        }
        if (live == 0 || waiting != live) return false;
        for (int i = from; i < to; ++i) fibers_[size_t(i)].wait = kNone;
        return true;
    }

    // Shared memory starts as all-ones bits (NaN as f32 and as both f16 halves), not zeros: on the device it holds
    // whatever was there, so a kernel that reads what it never wrote should not get zeros for free.
    static inline const float kPoison = [] {
        const uint32_t ones = ~0u;
        float f;
        std::memcpy(&f, &ones, sizeof f);
        return f;
    }();
    int bx_, by_, current_ = 0;
    // The block's shared memory: exactly the floats asked for (so that AddressSanitizer sees a read past them), 16-byte
    // aligned as the device's is, starting as kPoison.
    struct Shared {
        explicit Shared(size_t n) : n_(n), p_(static_cast<float*>(::operator new(n * sizeof(float), kAlign))) {
            std::fill(p_, p_ + n, kPoison);
        }
        ~Shared() { ::operator delete(p_, kAlign); }
        Shared(const Shared&) = delete;
        Shared& operator=(const Shared&) = delete;
        float* data() const { return p_; }
        size_t size() const { return n_; }

      private:
        static constexpr std::align_val_t kAlign{16};
        size_t n_;
        float* p_;
    };
    Shared smem_;
    std::vector<float> exch_;
    std::vector<std::array<uint32_t, 6>> frags_;  // mma: each lane's A and B registers
    // A thread's copy_async copies not yet landed: those since its last commit, and its committed groups, oldest first.
    std::vector<AsyncCopies> copies_;  // each thread's
    std::vector<const void*> rows_;  // ldmatrix: each lane's row address
    std::vector<Fiber> fibers_;
    ucontext_t main_{};
    const void* main_bottom_ = nullptr;  // the stack run() runs on, for AddressSanitizer (StackSwitch)
    size_t main_size_ = 0;
    const std::function<void(int)>* body_ = nullptr;
    std::exception_ptr error_;
};

// The HostThread context the attention bodies see.
struct HostThread {
    FiberBlock* b;
    int tid;
    int thread() const { return tid; }
    int block_x() const { return b->bx(); }
    int block_y() const { return b->by(); }
    float warp_sum(float v) const { return b->warp_sum(v); }
    float warp_max(float v) const { return b->warp_max(v); }
    float quad_sum(float v) const { return b->quad_sum(v); }
    float quad_max(float v) const { return b->quad_max(v); }
    float shfl_xor(float v, int o) const { return b->shfl_xor(v, o); }
    float shfl(float v, int src_lane) const { return b->shfl(v, src_lane); }
    void sync_warp() const { b->wait(FiberBlock::kWarp); }
    void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b_)[2]) const { b->mma(c, a, b_); }
    template <bool AU, bool BU>
    void mma_i8(int (&c)[4], const uint32_t (&a)[4], const uint32_t (&b_)[2]) const {
        b->mma_i8(c, a, b_, AU, BU);
    }
    float load_other(const float* p) const { return *p; }
    void fence() const {}
    int atomic_add(int* p, int v) const {  // blocks run one after another here
        const int old = *p;
        *p += v;
        return old;
    }
    void sync() const { b->wait(FiberBlock::kBlock); }
    float* shared() const { return b->shared(); }
    void copy16_async(void* dst, const void* src) const { b->copy_async(dst, src); }
    void wait_async() const { b->wait_async(); }
    void commit_async() const { b->commit_async(); }
    template <int N>
    void wait_async_group() const {
        b->wait_async_group(N);
    }
    template <bool Trans>
    void ldmatrix_x4(uint32_t (&r)[4], const __half* p) const {
        b->ldmatrix_x4(r, p, Trans);
    }
};

template <typename Body>
void run_grid(int gx, int gy, int threads, size_t shared_floats, Body body) {
    for (int by = 0; by < gy; ++by)
        for (int bx = 0; bx < gx; ++bx) {
            FiberBlock block(threads, shared_floats, bx, by);
            const std::function<void(int)> f = [&](int tid) { body(HostThread{&block, tid}); };
            block.run(f);
        }
}

}  // namespace

void warp_after_a_lane_returned(int kind) {
    run_grid(1, 1, 32, 0, [&](const HostThread& t) {
        if (kind != 2 && t.thread() == 31) return;
        if (kind == 1) {
            float c[4] = {0, 0, 0, 0};
            const uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
            t.mma(c, a, b);
        } else {
            t.warp_sum(1.0f);
        }
    });
}

std::pair<float, float> unsynchronized_reads() {
    std::pair<float, float> seen{-1.0f, -1.0f};
    run_grid(1, 1, 64, 2, [&](const HostThread& t) {
        float* const sm = t.shared();
        const int warp = t.thread() / 32, lane = t.thread() % 32;
        if (t.thread() == 0) sm[0] = sm[1] = 0.0f;
        t.sync();
        if (warp == 0 && lane == 0) sm[0] = 1.0f;
        if (warp == 1 && lane == 0) seen.first = sm[0];
        t.sync();
        if (warp == 0) {
            t.sync_warp();
            if (lane == 0) sm[1] = 1.0f;
        } else if (lane == 0) {
            seen.second = sm[1];
        }
    });
    return seen;
}

void barrier_deadlock() {
    run_grid(1, 1, 32, 0, [&](const HostThread& t) {
        if (t.thread() == 0)
            t.sync_warp();
        else
            t.sync();
    });
}

void copy_never_waited() {
    alignas(16) static const float src[4] = {1, 2, 3, 4};
    run_grid(1, 1, 32, 4, [&](const HostThread& t) {
        if (t.thread() == 0) t.copy16_async(t.shared(), src);
    });
}

std::vector<float> dequantize_rows(GgmlType type, const uint8_t* bytes, int64_t cols, int64_t r0, int64_t n_rows) {
    const DeviceRows dev = device_rows(type, bytes, r0 + n_rows, cols);
    const int64_t row_bytes = dev.row_bytes, cpr = cols / 32, n_chunks = n_rows * cpr;
    // 16-byte aligned, as the kernel's stores need; poisoned (all-ones halves are NaN) so a missed store shows
    std::vector<uint4> raw(size_t((n_rows * cols + 7) / 8), make_uint4(~0u, ~0u, ~0u, ~0u));
    __half* out = reinterpret_cast<__half*>(raw.data());
    const bool ok = dispatch_type(type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        const int blocks = int((n_chunks + kDqThreads - 1) / kDqThreads);
        run_grid(blocks, 1, kDqThreads, size_t(kDqShared), [&](const HostThread& t) {
            dequantize_rows_body<T>(t, dev.p, row_bytes, cpr, r0, n_chunks, out);
        });
    });
    if (!ok) throw Error(fmt::format("no device decoder for {}", ggml_type_name(type)));
    std::vector<float> f(size_t(n_rows * cols));
    for (size_t i = 0; i < f.size(); ++i) f[i] = __half2float(out[i]);
    return f;
}

std::vector<float> gemm_mma(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                            const std::vector<float>& x, int n, const std::vector<float>* y0, int tok,
                            const uint8_t* up_bytes, int64_t end0, int64_t end1, int splits, int stages) {
    const DeviceRows dev = device_rows(type, bytes, rows, cols);
    const DeviceRows up = up_bytes ? device_rows(type, up_bytes, rows, cols) : DeviceRows{};
    std::vector<uint4> raw(size_t((int64_t(n) * cols + 7) / 8));  // 16-byte aligned, as the kernel's loads need
    __half* xh = reinterpret_cast<__half*>(raw.data());
    for (size_t i = 0; i < x.size(); ++i) xh[i] = __float2half_rn(x[i]);
    // three buffers as RowSplit lays them out, each poisoned (NaN: not written) or holding its part of y0
    end1 = std::max(end0, end1);
    const int64_t widths[3] = {end0, end1 - end0, rows - end1};
    std::vector<float> parts[3];
    for (int b = 0; b < 3; ++b) parts[b].assign(size_t(std::max<int64_t>(1, n * widths[b])), std::nanf(""));
    const RowSplit split{{parts[0].data(), parts[1].data(), parts[2].data()}, {end0, end1}};
    for (int i = 0; i < n && y0; ++i)
        for (int64_t r = 0; r < rows; ++r) *split.at(r, i, rows) = (*y0)[size_t(i * rows + r)];
    // with splits, the blocks' partial sums (poisoned: a block that writes none shows) and then their sum
    std::vector<float> partials(splits > 1 ? size_t(splits) * size_t(n * rows) : 0, std::nanf(""));
    const RowSplit dst = splits > 1 ? RowSplit::one(partials.data(), rows) : split;
    const bool ok = dispatch_type(type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        const auto grid = [&](auto tile, auto glu) {
            constexpr int TOK = decltype(tile)::value;
            constexpr bool GLU = decltype(glu)::value;
            run_grid(gemm_mma_token_tiles(n, TOK), int(gemm_mma_row_tiles(GLU ? 2 * rows : rows)) * splits,
                     kQgThreads, size_t(stages) * size_t(kQgShared<TOK>), [&](const HostThread& t) {
                         gemm_mma_body<T, TOK, GLU>(t, dev.p, up.p, dev.row_bytes, rows, cols, xh, n, dst,
                                                    y0 != nullptr, splits, stages);
                     });
        };
        const auto tiles = [&](auto glu) {
            if (tok == 128)
                grid(std::integral_constant<int, 128>{}, glu);
            else if (tok == 64)
                grid(std::integral_constant<int, 64>{}, glu);
            else
                throw Error(fmt::format("gemm_mma: no tile of {} tokens", tok));
        };
        if (up_bytes)
            tiles(std::true_type{});
        else
            tiles(std::false_type{});
    });
    if (!ok) throw Error(fmt::format("no device decoder for {}", ggml_type_name(type)));
    if (splits > 1)
        for (int64_t j = 0; j < n * rows; ++j) gemm_split_sum_item(j, partials.data(), splits, n, rows, split, y0);
    std::vector<float> out(size_t(n * rows));
    for (int i = 0; i < n; ++i)
        for (int64_t r = 0; r < rows; ++r) out[size_t(i * rows + r)] = *split.at(r, i, rows);
    return out;
}

std::vector<int> mma_i8(const uint8_t* a, const uint8_t* b, bool au, bool bu, int c0) {
    std::vector<int> d(16 * 8);
    run_grid(1, 1, 32, 0, [&](const HostThread& t) {
        const int lane = t.thread(), gid = lane >> 2, tig = lane & 3;
        auto word = [](const uint8_t* p, int stride) {  // four bytes stride apart, byte j of the word the j-th
            uint32_t w = 0;
            for (int j = 0; j < 4; ++j) w |= uint32_t(p[j * stride]) << (8 * j);
            return w;
        };
        const uint32_t af[4] = {word(a + gid * 32 + 4 * tig, 1), word(a + (gid + 8) * 32 + 4 * tig, 1),
                                word(a + gid * 32 + 16 + 4 * tig, 1), word(a + (gid + 8) * 32 + 16 + 4 * tig, 1)};
        const uint32_t bf[2] = {word(b + (4 * tig) * 8 + gid, 8), word(b + (16 + 4 * tig) * 8 + gid, 8)};
        int c[4] = {c0, c0, c0, c0};
        if (au && bu)
            t.mma_i8<true, true>(c, af, bf);
        else if (au)
            t.mma_i8<true, false>(c, af, bf);
        else if (bu)
            t.mma_i8<false, true>(c, af, bf);
        else
            t.mma_i8<false, false>(c, af, bf);
        for (int e = 0; e < 4; ++e) d[size_t((gid + 8 * (e >> 1)) * 8 + 2 * tig + (e & 1))] = c[e];
    });
    return d;
}

namespace {
// The launch of matvec_int_mma_kernel launch_int_mma (ops.cu) makes for n tokens (int_mma_launch_of: groups of tokens
// the grid's x, row blocks its y), its outputs into y [token][row] and counted in stored; with yq (GLU), also
// quantized by int_mma_glu_quantize on counters.
template <GgmlType T, bool GLU>
void int_mma_all(const DeviceRows& dev, const DeviceRows& dup, int64_t rows, int n_units, const ActBlock* x, int n,
                 std::vector<float>& y, std::vector<int>& stored, int* counters, ActBlock* yq) {
    int_mma_launch_of<T>(n, [&](auto ntt, ImPlan p) {
        constexpr int NTT = decltype(ntt)::value;
        const int64_t block_rows = int64_t(p.sets) * int_mma_block_rows(GLU);
        const int row_blocks = int((rows + block_rows - 1) / block_rows);
        if (yq && p.groups > kImMaxGroups) throw Error("matvec_int_mma: more groups of tokens than counters");
        run_grid(p.groups, row_blocks, 32 * kImWarps, size_t(int_mma_shared(NTT)), [&](const HostThread& t) {
            matvec_int_mma_body<T, GLU, NTT>(t, dev.p, dup.p, dev.row_bytes, n_units, rows, x, n, p.group_tokens,
                                             p.sets, [&](int64_t r, int i, float v) {
                                                 const size_t at = size_t(i) * size_t(rows) + size_t(r);
                                                 y[at] = v;
                                                 ++stored[at];
                                             });
            if (yq) int_mma_glu_quantize(t, y.data(), rows, n, p.group_tokens, p.sets, counters, yq);
        });
    });
}
}  // namespace

std::vector<float> matvec_int_mma(GgmlType type, const uint8_t* bytes, const uint8_t* up, int64_t rows, int64_t cols,
                                  const std::vector<float>& x, int n, std::vector<HostActBlock>* yq) {
    if (n < 1 || n > kImBatchTokens || cols % 32 != 0) throw Error("matvec_int_mma: 1 to 64 tokens of whole blocks");
    if (!int_mma_type(type)) throw Error(fmt::format("no tensor-core integer product for {}", ggml_type_name(type)));
    if (yq && (!up || rows % 32 != 0)) throw Error("matvec_int_mma: a SwiGLU output of whole 32-row groups quantized");
    const std::vector<ActBlock> a = act_blocks(x);
    const DeviceRows dev = device_rows(type, bytes, rows, cols);
    const DeviceRows dup = up ? device_rows(type, up, rows, cols) : DeviceRows{};
    std::vector<float> y(size_t(n) * size_t(rows), NAN);
    std::vector<int> stored(y.size(), 0);
    std::vector<ActBlock> blocks(yq ? size_t(n) * size_t(rows / 32) : 0);
    std::vector<int> counters(yq ? size_t(kImMaxGroups) * size_t(rows / 32) : 0, 0);
    ActBlock* const bq = yq ? blocks.data() : nullptr;
    const int n_units = int(cols / 32);
    dispatch_int_type(type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        if constexpr (int_mma_type(T)) {
            if (up)
                int_mma_all<T, true>(dev, dup, rows, n_units, a.data(), n, y, stored, counters.data(), bq);
            else
                int_mma_all<T, false>(dev, dup, rows, n_units, a.data(), n, y, stored, nullptr, nullptr);
        }
    });
    for (int c : stored)
        if (c != 1) throw Error("matvec_int_mma: an output stored other than once");
    for (int c : counters)
        if (c != 0) throw Error("matvec_int_mma: a row group's counter was not reset");
    if (yq) *yq = host_blocks(blocks);
    return y;
}

std::vector<float> rotate_rows(const std::vector<float>& x, int head_dim, std::vector<HostActBlock>* xq) {
    std::vector<float> out = x;
    const int rows = int(x.size() / size_t(head_dim));
    std::vector<ActBlock> blocks(xq ? x.size() / 32 : 0);
    const bool ok = dispatch_kv_rows(head_dim, [&](auto e) {
        constexpr int E = decltype(e)::value;
        run_grid(rows, 1, 32, 0, [&](const HostThread& t) {
            const size_t r = size_t(t.block_x());
            kv_rotate_row_warp<E>(t, out.data() + r * size_t(head_dim), xq ? blocks.data() + r * E : nullptr);
        });
    });
    if (!ok) throw Error(fmt::format("kv_rotate_rows: no kernel for head_dim {}", head_dim));
    if (xq) *xq = host_blocks(blocks);
    return out;
}

bool decode_reads_wide(const Config& c, KvType k, KvType v) {
    const KvLayout kv = KvLayout::of(c, 64, k, v);
    bool wide = false;
    const bool ok = dispatch_decode_attention(c.n_heads / c.n_kv_heads, kv, [&](auto nq, auto e) {
        constexpr int NQ = decltype(nq)::value, E = decltype(e)::value;
        dispatch_attention_cache<NQ, E>(kv,
                                        [&](auto cache) { wide = attention_wide<decltype(cache)::value, NQ, E>(); });
    });
    return ok && wide;
}

std::vector<float> kv_block_values(KvType t, const uint8_t* bytes, int rows, int head_dim) {
    std::vector<float> out(size_t(rows) * size_t(head_dim));
    const int64_t rb = KvLayout::row_bytes(t, head_dim);
    for (int c0 = 0; c0 < head_dim; c0 += 8) {
        const KvBlockCols cols = kv_block_cols(t, c0);
        for (int r = 0; r < rows; ++r) {
            float x[8];
            kv_block_decode(cols, kv_block_load(cols, bytes + r * rb), x);
            std::copy(x, x + 8, out.begin() + ptrdiff_t(r) * head_dim + c0);
        }
    }
    return out;
}

std::vector<float> kv_load_values(KvType t, const uint8_t* bytes, int rows, int head_dim) {
    std::vector<float> out(size_t(rows) * size_t(head_dim));
    const int64_t rb = KvLayout::row_bytes(t, head_dim);
    for (int r = 0; r < rows; ++r)
        for (int c0 = 0; c0 < head_dim; c0 += 8) {
            float x[8];
            kv_load<8>(t, bytes + r * rb, c0, x);
            std::copy(x, x + 8, out.begin() + ptrdiff_t(r) * head_dim + c0);
        }
    return out;
}

namespace {
// store_kv_rows_kernel's rows [0, rows), a warp each (store_kv_row_warp).
void host_store_rows(int64_t rows, const float* k, const float* v, const float* cos_t, const float* sin_t,
                     const float* k_offsets, int pos0, int i0, const KvLayout& kv, int half_rope, uint8_t* kc,
                     uint8_t* vc) {
    const bool ok = dispatch_kv_rows(kv.head_dim, [&](auto e) {
        run_grid(int(rows), 1, 32, 0, [&](const HostThread& t) {
            store_kv_row_warp<decltype(e)::value>(t, t.block_x(), k, v, cos_t, sin_t, k_offsets, &pos0, i0, kv,
                                                  half_rope, kc, vc);
        });
    });
    if (!ok) throw Error(fmt::format("store_kv_rows: no kernel for head_dim {}", kv.head_dim));
}

// kv_offsets_kernel: items [0, heads) from layer l on, a warp each (kv_offset_warp).
void host_kv_offsets(KvBytes& cache, int l, int n_layers) {
    const KvLayout& kv = cache.kv;
    if (!kv.k_offsets()) throw Error("kv_offsets: K carries no key offsets");
    const uint8_t* kc = cache.k.data() + kv.row_index(l, 0, 0) * kv.k_row_bytes();
    float* off = cache.k_offsets.data() + int64_t(l) * kv.n_kv_heads * kv.head_dim;
    const bool ok = dispatch_kv_rows(kv.head_dim, [&](auto e) {
        run_grid(n_layers * kv.n_kv_heads, 1, 32, 0,
                 [&](const HostThread& t) { kv_offset_warp<decltype(e)::value>(t, t.block_x(), kc, kv, off); });
    });
    if (!ok) throw Error(fmt::format("kv_offsets: no kernel for head_dim {}", kv.head_dim));
}
}  // namespace

void store_step(KvBytes& cache, int l, const float* k, const float* v, int pos0, int n) {
    const KvLayout& kv = cache.kv;
    if (!kv.quantized()) {  // store_kv_kernel's items: f16 pairs
        __half* kc = reinterpret_cast<__half*>(cache.k.data()) + kv.offset(l, 0, 0);
        __half* vc = reinterpret_cast<__half*>(cache.v.data()) + kv.offset(l, 0, 0);
        for (int64_t g = 0; g < int64_t(n) * kv.n_kv_heads * (kv.head_dim / 2); ++g)
            store_kv_item(g, k, v, nullptr, nullptr, &pos0, kv, 0, kc, vc);
        return;
    }
    uint8_t* kc = cache.k.data() + kv.row_index(l, 0, 0) * kv.k_row_bytes();
    uint8_t* vc = cache.v.data() + kv.row_index(l, 0, 0) * kv.v_row_bytes();
    const float* off = kv.k_offsets() ? cache.k_offsets.data() + int64_t(l) * kv.n_kv_heads * kv.head_dim : nullptr;
    auto rows = [&](int i0, int i1) {  // store_kv_rows_kernel over tokens [i0, i1)
        host_store_rows(int64_t(i1 - i0) * kv.n_kv_heads * 2, k, v, nullptr, nullptr, off, pos0, i0, kv, 0, kc, vc);
    };
    const bool sets = kv.k_offsets() && pos0 < kKvOffsetPositions && pos0 + n >= kKvOffsetPositions;
    const int split = sets ? kKvOffsetPositions - pos0 : 0;
    if (split > 0) {
        rows(0, split);
        host_kv_offsets(cache, l, 1);
    }
    rows(split, n);
}

void kv_write(KvBytes& cache, const void* k, const void* v, int n) {
    const KvLayout& kv = cache.kv;
    const int64_t heads = int64_t(kv.n_layers) * kv.n_kv_heads, krb = kv.k_row_bytes(), vrb = kv.v_row_bytes();
    for (int64_t lh = 0; lh < heads; ++lh) {  // cudaMemcpy2DAsync's rows
        std::memcpy(cache.k.data() + lh * kv.n_ctx * krb, static_cast<const uint8_t*>(k) + lh * n * krb,
                    size_t(n * krb));
        std::memcpy(cache.v.data() + lh * kv.n_ctx * vrb, static_cast<const uint8_t*>(v) + lh * n * vrb,
                    size_t(n * vrb));
    }
    if (kv.k_offsets() && n >= kKvOffsetPositions) host_kv_offsets(cache, 0, kv.n_layers);
}

std::vector<float> matvec_glu_int_quantized(GgmlType type, const uint8_t* gate, const uint8_t* up, int64_t rows,
                                            int64_t cols, const std::vector<float>& x, std::vector<HostActBlock>* yq) {
    if (rows % 32 != 0) throw Error("the SwiGLU product quantizes its output for rows a multiple of 32");
    const std::vector<float> sums = matvec_glu_int(type, gate, up, rows, cols, x);  // each block's outputs
    std::vector<float> y(size_t(rows), NAN);
    std::vector<ActBlock> blocks(size_t(rows / 32));
    std::vector<int> counters(size_t(rows / 32), 0);
    // matvec_glu_int_kernel's tail, block by block in a shuffled order (the device's is any): its first warp, lane 0
    // holding the block's outputs
    std::vector<int64_t> order;
    for (int64_t r0 = 0; r0 < rows; r0 += kMviGluRows) order.push_back(r0);
    std::shuffle(order.begin(), order.end(), std::mt19937(uint32_t(rows)));
    for (const int64_t r0 : order)
        run_grid(1, 1, 32, 0, [&](const HostThread& t) {
            float v[kMviGluRows];
            for (int r = 0; r < kMviGluRows; ++r) v[r] = sums[size_t(r0 + r)];
            glu_store_quantized(t, t.thread(), v, y.data(), r0, counters.data(), blocks.data());
        });
    for (int cnt : counters)
        if (cnt != 0) throw Error("matvec_glu_int: a row group's counter was not reset");
    *yq = host_blocks(blocks);
    return y;
}

std::vector<float> glu_quantized_tokens(const std::vector<float>& sums, int n, int64_t rows, int block_rows,
                                        int launch_tokens, std::vector<HostActBlock>* yq) {
    if (rows % 32 != 0) throw Error("the SwiGLU product quantizes its output for rows a multiple of 32");
    std::vector<float> y(size_t(n) * size_t(rows), NAN);
    std::vector<ActBlock> blocks(size_t(n) * size_t(rows / 32));
    std::vector<int> counters(size_t(rows / 32), 0);
    bool shaped = false;
    const auto run = [&](auto r_c, auto nt_c) {
        constexpr int R = decltype(r_c)::value, NT = decltype(nt_c)::value;
        if (R != block_rows || NT != launch_tokens) return;
        shaped = true;
        // launches of NT tokens; in each, matvec_glu_int_kernel's tail block by block in a shuffled order (the
        // device's is any): its first warp, lane t holding row r0 + t / NT of token t % NT
        for (int i0 = 0; i0 < n; i0 += NT) {
            const int m = std::min(NT, n - i0);
            std::vector<int64_t> order;
            for (int64_t r0 = 0; r0 < rows; r0 += R) order.push_back(r0);
            std::shuffle(order.begin(), order.end(), std::mt19937(uint32_t(rows + i0)));
            for (const int64_t r0 : order)
                run_grid(1, 1, 32, 0, [&](const HostThread& t) {
                    const int r = t.thread() / NT, i = t.thread() % NT;
                    const float o = r < R && i < m ? sums[size_t(i0 + i) * size_t(rows) + size_t(r0 + r)] : NAN;
                    glu_store_quantized_tokens<R, NT>(t, t.thread(), o, y.data() + int64_t(i0) * rows, rows, r0, m,
                                                      counters.data(), blocks.data() + int64_t(i0) * (rows / 32));
                });
            for (int cnt : counters)
                if (cnt != 0) throw Error("glu_store_quantized_tokens: a row group's counter was not reset");
        }
    };
    using I1 = std::integral_constant<int, 1>;
    using I2 = std::integral_constant<int, 2>;
    using I4 = std::integral_constant<int, 4>;
    using I8 = std::integral_constant<int, 8>;
    run(I1{}, I8{});
    run(I2{}, I8{});
    run(I2{}, I4{});
    run(I4{}, I4{});
    run(I4{}, I2{});
    run(I1{}, I4{});
    if (!shaped) throw Error("glu_store_quantized_tokens: no such block shape here");
    *yq = host_blocks(blocks);
    return y;
}

std::vector<float> matvec_int_residual_norm(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                                            const std::vector<float>& x, const std::vector<float>& residual,
                                            const std::vector<float>& norm_w, float eps, int block_rows,
                                            std::vector<HostActBlock>* xq) {
    if (rows % 32 != 0) throw Error("the residual product folds the norm in for rows a multiple of 32");
    if (block_rows != kMviRows && block_rows != kMviWideRows) throw Error("matvec_int_residual_norm: 4 or 8 rows");
    const std::vector<float> sums = matvec_int(type, bytes, rows, cols, x);  // each block's outputs
    std::vector<float> y = residual;
    std::vector<ActBlock> blocks(size_t(rows / 32));
    std::vector<float> group_sums(size_t(rows / 32), NAN);
    std::vector<int> counters(size_t(rows / 32 + 1), 0);
    const NormStore ns{norm_w.data(), blocks.data(), group_sums.data(), counters.data(), eps};
    // matvec_int_kernel's tail, block by block in a shuffled order (the device's is any): its first warp, lane 0
    // holding the block's rows with the residual added
    std::vector<int64_t> order;
    for (int64_t r0 = 0; r0 < rows; r0 += block_rows) order.push_back(r0);
    std::shuffle(order.begin(), order.end(), std::mt19937(uint32_t(rows + block_rows)));
    auto tail = [&](auto r) {
        constexpr int R = decltype(r)::value;
        for (const int64_t r0 : order)
            run_grid(1, 1, 32, 0, [&](const HostThread& t) {
                float v[R];
                for (int k = 0; k < R; ++k) v[k] = residual[size_t(r0 + k)] + sums[size_t(r0 + k)];
                residual_norm_store(t, t.thread(), v, y.data(), r0, rows, ns);
            });
    };
    if (block_rows == kMviRows)
        tail(std::integral_constant<int, kMviRows>{});
    else
        tail(std::integral_constant<int, kMviWideRows>{});
    for (int cnt : counters)
        if (cnt != 0) throw Error("matvec_int_residual_norm: a counter was not reset");
    *xq = host_blocks(blocks);
    return y;
}

int attention_split_positions() {
    return kAttnSplitPositions;
}
int attention_active_splits(int n_pos, int splits) {
    return cuda::attention_active_splits(n_pos, splits);
}
int attention_splits(int n_heads, const KvLayout& kv, int sm_count) {
    return cuda::attention_splits(n_heads, kv, sm_count);
}
int attention_prefill_splits(int n_heads, const KvLayout& kv, int n, int pos0, int sm_count) {
    return cuda::attention_prefill_splits(n_heads, kv, n, pos0, sm_count);
}
int64_t attention_partials(int n_heads, int head_dim, int splits, int n_batch) {
    return cuda::attention_partials(n_heads, head_dim, splits, n_batch);
}
bool flash_warp_split(int n, int n_rep) {
    return cuda::flash_warp_split(n, flash_heads_per_block(n_rep));
}
int attention_max_splits(const KvLayout& kv) {
    return cuda::attention_max_splits(kv);
}

std::vector<float> attention(const Config& c, const std::vector<float>& q_in, const std::vector<float>& k,
                             const std::vector<float>& v, int pos0, int n, int n_ctx, int splits, bool fold,
                             bool tensor_cores, KvType kt, KvType vt, std::vector<HostActBlock>* xq, bool flash_async,
                             bool warp_split) {
    const int hd = c.head_dim, n_rep = c.n_heads / c.n_kv_heads;
    // One layer's cache as store_kv writes it (no RoPE here): the positions before the queries' as one step, theirs
    // as the next.
    const KvLayout kv = KvLayout::of(c, n_ctx, kt, vt);
    if (!kv_cache_supported(kv))  // as CudaOps refuses it (the kernels read f16 where no half is quantized)
        throw Error(fmt::format("no CUDA kernels for a {} cache with head_dim {}", kv.types_name(), hd));
    KvBytes cache(kv);
    std::fill(cache.k.begin(), cache.k.end(), 0);
    std::fill(cache.v.begin(), cache.v.end(), 0);
    const size_t row = size_t(c.n_kv_heads) * size_t(hd);
    host::store_step(cache, 0, k.data(), v.data(), 0, pos0);
    host::store_step(cache, 0, k.data() + size_t(pos0) * row, v.data() + size_t(pos0) * row, pos0, n);
    const uint8_t *kc = cache.k.data(), *vc = cache.v.data();
    const float* koff = kv.k_offsets() ? cache.k_offsets.data() : nullptr;
    // the query turned to a quantized K's basis (kv_rotate_rows_kernel's body; CudaOps turns it in rope_store_kv's
    // launch)
    std::vector<float> q = q_in;
    if (kv_type_quantized(kt)) q = rotate_rows(q, hd);
    const float scale = 1.0f / std::sqrt(float(hd));
    std::vector<float> out(q.size(), NAN);
    auto unrotate = [&] {
        if (kv_type_quantized(vt)) out = rotate_rows(out, hd);
    };
    if (n > 1 && (tensor_cores || kv.quantized()) && dispatch_flash(n_rep, hd, [&](auto hdc, auto nq) {
            constexpr int HD = decltype(hdc)::value, NQ = decltype(nq)::value;
            // splits > 1: the positions split among that many blocks per query block, then flash_combine_kernel's
            // blocks; partials NaN-filled, so a row read that no split wrote shows
            const int sp = splits > 1 ? splits : 1, gy = (n + kFaRows / NQ - 1) / (kFaRows / NQ) * sp;
            std::vector<float> partials(sp > 1 ? size_t(n) * size_t(c.n_heads) * size_t(sp) * size_t(hd + 2) : 0,
                                        NAN);
            // the output also split for the output projection where the backend asks for it (an f16 V): by the
            // flash kernel, or with splits by the combine
            const bool split = !kv_type_quantized(vt);
            std::vector<__half> xh(split ? 2 * q.size() : 0, __float2half(NAN));
            // and quantized for an integer one (quantize_act's blocks), where the backend asks for it (an f16 V)
            std::vector<ActBlock> blocks(split ? q.size() / 32 : 0);
            if (!blocks.empty()) std::memset(blocks.data(), 0xee, blocks.size() * sizeof(ActBlock));
            const auto grid = [&](auto lo, auto async, auto ws) {
                constexpr bool LO = decltype(lo)::value, ASYNC = decltype(async)::value, WS = decltype(ws)::value;
                run_grid(c.n_heads / NQ, gy, kFaThreads, size_t(kFaShared<HD, LO, ASYNC>), [&](const HostThread& t) {
                    flash_prefill_body<HD, NQ, LO, HostThread, ASYNC, WS>(
                        t, q.data(), kc, vc, koff, &pos0, n, c.n_heads, n_rep, kv, scale, out.data(), sp,
                        partials.data(), split && sp == 1 ? xh.data() : nullptr,
                        split && sp == 1 ? blocks.data() : nullptr);
                });
            };
            const auto by_split = [&](auto lo, auto async) {  // as attention_prefill launches it
                if (warp_split && flash_warp_split(n, NQ))
                    grid(lo, async, std::true_type{});
                else
                    grid(lo, async, std::false_type{});
            };
            if (kv.quantized())
                by_split(std::true_type{}, std::false_type{});
            else if (flash_async)
                by_split(std::false_type{}, std::true_type{});
            else
                by_split(std::false_type{}, std::false_type{});
            if (sp > 1)
                run_grid(n * c.n_heads, 1, 128, 0, [&](const HostThread& t) {
                    combine_head(t, 128, partials.data(), sp, sp, hd, t.block_x(), out.data(),
                                 split ? blocks.data() : nullptr, split ? xh.data() : nullptr, int64_t(q.size()));
                });
            if (split) {
                std::vector<float> halves;
                for (const __half h : xh) halves.push_back(__half2float(h));
                const std::vector<float> want = split_halves(out);
                if (std::memcmp(halves.data(), want.data(), want.size() * sizeof(float)) != 0)
                    throw Error("flash attention: the split output differs from to_f16_split of the output");
                std::vector<ActBlock> want_q(blocks.size());
                for (size_t b = 0; b < blocks.size(); ++b) quantize_act_item(int64_t(b), out.data(), want_q.data());
                if (std::memcmp(blocks.data(), want_q.data(), blocks.size() * sizeof(ActBlock)) != 0)
                    throw Error("flash attention: the quantized output differs from quantize_act of the output");
            }
        })) {
        unrotate();
        return out;
    }
    // (one token: as attention_decode takes its heads, decode_heads_per_block; a prompt: attention_prefill's)
    const int heads = n == 1 ? decode_heads_per_block(n_rep, kv) : heads_per_block(n_rep);
    const bool ok = dispatch_attention_heads(heads, hd, [&](auto nq, auto e) {
        constexpr int NQ = decltype(nq)::value, E = decltype(e)::value;
        const int groups = c.n_heads / NQ;
        if (n == 1) {
            // the counters attention_decode's callers make room for: one a block of the grid's row
            if (groups != cuda::attention_counters(c.n_heads, kv)) throw Error("attention: counters for another grid");
            std::vector<float> partials(size_t(c.n_heads) * splits * (hd + 2), NAN);
            std::vector<int> counters(size_t(groups), 0);
            std::vector<ActBlock> blocks(xq ? out.size() / 32 : 0);
            ActBlock* xb = xq ? blocks.data() : nullptr;
            run_grid(groups, splits, kAttnThreads, size_t(kAttnDecodeShared<NQ, E>), [&](const HostThread& t) {
                int* cnt = fold ? counters.data() : nullptr;
                dispatch_attention_cache<NQ, E>(kv, [&](auto cache) {  // as attention_decode picks its kernel
                    attention_decode_body<NQ, E, decltype(cache)::value>(t, q.data(), kc, vc, koff, &pos0, n_rep, kv,
                                                                         splits, scale, partials.data(), cnt,
                                                                         out.data(), xb);
                });
            });
            if (fold) {
                for (int cnt : counters)
                    if (cnt != 0) throw Error("attention: a head group's counter was not reset");
            } else {
                run_grid(c.n_heads, 1, 128, 0, [&](const HostThread& t) {  // attention_combine_kernel's block
                    attention_combine_body(t, 128, partials.data(), &pos0, splits, hd, out.data(), xb);
                });
            }
            if (xq) *xq = host_blocks(blocks);
        } else {
            run_grid(groups, (n + kAttnWarps - 1) / kAttnWarps, kAttnThreads, 0, [&](const HostThread& t) {
                attention_prefill_body<NQ, E>(t, q.data(), kc, vc, &pos0, n, c.n_heads, n_rep, kv, scale, out.data());
            });
        }
    });
    if (!ok) {  // attention_generic_kernel: one thread per (query, head)
        if (!attention_head_dim_supported(hd)) throw Error(fmt::format("no attention kernel for head_dim {}", hd));
        for (int64_t g = 0; g < int64_t(n) * c.n_heads; ++g)
            attention_generic_item(g, q.data(), kc, vc, &pos0, c.n_heads, n_rep, kv, scale, out.data());
        if (xq) *xq = quantize_act(out);  // as attention_decode does after the generic kernel
    }
    unrotate();
    return out;
}

}  // namespace kvgen::cuda::host

namespace kvgen::cuda::host {

std::vector<HostActBlock> quantize_act(const std::vector<float>& x) {
    std::vector<ActBlock> a(x.size() / 32);
    run_grid(int(a.size()), 1, 32, 0, [&](const HostThread& t) {  // quantize_act_kernel: a warp per block
        quantize_act_warp(t, x[size_t(t.block_x()) * 32 + size_t(t.thread())], t.thread(), a[size_t(t.block_x())]);
    });
    return host_blocks(a);
}

namespace {
// rmsnorm_kernel's grid on the host (blocks of `threads`), out [n][dim], with xq and xh where not null.
std::vector<float> rmsnorm_grid(const std::vector<float>& x, const std::vector<float>& w, int n, int dim, float eps,
                                int threads, ActBlock* xq, __half* xh) {
    if (threads % 32 != 0 || threads < 32 || threads > kNormThreads) throw Error("rmsnorm: a block of 32 k threads");
    std::vector<float> out(x.size(), NAN);
    run_grid(n, 1, threads, kNormWarps, [&](const HostThread& t) {
        rmsnorm_body(t, threads, x.data(), w.data(), out.data(), xq, dim, eps, xh, int64_t(x.size()));
    });
    return out;
}
}  // namespace

std::vector<float> rmsnorm(const std::vector<float>& x, const std::vector<float>& w, int n, int dim, float eps,
                           int threads) {
    return rmsnorm_grid(x, w, n, dim, eps, threads, nullptr, nullptr);
}

std::vector<float> rmsnorm_split(const std::vector<float>& x, const std::vector<float>& w, int n, int dim, float eps,
                                 int threads) {
    std::vector<__half> xh(2 * x.size(), __float2half(NAN));
    std::vector<float> out = rmsnorm_grid(x, w, n, dim, eps, threads, nullptr, xh.data());
    for (const __half h : xh) out.push_back(__half2float(h));
    return out;
}

std::vector<float> split_halves(const std::vector<float>& x) {
    const int64_t count = int64_t(x.size());
    std::vector<__half> xh(size_t(2 * count));
    for (int64_t j = 0; j < count; ++j) to_f16_split_item(j, count, x.data(), xh.data());
    std::vector<float> out;
    for (const __half h : xh) out.push_back(__half2float(h));
    return out;
}

std::vector<float> f16_split_sum(const std::vector<float>& t, int n, int64_t rows, const std::vector<float>& y0,
                                 bool accumulate, bool glu, bool split) {
    std::vector<float> y = y0;
    std::vector<__half> xh(size_t(2 * n * rows), __float2half(NAN));
    const RowSplit out = RowSplit::one(y.data(), rows);
    for (int64_t j = 0; j < int64_t(n) * rows; ++j)
        f16_split_sum_item(j, t.data(), n, rows, out, accumulate, SplitSumTail{glu, split ? xh.data() : nullptr});
    if (split)
        for (const __half h : xh) y.push_back(__half2float(h));
    return y;
}

std::vector<float> rmsnorm_quantized(const std::vector<float>& x, const std::vector<float>& w, int n, int dim,
                                     float eps, int threads) {
    std::vector<ActBlock> xq(x.size() / 32);
    std::vector<float> out = rmsnorm_grid(x, w, n, dim, eps, threads, xq.data(), nullptr);
    for (const ActBlock& a : xq) {
        out.push_back(a.d);
        out.push_back(float(a.s));
        out.push_back(float(a.h[0]));
        out.push_back(float(a.h[1]));
        for (int16_t q : a.q) out.push_back(float(q));
    }
    return out;
}

namespace {
void host_rope_tables(int n, int pos0, const Config& c, const std::vector<float>& freq_factors,
                      std::vector<float>* cos_t, std::vector<float>* sin_t) {
    const int half = c.rope_dim / 2;
    const RopeFreqs r = RopeFreqs::of(c, freq_factors);
    cos_t->assign(size_t(n) * half, NAN);
    sin_t->assign(size_t(n) * half, NAN);
    for (int g = 0; g < n * half; ++g)
        rope_tables_item(g, &pos0, half, r.inv_freq.data(), r.factors.empty() ? nullptr : r.factors.data(), r.pos_div,
                         cos_t->data(), sin_t->data());
}
}  // namespace

std::vector<float> rope(const std::vector<float>& x, int n, int n_heads, int pos0, const Config& c,
                        const std::vector<float>& freq_factors) {
    std::vector<float> cs, sn, out = x;
    host_rope_tables(n, pos0, c, freq_factors, &cs, &sn);
    const int half = c.rope_dim / 2;
    for (int64_t g = 0; g < int64_t(n) * n_heads * half; ++g)
        rope_item(g, out.data(), cs.data(), sn.data(), n_heads, c.head_dim, half);
    return out;
}

std::vector<float> rope_turn_q(const std::vector<float>& x, int n, int n_heads, int pos0, const Config& c) {
    std::vector<float> cs, sn, out = x;
    host_rope_tables(n, pos0, c, {}, &cs, &sn);
    const bool ok = dispatch_kv_rows(c.head_dim, [&](auto e) {
        run_grid(n * n_heads, 1, 32, 0, [&](const HostThread& t) {
            rope_turn_q_row_warp<decltype(e)::value>(t, t.block_x(), out.data(), cs.data(), sn.data(), n_heads,
                                                     c.rope_dim / 2);
        });
    });
    if (!ok) throw Error(fmt::format("rope_turn_q: no kernel for head_dim {}", c.head_dim));
    return out;
}

std::vector<float> store_k(const Config& c, const std::vector<float>& k, int pos0, int n, int n_ctx) {
    std::vector<float> cs, sn;
    host_rope_tables(n, pos0, c, {}, &cs, &sn);
    const KvLayout kv = KvLayout::of(c, n_ctx, KvType::F16);
    std::vector<__half> kc(size_t(kv.layer_elems()), __float2half(NAN)), vc(kc);
    for (int64_t g = 0; g < int64_t(n) * c.n_kv_heads * (c.head_dim / 2); ++g)
        store_kv_item(g, k.data(), k.data(), cs.data(), sn.data(), &pos0, kv, c.rope_dim / 2, kc.data(), vc.data());
    // the per-row kernel of a quantized cache, run with f16 halves, writes the same values
    std::vector<__half> kr(kc.size(), __float2half(NAN)), vr(kr);
    host_store_rows(int64_t(n) * c.n_kv_heads * 2, k.data(), k.data(), cs.data(), sn.data(), nullptr, pos0, 0, kv,
                    c.rope_dim / 2, reinterpret_cast<uint8_t*>(kr.data()), reinterpret_cast<uint8_t*>(vr.data()));
    for (int i = 0; i < n; ++i)
        for (int h = 0; h < c.n_kv_heads; ++h)
            for (int j = 0; j < c.head_dim; ++j) {
                const size_t at = size_t(kv.row(h, pos0 + i) + j);
                if (__half2float(kr[at]) != __half2float(kc[at]))
                    throw Error("store_kv: the per-row kernel's f16 row differs from the per-pair kernel's");
            }
    std::vector<float> out(size_t(n) * c.n_kv_heads * c.head_dim);
    for (int i = 0; i < n; ++i)
        for (int h = 0; h < c.n_kv_heads; ++h)
            for (int j = 0; j < c.head_dim; ++j)
                out[(size_t(i) * c.n_kv_heads + h) * c.head_dim + j] =
                    __half2float(kc[size_t(kv.row(h, pos0 + i) + j)]);
    return out;
}

namespace {
// The rows of seg_rows / head_dim heads of one layer's f16 cache for the n positions from pos0, [n][heads][head_dim].
std::vector<float> cache_rows(const std::vector<__half>& cache, const KvLayout& kv, int n, int pos0, int64_t seg_rows) {
    const int heads = int(seg_rows / kv.head_dim);
    std::vector<float> r(size_t(n) * size_t(seg_rows));
    for (int i = 0; i < n; ++i)
        for (int h = 0; h < heads; ++h)
            for (int d = 0; d < kv.head_dim; ++d)
                r[(size_t(i) * heads + h) * kv.head_dim + d] = __half2float(cache[size_t(kv.row(h, pos0 + i) + d)]);
    return r;
}
}  // namespace

namespace {
// A Q|K|V epilogue with QkvStore run on the host over an f16 cache of n_ctx positions with c's heads, n tokens at
// positions pos0..: store(split, st) runs it for rows [0, q_end) queries, [q_end, k_end) keys, the rest values. The
// queries as written, the key and value rows read back; checked that RowSplit's k and v and every other cache value
// stay unwritten (what: the kernel, for the errors).
template <typename Store>
QkvStored qkv_stored(int n, int64_t rows, const Config& c, int pos0, int n_ctx, int64_t q_end, int64_t k_end,
                     const char* what, Store&& store) {
    std::vector<float> cs, sn;
    host_rope_tables(n, pos0, c, {}, &cs, &sn);
    const KvLayout kv = KvLayout::of(c, n_ctx, KvType::F16);
    std::vector<__half> kc(size_t(kv.layer_elems()), __float2half(NAN)), vc(kc);
    QkvStored out;
    out.q.assign(size_t(n) * size_t(q_end), NAN);
    std::vector<float> unused(size_t(n) * size_t(rows), NAN);  // RowSplit's k and v: never written
    store(RowSplit{{out.q.data(), unused.data(), unused.data()}, {q_end, k_end}},
          QkvStore{kc.data(), vc.data(), q_end, k_end, cs.data(), sn.data(), &pos0, c.rope_dim / 2, kv});
    for (float u : unused)
        if (!std::isnan(u)) throw Error(fmt::format("{} with QkvStore wrote RowSplit's k or v", what));
    // the step's rows, and nothing written elsewhere
    for (const auto& [cache, seg] : {std::pair{&kc, k_end - q_end}, std::pair{&vc, rows - k_end}})
        if (std::count_if(cache->begin(), cache->end(), [](__half e) { return !std::isnan(__half2float(e)); }) !=
            n * seg)
            throw Error(fmt::format("{} with QkvStore: cache values written outside the step's rows", what));
    out.k = cache_rows(kc, kv, n, pos0, k_end - q_end);
    out.v = cache_rows(vc, kv, n, pos0, rows - k_end);
    return out;
}
}  // namespace

QkvStored matvec_int_qkv_store(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                               const std::vector<float>& x, int n, const Config& c, int pos0, int n_ctx, int64_t q_end,
                               int64_t k_end) {
    const uint8_t* const w[1] = {bytes};
    const std::vector<float> y = matvec_int_blocks<1>(type, w, rows, cols, x, n, MviShape{})[0];  // the blocks' sums
    return qkv_stored(
        n, rows, c, pos0, n_ctx, q_end, k_end, "matvec_int", [&](const RowSplit& split, const QkvStore& st) {
            // matvec_int_kernel's epilogue, block by block in each launch: lane t of the first warp holds row r0 + t /
            // NT for token i0 + t % NT
            const bool ok = dispatch_int_type(type, [&](auto tag) {
                constexpr GgmlType T = decltype(tag)::value;
                int_launches(n, [&](auto nt, int i0, int m) {
                    constexpr int NT = decltype(nt)::value;
                    with_mvi_shape<T, 1, NT>(MviShape{}, [&](auto rows_a_block, auto) {
                        constexpr int R = decltype(rows_a_block)::value;
                        for (int64_t r0 = 0; r0 < rows; r0 += R)
                            run_grid(1, 1, 32, 0, [&](const HostThread& t) {
                                const int r = t.thread() / NT, i = t.thread() % NT;
                                const bool valid = r < R && i < m && r0 + r < rows;
                                const float v = valid ? y[size_t(i0 + i) * size_t(rows) + size_t(r0 + r)] : 0.0f;
                                qkv_store_row(t, v, valid, r0 + r, i0 + i, NT, split, rows, st);
                            });
                    });
                });
            });
            if (!ok) throw Error(fmt::format("no integer product for {}", ggml_type_name(type)));
        });
}

QkvStored f16_split_sum_qkv_store(const std::vector<float>& t, int n, int64_t rows, const Config& c, int pos0,
                                  int n_ctx, int64_t q_end, int64_t k_end) {
    return qkv_stored(n, rows, c, pos0, n_ctx, q_end, k_end, "f16_split_sum",
                      [&](const RowSplit& split, const QkvStore& st) {
                          for (int64_t p = 0; p < int64_t(n) * rows / 2; ++p)
                              f16_split_sum_qkv_item(p, t.data(), n, rows, split, st);
                      });
}

std::vector<float> get_rows(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols,
                            const std::vector<int32_t>& ids) {
    std::vector<float> out(ids.size() * size_t(cols), NAN);
    const DeviceRows dev = device_rows(type, bytes, rows, cols);
    const int64_t cpr = cols / 32, row_bytes = dev.row_bytes;
    if (cols % 32 != 0) {  // get_rows_ragged_kernel's item (the ids here are in range)
        if (!is_float_type(type)) throw Error("rows that are not whole blocks");
        for (int64_t g = 0; g < int64_t(ids.size()) * cols; ++g)
            out[size_t(g)] = float_weight(type, dev.p + ids[size_t(g / cols)] * row_bytes, g % cols);
        return out;
    }
    const bool ok = dispatch_type(type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        for (int64_t g = 0; g < int64_t(ids.size()) * cpr; ++g)
            get_rows_item<T>(g, dev.p, row_bytes, cpr, rows, ids.data(), out.data());
    });
    if (!ok) throw Error(fmt::format("no device decoder for {}", ggml_type_name(type)));
    return out;
}

std::vector<int> row_split_targets(int64_t rows, int64_t end0, int64_t end1, int n) {
    // Three buffers of n tokens' rows at distinct addresses of one array; a row's target is the buffer its pointer
    // lands in.
    const int64_t span = int64_t(n) * rows;
    std::vector<float> mem(size_t(3 * span));
    const RowSplit split{{mem.data(), mem.data() + span, mem.data() + 2 * span}, {end0, end1}};
    std::vector<int> out;
    for (int i = 0; i < n; ++i)
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t at = split.at(r, i, rows) - mem.data();
            out.push_back(int(at / span) * 1000000 + int(at % span));
        }
    return out;
}

}  // namespace kvgen::cuda::host
