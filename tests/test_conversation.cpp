// Conversation mode: each turn prefills only what the cache does not hold (the previous answer's last token and end
// text, and its own message), and its answer equals a single run over the whole conversation so far (greedy), on the
// default model.
#include "cli/conversation.h"
#include "cpu/cpu_backend.h"
#include "model/weights.h"
#include "test_util.h"

using namespace kvgen;

TEST_CASE("a three-turn conversation prefills only each turn's new tokens and answers as a single run over the "
          "transcript",
          "[conversation][default-model]") {
    if (!test::file_exists(KVGEN_DEFAULT_MODEL)) FAIL("default model missing: run models/fetch-default.sh");
    const Model model = Model::load(KVGEN_DEFAULT_MODEL);
    const Tokenizer tok = Tokenizer::from_gguf(model.file);
    const ChatFormat format = ChatFormat::of(model.file, "");
    // what a shift keeps by default: BOS, SmolLM2's default system turn and "<|im_start|>user\n"
    const int n_head = format.n_head_tokens(tok, tok.add_bos());
    const std::vector<int32_t> first = tok.encode(format.first_turn("Hello there"), tok.add_bos(), true);
    const std::vector<int32_t> head = tok.encode("<|im_start|>system\n" + format.system + "<|im_end|>\n<|im_start|>user\n",
                                                 tok.add_bos(), true);
    CHECK(n_head == int(head.size()));
    CHECK(std::equal(head.begin(), head.end(), first.begin()));
    Settings s;
    s.n_ctx = 512;
    s.n_threads = 2;
    GenerateOptions g;
    g.n_predict = 24;
    g.sampler.temp = 0.0f;
    const std::unique_ptr<Backend> backend = cpu::make_backend(model, s);
    // Q4_1 and Q8_0: a generated token's cache rows are a prompt token's, so answers stay in the cache
    REQUIRE(backend->decode_matches_prompt());
    Conversation conv(*backend, tok, model.config.n_vocab, format, g, tok.add_bos());
    const char* messages[] = {"What is the capital of France?", "And what is it famous for?",
                              "Name one river that flows through it."};
    std::vector<int32_t> before;  // the conversation before each turn
    std::vector<int32_t> answer;  // the previous turn's answer, without an end-of-turn token
    int prompt_end = 0;           // the previous turn's prompt length
    bool ended = false;           // whether the previous answer ended with an end-of-turn token
    for (int turn = 0; turn < 3; ++turn) {
        INFO("turn " << turn + 1);
        const std::vector<int32_t> added =
            tok.encode(turn == 0 ? format.first_turn(messages[turn]) : format.next_turn(messages[turn]),
                       turn == 0 && tok.add_bos(), true);
        const int n_cached = backend->n_past();
        const TurnResult r = conv.answer(messages[turn], [](int32_t) { return true; });
        // everything the cache holds is reused; the turn evaluates the previous answer's last token (unless it ended
        // the turn) and end-of-turn text, and its own message, nothing else
        CHECK(r.n_reused == n_cached);
        CHECK(r.n_added == int(added.size()));
        CHECK(r.n_prefilled == int(before.size()) - n_cached + int(added.size()));
        if (turn > 0) {
            CHECK(n_cached == prompt_end + int(answer.size()) - (ended ? 0 : 1));
            CHECK(r.n_prefilled - r.n_added == (ended ? 0 : 1) + 2);  // <|im_end|> "\n"
        }
        // a single cold run over the same transcript gives the same answer
        std::vector<int32_t> prompt = before;
        prompt.insert(prompt.end(), added.begin(), added.end());
        const std::unique_ptr<Backend> cold = cpu::make_backend(model, s);
        const GenerateStats st = Generator(*cold).run(
            prompt, g, [](int32_t, const float*) { return true; }, [&](int32_t id) { return tok.is_eog(id); },
            model.config.n_vocab);
        CHECK(r.tokens == st.tokens);
        CHECK(!r.tokens.empty());
        before = conv.tokens();
        prompt_end = int(prompt.size());
        answer = r.tokens;
        ended = tok.is_eog(answer.back());
        if (ended) answer.pop_back();
    }
}
