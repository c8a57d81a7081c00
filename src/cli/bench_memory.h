#pragma once

namespace kvgen {

// `kvgen --bench-memory`: the machine's memory read bandwidth with n_threads threads over a 1 GiB buffer (best of
// 5 passes), the ceiling decode is measured against. Prints "memory read bandwidth: X GB/s (...)".
void run_bench_memory(int n_threads);

}  // namespace kvgen
