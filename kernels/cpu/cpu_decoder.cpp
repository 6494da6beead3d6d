// GPT-2 decoding with a KV cache on the CPU (cpu_decoder.hpp).
#include "topolaunch/kernels/cpu_decoder.hpp"

#include <algorithm>

#include "attention.hpp"
#include "gelu.hpp"
#include "layernorm.hpp"
#include "matmul.hpp"
#include "residual.hpp"

namespace topolaunch::kernels {

Result<CpuDecoder> CpuDecoder::create(const GptConfig& c, const NamedWeights& weights) {
  CpuDecoder d;
  d.config_ = c;
  d.padded_vocab_ = c.padded_vocab ? c.padded_vocab : (c.vocab_size + 63) / 64 * 64;
  const std::int64_t C = c.n_embd;
  auto need = [&](const std::string& name, std::int64_t elements) -> Status {
    auto it = weights.find(name);
    if (it == weights.end()) return make_error("decoder: the weights lack " + name);
    if (static_cast<std::int64_t>(it->second.size()) != elements)
      return make_error("decoder: " + name + " has " + std::to_string(it->second.size()) +
                        " values, the model needs " + std::to_string(elements));
    d.weights_[name] = it->second;
    return ok_status();
  };
  if (auto s = need("wte", d.padded_vocab_ * C); !s) return s.error();
  if (auto s = need("wpe", c.block_size * C); !s) return s.error();
  for (std::int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "h" + std::to_string(l) + ".";
    const std::pair<const char*, std::int64_t> shapes[] = {{"ln1w", C},
                                                           {"ln1b", C},
                                                           {"qkvw", 3 * C * C},
                                                           {"qkvb", 3 * C},
                                                           {"attprojw", C * C},
                                                           {"attprojb", C},
                                                           {"ln2w", C},
                                                           {"ln2b", C},
                                                           {"fcw", 4 * C * C},
                                                           {"fcb", 4 * C},
                                                           {"fcprojw", 4 * C * C},
                                                           {"fcprojb", C}};
    for (const auto& [name, n] : shapes)
      if (auto s = need(p + name, n); !s) return s.error();
  }
  if (auto s = need("lnfw", C); !s) return s.error();
  if (auto s = need("lnfb", C); !s) return s.error();
  d.k_cache_.assign(static_cast<std::size_t>(c.n_layer),
                    std::vector<float>(static_cast<std::size_t>(c.block_size * C)));
  d.v_cache_ = d.k_cache_;
  const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  d.x_.resize(n(C));
  d.ln_.resize(n(C));
  d.qkv_.resize(n(3 * C));
  d.att_.resize(n(C));
  d.proj_.resize(n(C));
  d.fc_.resize(n(4 * C));
  d.fc_gelu_.resize(n(4 * C));
  d.scores_.resize(n(c.block_size));
  d.logits_.resize(n(d.padded_vocab_));
  return d;
}

std::span<const float> CpuDecoder::step(std::int32_t token) {
  const GptConfig& c = config_;
  const std::int64_t C = c.n_embd, t = position_;
  auto w = [&](const std::string& name) { return weights_.at(name).data(); };
  const float* wte = w("wte");
  const float* wpe = w("wpe");
  for (std::int64_t i = 0; i < C; ++i) x_[i] = wte[token * C + i] + wpe[t * C + i];
  for (std::int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "h" + std::to_string(l) + ".";
    cpu::layernorm_forward(ln_.data(), &mean_, &rstd_, x_.data(), w(p + "ln1w"), w(p + "ln1b"),
                           std::int64_t{1}, C);
    cpu::matmul_forward(qkv_.data(), ln_.data(), w(p + "qkvw"), w(p + "qkvb"), std::int64_t{1}, C,
                        3 * C);
    float* k = k_cache_[l].data();
    float* v = v_cache_[l].data();
    std::copy(qkv_.begin() + C, qkv_.begin() + 2 * C, k + t * C);
    std::copy(qkv_.begin() + 2 * C, qkv_.end(), v + t * C);
    cpu::attention_cached_forward(att_.data(), scores_.data(), qkv_.data(), k, v, t, C, c.n_head);
    cpu::matmul_forward(proj_.data(), att_.data(), w(p + "attprojw"), w(p + "attprojb"),
                        std::int64_t{1}, C, C);
    cpu::residual_forward(x_.data(), x_.data(), proj_.data(), C);
    cpu::layernorm_forward(ln_.data(), &mean_, &rstd_, x_.data(), w(p + "ln2w"), w(p + "ln2b"),
                           std::int64_t{1}, C);
    cpu::matmul_forward(fc_.data(), ln_.data(), w(p + "fcw"), w(p + "fcb"), std::int64_t{1}, C,
                        4 * C);
    cpu::gelu_forward(fc_gelu_.data(), fc_.data(), 4 * C);
    cpu::matmul_forward(proj_.data(), fc_gelu_.data(), w(p + "fcprojw"), w(p + "fcprojb"),
                        std::int64_t{1}, 4 * C, C);
    cpu::residual_forward(x_.data(), x_.data(), proj_.data(), C);
  }
  cpu::layernorm_forward(ln_.data(), &mean_, &rstd_, x_.data(), w("lnfw"), w("lnfb"),
                         std::int64_t{1}, C);
  cpu::matmul_forward(logits_.data(), ln_.data(), wte, static_cast<const float*>(nullptr),
                      std::int64_t{1}, C, padded_vocab_);
  ++position_;
  return {logits_.data(), static_cast<std::size_t>(c.vocab_size)};
}

}  // namespace topolaunch::kernels
