// Prompt-cache files: a hit gives exactly the tokens and logits of a cold run (the stored prompt equal to the new one,
// a prefix of it, longer than it, or parting from it in the middle; greedy and sampled), and a file that does not
// belong (another model, another KV type, damaged, truncated, not a cache at all) is refused with its reason and
// leaves an empty cache.
#include <cstdio>
#include <cstring>

#include <sys/stat.h>

#include "cli/prompt_cache.h"
#include "cpu/cpu_backend.h"
#include "engine/generator.h"
#include "engine/kv_offset.h"
#include "model/weights.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace kvgen;

namespace {

struct Run {
    std::vector<int32_t> tokens;
    std::vector<float> logits;  // [n steps][n_vocab]
    int n_reused = 0;
};

std::unique_ptr<Backend> backend_for(const Model& model, KvType kv = KvType::F16, int n_ctx = 160) {
    Settings s;
    s.n_ctx = n_ctx;
    s.n_threads = 2;
    s.n_batch = 16;  // several batches per prompt, so that a hit and a cold run split the prompt differently
    s.kv_type_k = s.kv_type_v = kv;
    return cpu::make_backend(model, s);
}

Run generate(const Model& model, Backend& backend, const std::vector<int32_t>& prompt, int n_reused, float temp) {
    GenerateOptions g;
    g.n_predict = 12;
    g.n_reused = n_reused;
    g.sampler.temp = temp;
    g.sampler.seed = 77;
    Run r;
    const int n_vocab = model.config.n_vocab;
    r.tokens = Generator(backend)
                   .run(prompt, g,
                        [&](int32_t, const float* l) {
                            r.logits.insert(r.logits.end(), l, l + n_vocab);
                            return true;
                        },
                        nullptr, n_vocab)
                   .tokens;
    r.n_reused = std::min(n_reused, int(prompt.size()) - 1);
    return r;
}

std::string temp_path(const char* name) { return test::temp_dir() + "/" + name; }  // removed by each test

}  // namespace

TEST_CASE("a prompt-cache hit gives exactly the tokens and logits of a cold run", "[prompt-cache]") {
    const Model model = Model::load(test::shared("testdata/ref/open-gqa-Q4_K_M.gguf"));
    const Tokenizer tok = Tokenizer::from_gguf(model.file);
    const uint64_t fp = model_fingerprint(model);
    const std::string path = temp_path("hit.kvpc");
    const std::string base_text =
        "The KV cache stores the keys and values of earlier tokens, so that each new token attends to them "
        "without computing them again.";
    const auto stored = tok.encode(base_text, true);
    struct Case {
        const char* what;
        std::vector<int32_t> prompt;
    };
    std::vector<int32_t> longer =
        tok.encode(base_text + " A longer prompt goes on from where the stored one ended.", true);
    std::vector<int32_t> shorter(stored.begin(), stored.begin() + int(stored.size()) * 2 / 3);
    std::vector<int32_t> parted(stored.begin(), stored.begin() + int(stored.size()) / 2);
    const auto tail = tok.encode(" and then something else entirely follows in this one.", false);
    parted.insert(parted.end(), tail.begin(), tail.end());
    std::vector<int32_t> parted_early(stored.begin(), stored.begin() + kKvOffsetPositions / 2);
    parted_early.insert(parted_early.end(), tail.begin(), tail.end());
    const Case cases[] = {{"the same prompt", stored},
                          {"the stored prompt a prefix of the new one", longer},
                          {"the new prompt a prefix of the stored one", shorter},
                          {"prompts that part in the middle", parted},
                          {"prompts that part before the key offsets' positions end", parted_early}};
    // note: a quantized K's rows past the first kKvOffsetPositions carry key offsets that follow from those first
    // rows; prompts that part early share fewer than kKvOffsetPositions tokens, so there the offsets are set after
    // loading
    REQUIRE(int(stored.size()) > kKvOffsetPositions);
    for (KvType kv : {KvType::F16, KvType::Q4_0})
    for (float temp : {0.0f, 0.8f}) {
        for (const Case& c : cases) {
            INFO(c.what << (temp == 0 ? ", greedy" : ", sampled") << ", KV " << kv_type_name(kv));
            std::remove(path.c_str());
            {  // the stored run writes the file
                auto b = backend_for(model, kv);
                const Run first = generate(model, *b, stored, 0, temp);
                save_prompt_cache(path, *b, fp, MathMode::Exact, stored, 1.0);
            }
            auto cold_backend = backend_for(model, kv);
            const Run cold = generate(model, *cold_backend, c.prompt, 0, temp);
            auto hit_backend = backend_for(model, kv);
            const PromptCacheLoad pc = load_prompt_cache(path, *hit_backend, fp, MathMode::Exact, c.prompt);
            CHECK(pc.problem.empty());
            CHECK(pc.n_file == int(stored.size()));
            CHECK(pc.n_reused > 0);
            CHECK(pc.n_reused < int(c.prompt.size()));
            const Run hit = generate(model, *hit_backend, c.prompt, pc.n_reused, temp);
            CHECK(hit.tokens == cold.tokens);
            CHECK(hit.logits == cold.logits);
        }
    }
    std::remove(path.c_str());
}

