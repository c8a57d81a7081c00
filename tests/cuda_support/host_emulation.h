// The host emulation's machinery, shared by its files (host_emulation.cu: the decoders, the products and the
// fibers' own checks; host_emulation_attention.cu: the K/V cache, attention, the element-wise items and the
// Q|K|V stores): a thread's cp.async copies, the warp butterfly, a weight in the device layout, and a block of
// CUDA threads as fibers. Each of those files has its own copy (an unnamed namespace).
#pragma once


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
#include "testing.h"

namespace kvgen::cuda::host {

// (host_emulation.cu) The blocks an emulated integer product's activations are, as the tests' HostActBlock.
std::vector<HostActBlock> host_blocks(const std::vector<ActBlock>& blocks);
// (host_emulation.cu) The integer product of NM matrices (NM 1 or 2) for n tokens x [n][cols], in the launches the
// device makes (int_launches, with_mvi_shape; rings where shape.stages > 0).
template <int NM>
std::vector<std::vector<float>> matvec_int_blocks(GgmlType type, const uint8_t* const (&bytes)[NM], int64_t rows,
                                                  int64_t cols, const std::vector<float>& x, int n, MviShape shape);

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
inline float butterfly_sum(float (&v)[32]) {
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
inline DeviceRows device_rows(GgmlType type, const uint8_t* bytes, int64_t rows, int64_t cols) {
    DeviceRows d;
    d.row_bytes = device_row_bytes(type, cols);
    d.mem.resize(size_t((rows * d.row_bytes + 15) / 16));
    to_device_rows(type, bytes, rows, cols, reinterpret_cast<uint8_t*>(d.mem.data()));
    d.p = reinterpret_cast<const uint8_t*>(d.mem.data());
    return d;
}

inline std::vector<ActBlock> act_blocks(const std::vector<float>& x) {
    std::vector<ActBlock> a(x.size() / 32);
    for (int64_t b = 0; b < int64_t(a.size()); ++b) quantize_act_item(b, x.data(), a.data());
    return a;
}

// --- the attention kernels' bodies on the host -----------------------------------------------------------------
// A block runs as one fiber per CUDA thread (ucontext, one OS thread): a fiber runs until it reaches a warp
// barrier (inside a shuffle) or the block barrier (__syncthreads), and a barrier opens when every live thread it
// spans has arrived. Shuffles exchange through a per-warp array between two warp barriers, in the device's
// butterfly order, so the sums are the device's.


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
inline void run_grid(int gx, int gy, int threads, size_t shared_floats, Body body) {
    for (int by = 0; by < gy; ++by)
        for (int bx = 0; bx < gx; ++bx) {
            FiberBlock block(threads, shared_floats, bx, by);
            const std::function<void(int)> f = [&](int tid) { body(HostThread{&block, tid}); };
            block.run(f);
        }
}

}  // namespace

}  // namespace kvgen::cuda::host
