// A topolaunch-worker built without the CUDA backend (meson's cuda option off): no executor for
// train.precision = "bf16", which run_worker then refuses (exit 2), and no GPU decoder for
// `sample --device cuda`. With -Dcuda=enabled the build links worker/cuda/cuda_executor.cpp and
// worker/cuda/cuda_sampling.cpp instead of this file.
#include "topolaunch/kernels/executor.hpp"
#include "topolaunch/kernels/sampling.hpp"

namespace topolaunch::kernels {

ExecutorFactory linked_cuda_executor() { return nullptr; }
DecoderFactory linked_cuda_decoder() { return nullptr; }

}  // namespace topolaunch::kernels
