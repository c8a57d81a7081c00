// The command line's own logic: llama.cpp's escapes, its flag spellings, device names and settings, and the chat
// formats with a system turn.
#include <catch2/catch.hpp>

#include "cli/chat.h"
#include "cli/llama_flags.h"
#include "cli/prompt.h"
#include "common/error.h"

using namespace kvgen;

namespace {

// A stand-in for kvgen's parser: which names are options, and which of them take a value.
int arity(const std::string& name) {
    for (const char* flag : {"--bench", "--special", "--single-turn", "--no-conversation", "-v", "--chat"})
        if (name == flag) return 0;
    for (const char* opt :
         {"-p", "-n", "-m", "-t", "--n-gpu-layers", "--device", "--flash-attn", "--cache-type-k", "--cache-type-v",
          "--threads-batch", "--system-prompt", "--system-prompt-file", "--reverse-prompt", "--repetitions", "-d"})
        if (name == opt) return 1;
    return -1;
}

std::vector<std::string> tr(std::vector<std::string> args) {
    return translate_llama_flags(args, arity);
}

std::string error_of(std::vector<std::string> args) {
    try {
        translate_llama_flags(args, arity);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("escapes are processed as llama.cpp does", "[cli]") {
    CHECK(process_escapes("a\\nb\\tc\\rd") == "a\nb\tc\rd");
    CHECK(process_escapes("\\\\ \\\" \\'") == "\\ \" '");
    CHECK(process_escapes("\\x41\\x4a\\x4A") == "AJJ");
    CHECK(process_escapes("\\x4") == "\\x4");  // not two hex digits: kept
    CHECK(process_escapes("\\xZZ") == "\\xZZ");
    CHECK(process_escapes("\\q \\") == "\\q \\");  // unknown escape and a final backslash: kept
    CHECK(process_escapes("") == "");
    CHECK(process_escapes("caf\xc3\xa9 \\n") == "caf\xc3\xa9 \n");
}

TEST_CASE("llama.cpp's multi-letter flags become kvgen's long names", "[cli]") {
    CHECK(tr({"-ngl", "99", "-p", "hi"}) == std::vector<std::string>{"--n-gpu-layers", "99", "-p", "hi"});
    CHECK(tr({"--gpu-layers", "0"}) == std::vector<std::string>{"--n-gpu-layers", "0"});
    CHECK(tr({"-dev", "CUDA0"}) == std::vector<std::string>{"--device", "CUDA0"});
    CHECK(tr({"-ctk", "f16", "-ctv", "f16"}) ==
          std::vector<std::string>{"--cache-type-k", "f16", "--cache-type-v", "f16"});
    CHECK(tr({"-tb", "2", "-sys", "Be brief.", "-sysf", "s.txt"}) ==
          std::vector<std::string>{"--threads-batch", "2", "--system-prompt", "Be brief.", "--system-prompt-file",
                                   "s.txt"});
    CHECK(tr({"-sp", "-no-cnv", "-st"}) == std::vector<std::string>{"--special", "--no-conversation", "--single-turn"});
    // A value that looks like a llama.cpp flag is left alone.
    CHECK(tr({"-p", "-cnv"}) == std::vector<std::string>{"-p", "-cnv"});
    CHECK(tr({"-p", "x", "--", "-cnv"}) == std::vector<std::string>{"-p", "x", "--", "-cnv"});
    CHECK(tr({"-p", "x", "-sp"}) == std::vector<std::string>{"-p", "x", "--special"});
}

TEST_CASE("llama.cpp's -fa takes on/off/auto, or nothing as older versions", "[cli]") {
    CHECK(tr({"-fa", "on", "-p", "x"}) == std::vector<std::string>{"--flash-attn", "on", "-p", "x"});
    CHECK(tr({"-fa", "-p", "x"}) == std::vector<std::string>{"--flash-attn", "on", "-p", "x"});
    CHECK(tr({"-p", "x", "-fa"}) == std::vector<std::string>{"-p", "x", "--flash-attn", "on"});
    CHECK(tr({"-fa", "OFF"}) == std::vector<std::string>{"--flash-attn", "OFF"});
}

TEST_CASE("llama.cpp's -r is the reverse prompt, or the repetition count with --bench", "[cli]") {
    CHECK(tr({"-p", "hi", "-r", "User:"}) == std::vector<std::string>{"-p", "hi", "--reverse-prompt", "User:"});
    CHECK(tr({"-r", "5", "-p", "hi"}) == std::vector<std::string>{"--reverse-prompt", "5", "-p", "hi"});
    CHECK(tr({"-r", "3", "--bench"}) == std::vector<std::string>{"--repetitions", "3", "--bench"});
    // Never a reverse prompt taken as a count.
    CHECK_THAT(error_of({"--bench", "-r", "User:"}), Catch::Contains("with --bench, -r is the number of repetitions"));
}

TEST_CASE("llama.cpp flags kvgen lacks are answered with the nearest option", "[cli]") {
    CHECK(tr({"-cnv", "-p", "Be brief."}) == std::vector<std::string>{"--conversation", "-p", "Be brief."});
    for (const char* f : {"-if", "-mli", "--in-prefix"})
        CHECK_THAT(error_of({f}), Catch::Contains("the conversation: -cnv (or -i)"));
    CHECK(tr({"-cnv", "-st", "-p", "hi"}) == std::vector<std::string>{"--single-turn", "-p", "hi"});
    CHECK_THAT(error_of({"-ub", "512"}), Catch::Contains("-b/--batch-size"));
    CHECK_THAT(error_of({"-hf", "org/model"}), Catch::Contains("-m FILE"));
    CHECK_THAT(error_of({"-mg", "1"}), Catch::Contains("--device cudaN"));
    CHECK_THAT(error_of({"--jinja"}), Catch::Contains("--chat"));
    // An unknown multi-letter flag with one dash is named, not split into -c and "o".
    CHECK_THAT(error_of({"-co"}), Catch::Contains("unknown option '-co'"));
    CHECK(error_of({"-n", "5"}).empty());
}

TEST_CASE("device names: kvgen's and llama.cpp's", "[cli]") {
    CHECK(normalize_device("cpu") == "cpu");
    CHECK(normalize_device("none") == "cpu");
    CHECK(normalize_device("auto") == "auto");
    CHECK(normalize_device("cuda") == "cuda");
    CHECK(normalize_device("CUDA0") == "cuda0");
    CHECK(normalize_device("cuda1") == "cuda1");
    CHECK_THROWS_WITH(normalize_device("CUDA0,CUDA1"), Catch::Contains("one device"));
    CHECK_THROWS_WITH(normalize_device("tpu"), Catch::Contains("expected cpu, cuda"));
    CHECK_THROWS(normalize_device("cuda-1"));
}

TEST_CASE("the bench backend column names the CUDA options that differ from the defaults", "[cli]") {
    Settings s;
    CHECK(cuda_options_name(s).empty());
    s.cuda_mma_gemm = true;
    CHECK(cuda_options_name(s) == "--cuda-gemm mma");
    s.cuda_pdl = false;
    s.cuda_graphs = false;
    CHECK(cuda_options_name(s) == "--no-cuda-graphs --cuda-pdl off --cuda-gemm mma");
    s.cuda_matvec_rows = 4;
    CHECK(cuda_options_name(s) == "--no-cuda-graphs --cuda-pdl off --cuda-matvec-rows 4 --cuda-gemm mma");
    s.cuda_gemm_chunk_mib = 0;
    CHECK(cuda_options_name(s) ==
          "--no-cuda-graphs --cuda-pdl off --cuda-matvec-rows 4 --cuda-gemm mma --cuda-gemm-chunk 0");
    s.cuda_gemm_chunk_mib = 16;  // the fixed chunk before auto became the default
    CHECK(cuda_options_name(s) ==
          "--no-cuda-graphs --cuda-pdl off --cuda-matvec-rows 4 --cuda-gemm mma --cuda-gemm-chunk 16");
    CHECK(Settings{}.cuda_gemm_chunk_mib < 0);  // auto
    s = Settings{};
    s.cuda_gemm_overlap = false;
    CHECK(cuda_options_name(s) == "--cuda-gemm-overlap off");
    CHECK(Settings{}.cuda_l2_prefetch);
    s.cuda_l2_prefetch = false;
    CHECK(cuda_options_name(s) == "--cuda-gemm-overlap off --cuda-prefetch off");
    s.cuda_l2_prefetch = true;
    s.cuda_matvec_unit = 32;
    CHECK(cuda_options_name(s) == "--cuda-matvec-unit 32 --cuda-gemm-overlap off");
    s.cuda_flash_pipeline = false;
    CHECK(cuda_options_name(s) == "--cuda-flash-pipeline off --cuda-matvec-unit 32 --cuda-gemm-overlap off");
    s.cuda_matvec_stages = 0;
    CHECK(cuda_options_name(s) ==
          "--cuda-flash-pipeline off --cuda-matvec-unit 32 --cuda-matvec-stages 0 --cuda-gemm-overlap off");
    s = Settings{};
    CHECK(Settings{}.cuda_ring_fit);
    s.cuda_ring_fit = false;
    CHECK(cuda_options_name(s) == "--cuda-ring-carveout max");
    Settings t;
    t.cuda_int_matvec = t.cuda_flash_attention = t.cuda_qkv_store = false;
    CHECK(cuda_options_name(t) == "--cuda-matvec f32 --cuda-attention warp --cuda-kv-store kernel");
    t.cuda_norm_fold = false;
    CHECK(cuda_options_name(t) == "--cuda-matvec f32 --cuda-attention warp --cuda-kv-store kernel --cuda-norm kernel");
    CHECK(Settings{}.cuda_flash_warp_split);
    Settings w;
    w.cuda_flash_warp_split = false;
    w.cuda_flash_pipeline = false;
    CHECK(cuda_options_name(w) == "--cuda-flash-pipeline off --cuda-flash-warps rows");
    t.cuda_f16_block = false;
    t.cuda_int_matvec = t.cuda_flash_attention = t.cuda_qkv_store = t.cuda_norm_fold = true;
    CHECK(cuda_options_name(t) == "--cuda-f16-matvec warp");
    CHECK(Settings{}.cuda_prompt_split == -1);  // auto
    t.cuda_prompt_split = 0;
    CHECK(cuda_options_name(t) == "--cuda-f16-matvec warp --cuda-short-prompt lanes");
    t.cuda_prompt_split = 1;
    CHECK(cuda_options_name(t) == "--cuda-f16-matvec warp --cuda-short-prompt split");
    t.cuda_prompt_split = -1;
    t.cuda_int_mma = true;  // after the stages, before the K/V store, as the fields are
    CHECK(cuda_options_name(t) == "--cuda-matvec-mma on --cuda-f16-matvec warp");
    CHECK_FALSE(Settings{}.cuda_int_mma);
}

TEST_CASE("llama.cpp's -ngl, -fa, -ctk/-ctv and -tb fold into kvgen's settings", "[cli]") {
    auto apply = [](LlamaSettings s, std::string device = "auto", bool kv_given = false, KvType kv = KvType::F16,
                    int threads = 0) {
        Settings run;
        run.device = device;
        run.kv_type_k = run.kv_type_v = kv;
        run.n_threads = threads;
        apply_llama_settings(s, run, kv_given);
        return std::make_pair(run.device, kv_types_name(run.kv_type_k, run.kv_type_v));
    };
    LlamaSettings s;
    s.n_gpu_layers = "99";
    CHECK(apply(s).first == "cuda");
    s.n_gpu_layers = "all";
    CHECK(apply(s).first == "cuda");
    s.n_gpu_layers = "0";
    CHECK(apply(s).first == "cpu");
    s.n_gpu_layers = "auto";
    CHECK(apply(s).first == "auto");
    s.n_gpu_layers = "0";
    CHECK(apply(s, "cpu").first == "cpu");
    CHECK_THROWS_WITH(apply(s, "cuda"), Catch::Contains("disagree"));
    s.n_gpu_layers = "lots";
    CHECK_THROWS_WITH(apply(s), Catch::Contains("expected a number of layers"));

    LlamaSettings fa;
    fa.flash_attn = "on";
    CHECK_NOTHROW(apply(fa));
    fa.flash_attn = "auto";
    CHECK_NOTHROW(apply(fa));
    fa.flash_attn = "off";
    CHECK_THROWS_WITH(apply(fa), Catch::Contains("no unfused attention"));
    fa.flash_attn = "sometimes";
    CHECK_THROWS_WITH(apply(fa), Catch::Contains("expected on, off or auto"));

    LlamaSettings ct;
    ct.cache_type_k = "f32";
    ct.cache_type_v = "f32";
    CHECK(apply(ct).second == "f32");
    CHECK_THROWS_WITH(apply(ct, "auto", true, KvType::F16), Catch::Contains("-ctk f32 and --kv-type f16 disagree on the K type"));
    CHECK(apply(ct, "auto", true, KvType::F32).second == "f32");
    ct.cache_type_v = "f16";
    CHECK(apply(ct).second == "f32/f16");
    ct.cache_type_k = "q8_0";
    ct.cache_type_v = "q4_0";
    CHECK(apply(ct).second == "q8_0/q4_0");
    ct.cache_type_v = "";
    CHECK(apply(ct).second == "q8_0/f16");
    CHECK(apply(ct, "auto", true, KvType::Q8_0).second == "q8_0");
    ct.cache_type_k = ct.cache_type_v = "q4_0";
    CHECK(apply(ct).second == "q4_0");
    ct.cache_type_k = "q5_1";
    CHECK_THROWS_WITH(apply(ct), Catch::Contains("-ctk q5_1: this KV cache type is not supported"));

    LlamaSettings tb;
    tb.threads_batch = 2;
    CHECK_NOTHROW(apply(tb, "auto", false, KvType::F16, 2));
    CHECK_THROWS_WITH(apply(tb, "auto", false, KvType::F16, 4), Catch::Contains("use -t 2"));
    CHECK_THROWS_WITH(apply(tb), Catch::Contains("use -t 2"));
}

TEST_CASE("a system prompt (-sys) replaces the system turn in every chat format", "[cli][chat]") {
    const std::string chatml =
        "{% for m in messages %}{% if loop.first and m.role != 'system' %}<|im_start|>system\nYou are a helpful "
        "assistant.<|im_end|>\n{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
    CHECK(apply_chat_template(chatml, "hi") ==
          "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
          "<|im_start|>assistant\n");
    CHECK(apply_chat_template(chatml, "hi", "Be brief.") ==
          "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    CHECK(apply_chat_template("<|start_header_id|>", "hi", "Be brief.") ==
          "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>"
          "\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    CHECK(apply_chat_template("<|user|> <|end|>", "hi", "Be brief.") ==
          "<|system|>\nBe brief.<|end|>\n<|user|>\nhi<|end|>\n<|assistant|>\n");
    CHECK(apply_chat_template("<|user|>", "hi", "Be brief.") ==
          "<|system|>\nBe brief.</s>\n<|user|>\nhi</s>\n<|assistant|>\n");
    CHECK(apply_chat_template("[INST]", "hi", "Be brief.") == "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nhi [/INST]");
    CHECK(apply_chat_template("[INST]", "hi") == "[INST] hi [/INST]");
}
