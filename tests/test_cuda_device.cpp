#include <catch2/catch.hpp>

#include "device.h"

TEST_CASE("a visible CUDA device reports its properties", "[cuda]") {
    std::string why;
    const auto devices = kvgen::cuda::list_devices(&why);
    REQUIRE_FALSE(devices.empty());
    for (const auto& d : devices) {
        CHECK_FALSE(d.name.empty());
        CHECK(d.cc_major >= 7);
        CHECK(d.sm_count > 0);
        CHECK(d.total_bytes > 0);
        CHECK(d.free_bytes <= d.total_bytes);
        CHECK(d.peak_gbs > 100.0);  // (every GPU this backend runs on has more)
    }
}
