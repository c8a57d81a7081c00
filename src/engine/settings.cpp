#include "engine/settings.h"

#include <algorithm>

#include "model/config.h"

namespace kvgen {

int Settings::context_size(const Config& c) const { return n_ctx > 0 ? n_ctx : std::min(c.n_ctx_train, kDefaultCtx); }

int Settings::batch_size(int ctx) const { return std::max(1, std::min(n_batch, ctx)); }

const char* math_mode_name(MathMode m) {
    switch (m) {
        case MathMode::Fast: return "fast";
        case MathMode::F32: return "f32";
        default: return "exact";
    }
}

bool math_mode_from_name(const std::string& s, MathMode* m) {
    for (MathMode v : {MathMode::Exact, MathMode::Fast, MathMode::F32})
        if (s == math_mode_name(v)) {
            *m = v;
            return true;
        }
    return false;
}

std::string cuda_options_name(const Settings& s) {
    const Settings d;
    std::string out;
    const auto add = [&out](const std::string& option) { out += (out.empty() ? "" : " ") + option; };
    if (!s.cuda_graphs) add("--no-cuda-graphs");
    if (s.cuda_int_matvec != d.cuda_int_matvec) add(s.cuda_int_matvec ? "--cuda-matvec int16" : "--cuda-matvec f32");
    if (s.cuda_flash_attention != d.cuda_flash_attention)
        add(s.cuda_flash_attention ? "--cuda-attention mma" : "--cuda-attention warp");
    if (s.cuda_flash_pipeline != d.cuda_flash_pipeline)
        add(s.cuda_flash_pipeline ? "--cuda-flash-pipeline on" : "--cuda-flash-pipeline off");
    if (s.cuda_flash_warp_split != d.cuda_flash_warp_split)
        add(s.cuda_flash_warp_split ? "--cuda-flash-warps positions" : "--cuda-flash-warps rows");
    if (s.cuda_pdl != d.cuda_pdl) add(s.cuda_pdl ? "--cuda-pdl on" : "--cuda-pdl off");
    if (s.cuda_matvec_rows != d.cuda_matvec_rows) add("--cuda-matvec-rows " + std::to_string(s.cuda_matvec_rows));
    if (s.cuda_matvec_unit != d.cuda_matvec_unit) add("--cuda-matvec-unit " + std::to_string(s.cuda_matvec_unit));
    if (s.cuda_matvec_stages != d.cuda_matvec_stages)
        add("--cuda-matvec-stages " + std::to_string(s.cuda_matvec_stages));
    if (s.cuda_ring_fit != d.cuda_ring_fit)
        add(s.cuda_ring_fit ? "--cuda-ring-carveout fit" : "--cuda-ring-carveout max");
    if (s.cuda_int_mma != d.cuda_int_mma) add(s.cuda_int_mma ? "--cuda-matvec-mma on" : "--cuda-matvec-mma off");
    if (s.cuda_qkv_store != d.cuda_qkv_store)
        add(s.cuda_qkv_store ? "--cuda-kv-store product" : "--cuda-kv-store kernel");
    if (s.cuda_norm_fold != d.cuda_norm_fold) add(s.cuda_norm_fold ? "--cuda-norm product" : "--cuda-norm kernel");
    if (s.cuda_f16_block != d.cuda_f16_block)
        add(s.cuda_f16_block ? "--cuda-f16-matvec block" : "--cuda-f16-matvec warp");
    if (s.cuda_prompt_split != d.cuda_prompt_split)
        add(s.cuda_prompt_split < 0    ? "--cuda-short-prompt auto"
            : s.cuda_prompt_split == 1 ? "--cuda-short-prompt split"
                                       : "--cuda-short-prompt lanes");
    if (s.cuda_mma_gemm != d.cuda_mma_gemm) add(s.cuda_mma_gemm ? "--cuda-gemm mma" : "--cuda-gemm cublas");
    if (s.cuda_gemm_chunk_mib != d.cuda_gemm_chunk_mib)
        add("--cuda-gemm-chunk " + (s.cuda_gemm_chunk_mib < 0 ? "auto" : std::to_string(s.cuda_gemm_chunk_mib)));
    if (s.cuda_gemm_overlap != d.cuda_gemm_overlap)
        add(s.cuda_gemm_overlap ? "--cuda-gemm-overlap on" : "--cuda-gemm-overlap off");
    if (s.cuda_l2_prefetch != d.cuda_l2_prefetch)
        add(s.cuda_l2_prefetch ? "--cuda-prefetch on" : "--cuda-prefetch off");
    return out;
}

int cuda_device_index(const std::string& device) {
    return device.rfind("cuda", 0) == 0 && device.size() > 4 ? std::stoi(device.substr(4)) : 0;
}

}  // namespace kvgen
