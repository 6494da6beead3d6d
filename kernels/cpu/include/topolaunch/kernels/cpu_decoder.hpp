// GPT-2 inference on the CPU, one token at a time with a KV cache: the key and value rows of every
// position fed so far are kept per layer, so position t costs one row of each matmul and an
// attention over t + 1 cached rows instead of a forward over the whole prefix. The same reference
// kernels as the training graph (kernels/cpu/), fp32.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/kernels/graph.hpp"
#include "topolaunch/kernels/weights.hpp"

namespace topolaunch::kernels {

class CpuDecoder {
 public:
  // The weights under the graph's names (wte padded to the padded vocabulary); a missing or
  // wrongly sized one is an error naming it.
  static Result<CpuDecoder> create(const GptConfig& config, const NamedWeights& weights);

  // Feeds `token` at position position() (< block_size) and returns the logits of the next token
  // (vocab_size values, valid until the next call).
  std::span<const float> step(std::int32_t token);
  std::int64_t position() const { return position_; }
  void reset() { position_ = 0; }
  const GptConfig& config() const { return config_; }

 private:
  CpuDecoder() = default;
  GptConfig config_;
  std::int64_t padded_vocab_ = 0;
  NamedWeights weights_;
  std::vector<std::vector<float>> k_cache_, v_cache_;  // per layer: (block_size, C)
  std::vector<float> x_, ln_, qkv_, att_, proj_, fc_, fc_gelu_, scores_, logits_;
  float mean_ = 0, rstd_ = 0;
  std::int64_t position_ = 0;
};

}  // namespace topolaunch::kernels
