#pragma once
#include <cstdint>
#include <cstdlib>
#include <unistd.h>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace kvgen::test {

inline std::string shared(const std::string& rel) { return std::string(KVGEN_SHARED_DIR) + "/" + rel; }
inline std::string source(const std::string& rel) { return std::string(KVGEN_SOURCE_DIR) + "/" + rel; }

inline std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in.good());
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A file's bytes as a string ("" when it cannot be read), and a file made of these bytes (for damaging a good one).
inline std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
inline void write_text(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    REQUIRE(out.good());
}

inline bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

// A directory of this test process's own under /tmp (made on first use, removed at exit once the tests have
// removed their files), for files a test writes.
inline const std::string& temp_dir() {
    struct Dir {
        std::string path;
        Dir() {
            char tmpl[] = "/tmp/kvgen-test-XXXXXX";
            REQUIRE(mkdtemp(tmpl) != nullptr);
            path = tmpl;
        }
        ~Dir() { rmdir(path.c_str()); }
    };
    static const Dir dir;
    return dir.path;
}

}  // namespace kvgen::test