TEST_CASE("a prompt-cache file that does not belong is refused with its reason, and the run is cold",
          "[prompt-cache]") {
    const Model model = Model::load(test::shared("testdata/ref/open-gqa-Q4_K_M.gguf"));
    const Model other = Model::load(test::shared("testdata/ref/open-gqa-Q8_0.gguf"));
    const Tokenizer tok = Tokenizer::from_gguf(model.file);
    const uint64_t fp = model_fingerprint(model);
    CHECK(fp == model_fingerprint(model));
    CHECK(fp != model_fingerprint(other));
    const auto prompt = tok.encode("Attention over the cache reads every earlier key and value.", true);
    const std::string path = temp_path("bad.kvpc");
    {
        auto b = backend_for(model);
        generate(model, *b, prompt, 0, 0.0f);
        save_prompt_cache(path, *b, fp, MathMode::Exact, prompt, 1.0);
    }
    const std::string good = test::read_text(path);
    auto write = [&](const std::string& bytes) { test::write_text(path, bytes); };
    auto problem = [&](const Model& m, uint64_t f, KvType kv) {
        auto b = backend_for(m, kv);
        const PromptCacheLoad pc = load_prompt_cache(path, *b, f, MathMode::Exact, prompt);
        CHECK(b->n_past() == (pc.problem.empty() ? pc.n_reused : 0));
        return pc.problem;
    };
    CHECK(problem(model, fp, KvType::F16).empty());
    CHECK(problem(other, model_fingerprint(other), KvType::F16) == "written for another model");
    CHECK(problem(model, fp, KvType::Q8_0).find("its KV cache type is f16 (this run: q8_0)") != std::string::npos);
    {  // a quantized K's offsets cover the dimensions that turn slowly over the context: another -c, others
        auto b = backend_for(model, KvType::Q4_0);
        generate(model, *b, prompt, 0, 0.0f);
        save_prompt_cache(path, *b, fp, MathMode::Exact, prompt, 1.0);
        REQUIRE(b->kv_layout().k_offset_dim0 != backend_for(model, KvType::Q4_0, 8000)->kv_layout().k_offset_dim0);
        auto other_ctx = backend_for(model, KvType::Q4_0, 8000);
        const PromptCacheLoad pc = load_prompt_cache(path, *other_ctx, fp, MathMode::Exact, prompt);
        CHECK(pc.problem.find("another --ctx-size") != std::string::npos);
        CHECK(other_ctx->n_past() == 0);
        write(good);
    }
    {  // a file of the format before key offsets (version 1) is refused: its later quantized keys carry none
        std::string old = good;
        const uint32_t v1 = 1;
        std::memcpy(old.data() + 8, &v1, 4);  // after the 8-byte magic
        write(old);
        CHECK(problem(model, fp, KvType::F16) == "format version 1 (this kvgen reads 3)");
        write(good);
    }
    {  // rows computed with another --math are not this run's: the products round activations differently
        auto b = backend_for(model);
        generate(model, *b, prompt, 0, 0.0f);
        save_prompt_cache(path, *b, fp, MathMode::Fast, prompt, 1.0);
        auto exact = backend_for(model);
        const PromptCacheLoad pc = load_prompt_cache(path, *exact, fp, MathMode::Exact, prompt);
        CHECK(pc.problem == "its rows were computed with --math fast (this run: exact)");
        CHECK(prompt_cache_foreign(path).empty());
        CHECK(exact->n_past() == 0);
        write(good);
    }
    auto foreign = [&] { return !prompt_cache_foreign(path).empty(); };
    write(good.substr(0, good.size() - 100));
    CHECK(problem(model, fp, KvType::F16).find("truncated") != std::string::npos);
    CHECK_FALSE(foreign());  // a cache file, damaged: the next save replaces it
    write(good.substr(0, 5));
    CHECK_FALSE(foreign());
    write("");
    CHECK_FALSE(foreign());
    std::string flipped = good;
    flipped[flipped.size() / 2] = char(flipped[flipped.size() / 2] ^ 0x40);
    write(flipped);
    CHECK(problem(model, fp, KvType::F16).find("checksum") != std::string::npos);
    write("GGUF and then nothing that a prompt cache would hold, but long enough to have a header and more........");
    CHECK(problem(model, fp, KvType::F16) == "not a kvgen prompt-cache file");
    CHECK(foreign());  // another kind of file (a model given by mistake): never overwritten
    write("short");
    CHECK(problem(model, fp, KvType::F16).find("too short") != std::string::npos);
    CHECK(foreign());
    std::remove(path.c_str());
    CHECK(problem(model, fp, KvType::F16).empty());  // no file: nothing to say, a cold run
    CHECK_FALSE(foreign());
    {  // a directory or a FIFO is refused at once (a FIFO is not waited on) and never overwritten
        auto b = backend_for(model);
        CHECK(load_prompt_cache(test::temp_dir(), *b, fp, MathMode::Exact, prompt).problem == "it is a directory");
        CHECK(prompt_cache_foreign(test::temp_dir()) == "it is a directory");
        REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
        CHECK(problem(model, fp, KvType::F16) == "not a regular file");
        CHECK(prompt_cache_foreign(path) == "not a regular file");
        std::remove(path.c_str());
    }
    // a refused file leaves the cache empty, so the run is exactly a cold one
    write(flipped);
    auto b = backend_for(model);
    const PromptCacheLoad pc = load_prompt_cache(path, *b, fp, MathMode::Exact, prompt);
    REQUIRE_FALSE(pc.problem.empty());
    const Run refused = generate(model, *b, prompt, pc.n_reused, 0.0f);
    auto cold_backend = backend_for(model);
    CHECK(refused.logits == generate(model, *cold_backend, prompt, 0, 0.0f).logits);
    std::remove(path.c_str());
}
