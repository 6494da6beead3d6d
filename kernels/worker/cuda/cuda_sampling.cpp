// linked_cuda_decoder() of a CUDA build: `sample --device cuda` through kernels/cuda's CudaDecoder.
#include <cuda_runtime.h>

#include "cuda_decoder.hpp"
#include "topolaunch/kernels/sampling.hpp"

namespace topolaunch::kernels {

namespace {

class CudaTokenDecoder final : public TokenDecoder {
 public:
  explicit CudaTokenDecoder(std::unique_ptr<cuda::CudaDecoder> d) : decoder_(std::move(d)) {}
  Result<std::span<const float>> step(std::int32_t token) override { return decoder_->step(token); }
  std::int64_t position() const override { return decoder_->position(); }
  void reset() override { decoder_->reset(); }
  std::string description() const override {
    return "GPU " + std::to_string(decoder_->device()) + ", bf16, KV cache";
  }

 private:
  std::unique_ptr<cuda::CudaDecoder> decoder_;
};

Result<std::unique_ptr<TokenDecoder>> create_cuda_decoder(const GptConfig& config,
                                                          const NamedWeights& weights) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    return make_error("no CUDA device (sample --device cuda)", 1);
  auto d = cuda::CudaDecoder::create(config, weights);
  if (!d) return d.error();
  return std::unique_ptr<TokenDecoder>(std::make_unique<CudaTokenDecoder>(std::move(*d)));
}

}  // namespace

DecoderFactory linked_cuda_decoder() { return &create_cuda_decoder; }

}  // namespace topolaunch::kernels
