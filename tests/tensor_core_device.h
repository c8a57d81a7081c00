#pragma once
// [cuda] cases of the tensor cores' integer products (--cuda-matvec-mma on): whether the first device runs them
// (sm_80 and later). Where it does not, the case says so, visibly, and is skipped.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "device.h"

namespace kvgen::test {

inline bool integer_mma_device() {
    std::string why;
    const std::vector<cuda::DeviceInfo> devices = cuda::list_devices(&why);
    REQUIRE_FALSE(devices.empty());
    if (devices[0].cc_major >= 8) return true;
    WARN("SKIPPED: the tensor-core integer products need sm_80 or later");
    return false;
}

}  // namespace kvgen::test
