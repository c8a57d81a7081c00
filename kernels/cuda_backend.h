#pragma once
// The CUDA backend: the forward pass's operations on one NVIDIA GPU (cuda_ops.cu; memory placed by memory_plan.h,
// weights loaded by upload.cu). Declared without CUDA types, so the CLI and the tests build against it like any
// other backend.
#include <memory>
#include <string>

#include "engine/backend.h"
#include "engine/settings.h"
#include "model/weights.h"

namespace kvgen::cuda {

// What the backend will allocate on the device, in bytes.
struct CudaMemoryPlan {
    size_t weights = 0, kv_cache = 0, buffers = 0;
    size_t total() const { return weights + kv_cache + buffers; }
};
CudaMemoryPlan plan_memory(const Model& model, const Settings& s);

// Uploads the model and allocates the KV cache on device cuda_device_index(s.device). Throws kvgen::Error when
// there is no device, a weight type or head_dim has no kernel, the KV type is not f16, or the device lacks the
// memory (the message gives needed and free bytes).
std::unique_ptr<Backend> make_backend(const Model& model, const Settings& s);

// "cuda0 (NVIDIA H200, 132 SMs, 139.7 GiB)" for the device a backend runs on.
std::string describe_device(int device);

}  // namespace kvgen::cuda
