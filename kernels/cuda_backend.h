#pragma once
// The CUDA backend: the whole forward pass on one NVIDIA GPU. Declared without CUDA types, so the CLI and the
// tests build against it like any other backend.
#include <memory>
#include <string>

#include "engine/backend.h"
#include "model/weights.h"

namespace kvgen::cuda {

struct CudaOptions {
    int device = 0;
    int n_ctx = 4096;
    int n_batch = 512;
    bool graphs = true;     // capture the decode step once as a CUDA graph and replay it
    bool progress = false;  // show upload progress on stderr
};

// What the backend will allocate on the device, in bytes.
struct CudaMemoryPlan {
    size_t weights = 0, kv_cache = 0, buffers = 0;
    size_t total() const { return weights + kv_cache + buffers; }
};
CudaMemoryPlan plan_memory(const Model& model, const CudaOptions& opt);

// Uploads the model and allocates the KV cache. Throws kvgen::Error when there is no device, a weight type or
// head_dim has no kernel, or the device lacks the memory (the message gives needed and free bytes).
std::unique_ptr<Backend> make_backend(const Model& model, const CudaOptions& opt);

// "cuda0 (NVIDIA H200, 132 SMs, 139.7 GiB)" for the device a backend runs on.
std::string describe_device(int device);

}  // namespace kvgen::cuda
