#pragma once
// CUDA device discovery. Declared without CUDA types so CPU code can call it when the backend is built.
#include <cstddef>
#include <string>
#include <vector>

namespace kvgen::cuda {

struct DeviceInfo {
    int id = 0;
    std::string name;
    int cc_major = 0, cc_minor = 0;
    int sm_count = 0;
    size_t total_bytes = 0;
    size_t free_bytes = 0;
};

// Every visible device; empty with *why_none set when there is none (no driver, no device, an error).
std::vector<DeviceInfo> list_devices(std::string* why_none);

}  // namespace kvgen::cuda
