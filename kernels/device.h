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
    double peak_gbs = 0.0;  // memory bandwidth, GB/s: memory_peak_gbs of what the driver says (0: it says nothing)
};

// A memory's peak bandwidth in GB/s from its clock (kHz, as the driver gives it) and bus width (bits): two transfers a
// clock across the bus, as the CUDA samples count it (an H100 SXM's 2,619 MHz and 5,120 bits: 3,352 GB/s).
inline double memory_peak_gbs(int clock_khz, int bus_bits) {
    return clock_khz > 0 && bus_bits > 0 ? 2.0 * double(clock_khz) * 1e3 * (bus_bits / 8.0) / 1e9 : 0.0;
}

// Every visible device; empty with *why_none set when there is none (no driver, no device, an error).
std::vector<DeviceInfo> list_devices(std::string* why_none);

}  // namespace kvgen::cuda
