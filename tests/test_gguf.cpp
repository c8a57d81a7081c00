#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "test_util.h"

using namespace kvgen;
using kvgen::test::shared;

namespace {

std::vector<std::string> shared_gguf_files() {
    std::vector<std::string> out;
    for (const char* dir : {"tiny", "ref", "vocab"}) {
        const std::string d = shared(std::string("testdata/") + dir);
        DIR* dp = opendir(d.c_str());
        REQUIRE(dp != nullptr);
        while (dirent* e = readdir(dp)) {
            const std::string name = e->d_name;
            if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0) out.push_back(d + "/" + name);
        }
        closedir(dp);
    }
    return out;
}

}  // namespace

TEST_CASE("every GGUF file in the shared test data parses", "[gguf]") {
    const auto files = shared_gguf_files();
    REQUIRE(files.size() >= 9);
    for (const std::string& path : files) {
        INFO(path);
        const GgufFile f = GgufFile::open(path);
        CHECK(f.version() == 3);
        CHECK(f.find("general.architecture") != nullptr);
        const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
        REQUIRE(tokens != nullptr);
        CHECK(tokens->elem_type() == GgufValueType::STRING);
        CHECK(tokens->size() >= 4096);
        for (const GgufTensor& t : f.tensors()) {
            CHECK(t.data != nullptr);
            CHECK(t.offset % f.alignment() == 0);
            CHECK(f.data_offset() + t.offset + t.nbytes <= f.file_size());
        }
        // The same bytes parse the same way from a buffer.
        const GgufFile g = GgufFile::parse(test::read_bytes(path), path);
        CHECK(g.metadata().size() == f.metadata().size());
        CHECK(g.tensors().size() == f.tensors().size());
    }
}

TEST_CASE("the tiny model's header, metadata and tensors read back as written", "[gguf]") {
    const GgufFile f = GgufFile::open(shared("testdata/tiny/llama-2-tiny-random.gguf"));
    CHECK(f.find("general.architecture")->as_string() == "llama");
    CHECK(f.find("llama.embedding_length")->as_u64() == 8);
    CHECK(f.find("llama.attention.head_count")->as_u64() == 2);
    CHECK(f.find("llama.attention.layer_norm_rms_epsilon")->as_f64() == Approx(1e-5));
    const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
    REQUIRE(tokens->size() == 32000);
    CHECK(tokens->items()[1].as_string() == "<s>");
    CHECK(tokens->items()[2].as_string() == "</s>");
    CHECK(tokens->items()[259].as_string() == "\xe2\x96\x81\xe2\x96\x81");  // "▁▁"
    const GgufValue* types = f.find("tokenizer.ggml.token_type");
    CHECK(types->integer_at(0) == 2);  // <unk>: unknown
    CHECK(types->integer_at(3) == 6);  // <0x00>: byte
    CHECK(f.find("tokenizer.ggml.scores")->number_at(300) < 0.0);
    REQUIRE(f.tensors().size() == 12);
    const GgufTensor* emb = f.tensor("token_embd.weight");
    REQUIRE(emb != nullptr);
    CHECK(emb->type == 1);  // F16
    CHECK(emb->n_dims == 2);
    CHECK(emb->ne[0] == 8);
    CHECK(emb->ne[1] == 32000);
    CHECK(emb->nbytes == 8 * 32000 * 2);
    CHECK(f.tensor("no.such.tensor") == nullptr);
}

