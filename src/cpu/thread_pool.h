#pragma once
// A fixed pool of workers for the forward pass. A parallel region costs a few microseconds: workers spin for up
// to 100 us on a generation counter before sleeping, since decode runs hundreds of short regions per token.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace kvgen::cpu {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }

    // Calls fn(begin, end, thread) on contiguous slices of [0, n), one slice per thread, and waits for all.
    template <typename Fn>
    void parallel_for(int64_t n, Fn&& fn) {
        run(n, [](void* ctx, int64_t b, int64_t e, int t) { (*static_cast<Fn*>(ctx))(b, e, t); }, &fn);
    }

    // Physical cores of this machine (hyper-threads not counted), at least 1.
    static int physical_cores();

private:
    using Task = void (*)(void*, int64_t, int64_t, int);
    void run(int64_t n, Task task, void* ctx);
    void worker(int t);
    void slice(int t);

    int n_threads_;
    std::vector<std::thread> workers_;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stop_{false};
    std::mutex mu_;
    std::condition_variable cv_;
    Task task_ = nullptr;
    void* ctx_ = nullptr;
    int64_t n_ = 0;
};

}  // namespace kvgen::cpu
