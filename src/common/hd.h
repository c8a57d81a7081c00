#pragma once
// KVGEN_HD marks a small function that CUDA code calls on the device and host code (the CPU backend, the tests)
// calls on the host: under nvcc it is compiled for both, elsewhere it is a plain inline function.
#if defined(__CUDACC__)
#define KVGEN_HD __host__ __device__ __forceinline__
#else
#define KVGEN_HD inline
#endif
