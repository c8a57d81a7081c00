#pragma once
// [cuda] cases of what needs sm_80 and later (the tensor cores' integer products, --cuda-matvec-mma on; the rings of
// shared memory, --cuda-matvec-stages): whether the first device runs them. Where it does not, the case says so,
// visibly, naming `what`, and is skipped.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "device.h"

namespace kvgen::test {

inline bool sm80_device(const std::string& what = "the tensor-core integer products") {
    std::string why;
    const std::vector<cuda::DeviceInfo> devices = cuda::list_devices(&why);
    REQUIRE_FALSE(devices.empty());
    if (devices[0].cc_major >= 8) return true;
    WARN("SKIPPED: " << what << " need sm_80 or later");
    return false;
}

}  // namespace kvgen::test
