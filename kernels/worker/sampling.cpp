// The sampler and the CPU decoder behind TokenDecoder (sampling.hpp).
#include "topolaunch/kernels/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "topolaunch/kernels/cpu_decoder.hpp"

namespace topolaunch::kernels {

namespace {

class CpuTokenDecoder final : public TokenDecoder {
 public:
  explicit CpuTokenDecoder(CpuDecoder decoder) : decoder_(std::move(decoder)) {}
  Result<std::span<const float>> step(std::int32_t token) override { return decoder_.step(token); }
  std::int64_t position() const override { return decoder_.position(); }
  void reset() override { decoder_.reset(); }
  std::string description() const override { return "CPU, fp32, KV cache"; }

 private:
  CpuDecoder decoder_;
};

}  // namespace

Result<std::unique_ptr<TokenDecoder>> create_cpu_decoder(const GptConfig& config,
                                                         const NamedWeights& weights) {
  auto d = CpuDecoder::create(config, weights);
  if (!d) return d.error();
  return std::unique_ptr<TokenDecoder>(std::make_unique<CpuTokenDecoder>(std::move(*d)));
}

std::int32_t sample_token(std::span<const float> logits, const SamplingOptions& o,
                          std::mt19937_64& rng) {
  const std::size_t V = logits.size();
  std::vector<std::int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  auto higher = [&](std::int32_t a, std::int32_t b) {
    return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)] ||
           (logits[static_cast<std::size_t>(a)] == logits[static_cast<std::size_t>(b)] && a < b);
  };
  if (o.temperature <= 0) return *std::min_element(ids.begin(), ids.end(), higher);
  const std::size_t k =
      o.top_k > 0 ? std::min<std::size_t>(V, static_cast<std::size_t>(o.top_k)) : V;
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), higher);
  const double top = logits[static_cast<std::size_t>(ids[0])];
  std::vector<double> p(k);
  double sum = 0;
  for (std::size_t i = 0; i < k; ++i) {
    p[i] = std::exp((logits[static_cast<std::size_t>(ids[i])] - top) / o.temperature);
    sum += p[i];
  }
  // One uniform double in [0, 1) from 53 bits (the same on every platform, unlike
  // std::uniform_real_distribution's).
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  for (std::size_t i = 0; i < k; ++i) {
    acc += p[i];
    if (u < acc) return ids[i];
  }
  return ids[k - 1];
}

Result<std::vector<std::int32_t>> generate(TokenDecoder& decoder,
                                           std::span<const std::int32_t> prompt,
                                           const SamplingOptions& o, std::int64_t block_size,
                                           const std::function<void(std::int32_t)>& emit) {
  if (prompt.empty()) return make_error("sample: the prompt has no tokens");
  if (static_cast<std::int64_t>(prompt.size()) > block_size)
    return make_error("sample: the prompt is " + std::to_string(prompt.size()) +
                      " tokens, more than the model's context (block_size " +
                      std::to_string(block_size) + ")");
  std::mt19937_64 rng(o.seed);
  std::span<const float> logits;
  for (std::int32_t t : prompt) {
    auto l = decoder.step(t);
    if (!l) return l.error();
    logits = *l;
  }
  std::vector<std::int32_t> out, history(prompt.begin(), prompt.end());
  for (std::int64_t i = 0; i < o.tokens; ++i) {
    const std::int32_t next = sample_token(logits, o, rng);
    out.push_back(next);
    history.push_back(next);
    if (emit) emit(next);
    if (i + 1 == o.tokens) break;
    std::span<const std::int32_t> feed(&history.back(), 1);
    if (decoder.position() >= block_size) {  // the context is full: slide
      const std::size_t keep = static_cast<std::size_t>(std::max<std::int64_t>(1, block_size / 2));
      feed = std::span<const std::int32_t>(history).last(keep);
      decoder.reset();
    }
    for (std::int32_t t : feed) {
      auto l = decoder.step(t);
      if (!l) return l.error();
      logits = *l;
    }
  }
  return out;
}

}  // namespace topolaunch::kernels
