// --perplexity against the same measurement made by hand: every scored token's probability from single-token decode
// steps through the KV cache (another code path: the decode products instead of the batched GEMM), then
// llama-perplexity's formulas.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cli/perplexity.h"
#include "cpu/cpu_backend.h"
#include "model/weights.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace kvgen;

TEST_CASE("perplexity (--perplexity) equals the hand-computed value from token-by-token decoding", "[perplexity]") {
    const std::string path = test::shared("testdata/ref/open-gqa-Q4_K_M.gguf");
    std::string text;
    for (int i = 0; i < 8; ++i) text += "Once upon a time, there was a little girl who lived by the sea. ";
    PerplexityOptions opt;
    opt.model_path = path;
    opt.text_path = "(test)";
    opt.text = text;
    opt.run.device = "cpu";
    opt.run.n_ctx = 24;
    opt.run.n_batch = 10;  // chunks of 24 in batches of 10, 10 and 4
    opt.run.n_threads = 2;
    opt.run.kv_type_k = opt.run.kv_type_v = KvType::F32;
    const PerplexityResult got = run_perplexity(opt);

    const Model model = Model::load(path);
    const Tokenizer tok = Tokenizer::from_gguf(model.file);
    std::vector<int32_t> tokens = tok.encode(text, tok.add_bos());
    const int n_ctx = 24, first = n_ctx / 2, n_vocab = model.config.n_vocab;
    REQUIRE(got.n_tokens == int(tokens.size()));
    REQUIRE(got.n_chunks == int(tokens.size()) / n_ctx);
    Settings s;
    s.n_ctx = n_ctx;
    s.n_threads = 1;
    s.kv_type_k = s.kv_type_v = KvType::F32;
    const std::unique_ptr<Backend> backend = cpu::make_backend(model, s);
    double nll = 0, nll2 = 0;
    int count = 0;
    for (int i = 0; i < got.n_chunks; ++i) {
        std::vector<int32_t> chunk(tokens.begin() + i * n_ctx, tokens.begin() + (i + 1) * n_ctx);
        chunk[0] = tok.bos();
        backend->kv_truncate(0);
        for (int j = 0; j < n_ctx - 1; ++j) {
            const float* logits = backend->forward(&chunk[size_t(j)], 1, j, Pass::Prefill);
            if (j < first) continue;
            double mx = logits[0], sum = 0;
            for (int v = 1; v < n_vocab; ++v) mx = std::max(mx, double(logits[v]));
            for (int v = 0; v < n_vocab; ++v) sum += std::exp(double(logits[v]) - mx);
            const double nl = std::log(sum) - (double(logits[chunk[size_t(j + 1)]]) - mx);
            nll += nl;
            nll2 += nl * nl;
            ++count;
        }
        INFO("chunk " << i);
        CHECK(std::fabs(got.running[size_t(i)] - std::exp(nll / count)) <= 1e-3 * std::exp(nll / count));
    }
    REQUIRE(got.n_scored == count);
    const double ppl = std::exp(nll / count);
    const double sd = std::sqrt((nll2 / count - (nll / count) * (nll / count)) / (count - 1));
    CHECK(std::fabs(got.ppl - ppl) <= 1e-3 * ppl);
    CHECK(std::fabs(got.ppl_stderr - sd * ppl) <= 1e-2 * sd * ppl);
    CHECK(got.ppl > 1.0);
}

TEST_CASE("KL divergence against a base run: zero against itself, small for a q8_0 cache, refused for another text",
          "[perplexity]") {
    std::string text;
    for (int i = 0; i < 6; ++i) text += "The little boat sailed past the lighthouse every evening at dusk. ";
    PerplexityOptions opt;
    opt.model_path = test::shared("testdata/ref/open-gqa-Q8_0.gguf");
    opt.text_path = "(test)";
    opt.text = text;
    opt.run.device = "cpu";
    opt.run.n_ctx = 32;
    opt.run.n_threads = 1;
    char dir[] = "/tmp/kvgen-kl-XXXXXX";
    REQUIRE(mkdtemp(dir) != nullptr);
    const std::string base = std::string(dir) + "/base.kld";
    opt.kl_base_path = base;
    const PerplexityResult b = run_perplexity(opt);
    opt.kl_base_path.clear();
    opt.kl_path = base;
    const PerplexityResult same = run_perplexity(opt);
    REQUIRE(same.have_kl);
    CHECK(same.kl < 1e-6);
    CHECK(same.top1 == 1.0);
    CHECK(same.base_ppl == b.ppl);
    opt.run.kv_type_k = opt.run.kv_type_v = KvType::Q4_0;
    const PerplexityResult q = run_perplexity(opt);
    CHECK(q.kl > same.kl);
    CHECK(q.kl < 0.5);
    {  // a damaged file: a token id outside the vocabulary, a record count that does not match, too few records
        const std::string good = test::read_text(base);
        auto write = [&](const std::string& bytes) { test::write_text(base, bytes); };
        const size_t header = 56, n_records_at = 40;  // KlHeader: the record count after magic, 4 words, 2 hashes
        uint64_t n_records = 0;
        std::memcpy(&n_records, good.data() + n_records_at, 8);
        const size_t record = (good.size() - header) / n_records;
        std::string bad = good;
        const int32_t outside = 1 << 30;
        std::memcpy(bad.data() + header + record * (n_records / 2), &outside, 4);
        write(bad);
        CHECK_THROWS_WITH(run_perplexity(opt), Catch::Contains("a token id outside the vocabulary"));
        bad = good;
        const uint64_t huge = uint64_t(1) << 62;
        std::memcpy(bad.data() + n_records_at, &huge, 8);
        write(bad);
        CHECK_THROWS_WITH(run_perplexity(opt), Catch::Contains("does not match its header"));
        bad = good.substr(0, good.size() - record);
        const uint64_t fewer = n_records - 1;
        std::memcpy(bad.data() + n_records_at, &fewer, 8);
        write(bad);
        CHECK_THROWS_WITH(run_perplexity(opt), Catch::Contains("does not match its header"));
        write(good);
    }
    {  // a run that compares with one base and writes another: the new file holds this run's records alone
        const std::string base2 = std::string(dir) + "/base2.kld";
        opt.kl_base_path = base2;
        const PerplexityResult both = run_perplexity(opt);
        CHECK(both.have_kl);
        opt.kl_base_path.clear();
        opt.kl_path = base2;
        const PerplexityResult again = run_perplexity(opt);
        CHECK(again.kl < 1e-6);
        CHECK(again.base_ppl == both.ppl);
        opt.kl_path = base;
        std::remove(base2.c_str());
    }
    opt.text = "A different text. " + text;  // other tokens in the scored chunks
    CHECK_THROWS_WITH(run_perplexity(opt), Catch::Contains("another text"));
    opt.text = text;
    opt.run.n_ctx = 16;
    CHECK_THROWS_WITH(run_perplexity(opt), Catch::Contains("made with -c 32"));
    std::remove(base.c_str());
    rmdir(dir);
}
