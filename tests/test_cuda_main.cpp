// [cuda] tests run only where a CUDA device is visible; elsewhere the binary says why and exits 77, which CTest
// reports as a skipped test.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "device.h"
#include "first_failure.h"

int main(int argc, char** argv) {
    std::string why;
    if (kvgen::cuda::list_devices(&why).empty()) {
        std::printf("SKIP [cuda] tests: %s\n", why.c_str());
        return 77;
    }
    return Catch::Session().run(argc, argv);
}
