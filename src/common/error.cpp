#include "common/error.h"

#include <cstdio>
#include <cstdlib>

namespace kvgen {

[[noreturn]] void assert_fail(const char* expr, const char* file, int line) {
    std::fprintf(stderr, "kvgen: internal error: assertion '%s' failed at %s:%d\n", expr, file, line);
    std::abort();
}

}  // namespace kvgen
