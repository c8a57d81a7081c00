#pragma once
// Error checking for CUDA calls: every failure becomes a kvgen::Error naming the call and CUDA's reason.
#include <cuda_runtime.h>

#include <fmt/format.h>

#include "common/error.h"

namespace kvgen::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t err, const char* what, const char* file, int line) {
    cudaGetLastError();  // clear a non-sticky error so that the caller can go on (e.g. fall back)
    throw Error(fmt::format("CUDA: {} failed: {} ({}:{})", what, cudaGetErrorString(err), file, line));
}

}  // namespace kvgen::cuda

#define KVGEN_CUDA_CHECK(expr)                                                                           \
    do {                                                                                                 \
        const cudaError_t kvgen_err_ = (expr);                                                           \
        if (kvgen_err_ != cudaSuccess) ::kvgen::cuda::throw_cuda(kvgen_err_, #expr, __FILE__, __LINE__); \
    } while (0)

// After a kernel launch: a bad configuration shows here, a fault at the next synchronization.
#define KVGEN_CUDA_LAUNCHED(name)                                                                                    \
    do {                                                                                                             \
        const cudaError_t kvgen_err_ = cudaGetLastError();                                                           \
        if (kvgen_err_ != cudaSuccess) ::kvgen::cuda::throw_cuda(kvgen_err_, "launch of " name, __FILE__, __LINE__); \
    } while (0)
