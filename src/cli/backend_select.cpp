#include "cli/backend_select.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "cpu/cpu_backend.h"
#include "cpu/matmul.h"
#if defined(KVGEN_HAVE_CUDA)
#include "cuda_backend.h"
#include "device.h"
#endif

namespace kvgen {

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

Tokenizer tokenizer_for(const Model& model, const std::string& path) {
    Tokenizer tok = Tokenizer::from_gguf(model.file);
    if (tok.n_vocab() != model.config.n_vocab)
        throw Error(fmt::format("{}: the tokenizer has {} tokens but the model {}", path, tok.n_vocab(),
                                model.config.n_vocab));
    if (tok.pre_fallback())
        spdlog::warn("unknown pre-tokenizer '{}': using GPT-2's rules, token ids may differ from the model's", tok.pre());
    return tok;
}

SelectedBackend make_backend(const Model& model, const Settings& s) {
    SelectedBackend out;
    out.device = resolve_device(s.device);  // throws for a device that is not there
    if (out.device == "cuda") {
        if (s.math != MathMode::Exact)
            throw Error(fmt::format("--math {}: the CUDA backend computes in the exact mode only (use --device cpu)",
                                    math_mode_name(s.math)));
#if defined(KVGEN_HAVE_CUDA)
        out.backend = cuda::make_backend(model, s);
        const int index = cuda_device_index(s.device);
        out.description = cuda::describe_device(index);
        std::string why;
        for (const cuda::DeviceInfo& d : cuda::list_devices(&why))
            if (d.id == index) out.gpu_name = d.name;
        return out;
#else
        throw Error("--device cuda: this build has no CUDA backend (configure with -DKVGEN_CUDA=ON; use --device cpu)");
#endif
    }
    auto ops = std::make_unique<cpu::CpuOps>(model, s);
    out.n_threads = ops->n_threads();
    out.description = fmt::format("cpu ({} threads, {} kernels{})", out.n_threads, cpu::matmul_isa(),
                                  s.math == MathMode::Exact ? "" : fmt::format(", --math {}", math_mode_name(s.math)));
    out.backend = std::make_unique<Backend>(model.config, std::move(ops));
    return out;
}

}  // namespace kvgen
