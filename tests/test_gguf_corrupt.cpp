// Malformed GGUF files: every truncation of the tiny model's first 4 KiB and a set of single-field corruptions must
// be rejected with a kvgen::Error that names the byte offset; nothing may crash or allocate what a count claims.
#include <dirent.h>

#include <cstring>
#include <random>

#include "common/error.h"
#include "gguf/gguf.h"
#include "model/weights.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace kvgen;

namespace {

const std::vector<uint8_t>& tiny_bytes() {
    static const std::vector<uint8_t> bytes = test::read_bytes(test::shared("testdata/tiny/llama-2-tiny-random.gguf"));
    return bytes;
}

template <typename T>
void poke(std::vector<uint8_t>& b, size_t at, T v) {
    REQUIRE(at + sizeof(T) <= b.size());
    std::memcpy(b.data() + at, &v, sizeof(T));
}

// Where a GGUF string (u64 length, then the bytes) holding `name` starts: the first or the last occurrence.
size_t string_at(const std::vector<uint8_t>& b, const std::string& name, bool last) {
    std::string pattern(8, '\0');
    const uint64_t len = name.size();
    std::memcpy(&pattern[0], &len, 8);
    pattern += name;
    const std::string hay(b.begin(), b.end());
    const size_t at = last ? hay.rfind(pattern) : hay.find(pattern);
    REQUIRE(at != std::string::npos);
    return at;
}

// Offset of a tensor info: where its name's u64 length field starts (tensor infos follow the metadata).
size_t tensor_info_at(const std::vector<uint8_t>& b, const std::string& name) { return string_at(b, name, true); }

void expect_rejected(std::vector<uint8_t> bytes, const std::string& what) {
    INFO("expected: " << what);
    try {
        GgufFile::parse(std::move(bytes), "corrupt.gguf");
        FAIL("the corrupt file parsed");
    } catch (const Error& e) {
        const std::string msg = e.what();
        INFO(msg);
        CHECK(msg.rfind("corrupt.gguf: ", 0) == 0);
        CHECK(msg.find("(offset ") != std::string::npos);
        CHECK(msg.find(what) != std::string::npos);
    }
}

}  // namespace

TEST_CASE("every truncation of the tiny model's first 4 KiB is rejected cleanly", "[gguf][corrupt]") {
    const auto& full = tiny_bytes();
    for (size_t len = 0; len <= 4096; ++len) {
        std::vector<uint8_t> cut(full.begin(), full.begin() + long(len));
        INFO("length " << len);
        CHECK_THROWS_AS(GgufFile::parse(std::move(cut), "cut.gguf"), Error);
    }
}

TEST_CASE("truncations inside the tensor infos and the data are rejected", "[gguf][corrupt]") {
    const auto& full = tiny_bytes();
    const GgufFile f = GgufFile::parse(full);
    for (uint64_t len : {f.data_offset() - 1, f.data_offset(), f.data_offset() + 100, uint64_t(full.size() - 1)}) {
        std::vector<uint8_t> cut(full.begin(), full.begin() + long(len));
        INFO("length " << len);
        CHECK_THROWS_AS(GgufFile::parse(std::move(cut), "cut.gguf"), Error);
    }
}

TEST_CASE("single-field corruptions are rejected with the field named", "[gguf][corrupt]") {
    const auto& good = tiny_bytes();
    const size_t embd = tensor_info_at(good, "token_embd.weight");  // first tensor: 2 dims [8, 32000], F16
    const size_t embd_dims = embd + 8 + 17;
    const size_t embd_type = embd_dims + 4 + 16;
    const size_t embd_offset = embd_type + 4;
    auto with = [&](auto fn) {
        std::vector<uint8_t> b = good;
        fn(b);
        return b;
    };
    expect_rejected(with([](auto& b) { b[0] = 'X'; }), "not a GGUF file");
    expect_rejected(with([](auto& b) { poke<uint32_t>(b, 4, 1); }), "version 1 is not supported");
    expect_rejected(with([](auto& b) { poke<uint32_t>(b, 4, 4); }), "version 4 is not supported");
    expect_rejected(with([](auto& b) { poke<uint32_t>(b, 4, 0x03000000); }), "byte-swapped");
    expect_rejected(with([](auto& b) { poke<uint64_t>(b, 8, 1ull << 40); }), "tensor count");
    expect_rejected(with([](auto& b) { poke<uint64_t>(b, 16, ~0ull); }), "metadata count");
    expect_rejected(with([](auto& b) { poke<uint64_t>(b, 24, 1ull << 50); }), "runs past the end");
    // The first key is general.architecture (20 bytes); its value type follows it.
    expect_rejected(with([](auto& b) { poke<uint32_t>(b, 24 + 8 + 20, 13); }), "unknown metadata value type 13");
    expect_rejected(with([&](auto& b) { poke<uint32_t>(b, embd_dims, 5); }), "has 5 dimensions");
    expect_rejected(with([&](auto& b) { poke<uint64_t>(b, embd_dims + 4, 0); }), "dimension 0 is 0");
    expect_rejected(with([&](auto& b) { poke<uint64_t>(b, embd_dims + 12, 1ull << 62); }), "overflow");
    expect_rejected(with([&](auto& b) { poke<uint32_t>(b, embd_type, 99); }), "unknown type id 99");
    expect_rejected(with([&](auto& b) { poke<uint32_t>(b, embd_type, 2); }), "not a multiple of its block size");
    expect_rejected(with([&](auto& b) { poke<uint64_t>(b, embd_offset, 3); }), "not a multiple of the alignment");
    expect_rejected(with([&](auto& b) { poke<uint64_t>(b, embd_offset, 1ull << 40); }), "runs past the end");
    // Renaming attn_k to attn_q (same length) duplicates a name.
    const size_t k = tensor_info_at(good, "blk.0.attn_k.weight");
    expect_rejected(with([&](auto& b) { b[k + 8 + 11] = 'q'; }), "duplicate tensor name 'blk.0.attn_q.weight'");
}

