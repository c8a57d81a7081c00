#pragma once
// The test library's flat form of ActBlocks (matvec_int.cuh), so that a call returning float rows can return the
// blocks it wrote beside them: each block as d, s, h[0], h[1], q[0..31], after `result`. Used alike by the device
// calls and the host emulation, so that the tests compare the two forms value for value.
#include <cstdint>
#include <vector>

#include "matvec_int.cuh"

namespace kvgen::cuda::testing {

inline std::vector<float> append_blocks(std::vector<float> result, const std::vector<ActBlock>& blocks) {
    for (const ActBlock& a : blocks) {
        result.push_back(a.d);
        result.push_back(float(a.s));
        result.push_back(float(a.h[0]));
        result.push_back(float(a.h[1]));
        for (int16_t q : a.q) result.push_back(float(q));
    }
    return result;
}

}  // namespace kvgen::cuda::testing
