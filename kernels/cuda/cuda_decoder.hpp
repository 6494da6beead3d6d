// GPT-2 inference on the GPU one token at a time with a KV cache: the twin of CpuDecoder
// (kernels/cpu/include/topolaunch/kernels/cpu_decoder.hpp), over the training kernels of this
// folder (encoder, LayerNorm, cuBLASLt GEMMs, GELU, residual) plus attention_cached_forward. bf16
// weights, activations and caches, fp32 statistics and accumulation (the training step's
// precision), logits copied to the host as fp32 after each token.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/kernels/graph.hpp"
#include "topolaunch/kernels/weights.hpp"

namespace topolaunch::kernels::cuda {

class Matmul;

class CudaDecoder {
 public:
  // On the current device; the weights under the graph's names (wte padded), as CpuDecoder takes.
  static Result<std::unique_ptr<CudaDecoder>> create(const GptConfig& config,
                                                     const NamedWeights& weights);
  ~CudaDecoder();
  CudaDecoder(const CudaDecoder&) = delete;
  CudaDecoder& operator=(const CudaDecoder&) = delete;

  // Feeds `token` at position position() (< block_size); the next token's logits (vocab_size,
  // fp32 on the host, valid until the next call). Synchronises the stream.
  Result<std::span<const float>> step(std::int32_t token);
  std::int64_t position() const { return position_; }
  void reset() { position_ = 0; }  // rows past the position are never read
  int device() const { return device_; }

 private:
  CudaDecoder() = default;
  struct Layer {
    void *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw,
        *fcprojb, *k_cache, *v_cache;
  };
  GptConfig config_;
  std::int64_t padded_vocab_ = 0, position_ = 0;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Matmul> matmul_;
  std::vector<void*> allocations_;
  void *wte_ = nullptr, *wpe_ = nullptr, *lnfw_ = nullptr, *lnfb_ = nullptr;
  std::vector<Layer> layers_;
  // activations (bf16) and statistics (fp32)
  void *x_ = nullptr, *ln_ = nullptr, *qkv_ = nullptr, *att_ = nullptr, *proj_ = nullptr,
       *fc_ = nullptr, *fc_gelu_ = nullptr, *logits_device_ = nullptr, *stats_ = nullptr,
       *token_ = nullptr;
  std::int32_t* token_host_ = nullptr;    // pinned
  std::uint16_t* logits_host_ = nullptr;  // pinned bf16 bits
  std::vector<float> logits_;
};

}  // namespace topolaunch::kernels::cuda
