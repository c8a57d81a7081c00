#include "cli/inspect.h"

#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/format.h"
#include "common/error.h"
#include "engine/kv_layout.h"
#include "gguf/gguf.h"
#include "model/config.h"
#include "model/weights.h"

namespace kvgen {

namespace {

struct TypeStats {
    int count = 0;
    uint64_t bytes = 0;
    int64_t elements = 0;
};

std::string meta_string(const GgufFile& f, const char* key) {
    const GgufValue* v = f.find(key);
    return v && v->type() == GgufValueType::STRING ? v->as_string() : "";
}

// A metadata value for --json: numbers and booleans as JSON values, strings whole (a chat template included),
// arrays as "type[n]".
nlohmann::ordered_json json_value(const GgufValue& v) {
    switch (v.type()) {
        case GgufValueType::STRING: return v.as_string();
        case GgufValueType::BOOL: return v.as_bool();
        case GgufValueType::ARRAY: return v.describe();
        case GgufValueType::F32:
        case GgufValueType::F64: return v.as_f64();
        case GgufValueType::U64: return v.as_u64();
        default: return v.as_i64();  // the other integer types fit
    }
}

}  // namespace

void run_inspect(const std::string& model_path, const std::string& json_path, bool verbose, KvType kt, KvType vt) {
    GgufFile file = GgufFile::open(model_path);
    const bool vocab_only = file.tensors().empty();
    const std::string arch = gguf_architecture(file);

    // A file with weights must be a model kvgen can run: the same checks as loading it for generation.
    Config cfg;
    ModelWeights weights;
    const bool has_config = !vocab_only || arch == "llama";
    if (has_config) cfg = Config::from_gguf(file);
    if (!vocab_only) weights = bind_weights(file, cfg);

    std::map<std::string, TypeStats> types;
    int64_t n_params = 0;
    for (const GgufTensor& t : file.tensors()) {
        TypeStats& s = types[ggml_type_name(t.type)];
        ++s.count;
        s.bytes += t.nbytes;
        s.elements += t.n_elements();
        n_params += t.n_elements();
    }
    const std::string tok_model = meta_string(file, "tokenizer.ggml.model");
    const std::string tok_pre = meta_string(file, "tokenizer.ggml.pre");
    const GgufValue* tokens = file.find("tokenizer.ggml.tokens");
    // note: a quantized type on a head_dim it cannot hold is refused when a cache is made; here the f16 figure stands.
    const bool chosen_fits = !has_config || cfg.head_dim % 32 == 0 || (!kv_type_quantized(kt) && !kv_type_quantized(vt));
    if (!chosen_fits) kt = vt = KvType::F16;
    const int64_t kv_per_token = has_config ? KvLayout::of(cfg, 1, kt, vt).bytes_per_token() : 0;
    const int64_t kv_total = kv_per_token * (has_config ? cfg.n_ctx_train : 0);

    if (!json_path.empty()) {
        nlohmann::ordered_json j;
        j["file"] = model_path;
        j["file_size"] = file.file_size();
        j["gguf_version"] = file.version();
        j["n_tensors"] = file.tensors().size();
        j["architecture"] = arch;
        j["vocab_only"] = vocab_only;
        if (has_config) {
            j["name"] = cfg.name;
            j["n_params"] = n_params;
            j["n_layers"] = cfg.n_layers;
            j["n_heads"] = cfg.n_heads;
            j["n_kv_heads"] = cfg.n_kv_heads;
            j["head_dim"] = cfg.head_dim;
            j["n_embd"] = cfg.n_embd;
            j["n_ff"] = cfg.n_ff;
            j["n_vocab"] = cfg.n_vocab;
            j["n_ctx_train"] = cfg.n_ctx_train;
            j["rope_base"] = cfg.rope_base;
            j["rope_dim"] = cfg.rope_dim;
            j["rope_scaling"] = cfg.rope_scaling == RopeScaling::Linear ? "linear" : "none";
            j["rope_scale"] = cfg.rope_scale;
            j["rms_eps"] = cfg.rms_eps;
            if (!vocab_only) {
                j["tied_output"] = weights.tied_output;
                j["rope_freqs"] = weights.rope_freqs.tensor != nullptr;
                // Decode reads every weight once per token, except the embedding table (one row is looked up)
                // unless it doubles as the output projection.
                uint64_t per_token = 0;
                for (const GgufTensor& t : file.tensors()) per_token += t.nbytes;
                if (!weights.tied_output) per_token -= weights.token_embd.tensor->nbytes;
                j["weight_bytes_per_token"] = per_token;
            }
            j["kv_cache"] = {{"type", kv_types_name(kt, vt)},
                             {"bytes_per_token", kv_per_token},
                             {"n_ctx", cfg.n_ctx_train},
                             {"bytes", kv_total}};
            // Every --kv-type: bytes per token and for the trained context (null where the type cannot hold it).
            nlohmann::ordered_json types = nlohmann::ordered_json::object();
            for (KvType t : {KvType::F16, KvType::F32, KvType::Q8_0, KvType::Q4_0}) {
                const KvLayout kv = KvLayout::of(cfg, cfg.n_ctx_train, t);
                if (kv_type_quantized(t) && cfg.head_dim % 32 != 0)
                    types[kv_type_name(t)] = nullptr;
                else
                    types[kv_type_name(t)] = {{"bytes_per_token", kv.bytes_per_token()}, {"bytes", kv.bytes()}};
            }
            j["kv_cache_types"] = types;
        }
        j["tokenizer"] = {{"model", tok_model}, {"pre", tok_pre}, {"n_tokens", tokens ? tokens->size() : 0}};
        nlohmann::ordered_json jt = nlohmann::ordered_json::object();
        for (const auto& [name, s] : types) jt[name] = {{"tensors", s.count}, {"bytes", s.bytes}, {"params", s.elements}};
        j["tensor_types"] = jt;
        if (verbose) {
            nlohmann::ordered_json jm = nlohmann::ordered_json::object();
            for (const auto& [key, v] : file.metadata()) jm[key] = json_value(v);
            j["metadata"] = jm;
        }
        // note: a string that is not valid UTF-8 (a file can hold one) is written with U+FFFD in its place.
        write_text_file(json_path, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
        return;
    }

    std::string out;
    auto line = [&out](const std::string& label, const std::string& value) {
        out += fmt::format("{:<14}{}\n", label + ":", value);
    };
    line("file", fmt::format("{} ({}, GGUF v{}, {} tensors, {} metadata keys)", model_path,
                             human_bytes(double(file.file_size())), file.version(), file.tensors().size(),
                             file.metadata().size()));
    line("architecture", arch.empty() ? "(none)" : arch);
    if (has_config) {
        line("name", cfg.name);
        if (!vocab_only) line("parameters", fmt::format("{} ({})", human_count(double(n_params)), n_params));
        line("layers", std::to_string(cfg.n_layers));
        line("heads", cfg.n_kv_heads == cfg.n_heads
                          ? fmt::format("{} (KV heads {}, multi-head)", cfg.n_heads, cfg.n_kv_heads)
                          : fmt::format("{} (KV heads {}, grouped-query {}:1)", cfg.n_heads, cfg.n_kv_heads,
                                        cfg.n_rep()));
        line("head_dim", std::to_string(cfg.head_dim));
        line("n_embd", std::to_string(cfg.n_embd));
        line("n_ff", std::to_string(cfg.n_ff));
        line("vocab", std::to_string(cfg.n_vocab));
        line("context", fmt::format("{} (trained)", cfg.n_ctx_train));
        line("rope", fmt::format("base {}, {} of {} dims rotated{}{}", cfg.rope_base, cfg.rope_dim, cfg.head_dim,
                                 cfg.rope_scaling == RopeScaling::Linear
                                     ? fmt::format(", linear scaling x{}", cfg.rope_scale)
                                     : "",
                                 weights.rope_freqs.tensor ? ", rope_freqs factors" : ""));
        line("rms_eps", fmt::format("{:g}", cfg.rms_eps));
        if (!vocab_only) line("output", weights.tied_output ? "tied to token_embd" : "separate output.weight");
    }
    line("tokenizer", tok_model.empty() ? "(none)"
                                        : fmt::format("{}{}, {} tokens", tok_model,
                                                      tok_pre.empty() ? "" : " (pre " + tok_pre + ")",
                                                      tokens ? tokens->size() : 0));
    if (vocab_only) {
        out += "vocabulary-only file: no tensors\n";
    } else {
        out += "tensor types:\n";
        for (const auto& [name, s] : types)
            out += fmt::format("  {:<6} {:>5} tensors {:>10} params {:>10}\n", name, s.count,
                               human_count(double(s.elements)), human_bytes(double(s.bytes)));
    }
    if (has_config)
    {
        out += fmt::format("KV cache ({}): {} per token, {} for {} tokens\n", kv_types_name(kt, vt),
                           human_bytes(double(kv_per_token)), human_bytes(double(kv_total)), cfg.n_ctx_train);
        std::string others;
        for (KvType t : {KvType::F16, KvType::F32, KvType::Q8_0, KvType::Q4_0}) {
            if ((kv_type_quantized(t) && cfg.head_dim % 32 != 0) || (t == kt && t == vt)) continue;
            const KvLayout kv = KvLayout::of(cfg, cfg.n_ctx_train, t);
            others += fmt::format("{}{} {} per token, {}", others.empty() ? "" : "; ", kv_type_name(t),
                                  human_bytes(double(kv.bytes_per_token())), human_bytes(double(kv.bytes())));
        }
        out += fmt::format("  other --kv-type: {}\n", others);
    }
    if (verbose) {
        out += "metadata:\n";
        for (const auto& [key, v] : file.metadata()) out += fmt::format("  {} = {}\n", key, v.describe());
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
}

}  // namespace kvgen
