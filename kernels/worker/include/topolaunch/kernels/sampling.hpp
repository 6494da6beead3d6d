// Text from a trained GPT-2: a decoder feeds one token at a time through a KV cache (the CPU's
// CpuDecoder, the CUDA backend's CudaDecoder) and the sampler picks each next token from its
// logits (temperature, top-k, a seeded generator), so the same seed gives the same text.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/kernels/graph.hpp"
#include "topolaunch/kernels/weights.hpp"

namespace topolaunch::kernels {

class TokenDecoder {
 public:
  virtual ~TokenDecoder() = default;
  // Feeds `token` at the next position; the logits of the token after it (vocab_size values,
  // valid until the next call).
  virtual Result<std::span<const float>> step(std::int32_t token) = 0;
  virtual std::int64_t position() const = 0;
  // Back to position 0 (an empty cache).
  virtual void reset() = 0;
  virtual std::string description() const = 0;  // "CPU, fp32", "GPU 0, bf16"
};

using DecoderFactory = Result<std::unique_ptr<TokenDecoder>> (*)(const GptConfig& config,
                                                                 const NamedWeights& weights);
Result<std::unique_ptr<TokenDecoder>> create_cpu_decoder(const GptConfig& config,
                                                         const NamedWeights& weights);
// The CUDA backend's decoder when this program was linked with it (worker/cuda/), else null.
DecoderFactory linked_cuda_decoder();

struct SamplingOptions {
  std::int64_t tokens = 200;  // new tokens
  double temperature = 0.8;   // 0: the most likely token every time
  int top_k = 40;             // 0: the whole vocabulary
  std::uint64_t seed = 1337;
};

// One token from `logits`: softmax(logits / temperature) over the top_k largest (ties: the lower
// id), drawn with one uniform number of `rng`.
std::int32_t sample_token(std::span<const float> logits, const SamplingOptions& options,
                          std::mt19937_64& rng);

// Feeds the prompt (at least one token, at most block_size), then samples options.tokens tokens,
// calling `emit` with each as it is drawn. When the cache holds the model's whole context
// (block_size), it starts again from the last block_size / 2 tokens (a sliding window, recomputed
// once per half context). Returns the new tokens.
Result<std::vector<std::int32_t>> generate(TokenDecoder& decoder,
                                           std::span<const std::int32_t> prompt,
                                           const SamplingOptions& options, std::int64_t block_size,
                                           const std::function<void(std::int32_t)>& emit = {});

}  // namespace topolaunch::kernels
