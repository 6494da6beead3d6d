// GPT-2 decoding with a KV cache on the GPU (cuda_decoder.hpp).
#include "cuda_decoder.hpp"

#include <cuda_bf16.h>

#include <cstring>
#include <string>

#include "attention.cuh"
#include "encoder.cuh"
#include "gelu.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"
#include "residual.cuh"

namespace topolaunch::kernels::cuda {

namespace {

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ok_status();
  return make_error(std::string("cuda decoder: ") + what + ": " + cudaGetErrorString(e), 1);
}

}  // namespace

CudaDecoder::~CudaDecoder() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (void* p : allocations_) cudaFree(p);
  if (token_host_ != nullptr) cudaFreeHost(token_host_);
  if (logits_host_ != nullptr) cudaFreeHost(logits_host_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Result<std::unique_ptr<CudaDecoder>> CudaDecoder::create(const GptConfig& c,
                                                         const NamedWeights& weights) {
  std::unique_ptr<CudaDecoder> d(new CudaDecoder());
  d->config_ = c;
  d->padded_vocab_ = c.padded_vocab ? c.padded_vocab : (c.vocab_size + 63) / 64 * 64;
  const std::int64_t C = c.n_embd;
  if (C % c.n_head != 0 || C / c.n_head > 256)
    return make_error("cuda decoder: head size " + std::to_string(C / c.n_head) + " above 256");
  if (auto s = cuda_status(cudaGetDevice(&d->device_), "cudaGetDevice"); !s) return s.error();
  if (auto s = cuda_status(cudaStreamCreateWithFlags(&d->stream_, cudaStreamNonBlocking),
                           "cudaStreamCreate");
      !s)
    return s.error();
  d->matmul_ = std::make_unique<Matmul>();
  if (!d->matmul_->error().empty()) return make_error("cuda decoder: " + d->matmul_->error(), 1);
  auto alloc = [&](std::size_t bytes, void** out) -> Status {
    if (auto s = cuda_status(cudaMalloc(out, bytes), "cudaMalloc"); !s) return s;
    d->allocations_.push_back(*out);
    return cuda_status(cudaMemset(*out, 0, bytes), "cudaMemset");
  };
  // A parameter as bf16 on the device.
  auto upload = [&](const std::string& name, std::int64_t elements, void** out) -> Status {
    auto it = weights.find(name);
    if (it == weights.end()) return make_error("cuda decoder: the weights lack " + name);
    if (static_cast<std::int64_t>(it->second.size()) != elements)
      return make_error("cuda decoder: " + name + " has " + std::to_string(it->second.size()) +
                        " values, the model needs " + std::to_string(elements));
    std::vector<__nv_bfloat16> host(it->second.size());
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = __float2bfloat16(it->second[i]);
    if (auto s = alloc(host.size() * sizeof(__nv_bfloat16), out); !s) return s;
    return cuda_status(
        cudaMemcpy(*out, host.data(), host.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice),
        "cudaMemcpy");
  };
  if (auto s = upload("wte", d->padded_vocab_ * C, &d->wte_); !s) return s.error();
  if (auto s = upload("wpe", c.block_size * C, &d->wpe_); !s) return s.error();
  for (std::int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "h" + std::to_string(l) + ".";
    Layer L{};
    const std::tuple<const char*, std::int64_t, void**> params[] = {
        {"ln1w", C, &L.ln1w},
        {"ln1b", C, &L.ln1b},
        {"qkvw", 3 * C * C, &L.qkvw},
        {"qkvb", 3 * C, &L.qkvb},
        {"attprojw", C * C, &L.attprojw},
        {"attprojb", C, &L.attprojb},
        {"ln2w", C, &L.ln2w},
        {"ln2b", C, &L.ln2b},
        {"fcw", 4 * C * C, &L.fcw},
        {"fcb", 4 * C, &L.fcb},
        {"fcprojw", 4 * C * C, &L.fcprojw},
        {"fcprojb", C, &L.fcprojb}};
    for (const auto& [name, n, out] : params)
      if (auto s = upload(p + name, n, out); !s) return s.error();
    const std::size_t cache = static_cast<std::size_t>(c.block_size * C) * sizeof(__nv_bfloat16);
    if (auto s = alloc(cache, &L.k_cache); !s) return s.error();
    if (auto s = alloc(cache, &L.v_cache); !s) return s.error();
    d->layers_.push_back(L);
  }
  if (auto s = upload("lnfw", C, &d->lnfw_); !s) return s.error();
  if (auto s = upload("lnfb", C, &d->lnfb_); !s) return s.error();
  const std::size_t b = sizeof(__nv_bfloat16);
  const std::pair<std::size_t, void**> buffers[] = {{C * b, &d->x_},
                                                    {C * b, &d->ln_},
                                                    {3 * C * b, &d->qkv_},
                                                    {C * b, &d->att_},
                                                    {C * b, &d->proj_},
                                                    {4 * C * b, &d->fc_},
                                                    {4 * C * b, &d->fc_gelu_},
                                                    {d->padded_vocab_ * b, &d->logits_device_},
                                                    {2 * sizeof(float), &d->stats_},
                                                    {sizeof(std::int32_t), &d->token_}};
  for (const auto& [bytes, out] : buffers)
    if (auto s = alloc(bytes, out); !s) return s.error();
  if (auto s = cuda_status(
          cudaMallocHost(reinterpret_cast<void**>(&d->token_host_), sizeof(std::int32_t)),
          "cudaMallocHost");
      !s)
    return s.error();
  if (auto s = cuda_status(cudaMallocHost(reinterpret_cast<void**>(&d->logits_host_),
                                          static_cast<std::size_t>(d->padded_vocab_) * b),
                           "cudaMallocHost");
      !s)
    return s.error();
  d->logits_.resize(static_cast<std::size_t>(c.vocab_size));
  return Result<std::unique_ptr<CudaDecoder>>(std::move(d));
}

Result<std::span<const float>> CudaDecoder::step(std::int32_t token) {
  const GptConfig& c = config_;
  const std::int64_t C = c.n_embd, t = position_;
  if (t >= c.block_size) return make_error("cuda decoder: the context (block_size) is full");
  using bf = __nv_bfloat16;
  auto B = [](void* p) { return static_cast<bf*>(p); };
  float* mean = static_cast<float*>(stats_);
  float* rstd = mean + 1;
  cudaStream_t s = stream_;
  *token_host_ = token;
  if (auto st = cuda_status(
          cudaMemcpyAsync(token_, token_host_, sizeof(std::int32_t), cudaMemcpyHostToDevice, s),
          "token copy");
      !st)
    return st.error();
  // Position t's row of wpe: the encoder's position 0 of a one-token sequence.
  encoder_forward(B(x_), static_cast<const std::int32_t*>(token_), B(wte_), B(wpe_) + t * C, 1, 1,
                  C, s);
  bool gemm_ok = true;
  cudaError_t e = cudaSuccess;
  for (const Layer& L : layers_) {
    if (e == cudaSuccess)
      e = layernorm_forward(B(ln_), mean, rstd, B(x_), B(L.ln1w), B(L.ln1b), 1, C, s);
    gemm_ok &= matmul_->matmul_forward(B(qkv_), B(ln_), B(L.qkvw), B(L.qkvb), 1, C, 3 * C, s) ==
               CUBLAS_STATUS_SUCCESS;
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(B(L.k_cache) + t * C, B(qkv_) + C, C * sizeof(bf),
                          cudaMemcpyDeviceToDevice, s);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(B(L.v_cache) + t * C, B(qkv_) + 2 * C, C * sizeof(bf),
                          cudaMemcpyDeviceToDevice, s);
    if (e == cudaSuccess)
      e = attention_cached_forward(B(att_), B(qkv_), B(L.k_cache), B(L.v_cache), t, C, c.n_head, s);
    gemm_ok &= matmul_->matmul_forward(B(proj_), B(att_), B(L.attprojw), B(L.attprojb), 1, C, C,
                                       s) == CUBLAS_STATUS_SUCCESS;
    residual_forward(B(x_), B(x_), B(proj_), C, s);
    if (e == cudaSuccess)
      e = layernorm_forward(B(ln_), mean, rstd, B(x_), B(L.ln2w), B(L.ln2b), 1, C, s);
    gemm_ok &= matmul_->matmul_forward(B(fc_), B(ln_), B(L.fcw), B(L.fcb), 1, C, 4 * C, s) ==
               CUBLAS_STATUS_SUCCESS;
    gelu_forward(B(fc_gelu_), B(fc_), 4 * C, s);
    gemm_ok &= matmul_->matmul_forward(B(proj_), B(fc_gelu_), B(L.fcprojw), B(L.fcprojb), 1, 4 * C,
                                       C, s) == CUBLAS_STATUS_SUCCESS;
    residual_forward(B(x_), B(x_), B(proj_), C, s);
  }
  if (e == cudaSuccess)
    e = layernorm_forward(B(ln_), mean, rstd, B(x_), B(lnfw_), B(lnfb_), 1, C, s);
  gemm_ok &= matmul_->matmul_forward(B(logits_device_), B(ln_), B(wte_), nullptr, 1, C,
                                     padded_vocab_, s) == CUBLAS_STATUS_SUCCESS;
  if (!gemm_ok) return make_error("cuda decoder: a cuBLASLt GEMM failed", 1);
  if (auto st = cuda_status(e, "a kernel"); !st) return st.error();
  if (auto st = cuda_status(cudaMemcpyAsync(logits_host_, logits_device_,
                                            padded_vocab_ * sizeof(bf), cudaMemcpyDeviceToHost, s),
                            "logits copy");
      !st)
    return st.error();
  if (auto st = cuda_status(cudaStreamSynchronize(s), "the step"); !st) return st.error();
  for (std::size_t i = 0; i < logits_.size(); ++i) {
    const std::uint32_t bits = std::uint32_t{logits_host_[i]} << 16;
    std::memcpy(&logits_[i], &bits, 4);
  }
  ++position_;
  return std::span<const float>(logits_);
}

}  // namespace topolaunch::kernels::cuda
