#pragma once
// Which kernel builds this CPU can run (checked once; the answer does not change while the process runs). The
// environment variable KVGEN_ISA=avx2 or KVGEN_ISA=generic holds the kernels to that build or below, to measure or
// test the paths another CPU would take.
#include <string>

namespace kvgen::cpu {

bool has_avx2();         // AVX2 with FMA and F16C
bool has_avx512_vnni();  // AVX-512 F, BW, VL and VNNI (and AVX2)

// The CPU's model name as /proc/cpuinfo gives it ("AMD EPYC 7B13"); "unknown" where there is none.
std::string model_name();

}  // namespace kvgen::cpu
