#pragma once
#include <string>

#include "engine/kv_layout.h"

namespace kvgen {

// `kvgen --inspect`: the model's architecture, shape, tensor types and KV cache cost (in the chosen --kv-type k/v
// first, then every other type). Text to stdout, or JSON to json_path ("-" for stdout) when it is not empty. verbose
// adds every metadata key.
void run_inspect(const std::string& model_path, const std::string& json_path, bool verbose,
                 KvType k = KvType::F16, KvType v = KvType::F16);

}  // namespace kvgen
