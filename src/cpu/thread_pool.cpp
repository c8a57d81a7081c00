#include "cpu/thread_pool.h"

#include <chrono>
#include <fstream>
#include <set>
#include <string>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvgen::cpu {

namespace {
inline void cpu_relax() {
#if defined(__x86_64__)
    _mm_pause();
#endif
}
// note: a worker spins this long for the next region before sleeping. Decode starts a region every few tens of
// microseconds, so short spins keep hand-offs cheap; a longer spin would steal the core from whatever else runs
// (another process, or a busy main thread) for no gain.
constexpr auto kSpin = std::chrono::microseconds(100);
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
    for (int t = 1; t < n_threads_; ++t) workers_.emplace_back([this, t] { worker(t); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
        generation_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
}

// note: where n does not divide evenly the larger slices go to the first threads: thread 0, the caller, starts
// without a hand-off and runs closer to the data it just wrote (3 attention items on 2 threads: the caller takes 2,
// and a default-model token is about 2% faster than with the caller taking 1). Sizes differ by one at most.
void ThreadPool::slice(int t) {
    const int64_t q = n_ / n_threads_, r = n_ % n_threads_;
    const int64_t b = t * q + (t < r ? t : r), e = b + q + (t < r ? 1 : 0);
    if (b < e) task_(ctx_, b, e, t);
}

void ThreadPool::run(int64_t n, Task task, void* ctx) {
    if (n_threads_ == 1 || n <= 1) {
        if (n > 0) task(ctx, 0, n, 0);
        return;
    }
    task_ = task;
    ctx_ = ctx;
    n_ = n;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    {
        std::lock_guard<std::mutex> lock(mu_);
        generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    slice(0);
    // note: after a short spin, yield: when the machine is oversubscribed a worker may be waiting for this very core.
    for (int i = 0; pending_.load(std::memory_order_acquire) != 0; ++i) {
        if (i < 4096) cpu_relax();
        else std::this_thread::yield();
    }
}

void ThreadPool::worker(int t) {
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = generation_.load(std::memory_order_acquire);
        const auto deadline = std::chrono::steady_clock::now() + kSpin;
        for (int i = 0; g == seen; ++i) {
            cpu_relax();
            g = generation_.load(std::memory_order_acquire);
            if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) break;
        }
        if (g == seen) {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return generation_.load() != seen; });
            g = generation_.load();
        }
        seen = g;
        if (stop_) return;
        slice(t);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

int ThreadPool::physical_cores() {
    // Distinct (physical id, core id) pairs in /proc/cpuinfo; the hardware thread count where that is unreadable.
    std::ifstream in("/proc/cpuinfo");
    std::set<std::pair<std::string, std::string>> cores;
    std::string line, phys = "0";
    while (std::getline(in, line)) {
        const auto colon = line.find(':');
        if (colon == std::string::npos) continue;
        const std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
        const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
        if (key == "physical id") phys = value;
        if (key == "core id") cores.emplace(phys, value);
    }
    const int hw = int(std::thread::hardware_concurrency());
    if (cores.empty()) return hw > 0 ? hw : 1;
    return int(cores.size());
}

}  // namespace kvgen::cpu
