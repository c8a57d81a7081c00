#pragma once
// `--device cpu|cuda|auto`: builds the backend a run asked for, with a one-line description for the logs.
#include <memory>
#include <string>

#include "engine/backend.h"
#include "engine/settings.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvgen {

struct SelectedBackend {
    std::unique_ptr<Backend> backend;
    std::string device;       // "cpu" or "cuda"
    std::string description;  // "cpu (2 threads, avx512-vnni kernels)", "cuda0 (NVIDIA H200, 132 SMs, 139.8 GiB)"
    int n_threads = 0;        // CPU threads (0 for CUDA)
    std::string gpu_name;     // the CUDA device's name ("NVIDIA H200"); empty on the CPU
};

// "cpu" or "cuda": where a --device value (as normalize_device returns it) runs on this machine; auto picks cuda
// when this build has it and a device is visible. A GPU that is not there is an error whose message starts with
// `asked_by` (the flag the user gave).
std::string resolve_device(const std::string& device, const std::string& asked_by = "--device cuda");

// Throws kvgen::Error for a device this build or machine lacks, or an option the device does not support.
SelectedBackend make_backend(const Model& model, const Settings& s);

// The model's tokenizer, checked against the model (the same vocabulary size; a warning for an unknown
// pre-tokenizer). path names the model in messages.
Tokenizer tokenizer_for(const Model& model, const std::string& path);

}  // namespace kvgen
