// The kernels' own bodies run on the host, without a GPU (host_emulation.h; attention and the K/V cache's kernels in
// host_emulation_attention.cu): the device decoders, the products' lane and block splits, their rings and tensor-core
// fragments, and the fibers' own checks. The CPU-only tests compare them with the CPU twins, so CI checks the kernels'
// indexing and bit layouts on every run.
#include "host_emulation.h"

namespace kvgen::cuda::host {

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
}  // namespace

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
template std::vector<std::vector<float>> matvec_int_blocks<1>(GgmlType, const uint8_t* const (&)[1], int64_t, int64_t,
                                                              const std::vector<float>&, int, MviShape);
template std::vector<std::vector<float>> matvec_int_blocks<2>(GgmlType, const uint8_t* const (&)[2], int64_t, int64_t,
                                                              const std::vector<float>&, int, MviShape);

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

namespace kvgen::cuda::host {

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

}  // namespace kvgen::cuda::host
