#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "cli/format.h"
#include "engine/kv_layout.h"
#include "model/config.h"
#include "test_util.h"

using namespace kvgen;

TEST_CASE("byte sizes print like the docs", "[format]") {
    CHECK(human_bytes(512) == "512 B");
    CHECK(human_bytes(800 * 1024) == "800 KiB");
    CHECK(human_bytes(3.125 * 1024 * 1024 * 1024) == "3.12 GiB");
    CHECK(human_bytes(22.5 * 1024) == "22.5 KiB");
}

TEST_CASE("KV cache cost of LLaMA-2 13B is 800 KiB per token at f16", "[format][kv]") {
    Config c;
    c.n_layers = 40;
    c.n_kv_heads = 40;
    c.head_dim = 128;
    const KvLayout kv = KvLayout::of(c, 4096, KvType::F16);
    CHECK(kv.bytes_per_token() == 800 * 1024);
    CHECK(kv.bytes() == size_t(800) * 1024 * 4096);
    CHECK(human_bytes(double(kv.bytes())) == "3.12 GiB");
    CHECK(KvLayout::of(c, 4096, KvType::F32).bytes() == 2 * kv.bytes());
}

namespace {
bool temporaries_beside(const std::string& dir) {
    for (const auto& e : std::filesystem::directory_iterator(dir))
        if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
    return false;
}
}  // namespace

TEST_CASE("an output file is whole or absent; through a link its target is replaced; a FIFO or device is written "
          "directly",
          "[format]") {
    const std::string dir = test::temp_dir(), path = dir + "/out.json", target = dir + "/target.json";
    {  // not committed: nothing written, the old file kept
        write_text_file(path, "old\n");
        OutputFile f(path);
        f.write("new", 3);
        CHECK(temporaries_beside(dir));
    }
    CHECK(test::read_text(path) == "old\n");
    CHECK_FALSE(temporaries_beside(dir));
    write_text_file(path, "new\n");
    CHECK(test::read_text(path) == "new\n");
    // a symbolic link keeps pointing at its target, which gets the text
    write_text_file(target, "target\n");
    std::remove(path.c_str());
    REQUIRE(::symlink("target.json", path.c_str()) == 0);
    check_writable(path);
    write_text_file(path, "through the link\n");
    struct stat st {};
    REQUIRE(::lstat(path.c_str(), &st) == 0);
    CHECK(S_ISLNK(st.st_mode));
    CHECK(test::read_text(target) == "through the link\n");
    // a link to a file that does not exist yet: the file is made there, the link kept
    std::remove(target.c_str());
    write_text_file(path, "made through the link\n");
    REQUIRE(::lstat(path.c_str(), &st) == 0);
    CHECK(S_ISLNK(st.st_mode));
    CHECK(test::read_text(target) == "made through the link\n");
    // a new file gets the mode the umask allows, as open(2) gives; an existing one keeps its mode
    std::remove(path.c_str());
    std::remove(target.c_str());
    const mode_t old_mask = ::umask(077);
    write_text_file(path, "private\n");
    ::umask(old_mask);
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    REQUIRE(::chmod(path.c_str(), 0640) == 0);
    write_text_file(path, "again\n");
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0640);
    // a character device is written, not replaced; one that fails says so
    check_writable("/dev/null");
    write_text_file("/dev/null", "nothing\n");
    REQUIRE(::stat("/dev/null", &st) == 0);
    CHECK(S_ISCHR(st.st_mode));
    if (::access("/dev/full", W_OK) == 0)
        CHECK_THROWS_WITH(write_text_file("/dev/full", "x"), Catch::Contains("/dev/full: write failed"));
    // a FIFO nobody reads is an error at once, not a wait
    const std::string fifo = dir + "/fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    CHECK_THROWS_WITH(write_text_file(fifo, "x"), Catch::Contains("a FIFO that nobody reads"));
    CHECK_THROWS_WITH(check_writable(dir), Catch::Contains("is a directory"));
    CHECK_THROWS_WITH(write_text_file(dir, "x"), Catch::Contains("is a directory"));
    CHECK_THROWS_WITH(check_writable(""), Catch::Contains("output path is empty"));
    for (const std::string& p : {path, target, fifo}) std::remove(p.c_str());
}
