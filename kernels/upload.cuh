#pragma once
// Loading a model into device memory: the GGUF matrices copied as they are (through two pinned staging buffers, so
// reading the mapped file overlaps the transfer), norms decoded to f32 and RoPE's frequencies, each into the region
// memory_plan.h gave it.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "memory_plan.h"
#include "ops.cuh"

namespace kvgen::cuda {

struct LayerDev {
    DevWeight wq, wk, wv, wo, gate, up, down;
    DevWeight qkv;   // wq, wk and wv read as one matrix (rows of all three) when fused_qkv
    bool fused_qkv;  // MemoryPlan::fused_qkv
    const float *attn_norm, *ffn_norm;  // [n_embd]
};

// The model's weights on the device, pointing into the plan's regions.
struct DeviceModel {
    DevWeight embd, output;  // output is embd when tied
    std::vector<LayerDev> layers;
    const float* output_norm = nullptr;   // [n_embd]
    const double* rope_inv_freq = nullptr;  // [rope_dim / 2]
    const double* rope_factors = nullptr;   // [rope_dim / 2] or null
    double rope_pos_div = 1.0;
};

// Copies the model into `base` (an allocation of plan.total bytes) on stream s, and waits for it. progress: the
// upload's percentage on stderr, as cuda<device>.
DeviceModel upload_model(const Model& m, const MemoryPlan& plan, uint8_t* base, int device, bool progress,
                         cudaStream_t s);

}  // namespace kvgen::cuda
