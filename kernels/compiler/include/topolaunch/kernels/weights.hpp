// A model's parameters by name (the graph's names: wte, h0.qkvw, ...), fp32 on the host: what a
// checkpoint holds of a model, what the decoders and the safetensors interchange take.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace topolaunch::kernels {

using NamedWeights = std::map<std::string, std::vector<float>>;

}  // namespace topolaunch::kernels