TEST_CASE("the writer round-trips every value type, nested arrays and alignment", "[gguf]") {
    GgufWriter w(64);
    w.set("u8", GgufValue::uint(GgufValueType::U8, 200));
    w.set("i8", GgufValue::sint(GgufValueType::I8, -100));
    w.set("u16", GgufValue::uint(GgufValueType::U16, 60000));
    w.set("i16", GgufValue::sint(GgufValueType::I16, -30000));
    w.set("u32", GgufValue::uint(GgufValueType::U32, 4000000000u));
    w.set("i32", GgufValue::sint(GgufValueType::I32, -2000000000));
    w.set("f32", GgufValue::real(GgufValueType::F32, 0.25));
    w.set("bool", GgufValue::boolean(true));
    w.set("string", GgufValue::string("h\xc3\xa9llo"));
    w.set("u64", GgufValue::uint(GgufValueType::U64, 1ull << 60));
    w.set("i64", GgufValue::sint(GgufValueType::I64, -(1ll << 60)));
    w.set("f64", GgufValue::real(GgufValueType::F64, 1e300));
    w.set("arr.i32", GgufValue::numbers<int32_t>(GgufValueType::I32, {1, -2, 3}));
    w.set("arr.str", GgufValue::string_array({"a", "", "ccc"}));
    w.set("arr.empty", GgufValue::numbers<float>(GgufValueType::F32, {}));
    w.set("arr.nested", GgufValue::array_of(GgufValueType::ARRAY,
                                            {GgufValue::numbers<uint8_t>(GgufValueType::U8, {1, 2}),
                                             GgufValue::string_array({"x"})}));
    w.add_tensor("a", GgmlType::F32, {3});
    w.add_tensor("b", GgmlType::Q8_0, {64, 2});
    const auto bytes = w.to_bytes([](size_t i, uint8_t* dst, uint64_t n) { std::memset(dst, int(0x10 + i), n); });
    const GgufFile f = GgufFile::parse(bytes);
    CHECK(f.alignment() == 64);
    CHECK(f.data_offset() % 64 == 0);
    CHECK(f.find("u8")->as_u64() == 200);
    CHECK(f.find("i8")->as_i64() == -100);
    CHECK(f.find("u16")->as_u64() == 60000);
    CHECK(f.find("i16")->as_i64() == -30000);
    CHECK(f.find("u32")->as_u64() == 4000000000u);
    CHECK(f.find("i32")->as_i64() == -2000000000);
    CHECK(f.find("f32")->as_f64() == 0.25);
    CHECK(f.find("bool")->as_bool());
    CHECK(f.find("string")->as_string() == "h\xc3\xa9llo");
    CHECK(f.find("u64")->as_u64() == (1ull << 60));
    CHECK(f.find("i64")->as_i64() == -(1ll << 60));
    CHECK(f.find("f64")->as_f64() == 1e300);
    CHECK(f.find("arr.i32")->integer_at(1) == -2);
    CHECK(f.find("arr.str")->strings() == std::vector<std::string>{"a", "", "ccc"});
    CHECK(f.find("arr.empty")->size() == 0);
    const GgufValue* nested = f.find("arr.nested");
    REQUIRE(nested->size() == 2);
    CHECK(nested->items()[0].integer_at(1) == 2);
    CHECK(nested->items()[1].strings()[0] == "x");
    CHECK_THROWS_AS(f.find("string")->as_u64(), Error);
    CHECK_THROWS_AS(f.find("i8")->as_u64(), Error);
    REQUIRE(f.tensors().size() == 2);
    CHECK(f.tensor("b")->offset % 64 == 0);
    CHECK(f.tensor("b")->nbytes == 2 * 2 * 34);  // 2 rows of 2 blocks
    CHECK(f.tensor("b")->data[0] == 0x11);
    CHECK(f.tensor("a")->data[11] == 0x10);
}

TEST_CASE("opening a missing file, a directory or an empty file is a clear error", "[gguf]") {
    CHECK_THROWS_WITH(GgufFile::open("/nonexistent/model.gguf"), Catch::Contains("cannot open"));
    CHECK_THROWS_WITH(GgufFile::open("/tmp"), Catch::Contains("is a directory"));
    char tmpl[] = "/tmp/kvgen-empty-XXXXXX";
    const int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    close(fd);
    CHECK_THROWS_WITH(GgufFile::open(tmpl), Catch::Contains("empty file"));
    unlink(tmpl);
}
