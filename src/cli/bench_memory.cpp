#include "cli/bench_memory.h"

#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "cpu/thread_pool.h"

namespace kvgen {

void run_bench_memory(int n_threads) {
    const size_t bytes = size_t(1) << 30;
    void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) throw Error("--bench-memory: cannot allocate a 1 GiB buffer");
    std::memset(mem, 1, bytes);
    const auto* words = static_cast<const uint64_t*>(mem);
    const int64_t n_words = int64_t(bytes / 8);
    cpu::ThreadPool pool(n_threads);
    double best = 0;
    volatile uint64_t sink = 0;  // keeps the sums, so the reads cannot be optimized away
    for (int pass = 0; pass < 5; ++pass) {
        std::vector<uint64_t> sums(size_t(pool.size()), 0);
        const auto t0 = std::chrono::steady_clock::now();
        // note: eight independent sums keep enough loads in flight; the compiler vectorizes the inner loop.
        pool.parallel_for(n_words / 8, [&](int64_t b, int64_t e, int t) {
            uint64_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int64_t i = b; i < e; ++i)
                for (int k = 0; k < 8; ++k) acc[k] += words[i * 8 + k];
            sums[size_t(t)] = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
        });
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        for (uint64_t v : sums) sink += v;
        best = std::max(best, double(bytes) / s / 1e9);
    }
    ::munmap(mem, bytes);
    std::printf("memory read bandwidth: %.1f GB/s (%d thread%s, 1 GiB, best of 5)\n", best, pool.size(),
                pool.size() == 1 ? "" : "s");
}

}  // namespace kvgen
