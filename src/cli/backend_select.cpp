#include "cli/backend_select.h"

#include <fmt/format.h>

#include "common/error.h"
#include "cpu/cpu_backend.h"
#include "cpu/matmul.h"
#if defined(KVGEN_HAVE_CUDA)
#include "cuda_backend.h"
#include "device.h"
#endif

namespace kvgen {

#if defined(KVGEN_HAVE_CUDA)
namespace {

// The CUDA device index of "cuda" / "cudaN".
int cuda_index(const std::string& device) {
    return device.size() > 4 ? std::stoi(device.substr(4)) : 0;
}

}  // namespace
#endif

std::string resolve_device(const std::string& device, const std::string& asked_by) {
    if (device == "cpu") return device;
    const bool want_cuda = device.rfind("cuda", 0) == 0;
    if (device != "auto" && !want_cuda)
        throw Error(fmt::format("--device '{}': expected cpu, cuda, cudaN or auto", device));
#if defined(KVGEN_HAVE_CUDA)
    std::string why;
    if (!cuda::list_devices(&why).empty()) return "cuda";
    if (want_cuda) throw Error(fmt::format("{}: {} (use --device cpu)", asked_by, why));
#else
    if (want_cuda)
        throw Error(fmt::format("{}: this build has no CUDA backend (configure with -DKVGEN_CUDA=ON; use --device cpu)",
                                asked_by));
#endif
    return "cpu";
}

SelectedBackend make_backend(const Model& model, const BackendChoice& choice) {
    SelectedBackend out;
    out.device = resolve_device(choice.device);  // throws for a device that is not there
    if (out.device == "cuda") {
#if defined(KVGEN_HAVE_CUDA)
        if (choice.kv_type != KvType::F16)
            throw Error("--kv-type f32: the CUDA backend keeps its KV cache in f16 (use --device cpu for f32)");
        cuda::CudaOptions o;
        o.device = choice.device == "auto" ? 0 : cuda_index(choice.device);
        o.n_ctx = choice.n_ctx;
        o.n_batch = choice.n_batch;
        o.graphs = choice.cuda_graphs;
        o.progress = choice.progress;
        out.backend = cuda::make_backend(model, o);
        out.description = cuda::describe_device(o.device);
        return out;
#else
        throw Error("--device cuda: this build has no CUDA backend (configure with -DKVGEN_CUDA=ON; use --device cpu)");
#endif
    }
    cpu::CpuOptions o;
    o.n_ctx = choice.n_ctx;
    o.n_batch = choice.n_batch;
    o.n_threads = choice.n_threads > 0 ? choice.n_threads : cpu::ThreadPool::physical_cores();
    o.kv_type = choice.kv_type;
    out.backend = std::make_unique<cpu::CpuBackend>(model, o);
    out.n_threads = o.n_threads;
    out.description = fmt::format("cpu ({} threads, {} kernels)", o.n_threads, cpu::matmul_isa());
    return out;
}

}  // namespace kvgen
