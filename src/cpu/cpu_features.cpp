#include "cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>
#include <fstream>

namespace kvgen::cpu {

namespace {
// KVGEN_ISA: the highest kernel build to use ("avx512", "avx2" or "generic"; unset: the best this CPU runs).
int isa_cap() {
    const char* v = std::getenv("KVGEN_ISA");
    if (!v || !*v) return 2;
    return std::strcmp(v, "generic") == 0 ? 0 : std::strcmp(v, "avx2") == 0 ? 1 : 2;
}

bool detect_avx2() {
    if (isa_cap() < 1) return false;
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return false;
#endif
}

bool detect_avx512_vnni() {
    if (isa_cap() < 2) return false;
#if defined(__x86_64__)
    __builtin_cpu_init();
    return detect_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
}
}  // namespace

bool has_avx2() {
    static const bool yes = detect_avx2();
    return yes;
}

bool has_avx512_vnni() {
    static const bool yes = detect_avx512_vnni();
    return yes;
}

std::string model_name() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("model name", 0) != 0) continue;
        const size_t colon = line.find(':');
        if (colon == std::string::npos) break;
        const size_t start = line.find_first_not_of(" \t", colon + 1);
        if (start != std::string::npos) return line.substr(start, line.find_last_not_of(" \t") + 1 - start);
        break;
    }
    return "unknown";
}

}  // namespace kvgen::cpu
