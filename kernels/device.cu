#include "device.h"

#include <cuda_runtime.h>

#include <fmt/format.h>

namespace kvgen::cuda {

namespace {

// note: with no NVIDIA driver installed the runtime says "driver version is insufficient for CUDA runtime version",
// which sends a user to update a driver they do not have; the driver version (0: none) tells the cases apart.
std::string no_device_reason(cudaError_t err) {
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    if (driver == 0) return "no NVIDIA driver or GPU found";
    if (err == cudaErrorNoDevice) return "no NVIDIA GPU found";
    if (err == cudaErrorInsufficientDriver)
        return fmt::format("the NVIDIA driver supports CUDA {}.{} but this build needs {}.{} (update the driver)",
                           driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
    return fmt::format("no usable CUDA device ({})", cudaGetErrorString(err));
}

}  // namespace

std::vector<DeviceInfo> list_devices(std::string* why_none) {
    std::vector<DeviceInfo> out;
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        if (why_none) *why_none = no_device_reason(err);
        cudaGetLastError();  // clear the error so later calls start clean
        return out;
    }
    if (n == 0) {
        if (why_none) *why_none = "no CUDA device is visible";
        return out;
    }
    // note: reading a device's free memory makes it current; the caller's current device is put back after, so a
    // backend already running on one device is not moved to another by a later listing
    int current = 0;
    const bool restore = cudaGetDevice(&current) == cudaSuccess;
    for (int i = 0; i < n; ++i) {
        cudaDeviceProp p{};
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
        DeviceInfo d;
        d.id = i;
        d.name = p.name;
        d.cc_major = p.major;
        d.cc_minor = p.minor;
        d.sm_count = p.multiProcessorCount;
        d.total_bytes = p.totalGlobalMem;
        int clock_khz = 0, bus_bits = 0;
        if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, i) == cudaSuccess &&
            cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, i) == cudaSuccess)
            d.peak_gbs = memory_peak_gbs(clock_khz, bus_bits);
        else
            cudaGetLastError();  // unknown (0), and no error left for the backend's first launch check to find
        if (cudaSetDevice(i) == cudaSuccess) {
            size_t free_b = 0, total_b = 0;
            if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) d.free_bytes = free_b;
        }
        out.push_back(d);
    }
    if (restore) cudaSetDevice(current);
    if (out.empty() && why_none) *why_none = "CUDA devices are present but their properties cannot be read";
    return out;
}

}  // namespace kvgen::cuda
