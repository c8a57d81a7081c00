#include "cli/llama_flags.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "common/error.h"

namespace kvgen {

namespace {

struct Rename {
    const char* from;
    const char* to;
};

// llama.cpp spellings with a kvgen option of the same meaning.
const Rename kRenames[] = {
    {"-ngl", "--n-gpu-layers"}, {"--gpu-layers", "--n-gpu-layers"}, {"-dev", "--device"},
    {"-fa", "--flash-attn"},    {"-ctk", "--cache-type-k"},         {"-ctv", "--cache-type-v"},
    {"-tb", "--threads-batch"}, {"-sys", "--system-prompt"},        {"-sysf", "--system-prompt-file"},
    {"-st", "--single-turn"},   {"-no-cnv", "--no-conversation"},   {"-sp", "--special"},
    {"-cnv", "--conversation"}, {"-pg", "--prompt-gen"},
};

struct Answer {
    std::vector<const char*> names;
    const char* answer;
};

// llama.cpp flags kvgen has no counterpart for, each with the nearest thing kvgen offers.
const std::vector<Answer>& answers() {
    static const std::vector<Answer> a = {
        {{"-if", "--interactive-first", "-mli", "--multiline-input", "--in-prefix", "--in-suffix", "--in-prefix-bos"},
         "kvgen's interactive mode is the conversation: -cnv (or -i) reads one message per line in the model's chat "
         "format"},
        {{"-ub", "--ubatch-size"}, "kvgen has one batch size for prompt processing: -b/--batch-size N"},
        {{"-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-mu", "--model-url"},
         "kvgen does not download models: give a local GGUF file with -m FILE"},
        {{"-mg", "--main-gpu"}, "choose the GPU with --device cudaN (or -dev CUDAN)"},
        {{"-sm", "--split-mode", "-ts", "--tensor-split"}, "kvgen runs a model on one device: --device cpu|cuda"},
        {{"--jinja", "--chat-template", "--chat-template-file"},
         "--chat formats the prompt with the model's own template family (ChatML, Llama 2, Llama 3, Zephyr, Phi-3); "
         "kvgen does not run Jinja templates"},
    };
    return a;
}

bool is_integer(const std::string& s) {
    size_t i = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
    if (i == s.size()) return false;
    for (; i < s.size(); ++i)
        if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
    return true;
}

// One dash and two or more letters: llama.cpp style, which CLI11 would split into a short flag and a value.
bool multi_letter_single_dash(const std::string& s) {
    if (s.size() < 3 || s[0] != '-' || s[1] == '-') return false;
    return std::all_of(s.begin() + 1, s.end(),
                       [](char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '-'; });
}

std::string lower(std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

const char* const kOnOff[] = {"on", "off", "auto", "enabled", "disabled", "true", "false", "1", "0", "-1"};

}  // namespace

std::vector<std::string> translate_llama_flags(const std::vector<std::string>& args, const OptionArity& arity) {
    const bool bench = std::find(args.begin(), args.end(), "--bench") != args.end();
    const bool single_turn = std::find_if(args.begin(), args.end(), [](const std::string& a) {
                                 return a == "-st" || a == "--single-turn";
                             }) != args.end();
    std::vector<std::string> out;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& arg = args[i];
        if (arg == "--") {
            out.insert(out.end(), args.begin() + long(i), args.end());
            break;
        }
        const size_t eq = arg.rfind("--", 0) == 0 ? arg.find('=') : std::string::npos;
        std::string name = arg.substr(0, eq);
        const bool has_value = eq != std::string::npos;

        if ((name == "-cnv" || name == "--conversation") && single_turn) continue;  // -cnv -st: one chat turn
        for (const Answer& a : answers())
            if (std::find_if(a.names.begin(), a.names.end(), [&](const char* n) { return name == n; }) != a.names.end())
                throw Error(fmt::format("{}: {}", name, a.answer));
        for (const Rename& r : kRenames)
            if (name == r.from) name = r.to;
        if (name == "-r") name = bench ? "--repetitions" : "--reverse-prompt";

        const int n_values = arity(name);
        if (n_values < 0 && multi_letter_single_dash(name))
            throw Error(fmt::format("unknown option '{}' (options with one dash are one letter; see --help)", name));
        out.push_back(has_value ? name + arg.substr(eq) : name);
        if (n_values <= 0 || has_value) continue;
        const bool next_is_value = i + 1 < args.size();
        if (name == "--flash-attn" && (!next_is_value || std::find(std::begin(kOnOff), std::end(kOnOff),
                                                                   lower(args[i + 1])) == std::end(kOnOff))) {
            out.push_back("on");  // older llama.cpp: -fa was a flag without a value
            continue;
        }
        if (!next_is_value) continue;
        const std::string& value = args[i + 1];
        if (name == "--repetitions" && bench && !is_integer(value))
            throw Error(
                fmt::format("-r '{}': with --bench, -r is the number of repetitions (llama-bench's -r); a "
                            "reverse prompt (llama-completion's -r) applies to generation only",
                            value));
        out.push_back(value);
        ++i;
    }
    return out;
}

std::string normalize_device(const std::string& value) {
    if (value.find(',') != std::string::npos)
        throw Error(fmt::format("--device '{}': kvgen runs a model on one device (cpu, cuda, cudaN or auto)", value));
    const std::string v = lower(value);
    if (v == "cpu" || v == "none") return "cpu";
    if (v == "auto" || v == "cuda") return v;
    // note: at most 4 digits, so the index fits an int (no machine has 10,000 GPUs)
    if (v.rfind("cuda", 0) == 0 && v.size() > 4 && v.size() <= 8 && is_integer(v.substr(4)) && v[4] != '-' &&
        v[4] != '+')
        return "cuda" + std::to_string(std::stoi(v.substr(4)));
    throw Error(
        fmt::format("--device '{}': expected cpu, cuda, cudaN (CUDA0 as llama.cpp names it), none or auto", value));
}

void apply_llama_settings(const LlamaSettings& s, Settings& run, bool kv_type_given) {
    std::string& device = run.device;
    if (!s.n_gpu_layers.empty()) {
        const std::string v = lower(s.n_gpu_layers);
        std::string want;
        if (v == "auto" || v == "-1") {
            want = "auto";
        } else if (v == "all") {
            want = "cuda";
        } else if (is_integer(v) && v[0] != '-') {  // any count of layers, however large: 0 or more than 0
            want = v.find_first_not_of("+0") != std::string::npos ? "cuda" : "cpu";
        } else {
            throw Error(
                fmt::format("-ngl/--n-gpu-layers '{}': expected a number of layers, auto or all", s.n_gpu_layers));
        }
        if (device == "auto") {
            device = want;
        } else if (want != "auto" && (want == "cpu") != (device == "cpu")) {
            throw Error(fmt::format("-ngl {} and --device {} disagree (-ngl 0 is the CPU, N > 0 the GPU)",
                                    s.n_gpu_layers, device));
        }
    }

    if (!s.flash_attn.empty()) {
        const std::string v = lower(s.flash_attn);
        if (v == "off" || v == "disabled" || v == "false" || v == "0")
            throw Error(
                fmt::format("-fa {}: kvgen has no unfused attention; its attention always runs as one fused "
                            "pass (drop -fa)",
                            s.flash_attn));
        if (std::find(std::begin(kOnOff), std::end(kOnOff), v) == std::end(kOnOff))
            throw Error(fmt::format("-fa/--flash-attn '{}': expected on, off or auto", s.flash_attn));
    }

    // -ctk sets K's type and -ctv V's; where --kv-type was given too, they must agree with it.
    auto cache_type = [&](const std::string& given, const char* flag, KvType* type, const char* which) {
        if (given.empty()) return;
        const std::string v = lower(given);
        KvType t;
        try {
            t = kv_type_from_name(v, flag);
        } catch (const Error&) {
            throw Error(fmt::format("{} {}: this KV cache type is not supported (kvgen: --kv-type {})", flag, v,
                                    kv_type_names()));
        }
        if (kv_type_given && t != *type)
            throw Error(fmt::format("{} {} and --kv-type {} disagree on the {} type (give one of them)", flag, v,
                                    kv_types_name(run.kv_type_k, run.kv_type_v), which));
        *type = t;
    };
    cache_type(s.cache_type_k, "-ctk", &run.kv_type_k, "K");
    cache_type(s.cache_type_v, "-ctv", &run.kv_type_v, "V");

    if (s.threads_batch > 0 && s.threads_batch != run.n_threads)
        throw Error(
            fmt::format("-tb/--threads-batch {}: kvgen runs prompt processing and generation on the same "
                        "threads; use -t {}",
                        s.threads_batch, s.threads_batch));
}

}  // namespace kvgen