TEST_CASE("a huge array count is rejected before anything is allocated", "[gguf][corrupt]") {
    const auto& good = tiny_bytes();
    // tokenizer.ggml.tokens: key, type ARRAY, element type STRING, then the u64 count.
    const std::string key = "tokenizer.ggml.tokens";
    const size_t count_at = string_at(good, key, false) + 8 + key.size() + 4 + 4;
    std::vector<uint8_t> b = good;
    poke<uint64_t>(b, count_at, 1ull << 61);
    expect_rejected(b, "cannot fit");
    b = good;
    poke<uint32_t>(b, count_at - 4, 77);
    expect_rejected(b, "unknown array element type 77");
}

TEST_CASE("arrays nested without end are rejected, not recursed into", "[gguf][corrupt]") {
    // Header, one key "k" whose value is ARRAY of ARRAY of ARRAY ... (each a 1-element array).
    std::vector<uint8_t> b = {'G', 'G', 'U', 'F'};
    auto put = [&b](auto v) {
        const auto* p = reinterpret_cast<const uint8_t*>(&v);
        b.insert(b.end(), p, p + sizeof(v));
    };
    put(uint32_t(3));
    put(uint64_t(0));
    put(uint64_t(1));
    put(uint64_t(1));
    b.push_back('k');
    put(uint32_t(9));
    for (int i = 0; i < 100; ++i) {
        put(uint32_t(9));
        put(uint64_t(1));
    }
    expect_rejected(b, "nested deeper");
}

TEST_CASE("random byte corruptions of the header never crash", "[gguf][corrupt]") {
    const auto& good = tiny_bytes();
    std::mt19937_64 rng(7);
    int rejected = 0;
    for (int trial = 0; trial < 300; ++trial) {
        std::vector<uint8_t> b = good;
        const size_t at = size_t(rng() % 2048);
        b[at] = uint8_t(rng());
        try {
            GgufFile::parse(std::move(b), "fuzz.gguf");
        } catch (const Error&) {
            ++rejected;
        }
    }
    CHECK(rejected > 0);  // most flips land in string bytes and still parse; some must not
}

TEST_CASE("every fuzz regression input is handled", "[gguf][corrupt][fuzz]") {
    const std::string dir = test::source("tests/data/fuzz");
    DIR* dp = opendir(dir.c_str());
    REQUIRE(dp != nullptr);
    int files = 0, rejected = 0;
    while (dirent* e = readdir(dp)) {
        const std::string name = e->d_name;
        if (name.size() < 5 || name.compare(name.size() - 4, 4, ".bin") != 0) continue;
        ++files;
        INFO(name);
        try {
            const GgufFile f = GgufFile::parse(test::read_bytes(dir + "/" + name), name);
            try {
                bind_weights(f, Config::from_gguf(f));
            } catch (const Error&) {
            }
            try {
                (void)Tokenizer::from_gguf(f).encode("hello", true);
            } catch (const Error&) {
            }
        } catch (const Error& err) {
            ++rejected;
            CHECK(std::string(err.what()).find("(offset ") != std::string::npos);
        }
    }
    closedir(dp);
    CHECK(files >= 2);
    CHECK(rejected >= 2);  // the hand-made ones are malformed
}
