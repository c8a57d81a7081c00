#include "cpu/cpu_features.h"

namespace kvgen::cpu {

namespace {
bool detect_avx2() {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return false;
#endif
}

bool detect_avx512_vnni() {
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

}  // namespace kvgen::cpu
