#pragma once
// Errors: user-caused problems throw kvgen::Error; main prints "kvgen: error: <what>" and exits 1.
// Invariants use KVGEN_ASSERT, which stays on in Release builds.
#include <stdexcept>
#include <string>

namespace kvgen {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& what) : std::runtime_error(what) {}
};

[[noreturn]] void assert_fail(const char* expr, const char* file, int line);

}  // namespace kvgen

#define KVGEN_ASSERT(cond)                                           \
    do {                                                             \
        if (!(cond)) ::kvgen::assert_fail(#cond, __FILE__, __LINE__); \
    } while (0)
