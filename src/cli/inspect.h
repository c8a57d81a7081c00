#pragma once
#include <string>

namespace kvgen {

// `kvgen --inspect`: the model's architecture, shape, tensor types and KV cache cost. Text to stdout, or JSON to
// json_path ("-" for stdout) when it is not empty. verbose adds every metadata key.
void run_inspect(const std::string& model_path, const std::string& json_path, bool verbose);

}  // namespace kvgen
